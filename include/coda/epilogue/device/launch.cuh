// Host side of a fused GEMM: D-shaped outputs of the accumulator produced by a FusedEpilogue, on
// the persistent warp-specialized GEMM kernel (coda/gemm/kernel.cuh), in one of two layouts:
//   GemmLayout::fwd   acc = a · wᵀ   a [M, K], w [N, K] as nn.Linear stores it (the forward);
//   GemmLayout::dgrad acc = a · w    a [M, K], w [K, N] (an input gradient: B is N-contiguous,
//                                    loaded in 64 x 64 boxes, the mainloop's MN-major path).
// The epilogue's TileShape picks the configuration:
//   CooperativeShape (64 x 256 per consumer warpgroup): 128 x 256 tiles, both warpgroups on one
//     tile. The plain GEMM's workhorse; the epilogue runs while the tensor cores wait.
//   PingpongShape (128 x 128 per warpgroup): 128 x 128 tiles, the warpgroups on alternate tiles,
//     so one's epilogue runs while the other's MMAs do (for heavy epilogues).
//   StagedWideShape (128 x 256, read by three warps of the producer warpgroup): the staged_wide
//     schedule (gemm/config.hpp): the cooperative tile's m64n256 MMAs, 3 stages beside the
//     64 KB staged tile; warp-local op lists only (driver.cuh, kStrips). K6 from K = 3072.
//   Fp8Shape (64 x 128 per consumer warpgroup): cooperative 128 x 128 tiles for E4M3 operands,
//     the FP8 mainloop's only tile (coda/gemm/fp8_mainloop.cuh: the partial and the promoted sum
//     in the consumers' registers, one B scale block per tile); FusedGemm::run_fp8 takes the
//     operands' block scales (docs/fp8.md, "The FP8 block").
//   Fp8StagedShape (128 x 128, read by the epilogue warpgroup): the staged schedule on the FP8
//     mainloop (one partial, as MainloopFor's): the consumers hand their 64 x 128 over as 16
//     bits and start the next tile, the ops after the Stage run in the fourth warpgroup. The
//     default of the fused kernels that have a staged list (src/gpu/fused/common.cuh,
//     with_fp8_rstd_variant, with_fp8_schedule; K6 from K = 3072, src/gpu/fused/k6.cu).
//   StagedShape (128 x 192, read by the epilogue warpgroup): the staged schedule; the op list
//     is cut at its Stage<T> op (driver.cuh). 192 columns: with 4 warpgroups a 256-wide tile
//     needs two 128-wide wgmmas per block, measured 6.5% slower than 192 (gemm-worklog step 9).
// All use clusters of 2 along M sharing B and as many pipeline stages (up to the plain GEMM's 4
// and 6) as fit beside the epilogue's shared memory. The mainloop and the launch
// (sm90::GemmKernel) are the plain GEMM's.
#pragma once

#include <algorithm>
#include <type_traits>

#include <cuda_runtime.h>

#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/gemm/config.hpp"
#include "coda/gemm/fp8_mainloop.cuh"
#include "coda/gemm/kernel.cuh"
#include "coda/gemm/launch.cuh"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/tensor_map.hpp"

namespace coda::epilogue::device {

using CooperativeShape = TileShape<2, 64, 256>;
using PingpongShape = TileShape<2, 128, 128>;
using StagedShape = TileShape<1, 128, 192, /*staged=*/true>;
using StagedWideShape = TileShape<1, 128, 256, /*staged=*/true, /*epilogue warps=*/3>;
using Fp8Shape = TileShape<2, 64, 128>;
using Fp8StagedShape = TileShape<1, 128, 128, /*staged=*/true>;
using FusedShape = CooperativeShape; // the default

// Each shape's GEMM schedule and the most pipeline stages it may take.
template <sm90::Schedule kSchedule_, int kMaxStages_> struct ScheduleTraits {
  static constexpr sm90::Schedule kSchedule = kSchedule_;
  static constexpr int kMaxStages = kMaxStages_;
};
template <class Shape> struct ScheduleOf;
template <> struct ScheduleOf<CooperativeShape> : ScheduleTraits<sm90::Schedule::cooperative, 4> {};
template <> struct ScheduleOf<PingpongShape> : ScheduleTraits<sm90::Schedule::pingpong, 6> {};
template <> struct ScheduleOf<StagedShape> : ScheduleTraits<sm90::Schedule::staged, 4> {};
template <> struct ScheduleOf<StagedWideShape> : ScheduleTraits<sm90::Schedule::staged_wide, 3> {};
template <> struct ScheduleOf<Fp8Shape> : ScheduleTraits<sm90::Schedule::cooperative, 6> {};
template <> struct ScheduleOf<Fp8StagedShape> : ScheduleTraits<sm90::Schedule::staged, 6> {};

// (One FP8 partial: the fused kernels' FP8 mainloop, MainloopFor. Epi's kConsumersRunOps: whether
// its consumers run ops before a Stage, which sets the staged FP8 register split.)
template <class Epi, int kStages, int kOperandBytes = 2>
using FusedConfig = sm90::GemmConfig<128, Epi::TileShape::kCols, kStages, 2,
                                     ScheduleOf<typename Epi::TileShape>::kSchedule, kOperandBytes,
                                     /*kFp8Partials=*/1, Epi::kConsumersRunOps>;

// Dynamic shared memory of the kernel with kStages pipeline stages.
template <class Epi, class InT, int kStages, GemmLayout kLayout = GemmLayout::fwd>
constexpr size_t fused_shared_bytes() {
  using Config = FusedConfig<Epi, kStages, int(sizeof(InT))>;
  using Main = sm90::MainloopFor<Config, kLayout, InT>;
  return sizeof(sm90::KernelSharedStorage<Main, Epi>); // as sm90::GemmKernel's
}

// As many stages as fit beside the epilogue's shared memory, at most kStages.
template <class Epi, class InT, GemmLayout kLayout = GemmLayout::fwd,
          int kStages = ScheduleOf<typename Epi::TileShape>::kMaxStages>
constexpr int fused_stages() {
  if constexpr (kStages <= 2)
    return 2;
  else if constexpr (fused_shared_bytes<Epi, InT, kStages, kLayout>() <= sm90::kMaxSharedBytes)
    return kStages;
  else
    return fused_stages<Epi, InT, kLayout, kStages - 1>();
}

template <class Epi, class InT, GemmLayout kLayout = GemmLayout::fwd> struct FusedGemm {
  static_assert(kLayout == GemmLayout::fwd || kLayout == GemmLayout::dgrad,
                "fused epilogues run on the forward and input-gradient layouts");
  using Shape = typename Epi::TileShape;
  using Config = FusedConfig<Epi, fused_stages<Epi, InT, kLayout>(), int(sizeof(InT))>;
  using Kernel = sm90::GemmKernel<Config, kLayout, InT, Epi>;
  static constexpr bool kFp8 = std::is_same_v<InT, e4m3>;
  static_assert(!kFp8 || ((std::is_same_v<Shape, Fp8Shape> ||
                           std::is_same_v<Shape, Fp8StagedShape>)&&kLayout == GemmLayout::fwd),
                "E4M3 operands run on Fp8Shape or Fp8StagedShape, in the forward layout (both "
                "operands K-major, as the FP8 wgmma reads them)");
  static constexpr size_t kSharedBytes = Kernel::kSharedBytes;
  static_assert(Config::kStaged || Config::kMmaBlocksM == Shape::kBlocks,
                "the epilogue's TileShape is the configuration's warpgroup tile");

  // a [M, K] and w ([N, K] for fwd, [K, N] for dgrad; 16-byte aligned rows); `epilogue` holds
  // the ops' parameters. No stream-K (the fused kernels take no workspace).
  static void run(const TensorView& a, const TensorView& w, const typename Epi::Params& epilogue,
                  cudaStream_t stream) {
    static_assert(!kFp8, "E4M3 operands come with their block scales: run_fp8");
    constexpr bool kDgrad = kLayout == GemmLayout::dgrad;
    const int64_t m = a.shape[0], k = a.shape[1], n = kDgrad ? w.shape[1] : w.shape[0];
    if (m == 0 || n == 0) return;
    if (k == 0) throw Error(Status::not_supported, "the fused GPU GEMMs need K > 0");
    Kernel::run(a, w, {m, n, k}, epilogue, plan_for(m), TensorView{}, stream);
  }

  // E4M3 a [M, K] and w [N, K] with gemm_fp8's block scales (Fp8GemmArgs: a_scales [M,
  // ceil(K/128)], w_scales [ceil(N/128), ceil(K/128)], checked by the caller); the epilogue sees
  // the promoted fp32 accumulator as it sees the 16-bit GEMM's.
  static void run_fp8(const TensorView& a, const TensorView& a_scales, const TensorView& w,
                      const TensorView& w_scales, const typename Epi::Params& epilogue,
                      cudaStream_t stream) {
    static_assert(kFp8, "run_fp8 is the E4M3 operands' entry");
    const int64_t m = a.shape[0], k = a.shape[1], n = w.shape[0];
    if (m == 0 || n == 0) return;
    if (k == 0) throw Error(Status::not_supported, "the fused GPU GEMMs need K > 0");
    typename Kernel::Main::Params mainloop = Kernel::mainloop_params(a, w, {m, n, k});
    Kernel::Main::set_scales(mainloop, a_scales, w_scales, m, n);
    Kernel::run(mainloop, {m, n, k}, epilogue, plan_for(m), TensorView{}, stream);
  }

private:
  // No stream-K (the fused kernels take no workspace; the FP8 consumer reads its scales in
  // k-block order, which a stream-K piece would not follow either).
  static sm90::GemmPlan plan_for(int64_t m) {
    sm90::GemmPlan plan;
    plan.stream_k = sm90::StreamKMode::off;
    plan.group_m = sm90::choose_group_m(
        ceil_div<int64_t>(ceil_div<int64_t>(m, Config::kTileM), Config::kClusterM),
        Kernel::max_active_clusters(), Config::kClusterM * Config::kTileM, Config::kTileN);
    return plan;
  }
};

} // namespace coda::epilogue::device
