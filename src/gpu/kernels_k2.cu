// K2 gemm_rms_swiglu: z = round(rstd[m] * (a · wᵀ)) on the fused interleaved gate/up weight;
// preact = z, act[m, j] = round(silu(z[m, 2j]) * z[m, 2j + 1]) from z as stored.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

// kStaged rstd partials staged per row on the cooperative schedule: 32 fit every hidden size up
// to 4096 (one partial per 128 columns), but their 16 KB leave the cooperative kernel 3 pipeline
// stages; with 16 (hidden up to 2048, e.g. Llama-1B) the 8 KB saved buy a fourth
// (docs/epilogue.md). Rows with more partials than staged would read them from global memory
// after the mainloop, so the launch takes the variant that stages them all. On the staged
// schedule the consumers hold them in registers instead (dev::kPartialsInRegisters): 4 stages.
template <class Shape, class T, int kStaged>
void run_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  using Scale = dev::ScalePerRow<BeforeStage<Shape>, dev::Pass::subtile, kStaged>;
  using Epi = dev::FusedEpilogue<Shape, Scale, dev::Stage<T>, MainStore<Shape, T>,
                                 dev::GatedPairStore<Shape, T, dev::SwigluGate>>;
  typename Epi::Params p{};
  dev::get<0>(p) =
      rstd_params<Scale>(args.sumsq_partials, args.a.shape[1], args.eps, args.rstd_out);
  dev::get<2>(p) = MainStore<Shape, T>::params("preact", args.preact);
  dev::get<3>(p) = dev::GatedPairStore<Shape, T, dev::SwigluGate>::params("act", args.act);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  fused::require_device("gemm_rms_swiglu");
  const bool few_partials = args.sumsq_partials.shape[1] <= 16;
  fused::with_half_type(args.a.dtype, [&](auto t) {
    // Staged (4 stages with the partials in registers; with them in shared memory at the
    // Llama-8B width, 3 stages measured 1.31x the plain GEMM against the cooperative 1.15x).
    fused::with_schedule<true>(FusedSchedule::staged, [&](auto shape) {
      using Shape = decltype(shape);
      using T = decltype(t);
      if constexpr (Shape::kStaged)
        fused::run_rms_swiglu<Shape, T, fused::dev::kPartialsInRegisters>(args, stream);
      else if (few_partials)
        fused::run_rms_swiglu<Shape, T, 16>(args, stream);
      else
        fused::run_rms_swiglu<Shape, T, 32>(args, stream);
    });
  });
}

} // namespace coda::gpu
