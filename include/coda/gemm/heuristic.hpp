// Which compiled kernel runs a given GEMM shape. Plain C++, tested on the CPU.
//
// The kernels (each instantiated for every layout and dtype pair; clusters of 2 along M with B
// multicast):
//   wide:     128 x 256 tiles, cooperative. The workhorse: the largest tile whose 128
//             accumulators per thread fit the 232-register consumers, halving the shared-memory
//             traffic per MMA compared to 128 x 128.
//   pingpong: 128 x 128 tiles, one per consumer warpgroup, alternating. Twice the tiles, so it
//             wins where the wide kernel's last wave would run mostly empty (measured on an
//             H200: 3072 x 2048 x 8192, 1.45 waves of wide tiles, +18%; elsewhere 5-10% slower).
// The raster group (unit-rows per L2 group) is chosen so that a wave of clusters covers about
// one group: the tiles running together then share few A row-blocks and B column-blocks.
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"
#include "coda/gemm/config.hpp"

namespace coda::gemm {

enum class KernelId : int32_t { wide = 0, pingpong = 1 };

// Stages fill what the epilogue leaves of 227 KB; fp32 outputs double the epilogue buffers.
template <class OutT>
using WideConfig = GemmConfig<128, 256, sizeof(OutT) == 4 ? 3 : 4, 2, Schedule::cooperative>;
template <class OutT>
using PingpongConfig = GemmConfig<128, 128, sizeof(OutT) == 4 ? 5 : 6, 2, Schedule::pingpong>;

struct GemmPlan {
  KernelId kernel = KernelId::wide;
  int32_t group_m = 8; // raster group height, in cluster units along M
};

// Fraction of the SMs busy over the waves of `tiles` equal tiles (1 = no idle tail).
inline double wave_efficiency(int64_t tiles, int64_t sms) {
  const int64_t waves = ceil_div<int64_t>(tiles, sms);
  return waves == 0 ? 1.0 : double(tiles) / double(waves * sms);
}

inline GemmPlan choose_plan(int64_t m, int64_t n, int64_t k, int32_t num_sms) {
  (void)k;
  GemmPlan plan;
  const int64_t tiles_m = ceil_div<int64_t>(m, 128);
  const double wide = wave_efficiency(tiles_m * ceil_div<int64_t>(n, 256), num_sms);
  const double narrow = wave_efficiency(tiles_m * ceil_div<int64_t>(n, 128), num_sms);
  // NOTE: pingpong loses 5-10% per tile; switch only when the wide kernel idles far more.
  if (wide < 0.8 && narrow > wide + 0.15) plan.kernel = KernelId::pingpong;
  const int64_t tile_n = plan.kernel == KernelId::wide ? 256 : 128;

  const int64_t units_m = ceil_div<int64_t>(tiles_m, 2);
  const int64_t tiles_n = ceil_div<int64_t>(n, tile_n);
  const int64_t clusters = num_sms / 2;
  // A group of g unit-rows holds g * tiles_n units; aim for about one wave of clusters per group,
  // and never fewer than 2 unit-rows (else consecutive units share no A).
  int64_t g = ceil_div<int64_t>(clusters, tiles_n > 0 ? tiles_n : 1);
  g = g < 2 ? 2 : g > 16 ? 16 : g;
  if (g > units_m) g = units_m > 0 ? units_m : 1;
  plan.group_m = int32_t(g);
  return plan;
}

} // namespace coda::gemm
