// gpu::gemm: pick a kernel for the shape (coda/gemm/heuristic.hpp) and launch it.
#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm_instances.hpp"

namespace coda::gpu {
namespace {

int current_device_sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    throw Error(Status::cuda_error, "cannot query the current CUDA device");
  return sms;
}

GemmLauncher find_launcher(GemmLayout layout, DType in, DType out, gemm::KernelId kernel) {
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

void gemm(const GemmArgs& args, Stream stream) {
  if (!device_supported())
    throw Error(Status::not_supported, "the GPU GEMM needs an sm_90 (Hopper) device");
  if (args.has_c() && args.c.dtype != args.d.dtype)
    throw Error(Status::not_supported, "the GPU GEMM needs C in D's dtype");
  if (args.m() == 0 || args.n() == 0) return;
  if (args.k() == 0) throw Error(Status::not_supported, "the GPU GEMM needs K > 0");
  const gemm::GemmPlan plan = gemm::choose_plan(args.m(), args.n(), args.k(), current_device_sms());
  const GemmLauncher launch = find_launcher(args.layout, args.a.dtype, args.d.dtype, plan.kernel);
  if (!launch)
    throw Error(Status::not_supported, std::string("no GPU GEMM kernel for ") +
                                           dtype_name(args.a.dtype) + " inputs and " +
                                           dtype_name(args.d.dtype) + " output");
  launch(args, plan.group_m, stream);
}

} // namespace coda::gpu
