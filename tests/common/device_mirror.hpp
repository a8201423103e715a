// Runs a test written against HostTensor on the GPU backend: while a DeviceMirror is alive,
// HostTensor::view() returns a device copy of the tensor (uploaded at its first view, NaN poison
// included), and download() copies every mirrored tensor back, so the host-side checks see the
// GPU's results. A mirror lives for one run of calls: it keys copies by host address, which a
// later tensor may reuse.
#pragma once

#include <cstddef>
#include <vector>

#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

// True when an sm_90 GPU and the CUDA backend are present.
bool gpu_backend_available();

class DeviceMirror : public ViewHook {
public:
  DeviceMirror();
  ~DeviceMirror() override; // uninstalls and frees (without downloading)
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  TensorView view(HostTensor& tensor, const TensorView& host) override;
  // Waits for the device, then copies every mirrored tensor back to its host tensor.
  void download();

private:
  struct Copy {
    void* host;
    void* device;
    size_t bytes;
  };
  std::vector<Copy> copies_;
  ViewHook* previous_;
};

// A DeviceMirror when `on_gpu`, nothing otherwise; finish() downloads.
class BackendScope {
public:
  explicit BackendScope(bool on_gpu);
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
  void finish();

private:
  DeviceMirror* mirror_ = nullptr;
};

} // namespace coda::test
