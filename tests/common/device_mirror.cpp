#include "tests/common/device_mirror.hpp"

#include <stdexcept>
#include <string>

#if CODA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace coda::test {

#if CODA_WITH_CUDA

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("DeviceMirror: ") + what + ": " + cudaGetErrorString(e));
}
} // namespace

bool gpu_backend_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError(); // clear the "no device" error
    return false;
  }
  cudaDeviceProp prop{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return false;
  return prop.major == 9 && prop.minor == 0;
}

DeviceMirror::DeviceMirror() : previous_(set_view_hook(this)) {}

DeviceMirror::~DeviceMirror() {
  set_view_hook(previous_);
  release();
  for (void* d : retired_) cudaFree(d);
}

void DeviceMirror::release() {
  for (const Copy& c : copies_) cudaFree(c.device);
  copies_.clear();
}

// A view taken before a sync and used after it would otherwise address freed memory, which the
// next upload may reuse (two such bugs: block_suite.hpp's Dloss, and a view aliasing a later
// copy as "grads.dx overlaps grads.dloss.tensor"). Poisoned and kept, a stale input reads NaN
// and a stale output's results never reach the host: the test fails where the mistake is.
void DeviceMirror::retire() {
  for (const Copy& c : copies_) {
    check(cudaMemset(c.device, 0xFF, c.bytes), "poison"); // NaN in f32, bf16 and f16
    retired_.push_back(c.device);
  }
  copies_.clear();
}

TensorView DeviceMirror::view(HostTensor&, const TensorView& host) {
  TensorView v = host;
  v.device = Device::cuda;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  v.device_index = device;
  for (const Copy& c : copies_)
    if (c.host == host.data) return v.data = c.device, v;
  const size_t bytes = size_t(host.numel()) * size_t(dtype_size(host.dtype));
  void* d = nullptr;
  check(cudaMalloc(&d, bytes), "cudaMalloc");
  copies_.push_back({host.data, d, bytes});
  check(cudaMemcpy(d, host.data, bytes, cudaMemcpyHostToDevice), "upload");
  v.data = d;
  return v;
}

void DeviceMirror::sync() {
  check(cudaDeviceSynchronize(), "the GPU calls");
  for (const Copy& c : copies_)
    check(cudaMemcpy(c.host, c.device, c.bytes, cudaMemcpyDeviceToHost), "download");
  retire();
}

#else

bool gpu_backend_available() { return false; }
DeviceMirror::DeviceMirror() : previous_(nullptr) {
  throw std::runtime_error("DeviceMirror: this build has no CUDA backend");
}
DeviceMirror::~DeviceMirror() = default;
void DeviceMirror::release() {}
void DeviceMirror::retire() {}
TensorView DeviceMirror::view(HostTensor&, const TensorView& host) { return host; }
void DeviceMirror::sync() {}

#endif

} // namespace coda::test
