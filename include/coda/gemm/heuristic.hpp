// Which compiled kernel runs a given GEMM shape, and how its tiles are ordered and split. Plain
// C++, tested on the CPU.
//
// The kernels (each instantiated for every layout and dtype pair; clusters of 2 along M with B
// multicast):
//   wide:     128 x 256 tiles, cooperative. The workhorse: the largest tile whose 128
//             accumulators per thread fit the 232-register consumers, halving the shared-memory
//             traffic per MMA compared to 128 x 128. Its last partial wave runs stream-K.
//   wide192:  128 x 192 tiles, cooperative, bf16 -> bf16 only: where its rounds are much fuller
//             (choose_plan).
//   pingpong: 128 x 128 tiles, one per consumer warpgroup, alternating. Twice the tiles, so it
//             was the answer to a mostly empty last wave before stream-K (measured on an H200:
//             3072 x 2048 x 8192, 1.45 waves of wide tiles, +18%; elsewhere 5-10% slower).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "coda/core/types.hpp"
#include "coda/gemm/config.hpp"

namespace coda::sm90 {

// The study kernels (bf16 in and out only) measure the floor of each epilogue schedule
// (docs/gemm-worklog.md, step 9): the wide tile with 3 stages (what a staged tile leaves), a
// 128 x 192 tile cooperative, and the staged schedule with 128 x 256 (3 stages) and 128 x 192
// (4 stages) tiles, and ping-pong with one 64 x 256 tile per warpgroup (4 stages: the
// cooperative tile's shared-memory reads per MMA and accumulators per thread; measured 0.897 of
// cuBLASLt, as slow as 128 x 128 ping-pong: worklog step 10). (The 128 x 192 ping-pong study
// kernel, 0.895 of cuBLASLt in that study, spilled 308-320 bytes and is no longer built.)
enum class KernelId : int32_t {
  wide = 0,
  pingpong = 1,
  wide_3stages = 2,
  wide192 = 3,
  staged = 5,
  staged192 = 6,
  pingpong_wide = 7,
  staged_wide = 8, // 128 x 256 staged, the epilogue in the producer warpgroup, 3 stages
  staged128 = 9,   // 128 x 128 staged, 5 stages: the floor of K0 on a staged tile that holds whole
                   // 128-column reduction blocks (docs/epilogue.md)
};
constexpr const char* kernel_name(KernelId id) {
  return name_of(id, {{KernelId::wide, "wide"},
                      {KernelId::pingpong, "pingpong"},
                      {KernelId::wide_3stages, "wide_3stages"},
                      {KernelId::wide192, "wide192"},
                      {KernelId::staged, "staged"},
                      {KernelId::staged192, "staged192"},
                      {KernelId::pingpong_wide, "pingpong_wide"},
                      {KernelId::staged_wide, "staged_wide"},
                      {KernelId::staged128, "staged128"}});
}

// Stages fill what the epilogue leaves of 227 KB; fp32 outputs double the epilogue buffers.
template <class OutT>
using WideConfig = GemmConfig<128, 256, sizeof(OutT) == 4 ? 3 : 4, 2, Schedule::cooperative>;
template <class OutT>
using PingpongConfig = GemmConfig<128, 128, sizeof(OutT) == 4 ? 5 : 6, 2, Schedule::pingpong>;

constexpr int32_t kClusterM = 2; // both kernels

// Stream-K over the last waves of the wide kernel: never, where the cost model says it pays,
// or always (tests).
enum class StreamKMode : int32_t { off = 0, automatic = 1, always = 2 };

struct GemmPlan {
  KernelId kernel = KernelId::wide;
  int32_t group_m = 8; // raster group height, in cluster units along M
  StreamKMode stream_k = StreamKMode::automatic;
  bool defer_stores = true; // plain epilogue: store a tile while the next one's MMAs run
};

// Fraction of the SMs busy over the waves of `tiles` equal tiles (1 = no idle tail).
inline double wave_efficiency(int64_t tiles, int64_t sms) {
  const int64_t waves = ceil_div<int64_t>(tiles, sms);
  return waves == 0 ? 1.0 : double(tiles) / double(waves * sms);
}

// Raster group height g (unit-rows) minimizing what a wave of `clusters` units reads: g unit-rows
// of A and ceil(clusters / g) column-blocks of B (DeepGEMM's rule, over powers of two).
inline int32_t choose_group_m(int64_t units_m, int64_t clusters, int64_t unit_rows,
                              int64_t tile_n) {
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t g = 1; g <= 16; g *= 2) {
    const int64_t cost = g * unit_rows + ceil_div<int64_t>(clusters, g) * tile_n;
    if (cost <= best_cost) best = g, best_cost = cost;
  }
  if (best > units_m) best = units_m > 0 ? units_m : 1;
  return int32_t(best);
}

constexpr int64_t tile_n_of(KernelId id) {
  return id == KernelId::pingpong || id == KernelId::staged128  ? 128
         : id == KernelId::wide192 || id == KernelId::staged192 ? 192
                                                                : 256;
}

constexpr int64_t tile_m_of(KernelId id) { return id == KernelId::pingpong_wide ? 64 : 128; }

// The raster group of `kernel`'s tiles (tile_m_of rows, tile_n_of columns) on `num_sms` SMs.
inline int32_t group_m_for(KernelId kernel, int64_t m, int32_t num_sms) {
  const int64_t tiles_m = ceil_div<int64_t>(m, tile_m_of(kernel));
  const int64_t clusters = num_sms / kClusterM;
  return choose_group_m(ceil_div<int64_t>(tiles_m, kClusterM), clusters,
                        kClusterM * tile_m_of(kernel), tile_n_of(kernel));
}

// The wide tile, except where the 128 x 192 tile (wide192; compiled for bf16 -> bf16 only:
// `narrow_compiled`) fills its rounds of cluster units far better: 3072 x 2048 x 8192 (Llama-1B's
// qkv weight gradient) has 1.45 rounds of 128 x 256 units and exactly 2 of 128 x 192, and there
// wide192 took 0.962 of the wide tile's time with stream-K (H200, bench/results/
// gemm_schedules.json at 5dd3b0b); on the other 26 shapes there, whose rounds both tiles fill
// alike or the wide one better, it was 2-23% slower.
inline GemmPlan choose_plan(int64_t m, int64_t n, int64_t k, int32_t num_sms,
                            bool narrow_compiled = false) {
  (void)k;
  constexpr double kFullerBy = 0.2; // the qkv weight gradient: 1.00 against 0.73
  GemmPlan plan;
  const int64_t units_m = ceil_div<int64_t>(ceil_div<int64_t>(m, 128), kClusterM);
  const int64_t clusters = num_sms / kClusterM;
  const auto rounds_filled = [&](KernelId id) {
    return wave_efficiency(units_m * ceil_div<int64_t>(n, tile_n_of(id)), clusters);
  };
  if (narrow_compiled &&
      rounds_filled(KernelId::wide192) >= rounds_filled(KernelId::wide) + kFullerBy)
    plan.kernel = KernelId::wide192;
  plan.group_m = group_m_for(plan.kernel, m, num_sms);
  return plan;
}

// ---- The fused kernels' schedules (src/gpu/fused; docs/epilogue.md), chosen here beside the plain
// GEMM's plan so that one file holds every kernel choice. Each named kernel's default, the faster
// one measured (bench_fused, docs/PERFORMANCE.md), which set_fused_schedule may override:
//   K0:      cooperative. No staged variant: its sum-of-squares partials are 128 columns wide, a
//            192-column tile holds one and a half (and the 128 x 128 staged floor is 0.88-0.92 of
//            cuBLASLt at K0's Llama-1B shapes, gemm-worklog step 16).
//   K1, K2 (and K2g), K5, K7: staged (128 x 192, the epilogue in a fourth warpgroup).
//   K4:      staged with head_dim 64 (a 192-column tile holds 3 heads; with its rstd partials in
//            registers 1.113-1.118x the plain GEMM against the cooperative 1.133-1.145x, H200,
//            f672385); cooperative with 128 (a 192-column tile cuts its heads).
//   K6:      staged_wide where its gradient is rounded (`rounded_gradient`: K from
//            kRmsBackwardRoundedGradientMinK, the rounding the staged tile's hand-over makes part
//            of its contract), cooperative below (the strip warps need about that much mainloop
//            per tile: 1B K = 3072 1.226 against cooperative 1.297, 765784c). On E4M3 operands
//            the same rule picks the FP8 mainloop's staged 128 x 128 tile (src/gpu/fused/k6.cu),
//            from the 16-bit threshold (at K = 3072 1.26x gemm_fp8 against the cooperative
//            FP8 tile's 1.58x, H100, 2026-12-07).
enum class FusedKernel : int32_t { k0, k1, k2, k4, k5, k6, k7 };
inline Schedule fused_schedule(FusedKernel kernel, int32_t head_dim = 0,
                               bool rounded_gradient = false) {
  switch (kernel) {
  case FusedKernel::k0:
    return Schedule::cooperative;
  case FusedKernel::k4:
    return head_dim == 64 ? Schedule::staged : Schedule::cooperative;
  case FusedKernel::k6:
    return rounded_gradient ? Schedule::staged_wide : Schedule::cooperative;
  case FusedKernel::k1:
  case FusedKernel::k2:
  case FusedKernel::k5:
  case FusedKernel::k7:
    return Schedule::staged;
  }
  return Schedule::cooperative;
}

// ---- The FP8 GEMM's tiles (gpu::gemm_fp8; docs/fp8.md, "The 128 x 192 tile"), cooperative with
// clusters of 2 along M like the kernels above:
//   n128:             128 x 128, two full-width partials in turn (the overlapped promotion);
//   n192:             128 x 192, a partial for each 96-column half of the tile, in turn;
//   n192_one_partial: 128 x 192 with one partial, each k-block waiting for its own batch: a study
//                     kernel (does the halves' overlap pay for their second read of A?);
//   n128_staged:      n128's consumers on the staged schedule: they round the tile to bf16 into
//                     shared memory and start the next one while a fourth warpgroup stores it,
//                     so the epilogue runs under the next tile's MMAs. A bf16 D, not accumulated
//                     into.
//   n128_staged_one_partial: n128_staged with one partial, the consumers the fused kernels'
//                     staged FP8 tile runs (Fp8StagedShape: its register split, one partial):
//                     their floor, a study kernel (1.06x n128_staged's time, H100, b2551aa).
// (Three more study tiles issued the one-partial consumers' batches in turns, at 128 and 192
// columns: measured slower and removed; docs/fp8.md, "The ordered issue".)
// The 192-column tiles take B scaled by blocks only (by rows the mainloop holds one partial and
// the by-columns promotion's shuffles; not compiled at 192), and so do the staged ones.
enum class Fp8Tile : int32_t {
  automatic = 0,
  n128 = 1,
  n192 = 2,
  n192_one_partial = 3,
  n128_staged = 4,
  n128_staged_one_partial = 5
};
constexpr const char* fp8_tile_name(Fp8Tile t) {
  return name_of(t, {{Fp8Tile::automatic, "automatic"},
                     {Fp8Tile::n128, "n128"},
                     {Fp8Tile::n192, "n192"},
                     {Fp8Tile::n192_one_partial, "n192_one_partial"},
                     {Fp8Tile::n128_staged, "n128_staged"},
                     {Fp8Tile::n128_staged_one_partial, "n128_staged_one_partial"}});
}

// The tile gpu::gemm_fp8 runs when not told. Where it applies (B scaled by blocks, a bf16 D not
// accumulated into: `bf16_store`), the staged 128 x 128 tile (measured faster than the
// cooperative one on all 26 benchmarked shapes, H100, 2026-12-06, 2199664: geomean 1.085; docs/
// fp8.md, "The staged 128 x 128 tile"), unless the cooperative one-partial 128 x 192 tile is
// predicted 5% faster. Since the block scales are staged as fp32 (docs/fp8.md, "The scales staged
// as fp32 by st.async") that tile leads on every Llama-8B shape; its time a tile is
// fp8_tile_192_cost times the staged 128-column tile's (fitted over the 24 block GEMMs, H100,
// 2026-12-07: 1.50 at K = 2048, 1.40 at 4096, 1.32 from 8192 on: a longer k-loop amortizes the
// cooperative tile's exposed epilogue), and each tile runs whole waves of clusters. Elsewhere 128 x
// 128 on the cooperative schedule.
inline double fp8_tile_192_cost(int64_t k) {
  const double per_doubling = 0.09, at_2048 = 1.50, floor = 1.32;
  const double cost = at_2048 - per_doubling * (std::log2(double(std::max<int64_t>(k, 1))) - 11.0);
  return std::clamp(cost, floor, at_2048);
}
inline Fp8Tile choose_fp8_tile(int64_t m, int64_t n, int64_t k, Fp8BScaling b_scaling,
                               bool bf16_store, int64_t clusters) {
  if (b_scaling != Fp8BScaling::blocks || !bf16_store) return Fp8Tile::n128;
  constexpr double kMargin = 0.95;
  const int64_t unit_rows = ceil_div<int64_t>(ceil_div<int64_t>(m, 128), kClusterM);
  const auto waves = [&](int64_t tile_n) {
    return ceil_div<int64_t>(unit_rows * ceil_div<int64_t>(n, tile_n),
                             std::max<int64_t>(clusters, 1));
  };
  return double(waves(192)) * fp8_tile_192_cost(k) < kMargin * double(waves(128))
             ? Fp8Tile::n192_one_partial
             : Fp8Tile::n128_staged;
}

// The stream-K split of the wide kernel's units (see scheduler.hpp), in cluster units.
struct StreamKSplit {
  int64_t first_unit; // units before it are data-parallel
  int32_t workers;    // 0: no stream-K
};

// Cost model in k-blocks of one cluster. Data-parallel, the last two rounds of units take two
// units' time (one when there is a single round). Stream-K spreads those units evenly, runs its
// k-blocks kSlowdown slower and pays, per contributor of a unit it owns, a partial-sum trip
// through L2 (128 KB per CTA, about kFixupBlocks k-blocks). Stream-K is used when it saves more
// than kMargin k-blocks. Measured on an H200 (docs/gemm-worklog.md, steps 4-6): before the
// k-blocks of concurrent pieces were aligned (scheduler.hpp) the slowdown was ~1.12.
inline StreamKSplit plan_stream_k(int64_t units, int64_t clusters, int32_t k_blocks,
                                  StreamKMode mode = StreamKMode::automatic) {
  constexpr double kSlowdown = 1.06, kFixupBlocks = 4, kMargin = 2;
  const StreamKSplit none{units, 0};
  if (mode == StreamKMode::off || clusters < 2 || units == 0) return none;
  const int64_t rounds = ceil_div(units, clusters);
  const int64_t dp_rounds = rounds > 2 ? rounds - 2 : 0;
  const int64_t sk_units = units - dp_rounds * clusters;
  if (sk_units * k_blocks * clusters >= (int64_t(1) << 31)) return none; // 32-bit k-block space
  if (mode == StreamKMode::always) return StreamKSplit{dp_rounds * clusters, int32_t(clusters)};
  if (units % clusters == 0 || k_blocks < 2) return none;
  const double share = double(sk_units * k_blocks) / double(clusters); // k-blocks per worker
  // A unit spans at most ceil(k_blocks / share) + 1 ranges, so that many minus one contribute.
  const double contributors = share >= k_blocks ? 1.0 : std::ceil(k_blocks / share);
  const double stream_k = share * kSlowdown + contributors * kFixupBlocks;
  const double data_parallel = double((rounds - dp_rounds) * k_blocks);
  if (stream_k + kMargin >= data_parallel) return none;
  return StreamKSplit{dp_rounds * clusters, int32_t(clusters)};
}

} // namespace coda::sm90
