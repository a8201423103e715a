#include "api/device.hpp"

#include <string>

#if CODA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/backend.hpp"
#endif

namespace coda::api {

void no_cuda_backend(const Validator& v, const char* name) {
  v.fail(Status::not_supported,
         std::string(name) + " is labelled cuda, but this build of coda has no CUDA backend; "
                             "pass host tensors to use the CPU backend");
}

#if CODA_WITH_CUDA

namespace {

bool no_usable_device(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorInitializationError;
}

} // namespace

void check_memory_matches_label(const Validator& v, const char* name, const TensorView& t) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, t.data);
  if (err != cudaSuccess) {
    cudaGetLastError(); // the failure is ours to report, not a sticky error for the caller
    if (t.device == Device::cpu) return; // no CUDA context can own it: plain host memory
    if (no_usable_device(err))
      v.fail(Status::not_supported, std::string(name) +
                                        " is labelled cuda, but no CUDA device is usable (" +
                                        cudaGetErrorString(err) + ")");
    v.fail(Status::cuda_error, std::string("cudaPointerGetAttributes(") + name +
                                   ") failed: " + cudaGetErrorString(err));
  }
  const std::string n = name;
  if (attr.type == cudaMemoryTypeManaged) return;
  const bool on_device = attr.type == cudaMemoryTypeDevice;
  if (t.device == Device::cpu && on_device)
    v.fail(Status::invalid_argument, n + " is labelled cpu but points to memory of cuda:" +
                                         std::to_string(attr.device) + "; label it cuda");
  if (t.device == Device::cuda && !on_device)
    v.fail(Status::invalid_argument,
           n + " is labelled cuda but points to host memory; label it cpu to use the CPU backend, "
               "or copy it to the device");
  if (t.device == Device::cuda && attr.device != t.device_index)
    v.fail(Status::invalid_argument,
           n + " is labelled cuda:" + std::to_string(t.device_index) +
               " but points to memory of cuda:" + std::to_string(attr.device));
}

void check_current_device(const Validator& v, const char* name, int32_t device_index) {
  int current = -1;
  const cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) {
    cudaGetLastError();
    v.fail(Status::cuda_error, std::string("cudaGetDevice failed: ") + cudaGetErrorString(err));
  }
  if (current != device_index)
    v.fail(Status::invalid_argument,
           std::string(name) + " is on cuda:" + std::to_string(device_index) +
               " but the current CUDA device is cuda:" + std::to_string(current) +
               " (the GPU backend launches on the current device); call cudaSetDevice(" +
               std::to_string(device_index) + ") first");
}

void require_supported_gpu(const char* op) {
  if (gpu::device_supported()) return;
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    throw Error(Status::not_supported, std::string(op) +
                                           ": the GPU backend needs an sm_90 (Hopper) device and "
                                           "the current device cannot be queried");
  }
  throw Error(Status::not_supported,
              std::string(op) +
                  ": the GPU backend needs an sm_90 (Hopper, compute capability 9.0) "
                  "device; cuda:" +
                  std::to_string(device) + " is " + prop.name + " (compute capability " +
                  std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                  "); pass host tensors to use the CPU backend");
}

#else

void check_memory_matches_label(const Validator&, const char*, const TensorView&) {}
void check_current_device(const Validator&, const char*, int32_t) {}
void require_supported_gpu(const char* op) {
  throw Error(Status::not_supported, std::string(op) + ": this build of coda has no CUDA backend");
}

#endif

} // namespace coda::api

namespace coda {

#if CODA_WITH_CUDA
bool gpu_supported() { return gpu::device_supported(); }
#else
bool gpu_supported() { return false; }
#endif

} // namespace coda
