// gpu::gemm: pick a kernel for the shape (coda/gemm/heuristic.hpp) and launch it; the size of
// the stream-K scratch it takes from the caller's workspace.
#include <string>

#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/instances.hpp"

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
  return {};
}

// The kernel for args and plan, after the checks every GPU GEMM makes; empty when M or N is 0.
GemmLauncher checked_launcher(const GemmArgs& args, const sm90::GemmPlan& plan) {
  require_device("GEMM");
  if (args.has_c() && args.c.dtype != args.d.dtype)
    throw Error(Status::not_supported, "the GPU GEMM needs C in D's dtype");
  if (args.m() == 0 || args.n() == 0) return {};
  if (args.k() == 0) throw Error(Status::not_supported, "the GPU GEMM needs K > 0");
  const GemmLauncher launcher = find_launcher(args.layout, args.a.dtype, args.d.dtype, plan.kernel);
  if (!launcher)
    throw Error(Status::not_supported, std::string("no GPU GEMM kernel for ") +
                                           dtype_name(args.a.dtype) + " inputs and " +
                                           dtype_name(args.d.dtype) + " output");
  return launcher;
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

void require_device(const char* kernel) {
  if (!device_supported())
    throw Error(Status::not_supported,
                std::string("the GPU ") + kernel + " needs an sm_90 (Hopper) device");
}

sm90::GemmPlan default_plan(const GemmArgs& args) {
  // Whether the 128 x 192 kernel is compiled for these dtypes (instances.cuh: bf16 only).
  const bool narrow_compiled =
      bool(find_launcher(args.layout, args.a.dtype, args.d.dtype, sm90::KernelId::wide192));
  return sm90::choose_plan(args.m(), args.n(), args.k(), current_device_sms(), narrow_compiled);
}

void gemm_with_plan(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream) {
  if (const GemmLauncher launcher = checked_launcher(args, plan)) launcher.run(args, plan, stream);
}

size_t gemm_workspace_size(const GemmArgs& args, const sm90::GemmPlan& plan) {
  const GemmLauncher launcher = checked_launcher(args, plan);
  return launcher ? launcher.workspace_size(args, plan) : 0;
}

void gemm(const GemmArgs& args, Stream stream) {
  require_device("GEMM");
  gemm_with_plan(args, default_plan(args), stream);
}

size_t gemm_workspace_size(const GemmArgs& args) {
  require_device("GEMM");
  return gemm_workspace_size(args, default_plan(args));
}

} // namespace coda::gpu
