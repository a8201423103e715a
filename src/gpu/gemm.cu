// gpu::gemm: pick a kernel for the shape (coda/gemm/heuristic.hpp) and launch it; the stream-K
// scratch it may need.
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm_instances.hpp"

namespace coda::gpu {
namespace {

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw Error(Status::cuda_error, "cannot query the current CUDA device");
  return device;
}

int current_device_sms() {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()) != cudaSuccess)
    throw Error(Status::cuda_error, "cannot query the current CUDA device");
  return sms;
}

GemmLauncher find_launcher(GemmLayout layout, DType in, DType out, sm90::KernelId kernel) {
  switch (layout) {
  case GemmLayout::fwd:
    return gemm_launcher<GemmLayout::fwd>(in, out, kernel);
  case GemmLayout::dgrad:
    return gemm_launcher<GemmLayout::dgrad>(in, out, kernel);
  case GemmLayout::wgrad:
    return gemm_launcher<GemmLayout::wgrad>(in, out, kernel);
  }
  return nullptr;
}

} // namespace

bool device_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError(); // clear the "no device" error so the caller's next CUDA call is clean
    return false;
  }
  return major == 9 && minor == 0;
}

sm90::GemmPlan default_plan(const GemmArgs& args) {
  return sm90::choose_plan(args.m(), args.n(), args.k(), current_device_sms());
}

void gemm_with_plan(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream) {
  if (!device_supported())
    throw Error(Status::not_supported, "the GPU GEMM needs an sm_90 (Hopper) device");
  if (args.has_c() && args.c.dtype != args.d.dtype)
    throw Error(Status::not_supported, "the GPU GEMM needs C in D's dtype");
  if (args.m() == 0 || args.n() == 0) return;
  if (args.k() == 0) throw Error(Status::not_supported, "the GPU GEMM needs K > 0");
  const GemmLauncher launch = find_launcher(args.layout, args.a.dtype, args.d.dtype, plan.kernel);
  if (!launch)
    throw Error(Status::not_supported, std::string("no GPU GEMM kernel for ") +
                                           dtype_name(args.a.dtype) + " inputs and " +
                                           dtype_name(args.d.dtype) + " output");
  launch(args, plan, stream);
}

void gemm(const GemmArgs& args, Stream stream) {
  if (!device_supported())
    throw Error(Status::not_supported, "the GPU GEMM needs an sm_90 (Hopper) device");
  gemm_with_plan(args, default_plan(args), stream);
}

// One scratch per (device, stream, host thread): launches on one stream run in order, so they
// may share it, and launches that may overlap get their own. Flags are zeroed once here; every
// launch leaves them zero. Kept for the life of the process (at most ~17 MB each).
// NOTE: sharing is still possible where stream order does not hold: a graph captured on a
// stream and replayed while that stream runs eager GEMMs, or a stream destroyed with a GEMM in
// flight whose handle a new stream reuses. A caller-supplied workspace in the public API would
// remove both (ARCHITECTURE section 6); until then such callers should not overlap those GEMMs.
sm90::StreamKWorkspace stream_k_workspace(size_t partial_bytes, size_t flag_bytes, Stream stream) {
  struct Scratch {
    void* base = nullptr;
    size_t partial_bytes = 0, flag_bytes = 0;
  };
  static std::mutex mutex;
  static std::map<std::tuple<int, Stream, std::thread::id>, Scratch> scratch;

  const std::lock_guard<std::mutex> lock(mutex);
  const int device = current_device();
  Scratch& s = scratch[{device, stream, std::this_thread::get_id()}];
  if (s.partial_bytes < partial_bytes || s.flag_bytes < flag_bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return {}; // no allocation inside a capture: this launch runs without stream-K
    }
    cudaFree(s.base); // synchronizes with the launches still using it
    s = Scratch{};
    const size_t flags_offset = (partial_bytes + 255) / 256 * 256;
    if (cudaMalloc(&s.base, flags_offset + flag_bytes) != cudaSuccess) {
      cudaGetLastError();
      s.base = nullptr;
      return {};
    }
    if (cudaMemsetAsync(static_cast<char*>(s.base) + flags_offset, 0, flag_bytes, stream) !=
        cudaSuccess) {
      cudaFree(s.base);
      cudaGetLastError();
      s.base = nullptr;
      return {};
    }
    s.partial_bytes = flags_offset;
    s.flag_bytes = flag_bytes;
  }
  return sm90::StreamKWorkspace{
      static_cast<float*>(s.base),
      reinterpret_cast<int32_t*>(static_cast<char*>(s.base) + s.partial_bytes)};
}

} // namespace coda::gpu
