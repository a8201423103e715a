// The compile-time shape of one GEMM kernel: CTA tile, pipeline depth, cluster and consumer
// schedule, in one struct whose static_asserts say what each combination requires. Plain C++
// (no CUDA), so the heuristic that picks a config is tested on the CPU.
#pragma once

#include <cstdint>

#include "coda/gemm/problem.hpp"

namespace coda::sm90 {

// How the two consumer warpgroups share work, and where the epilogue runs.
//   cooperative: both work on one tile, each owning half of its rows (tile M split in two), and
//                run the epilogue on their accumulators while the tensor cores wait;
//   pingpong:    each owns whole tiles, alternating, so one's epilogue overlaps the other's MMAs;
//   staged:      cooperative MMAs, but the consumers only round their accumulators to 16 bits
//                into a shared-memory tile (the stage) and start the next tile at once; a fourth
//                warpgroup runs the epilogue from the stage while the next tile's MMAs run
//                (docs/epilogue.md, "The staged schedule");
//   staged_wide: the staged hand-over on the cooperative 128 x 256 tile (m64n256 wgmmas, which
//                a fourth warpgroup's 128 registers per thread cannot compile): three warps of
//                the producer warpgroup run the epilogue, beside the one that issues the loads.
enum class Schedule : int { cooperative = 0, pingpong = 1, staged = 2, staged_wide = 3 };

// Which dimension is contiguous in global (and shared) memory for an operand.
enum class Major : int { k = 0, mn = 1 };

// fwd: A [M, K] and B [N, K] are K-major. dgrad: B [K, N] is N-major. wgrad: A [K, M] is
// M-major too. The wgmma transpose bits and the TMA boxes absorb the difference.
constexpr Major a_major(GemmLayout layout) {
  return layout == GemmLayout::wgrad ? Major::mn : Major::k;
}
constexpr Major b_major(GemmLayout layout) {
  return layout == GemmLayout::fwd ? Major::k : Major::mn;
}

// kOperandBytes: the size of an A or B element, 2 (bf16, f16) or 1 (e4m3, the FP8 mainloop).
// kFp8Partials_: the FP8 mainloop's partial sums per consumer thread (fp8_mainloop.cuh): 2 in
// gemm_fp8 (the overlapped promotion), 1 in the fused kernels (MainloopFor); it sets the staged
// FP8 split below and nothing else. kConsumerOps_: whether the consumers run epilogue ops before
// a staged list's Stage (K1, K2, K4: the rstd scale; not K7); it sets the staged FP8 fused split
// and nothing else.
template <int kTileM_, int kTileN_, int kStages_, int kClusterM_, Schedule kSchedule_,
          int kOperandBytes_ = 2, int kFp8Partials_ = 2, bool kConsumerOps_ = true>
struct GemmConfig {
  static constexpr int kTileM = kTileM_; // rows of D per tile
  static constexpr int kTileN = kTileN_; // columns of D per tile
  static constexpr int kOperandBytes = kOperandBytes_;
  // One 128-byte swizzle span deep: 64 16-bit elements, 128 FP8 ones (also the FP8 recipe's
  // scale block, so each k-block has one scale per row of A and per 128 rows of B).
  static constexpr int kTileK = 128 / kOperandBytes;
  static constexpr int kStages = kStages_;     // shared-memory ring depth
  static constexpr int kClusterM = kClusterM_; // CTAs of a cluster, stacked along M, sharing B
  static constexpr Schedule kSchedule = kSchedule_;

  static constexpr bool kStaged =
      kSchedule == Schedule::staged || kSchedule == Schedule::staged_wide;
  // staged_wide: the epilogue runs in warps 1..3 of the producer warpgroup (no fourth one).
  static constexpr bool kEpilogueInProducer = kSchedule == Schedule::staged_wide;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kEpilogueWarpgroups = kSchedule == Schedule::staged ? 1 : 0;
  // Warps that read the staged tile: the staged schedule's fourth warpgroup, or three.
  static constexpr int kEpilogueWarps = kEpilogueInProducer ? 3 : 4 * kEpilogueWarpgroups;
  // Producer warpgroup [0, 128) (one thread issues the loads), consumers [128, 384), and the
  // staged schedule's epilogue warpgroup [384, 512).
  static constexpr int kThreads = (1 + kConsumerWarpgroups + kEpilogueWarpgroups) * 128;
  static constexpr int kEpilogueThread = (1 + kConsumerWarpgroups) * 128;
  // Rows of a tile one consumer warpgroup owns, in 64-row wgmma blocks.
  static constexpr int kWarpgroupTileM = kSchedule == Schedule::pingpong ? kTileM : kTileM / 2;
  static constexpr int kMmaBlocksM = kWarpgroupTileM / 64;
  static constexpr int kAccumulatorsPerThread = kMmaBlocksM * kTileN / 2;
  // The N of one wgmma instruction. With 4 warpgroups the registers at entry are 128 per thread
  // and ptxas needs every instruction to fit them ("Insufficient registers (128) to compile
  // instruction" for a wgmma of 128 accumulators), so the staged schedule issues a 256-wide
  // tile as two 128-wide wgmmas (A read twice from shared memory).
  static constexpr int kWgmmaN = kSchedule == Schedule::staged && kTileN == 256 ? 128 : kTileN;
  // Register split (setmaxnreg; ptxas allocates each role's code within its count). NOTE:
  //  - 128 x 40 + 256 x 232 = 64512: consumers with up to 128 accumulators and the epilogue
  //    beside them (cutlass and fast.cu use the same split);
  //  - 128 x 24 + 256 x 240 = 64512: more than 128 accumulators (QuACK's split from 208 on);
  //  - the FP8 mainloop's partials (fp8_mainloop.cuh) are not counted: its 128 x 192 tile holds
  //    96 accumulators and 96 partial sums, which compile in 232 without spills, while 24 for
  //    the producer (240 for the consumers) spilled 60 bytes (ptxas, sm_90a, 2026-12-05);
  //  - staged: 128 x (32 + 2 x 176 + 128) = 65536. The consumers hold their accumulators, the
  //    mainloop's and scheduler's state and the ops before the Stage (the rstd scale): with
  //    160 (96 accumulators) ptxas spilled 4-20 bytes in K1, K2, K4, with 144 up to 92; the
  //    plain GEMM's 128 accumulators spilled with 160 or 168. The epilogue warpgroup holds 16
  //    values a subtile (a RoPE head's 32 in its prepass): the entry's 128.
  //  - staged_wide: 128 x 120 + 256 x 192 = 64512, the whole launch allocation. The consumers
  //    hold 128 accumulators and the hand-over (no epilogue of their own; 192 compile without
  //    spills); the producer warpgroup's warps share one count (setmaxnreg is per warpgroup),
  //    which the three epilogue warps need and the load issuer does not (K6's strips spilled
  //    64-88 bytes in 88; with 32-bit shared loads and 4 gamma loads a strip-subtile, 8 bytes
  //    in 104).
  // NOTE: the counts share the CTA's launch allocation (kThreads x the entry count, which
  // ptxas caps at 65536 / kThreads in steps of 8: 168 for 384 threads), not the SM's 64K
  // registers: a split above it leaves setmaxnreg.inc waiting forever (staged_wide with
  // 96 / 208 = 65536 hung).
  //  - staged with FP8 operands (gemm_fp8's n128_staged study tile): 128 x (24 + 2 x 232 + 24)
  //    = 65536. The FP8 consumers hold the promoted sum and two partials (192 registers at 128
  //    columns, fp8_mainloop.cuh) as in the cooperative kernel's 232; the epilogue warpgroup of
  //    a plain staged store (no ops after the Stage) and the producer fit 24 each (ptxas, sm_90a,
  //    2026-12-06: 0 spills; with 208 / 216 / 224 for the consumers 280 / 124 / 28 bytes).
  //  - staged with FP8 operands and one partial (the fused kernels' staged FP8 tile, 128 x 128:
  //    64 accumulators and 64 partial sums): 128 x (32 + 2 x 192 + 96) = 65536. The producer
  //    warpgroup runs the TMA warp and the two scale warps (Fp8Mainloop::load_scales: 24
  //    spilled 8 bytes, ptxas sm_90a, 2026-12-07). The consumers hold the ops before the Stage
  //    too (the rstd partials in registers): with 184 K2 spilled 4 bytes and K4 24, with 176
  //    44-56 (2026-12-06); the epilogue warpgroup runs K1's, K2's, K4's and K6's ops after the
  //    Stage in 96 without spills (2026-12-07; in 104 before the scale warps).
  //  - the same with no ops before the Stage (K7, whose consumers only round dy into the staged
  //    tile): 128 x (32 + 2 x 176 + 128) = 65536. K7's epilogue (the SwiGLU backward from
  //    global preact, zeta partials, act's store) spilled 12 bytes in 104 (2026-12-06) and fits
  //    128, as the 16-bit staged K7's does.
  //  - the staged two-partial FP8 tile keeps 24 for the producer (its consumers' 232 leave no
  //    more), so its consumers load their scales themselves (Fp8Mainloop::kStagedScales).
  static constexpr bool kHeavyAccumulators = kAccumulatorsPerThread > 128;
  static constexpr bool kStagedFp8 = kSchedule == Schedule::staged && kOperandBytes == 1;
  static constexpr bool kStagedFp8Fused = kStagedFp8 && kFp8Partials_ == 1;
  static constexpr bool kConsumerOps = kConsumerOps_;
  static constexpr int kProducerRegisters = kEpilogueInProducer  ? 120
                                            : kStagedFp8Fused    ? 32 // + the scale warps
                                            : kStagedFp8         ? 24
                                            : kStaged            ? 32
                                            : kHeavyAccumulators ? 24
                                                                 : 40;
  static constexpr int kConsumerRegisters = kEpilogueInProducer  ? 192
                                            : kStagedFp8Fused    ? (kConsumerOps ? 192 : 176)
                                            : kStagedFp8         ? 232
                                            : kStaged            ? 176
                                            : kHeavyAccumulators ? 240
                                                                 : 232;
  static constexpr int kEpilogueRegisters =
      kSchedule == Schedule::staged ? 512 - kProducerRegisters - 2 * kConsumerRegisters : 0;

  static_assert(kOperandBytes == 1 || kOperandBytes == 2, "operands are 16-bit or FP8");
  static_assert(kFp8Partials_ == 1 || kFp8Partials_ == 2, "one partial or two");
  static_assert(kTileK * kOperandBytes == 128,
                "operand tiles are one 128-byte swizzle span deep in K");
  static_assert(kTileN == 128 || kTileN == 192 || kTileN == 256,
                "wgmma wrappers exist for N = 128, 192 and 256");
  static_assert(kSchedule == Schedule::pingpong || kTileM == 128,
                "cooperative and staged schedules: two warpgroups of 64 rows, so tile M is 128");
  static_assert(kSchedule != Schedule::pingpong || kTileM == 64 || kTileM == 128,
                "ping-pong schedule: one warpgroup owns the tile, so tile M must be 64 or 128");
  static_assert(kAccumulatorsPerThread <= (kSchedule == Schedule::pingpong ? 192 : 128),
                "a consumer thread holds at most 128 fp32 accumulators beside an epilogue (192 "
                "on ping-pong with the 240-register split)");
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(kStages >= 2 && kStages <= 8, "2 to 8 pipeline stages");
  static_assert(kEpilogueRegisters <= 256 && kEpilogueRegisters % 8 == 0,
                "setmaxnreg takes at most 256, in steps of 8");
  static constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8; // per thread, at launch
  static_assert((kProducerRegisters + kEpilogueRegisters) * 128 +
                        kConsumerRegisters * 128 * kConsumerWarpgroups <=
                    kEntryRegisters * kThreads,
                "register split exceeds the CTA's registers at launch");
};

// Bytes of one pipeline stage (A tile + B tile).
template <class Config> constexpr int stage_bytes() {
  return (Config::kTileM + Config::kTileN) * Config::kTileK * Config::kOperandBytes;
}

} // namespace coda::sm90
