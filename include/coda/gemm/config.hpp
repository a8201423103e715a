// The compile-time shape of one GEMM kernel: CTA tile, pipeline depth, cluster and consumer
// schedule, in one struct whose static_asserts say what each combination requires. Plain C++
// (no CUDA), so the heuristic that picks a config is tested on the CPU.
#pragma once

#include <cstdint>

#include "coda/gemm/problem.hpp"

namespace coda::sm90 {

// How the two consumer warpgroups share work.
//   cooperative: both work on one tile, each owning half of its rows (tile M split in two);
//   pingpong:    each owns whole tiles, alternating, so one's epilogue overlaps the other's MMAs.
enum class Schedule : int { cooperative = 0, pingpong = 1 };

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

template <int kTileM_, int kTileN_, int kStages_, int kClusterM_, Schedule kSchedule_>
struct GemmConfig {
  static constexpr int kTileM = kTileM_;       // rows of D per tile
  static constexpr int kTileN = kTileN_;       // columns of D per tile
  static constexpr int kTileK = 64;            // one 128-byte swizzle span of 16-bit elements
  static constexpr int kStages = kStages_;     // shared-memory ring depth
  static constexpr int kClusterM = kClusterM_; // CTAs of a cluster, stacked along M, sharing B
  static constexpr Schedule kSchedule = kSchedule_;

  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = (1 + kConsumerWarpgroups) * 128; // producer WG + consumers
  // Rows of a tile one consumer warpgroup owns, in 64-row wgmma blocks.
  static constexpr int kWarpgroupTileM = kSchedule == Schedule::cooperative ? kTileM / 2 : kTileM;
  static constexpr int kMmaBlocksM = kWarpgroupTileM / 64;
  static constexpr int kAccumulatorsPerThread = kMmaBlocksM * kTileN / 2;
  // NOTE: 128 x 40 + 256 x 232 = 64512 <= 65536 registers; the producer needs few, and
  // consumers need ~100 beyond their accumulators (cutlass and fast.cu use the same split).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;

  static_assert(kTileK == 64,
                "operand tiles are one 128-byte swizzle span (64 elements) deep in K");
  static_assert(kTileN == 128 || kTileN == 256, "wgmma wrappers exist for N = 128 and 256");
  static_assert(kSchedule != Schedule::cooperative || kTileM == 128,
                "cooperative schedule: two warpgroups of 64 rows, so tile M must be 128");
  static_assert(kSchedule != Schedule::pingpong || kTileM == 64 || kTileM == 128,
                "ping-pong schedule: one warpgroup owns the tile, so tile M must be 64 or 128");
  static_assert(kAccumulatorsPerThread <= 128,
                "a consumer thread holds at most 128 fp32 accumulators (register budget 232)");
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(kTileN / 64 % kClusterM == 0,
                "each CTA of a cluster multicasts whole 64-column atoms of B");
  static_assert(kStages >= 2 && kStages <= 8, "2 to 8 pipeline stages");
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumerWarpgroups <= 65536,
                "register split exceeds the 64K registers of an SM");
};

// Bytes of one pipeline stage (A tile + B tile, 16-bit elements).
template <class Config> constexpr int stage_bytes() {
  return (Config::kTileM + Config::kTileN) * Config::kTileK * 2;
}

} // namespace coda::sm90
