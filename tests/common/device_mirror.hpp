// Runs a test written against HostTensor on the GPU backend: while a DeviceMirror is alive,
// HostTensor::view() returns a device copy of the tensor (uploaded at its first view, NaN poison
// included), and sync() (coda::test::sync_views()) copies every mirrored tensor back and forgets
// the copies: each is then filled with 0xFF bytes (NaN in every float type) and kept until the
// mirror dies, so a view taken before a sync and used after it fails its test instead of
// reaching memory a later copy reuses. Copies are keyed by host address, so a run of calls
// between two syncs must not destroy a viewed tensor and view another at its address.
#pragma once

#include <cstddef>
#include <vector>

#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

// True when an sm_90 GPU and the CUDA backend are present.
bool gpu_backend_available();

class DeviceMirror : public ViewHook {
public:
  DeviceMirror();           // installs itself as the thread's view hook
  ~DeviceMirror() override; // uninstalls and frees (without copying back)
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  TensorView view(HostTensor& tensor, const TensorView& host) override;
  // Waits for the device, copies every mirrored tensor back, then poisons and retires the copies.
  void sync() override;

private:
  void release();
  void retire();
  struct Copy {
    void* host;
    void* device;
    size_t bytes;
  };
  std::vector<Copy> copies_;
  std::vector<void*> retired_; // poisoned copies of earlier syncs, freed with the mirror
  ViewHook* previous_;
};

// Host views for its lifetime, whatever hook is installed (e.g. to run the CPU backend on the
// same tensors inside a GPU test).
class HostViews {
public:
  HostViews() : previous_(set_view_hook(nullptr)) {}
  ~HostViews() { set_view_hook(previous_); }
  HostViews(const HostViews&) = delete;
  HostViews& operator=(const HostViews&) = delete;

private:
  ViewHook* previous_;
};

} // namespace coda::test
