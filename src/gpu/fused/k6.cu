// K6 gemm_rms_backward: the RMSNorm backward in the input-gradient GEMM's epilogue (dgrad
// layout: acc = dz · w, w [K, N]). Its op list (coda/kernels/op_lists.hpp, the CPU backend's
// too) on the device ops:
//   g = alpha * acc                                   ScaleByScalar (alpha a value or value *
//                                                     [1]); on the staged schedules (from K =
//                                                     kRmsBackwardRoundedGradientMinK) rounded
//                                                     to T at the hand-over, Stage<T>
//   dx = rstd (g gamma - xh zeta), h_hat = xh gamma   RmsNormBackward (x by TMA, h_hat stored)
//   dgamma_partials = column partials of g xh         ReduceOverM<Sum> on its aux (AuxReduce)
//   dx (+)= ...                                       ResidualAdd(dx, 1) when accumulating
//   dx                                                TileStore
// The dx tile is read once (its subtile loaded before the subtile's store is issued) and rounded
// once, as the CPU backend's ResidualAdd + TileStore.
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
//
// E4M3 dz and w (docs/fp8.md, "K6 on the staged FP8 tile"): the same two by the same rule of K,
// on the FP8 mainloop's 128 x 128 tiles (gemm_fp8's forward form, w the weight's transposed
// codes), whose 128 rows are one dgamma block too:
//  - cooperative (Fp8Shape): the cooperative list, each consumer warpgroup its 64 x 128, g fp32;
//  - staged (Fp8StagedShape, from kRmsBackwardRoundedGradientMinK, the 16-bit kernel's
//    threshold: at K = 3072 it measured 1.26x gemm_fp8 against the cooperative tile's 1.58x,
//    H100, 2026-12-07; below it not compared): the consumers scale by alpha and round g to T at the
//    hand-over, and the epilogue warpgroup's four warps run RmsNormBackwardStrips warp-local,
//    each on its own 16 rows of every subtile. Its strip buffers (20 KB with accumulate, 12 KB
//    without) leave 5 pipeline stages of 32 KB beside the 32 KB staged tile (K7's 6). Registers:
//    the split of the staged FP8 tile with consumer ops (ScaleByScalar): 32 for the producer
//    warpgroup (the TMA thread and the two scale warps), 192 for the consumers and 96 for the
//    epilogue warpgroup, 0 spills (ptxas, sm_90a, 2026-12-07).
// set_fused_schedule forces either here too (staged: Fp8StagedShape), with its own rounding.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

using Shape = dev::CooperativeShape;

// K6's device ops on the cooperative schedule (S: its 128 x 256 tile, or the FP8 mainloop's
// 128 x 128): an x ring of 4 slots, or with the dx ring of an accumulating call, both of 2 (see
// the file comment).
template <class T, bool kAccumulate, class S = Shape> struct CooperativeOps : DeviceOps<S, T> {
  static constexpr int kSlots = kAccumulate ? 2 : 4;
  using RmsNormBackward = dev::RmsNormBackward<S, T, kSlots>;
  using ResidualAdd = dev::ResidualAdd<S, T, kSlots>;
};
template <class T, bool kAccumulate, class S = Shape>
using CooperativeEpilogue =
    kernels::RmsBackwardOps<CooperativeOps<T, kAccumulate, S>, /*rounded=*/false, kAccumulate>;

// The rounded list (kernels::RmsBackwardOps<F, true, kAccumulate>) on a staged tile is the GPU's
// own: on staged_wide three warps take the staged tile's 16-row strips in turn, on the staged FP8
// tile four warps each take their own rows, so the ops after the Stage must be warp-local
// (driver.cuh, kStrips and kWarpLocal), and the list's AuxReduce<RmsNormBackward, ReduceOverM> is
// not (its x ring and its column sums are the warpgroup's, in shared memory).
// RmsNormBackwardStrips is that pair and (kAccumulate) the ResidualAdd of dx in one warp-local
// op, and dx is stored in place from the staged tile: the list's numbers.
template <class S, class T, bool kAccumulate>
using StagedEpilogue =
    dev::FusedEpilogue<S, dev::ScaleByScalar, dev::Stage<T>,
                       dev::RmsNormBackwardStrips<S, T, kAccumulate>, MainStore<S, T>>;
template <class T, bool kAccumulate>
using StagedWideEpilogue = StagedEpilogue<dev::StagedWideShape, T, kAccumulate>;
template <class T, bool kAccumulate>
using Fp8StagedEpilogue = StagedEpilogue<dev::Fp8StagedShape, T, kAccumulate>;

template <class Epi, class T> using Gemm = dev::FusedGemm<Epi, T, GemmLayout::dgrad>;
static_assert(Gemm<CooperativeEpilogue<bf16, false>, bf16>::Config::kStages == 3 &&
                  Gemm<CooperativeEpilogue<bf16, true>, bf16>::Config::kStages == 3,
              "K6's epilogue buffers leave room for 3 pipeline stages (see the file comment)");
static_assert(StagedWideEpilogue<bf16, true>::kWarpLocal, "the staged_wide epilogue is warp-local");
static_assert(Gemm<StagedWideEpilogue<bf16, true>, bf16>::Config::kStages == 3 &&
                  Gemm<StagedWideEpilogue<bf16, false>, bf16>::Config::kStages == 3,
              "K6's strip buffers leave room for the staged_wide schedule's 3 stages");
static_assert(Fp8StagedEpilogue<bf16, true>::kWarpLocal &&
                  Fp8StagedEpilogue<f16, false>::kWarpLocal,
              "the staged FP8 epilogue runs warp-local, each warp on its own rows");
template <class T, bool kAccumulate>
using Fp8StagedGemm = dev::FusedGemm<Fp8StagedEpilogue<T, kAccumulate>, e4m3>;
static_assert(Fp8StagedGemm<bf16, true>::Config::kStages == 5 &&
                  Fp8StagedGemm<bf16, false>::Config::kStages == 5 &&
                  Fp8StagedGemm<f16, true>::Config::kStages == 5 &&
                  Fp8StagedGemm<f16, false>::Config::kStages == 5,
              "K6's strip buffers on the staged FP8 tile leave room for 5 pipeline stages (see the "
              "file comment)");

// Column partials [N, ceil(M / kReduceBlock)] of an [M, N] output.
template <class S = Shape>
typename dev::ReduceOverM<S, epilogue::Sum>::Params col_partials_params(const TensorView& partials,
                                                                        int64_t rows) {
  typename dev::ReduceOverM<S, epilogue::Sum>::Params p;
  p.partials = partials.ptr<float>();
  p.stride = partials.stride[0];
  p.rows = int32_t(rows);
  p.cols = int32_t(partials.shape[0]);
  p.blocks = int32_t(partials.shape[1]);
  return p;
}

// The cooperative list on S's tile with Operand dz and w: T on the 128 x 256 tile in the dgrad
// layout, or e4m3 (w the weight's transposed codes, RmsBackwardArgs) on the FP8 mainloop's
// 128 x 128 tile (Fp8Shape: its 128 rows one dgamma reduction block) in the forward form, g fp32
// either way.
template <class T, bool kAccumulate, class S = Shape, class Operand = T>
void run_cooperative(const RmsBackwardArgs& args, Stream stream) {
  using Ops = CooperativeOps<T, kAccumulate, S>;
  constexpr GemmLayout kLayout =
      std::is_same_v<Operand, e4m3> ? GemmLayout::fwd : GemmLayout::dgrad;
  using L = Launch<CooperativeEpilogue<T, kAccumulate, S>, Operand, kLayout>;
  const auto alpha = Ops::ScaleByScalar::params(args.alpha);
  const auto norm =
      Ops::RmsNormBackward::params(args.x, args.gamma, args.rstd, args.zeta, args.h_hat);
  const auto dgamma = col_partials_params<S>(args.dgamma_partials, args.dz.shape[0]);
  const auto dx = Ops::TileStore::params("dx", args.dx);
  if constexpr (kAccumulate)
    L::run_operands(args.dz, args.dz_scales, args.w, args.w_scales, stream, alpha, {norm, dgamma},
                    Ops::ResidualAdd::params(args.dx, 1.f), dx);
  else
    L::run_operands(args.dz, args.dz_scales, args.w, args.w_scales, stream, alpha, {norm, dgamma},
                    dx);
}

// The staged list on S's tile with Operand dz and w: T on staged_wide's 128 x 256 tile in the
// dgrad layout, or e4m3 on the staged FP8 128 x 128 tile (Fp8StagedShape) in the forward form; g
// rounded to T at the hand-over either way.
template <class S, class T, bool kAccumulate, class Operand = T>
void run_staged(const RmsBackwardArgs& args, Stream stream) {
  constexpr GemmLayout kLayout =
      std::is_same_v<Operand, e4m3> ? GemmLayout::fwd : GemmLayout::dgrad;
  Launch<StagedEpilogue<S, T, kAccumulate>, Operand, kLayout>::run_operands(
      args.dz, args.dz_scales, args.w, args.w_scales, stream,
      dev::ScaleByScalar::params(args.alpha), {},
      dev::RmsNormBackwardStrips<S, T, kAccumulate>::params(
          args.x, args.dx, args.gamma, args.rstd, args.zeta, args.h_hat, args.dgamma_partials),
      MainStore<S, T>::params("dx", args.dx));
}

} // namespace
} // namespace fused

void gemm_rms_backward(const RmsBackwardArgs& args, Stream stream) {
  fused::require_device("gemm_rms_backward");
  // Staged (g rounded) from K = kRmsBackwardRoundedGradientMinK on either operand type (on E4M3
  // operands the 16-bit kernel's threshold: see the file comment), cooperative below; the CPU
  // backend rounds g by the same rule.
  const FusedSchedule by_k = fused::default_schedule(
      sm90::FusedKernel::k6, 0, args.dz.shape[1] >= kRmsBackwardRoundedGradientMinK);
  const bool staged = fused::schedule_for(by_k) == FusedSchedule::staged;
  if (args.dz.dtype == DType::e4m3)
    return fused::with_half_type(args.dx.dtype, [&](auto t) {
      using T = decltype(t);
      using fused::dev::Fp8Shape, fused::dev::Fp8StagedShape;
      if (staged && args.accumulate)
        return fused::run_staged<Fp8StagedShape, T, true, e4m3>(args, stream);
      if (staged) return fused::run_staged<Fp8StagedShape, T, false, e4m3>(args, stream);
      if (args.accumulate) return fused::run_cooperative<T, true, Fp8Shape, e4m3>(args, stream);
      fused::run_cooperative<T, false, Fp8Shape, e4m3>(args, stream);
    });
  fused::with_half_type(args.dz.dtype, [&](auto t) {
    using T = decltype(t);
    using fused::dev::StagedWideShape;
    if (staged && args.accumulate) return fused::run_staged<StagedWideShape, T, true>(args, stream);
    if (staged) return fused::run_staged<StagedWideShape, T, false>(args, stream);
    if (args.accumulate) return fused::run_cooperative<T, true>(args, stream);
    fused::run_cooperative<T, false>(args, stream);
  });
}

} // namespace coda::gpu
