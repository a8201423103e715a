// K6 gemm_rms_backward: the RMSNorm backward in the input-gradient GEMM's epilogue (dgrad
// layout: acc = dz · w, w [K, N]). The op chain of the CPU backend (src/cpu/backward_kernels.cpp),
// on the device:
//   g = alpha * acc                                   ScaleByScalar (alpha a value or value * [1])
//   dx = rstd (g gamma - xh zeta), h_hat = xh gamma   RmsNormBackward (x by TMA, h_hat stored)
//   dgamma_partials = column partials of g xh         ReduceOverM<Sum> on its aux (AuxReduce)
//   dx (+)= ...                                       ResidualAdd(dx, 1) when accumulating
//   dx                                                TileStore
// The dx tile is read once (its subtile loaded before the subtile's store is issued) and rounded
// once, as the CPU backend's Accumulate + TileStore.
//
// By default the cooperative 128 x 256 schedule: a tile's 128 rows are exactly one dgamma
// reduction block, reduced across both warpgroups (ReduceOverM). Shared memory (bf16 and f16
// alike): with accumulate, x and dx rings of 2 slots, 3 pipeline stages; without, an x ring of 4
// slots, 3 stages (static_asserts below).
// Forced to FusedSchedule::staged (set_fused_schedule), it runs on the staged_wide schedule: the
// consumers round g = alpha acc to T and hand the 128 x 256 tile over; three warps of the
// producer warpgroup run the norm backward on 16-row strips (RmsNormBackwardStrips) under the
// next tile's MMAs, dx stored in place from the staged tile. Its numbers differ from the
// cooperative ones by that rounding of g (an unfused dgrad GEMM stores g so).
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

using Shape = dev::CooperativeShape;

template <class T, int kXSlots>
using RmsNormGrad =
    dev::AuxReduce<dev::RmsNormBackward<Shape, T, kXSlots>, dev::ReduceOverM<Shape, epilogue::Sum>>;

template <class T>
using OverwriteEpilogue =
    dev::FusedEpilogue<Shape, dev::ScaleByScalar, RmsNormGrad<T, 4>, dev::TileStore<Shape, T>>;
template <class T>
using AccumulateEpilogue =
    dev::FusedEpilogue<Shape, dev::ScaleByScalar, RmsNormGrad<T, 2>, dev::ResidualAdd<Shape, T, 2>,
                       dev::TileStore<Shape, T>>;

template <class Epi, class T> using Gemm = dev::FusedGemm<Epi, T, GemmLayout::dgrad>;
static_assert(Gemm<OverwriteEpilogue<bf16>, bf16>::Config::kStages == 3 &&
                  Gemm<AccumulateEpilogue<bf16>, bf16>::Config::kStages == 3,
              "K6's epilogue buffers leave room for 3 pipeline stages (see the file comment)");

// Column partials [N, ceil(M / kReduceBlock)] of an [M, N] output.
dev::ReduceOverM<Shape, epilogue::Sum>::Params col_partials_params(const TensorView& partials,
                                                                   int64_t rows) {
  dev::ReduceOverM<Shape, epilogue::Sum>::Params p;
  p.partials = partials.ptr<float>();
  p.stride = partials.stride[0];
  p.rows = int32_t(rows);
  p.cols = int32_t(partials.shape[0]);
  p.blocks = int32_t(partials.shape[1]);
  return p;
}

template <class T, int kXSlots, class Params>
void set_common(Params& p, const RmsBackwardArgs& args) {
  dev::get<0>(p) = dev::ScaleByScalar::params(args.alpha);
  auto& norm = dev::get<1>(p);
  norm.op = dev::RmsNormBackward<Shape, T, kXSlots>::params(args.x, args.gamma, args.rstd,
                                                            args.zeta, args.h_hat);
  norm.reduce = col_partials_params(args.dgamma_partials, args.dz.shape[0]);
}

template <class T> void run_rms_backward(const RmsBackwardArgs& args, Stream stream) {
  if (args.accumulate) {
    using Epi = AccumulateEpilogue<T>;
    typename Epi::Params p{};
    set_common<T, 2>(p, args);
    dev::get<2>(p) = dev::ResidualAdd<Shape, T, 2>::params(args.dx, 1.f);
    dev::get<3>(p) = dev::TileStore<Shape, T>::params("dx", args.dx);
    Gemm<Epi, T>::run(args.dz, args.w, p, stream);
  } else {
    using Epi = OverwriteEpilogue<T>;
    typename Epi::Params p{};
    set_common<T, 4>(p, args);
    dev::get<2>(p) = dev::TileStore<Shape, T>::params("dx", args.dx);
    Gemm<Epi, T>::run(args.dz, args.w, p, stream);
  }
}

// The staged_wide variant (see the file comment).
template <class T, bool kAccumulate>
using StagedWideEpilogue =
    dev::FusedEpilogue<dev::StagedWideShape, dev::ScaleByScalar, dev::Stage<T>,
                       dev::RmsNormBackwardStrips<dev::StagedWideShape, T, kAccumulate>,
                       MainStore<dev::StagedWideShape, T>>;
static_assert(StagedWideEpilogue<bf16, true>::kWarpLocal, "the staged_wide epilogue is warp-local");
static_assert(Gemm<StagedWideEpilogue<bf16, true>, bf16>::Config::kStages == 3 &&
                  Gemm<StagedWideEpilogue<bf16, false>, bf16>::Config::kStages == 3,
              "K6's strip buffers leave room for the staged_wide schedule's 3 stages");

template <class T, bool kAccumulate>
void run_rms_backward_staged_wide(const RmsBackwardArgs& args, Stream stream) {
  using S = dev::StagedWideShape;
  using Epi = StagedWideEpilogue<T, kAccumulate>;
  typename Epi::Params p{};
  dev::get<0>(p) = dev::ScaleByScalar::params(args.alpha);
  dev::get<2>(p) = dev::RmsNormBackwardStrips<S, T, kAccumulate>::params(
      args.x, args.dx, args.gamma, args.rstd, args.zeta, args.h_hat, args.dgamma_partials);
  dev::get<3>(p) = MainStore<S, T>::params("dx", args.dx);
  Gemm<Epi, T>::run(args.dz, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_rms_backward(const RmsBackwardArgs& args, Stream stream) {
  fused::require_device("gemm_rms_backward");
  const bool staged_wide = fused::schedule_for(FusedSchedule::cooperative) == FusedSchedule::staged;
  fused::with_half_type(args.dz.dtype, [&](auto t) {
    using T = decltype(t);
    if (!staged_wide) return fused::run_rms_backward<T>(args, stream);
    if (args.accumulate) return fused::run_rms_backward_staged_wide<T, true>(args, stream);
    fused::run_rms_backward_staged_wide<T, false>(args, stream);
  });
}

} // namespace coda::gpu
