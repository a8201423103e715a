// Persistent tile scheduler with grouped (L2-aware) rasterization. Plain C++ shared by the kernel
// and the CPU tests.
//
// The output is cut into tiles of kTileM x kTileN; clusters of kClusterM CTAs take "units" of
// kClusterM tiles stacked along M (they share the B tile, which is multicast). Units are visited
// in groups of `group_m` unit-rows: inside a group the walk goes down M first, then across N, so
// the CTAs running at one time touch group_m * kClusterM row-blocks of A and few column-blocks
// of B, and both stay in L2. Cluster c of a persistent grid of C clusters takes units c, c + C, ...
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"

namespace coda::gemm {

struct TileCoord {
  int32_t m_block; // tile index along M (may be past the end for the idle half of a cluster)
  int32_t n_block; // tile index along N
};

struct TileScheduler {
  int32_t tiles_m = 0, tiles_n = 0; // tiles of the output
  int32_t cluster_m = 1;            // CTAs per cluster, along M
  int32_t group_m = 8;              // unit-rows per raster group

  CODA_HD int32_t units_m() const { return ceil_div(tiles_m, cluster_m); }
  CODA_HD int64_t num_units() const { return int64_t(units_m()) * tiles_n; }

  // Tile of CTA `cta_rank` (0 .. cluster_m-1) in unit `unit` (0 .. num_units()-1).
  CODA_HD TileCoord tile(int64_t unit, int32_t cta_rank) const {
    const int64_t group_size = int64_t(group_m) * tiles_n;
    const int64_t group = unit / group_size;
    const int32_t first_m = int32_t(group * group_m);
    const int32_t rows_in_group = units_m() - first_m < group_m ? units_m() - first_m : group_m;
    const int64_t in_group = unit - group * group_size;
    const int32_t unit_m = first_m + int32_t(in_group % rows_in_group);
    const int32_t unit_n = int32_t(in_group / rows_in_group);
    return TileCoord{unit_m * cluster_m + cta_rank, unit_n};
  }
};

} // namespace coda::gemm
