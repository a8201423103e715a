// gpu::gemm_fp8: the block-scaled FP8 GEMM (Fp8GemmArgs) on the kernel of fp8.cuh.
#include <cstdint>
#include <string>

#include "coda/core/error.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/fp8.cuh"

namespace coda::gpu {
namespace {

using fp8::Config, fp8::Kernel;
using Epi = fp8::Epilogue;

typename Epi::Params epilogue_params(const Fp8GemmArgs& args) {
  typename Epi::Params p{};
  p.d = Epi::output_map("d", args.d, args.m(), args.n());
  p.c = p.d; // never read: load_c = 0
  p.alpha = 1.f;
  p.beta = 0.f;
  p.load_c = 0;
  p.defer_stores = 0;
  p.alpha_tensor = nullptr;
  return p;
}

} // namespace

void gemm_fp8(const Fp8GemmArgs& args, Stream stream) {
  require_device("FP8 GEMM");
  // Rows are 32-bit in the kernel (tile rows and the scale rows it reads).
  if (args.m() > INT32_MAX - Config::kTileM * Config::kClusterM)
    throw Error(Status::not_supported,
                "gemm_fp8: the GPU kernel takes M < 2^31 - 256; got " + std::to_string(args.m()));
  const Kernel::Problem problem{args.m(), args.n(), args.k()};
  Kernel::Main::Params mainloop = Kernel::mainloop_params(args.a, args.b, problem);
  mainloop.a_scales = args.a_scales.ptr<const uint8_t>();
  mainloop.b_scales = args.b_scales.ptr<const uint8_t>();
  mainloop.a_scales_row_stride = args.a_scales.stride[0];
  mainloop.b_scales_row_stride = args.b_scales.stride[0];
  mainloop.m = int32_t(args.m());
  // NOTE: no stream-K (no workspace, and the plan says so): the FP8 consumer reads the scales of
  // k-blocks in the order k_begin, k_begin + 1, ..., which a stream-K piece's rotated loads
  // would not follow.
  sm90::GemmPlan plan;
  plan.stream_k = sm90::StreamKMode::off;
  plan.defer_stores = false;
  Kernel::run(mainloop, problem, epilogue_params(args), plan, TensorView{}, stream);
}

} // namespace coda::gpu
