// K2 gemm_rms_swiglu: z = rstd[m] * (a · wᵀ) on the fused interleaved gate/up weight;
// preact = round(z), act[m, j] = round(silu(z[m, 2j]) * z[m, 2j + 1]) from the fp32 z.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T>
using RmsSwigluEpilogue =
    dev::FusedEpilogue<Shape, dev::ScalePerRow<Shape>, dev::TileStore<Shape, T>,
                       dev::GatedPairStore<Shape, T, dev::SwigluGate>>;

template <class Shape, class T> void run_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  using Epi = RmsSwigluEpilogue<Shape, T>;
  typename Epi::Params p{};
  dev::get<0>(p) =
      rstd_params<Shape>(args.sumsq_partials, args.a.shape[1], args.eps, args.rstd_out);
  dev::get<1>(p) = dev::TileStore<Shape, T>::params("preact", args.preact);
  dev::get<2>(p) = dev::GatedPairStore<Shape, T, dev::SwigluGate>::params("act", args.act);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  fused::require_device("gemm_rms_swiglu");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule(FusedSchedule::cooperative, [&](auto shape) {
      fused::run_rms_swiglu<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
