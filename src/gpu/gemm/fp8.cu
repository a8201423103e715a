// gpu::gemm_fp8: the block-scaled FP8 GEMM (Fp8GemmArgs) on the kernels of fp8.cuh.
#include <cstdint>
#include <string>

#include "coda/core/error.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/fp8.cuh"

namespace coda::gpu {
namespace {

template <Fp8BScaling kBScaling, class OutT> void run(const Fp8GemmArgs& args, Stream stream) {
  using Kernel = fp8::Kernel<kBScaling, OutT>;
  using Epi = fp8::Epilogue<OutT>;
  const typename Kernel::Problem problem{args.m(), args.n(), args.k()};
  typename Kernel::Main::Params mainloop = Kernel::mainloop_params(args.a, args.b, problem);
  Kernel::Main::set_scales(mainloop, args.a_scales, args.b_scales, args.m(), args.n());

  typename Epi::Params epilogue{};
  epilogue.d = Epi::output_map("d", args.d, args.m(), args.n());
  epilogue.c = epilogue.d; // accumulate: C is D itself, read before each subtile is stored
  epilogue.alpha = 1.f;
  epilogue.beta = args.accumulate ? 1.f : 0.f;
  epilogue.load_c = args.accumulate ? 1 : 0;
  epilogue.defer_stores = 0;
  epilogue.alpha_tensor = nullptr;

  // NOTE: no stream-K (no workspace, and the plan says so): the FP8 consumer reads the scales of
  // k-blocks in the order k_begin, k_begin + 1, ..., which a stream-K piece's rotated loads
  // would not follow.
  sm90::GemmPlan plan;
  plan.stream_k = sm90::StreamKMode::off;
  plan.defer_stores = false;
  Kernel::run(mainloop, problem, epilogue, plan, TensorView{}, stream);
}

template <Fp8BScaling kBScaling> void run_for_output(const Fp8GemmArgs& args, Stream stream) {
  if (args.d.dtype == DType::f32)
    run<kBScaling, float>(args, stream);
  else
    run<kBScaling, bf16>(args, stream);
}

} // namespace

void gemm_fp8(const Fp8GemmArgs& args, Stream stream) {
  require_device("FP8 GEMM");
  // Rows and columns are 32-bit in the kernel (tile rows, the scale rows it reads).
  constexpr int64_t kLargest = INT32_MAX - fp8::Config<bf16>::kTileM * fp8::Config<bf16>::kClusterM;
  if (args.m() > kLargest || args.n() > kLargest)
    throw Error(Status::not_supported,
                "gemm_fp8: the GPU kernel takes M and N < 2^31 - 256; got M " +
                    std::to_string(args.m()) + ", N " + std::to_string(args.n()));
  if (args.b_scaling == Fp8BScaling::rows)
    run_for_output<Fp8BScaling::rows>(args, stream);
  else
    run_for_output<Fp8BScaling::blocks>(args, stream);
}

} // namespace coda::gpu
