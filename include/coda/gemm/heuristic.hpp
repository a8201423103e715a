// Which compiled kernel runs a given GEMM shape. Plain C++, tested on the CPU.
//
// The kernels (each instantiated for every layout and dtype pair):
//   wide: 128 x 256 tiles, cooperative, cluster of 2 along M with B multicast. The workhorse:
//         the largest tile whose 128 accumulators per thread fit the 232-register consumers,
//         halving the shared-memory traffic per MMA compared to 128 x 128.
// The raster group (unit-rows per L2 group) is chosen so that a wave of clusters covers about
// one group: the tiles running together then share few A row-blocks and B column-blocks.
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"
#include "coda/gemm/config.hpp"

namespace coda::gemm {

enum class KernelId : int32_t { wide = 0 };

// 16-bit outputs leave room for 4 stages of 48 KB; fp32 outputs double the epilogue buffers.
template <class OutT>
using WideConfig = GemmConfig<128, 256, sizeof(OutT) == 4 ? 3 : 4, 2, Schedule::cooperative>;

struct GemmPlan {
  KernelId kernel = KernelId::wide;
  int32_t group_m = 8; // raster group height, in cluster units along M
};

inline GemmPlan choose_plan(int64_t m, int64_t n, int64_t k, int32_t num_sms) {
  (void)k;
  GemmPlan plan;
  constexpr int64_t kUnitRows = 128 * 2; // rows of one cluster unit of the wide kernel
  const int64_t units_m = ceil_div<int64_t>(m, kUnitRows);
  const int64_t tiles_n = ceil_div<int64_t>(n, 256);
  const int64_t clusters = num_sms / 2;
  // A group of g unit-rows holds g * tiles_n units; aim for about one wave of clusters per group,
  // and never fewer than 2 unit-rows (else consecutive units share no A).
  int64_t g = ceil_div<int64_t>(clusters, tiles_n > 0 ? tiles_n : 1);
  if (g < 2) g = 2;
  if (g > 16) g = 16;
  if (g > units_m) g = units_m > 0 ? units_m : 1;
  plan.group_m = int32_t(g);
  return plan;
}

} // namespace coda::gemm
