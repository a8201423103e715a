// K6 gemm_rms_backward: the RMSNorm backward in the input-gradient GEMM's epilogue (dgrad
// layout: acc = dz · w, w [K, N]). The op chain of the CPU backend (src/cpu/backward_kernels.cpp),
// on the device:
//   g = alpha * acc                                   ScaleByScalar (alpha a value or value *
//                                                     [1]); on staged_wide (from K =
//                                                     kRmsBackwardRoundedGradientMinK) rounded
//                                                     to T at the hand-over, Stage<T>
//   dx = rstd (g gamma - xh zeta), h_hat = xh gamma   RmsNormBackward (x by TMA, h_hat stored)
//   dgamma_partials = column partials of g xh         ReduceOverM<Sum> on its aux (AuxReduce)
//   dx (+)= ...                                       ResidualAdd(dx, 1) when accumulating
//   dx                                                TileStore
// The dx tile is read once (its subtile loaded before the subtile's store is issued) and rounded
// once, as the CPU backend's Accumulate + TileStore.
//
// Two schedules, both on the 128 x 256 tile, whose 128 rows are one dgamma reduction block:
//  - cooperative (K < kRmsBackwardRoundedGradientMinK, args.hpp): the epilogue in the MMA
//    warpgroups on the fp32 g, reduced across both (ReduceOverM). Shared memory (bf16 and f16
//    alike): with accumulate, x and dx rings of 2 slots, 3 pipeline stages; without, an x ring
//    of 4 slots, 3 stages;
//  - staged_wide (from that K): the consumers round g to T and hand the tile over; three warps
//    of the producer warpgroup run the norm backward on 16-row strip-subtiles
//    (RmsNormBackwardStrips) under the next tile's MMAs, dx stored in place from the staged
//    tile. Below K = 3072 (not measured there) its three warps would outlast the mainloop
//    (docs/epilogue.md, "K6 on the staged_wide schedule").
// set_fused_schedule forces either (staged: staged_wide); a forced schedule keeps its own
// rounding of g (the CPU backend follows the default's), so forcing is for tests and benchmarks.
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

template <class T, bool kAccumulate>
using StagedWideEpilogue =
    dev::FusedEpilogue<dev::StagedWideShape, dev::ScaleByScalar, dev::Stage<T>,
                       dev::RmsNormBackwardStrips<dev::StagedWideShape, T, kAccumulate>,
                       MainStore<dev::StagedWideShape, T>>;

template <class Epi, class T> using Gemm = dev::FusedGemm<Epi, T, GemmLayout::dgrad>;
static_assert(Gemm<OverwriteEpilogue<bf16>, bf16>::Config::kStages == 3 &&
                  Gemm<AccumulateEpilogue<bf16>, bf16>::Config::kStages == 3,
              "K6's epilogue buffers leave room for 3 pipeline stages (see the file comment)");
static_assert(StagedWideEpilogue<bf16, true>::kWarpLocal, "the staged_wide epilogue is warp-local");
static_assert(Gemm<StagedWideEpilogue<bf16, true>, bf16>::Config::kStages == 3 &&
                  Gemm<StagedWideEpilogue<bf16, false>, bf16>::Config::kStages == 3,
              "K6's strip buffers leave room for the staged_wide schedule's 3 stages");

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

template <class T> void run_cooperative(const RmsBackwardArgs& args, Stream stream) {
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

template <class T, bool kAccumulate>
void run_staged_wide(const RmsBackwardArgs& args, Stream stream) {
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
  const FusedSchedule by_k = args.dz.shape[1] >= kRmsBackwardRoundedGradientMinK
                                 ? FusedSchedule::staged
                                 : FusedSchedule::cooperative;
  const bool staged_wide = fused::schedule_for(by_k) == FusedSchedule::staged;
  fused::with_half_type(args.dz.dtype, [&](auto t) {
    using T = decltype(t);
    if (!staged_wide) return fused::run_cooperative<T>(args, stream);
    if (args.accumulate) return fused::run_staged_wide<T, true>(args, stream);
    fused::run_staged_wide<T, false>(args, stream);
  });
}

} // namespace coda::gpu
