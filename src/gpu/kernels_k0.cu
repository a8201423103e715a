// K0 gemm_residual_rms: x = a · wᵀ + residual (fp32); out = round(x), sumsq_partials = row
// partials of x² from the unrounded x, out_scaled = round(x * gamma[n]). The op chain of the CPU
// backend (src/cpu/forward_kernels.cpp), on the device.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T>
using ResidualRmsEpilogue =
    dev::FusedEpilogue<Shape, dev::ResidualAdd<Shape, T>, dev::TileStore<Shape, T>,
                       dev::ReduceOverN<Shape, epilogue::SumOfSquares>, dev::ScalePerCol<Shape, T>,
                       dev::TileStore<Shape, T>>;

template <class Shape, class T> void run_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  using Epi = ResidualRmsEpilogue<Shape, T>;
  const int64_t n = args.w.shape[0];
  typename Epi::Params p{};
  dev::get<0>(p) = dev::ResidualAdd<Shape, T>::params(args.residual, 1.f);
  dev::get<1>(p) = dev::TileStore<Shape, T>::params("out", args.out);
  dev::get<2>(p) = row_partials_params<Shape, epilogue::SumOfSquares>(args.sumsq_partials, n);
  dev::get<3>(p) = {args.gamma.ptr<const T>(), int32_t(n)};
  dev::get<4>(p) = dev::TileStore<Shape, T>::params("out_scaled", args.out_scaled);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

// The staged_wide schedule (gemm/config.hpp): the consumers round the accumulators to T and hand
// the 128 x 256 tile over; three warps of the producer warpgroup add the residual (so x =
// round(a · wᵀ) + residual, as an unfused GEMM followed by the add computes it), store out in
// place, fold the sums of squares and store out_scaled, under the next tile's MMAs. Each warp
// moves its own 16-row strips by TMA (ops/strip_io.cuh): the residual through a ring of 3 strips
// per warp, out_scaled through 2 strip buffers per warp, beside the 64 KB staged tile and 3
// stages. (Global loads and stores from registers instead ran K0 at 1.2-3.4x the plain GEMM.)
template <class T>
using StagedResidualRmsEpilogue =
    dev::FusedEpilogue<dev::StagedWideShape, dev::Stage<T>,
                       dev::ResidualAddStrips<dev::StagedWideShape, T>,
                       dev::TileStore<dev::StagedWideShape, T, false, /*in_place=*/true>,
                       dev::ReduceOverN<dev::StagedWideShape, epilogue::SumOfSquares>,
                       dev::ScalePerColGlobal<dev::StagedWideShape, T>,
                       dev::StripStore<dev::StagedWideShape, T>>;
static_assert(StagedResidualRmsEpilogue<bf16>::kWarpLocal, "the staged_wide epilogue is warp-local");
static_assert(dev::FusedGemm<StagedResidualRmsEpilogue<bf16>, bf16>::Config::kStages == 3,
              "the staged_wide K0's strip buffers leave room for 3 pipeline stages");

template <class T> void run_residual_rms_staged(const ResidualRmsArgs& args, Stream stream) {
  using S = dev::StagedWideShape;
  using Epi = StagedResidualRmsEpilogue<T>;
  const int64_t n = args.w.shape[0];
  typename Epi::Params p{};
  dev::get<1>(p) = dev::ResidualAddStrips<S, T>::params(args.residual, 1.f);
  dev::get<2>(p) = dev::TileStore<S, T, false, true>::params("out", args.out);
  dev::get<3>(p) = row_partials_params<S, epilogue::SumOfSquares>(args.sumsq_partials, n);
  dev::get<4>(p) = dev::ScalePerColGlobal<S, T>::params(args.gamma);
  dev::get<5>(p) = dev::StripStore<S, T>::params("out_scaled", args.out_scaled);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  fused::require_device("gemm_residual_rms");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    if (fused::schedule_for(FusedSchedule::cooperative) == FusedSchedule::staged_wide)
      return fused::run_residual_rms_staged<decltype(t)>(args, stream);
    fused::with_schedule<false>(FusedSchedule::cooperative, [&](auto shape) {
      fused::run_residual_rms<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
