// Persistent tile scheduler: grouped (L2-aware) rasterization, then a stream-K tail. Plain C++
// shared by the kernel and the CPU tests.
//
// The output is cut into tiles of kTileM x kTileN; clusters of kClusterM CTAs take "units" of
// kClusterM tiles stacked along M (they share the B tile, which is multicast). Units are ordered
// in groups of `group_m` unit-rows: inside a group the walk goes down M first, then across N, so
// the CTAs running at one time touch group_m * kClusterM row-blocks of A and few column-blocks
// of B, and both stay in L2.
//
// Units [0, sk_first_unit) are data-parallel: cluster c of a persistent grid of C clusters takes
// units c, c + C, ... whole. The remaining units are stream-K: their k-blocks, flattened unit by
// unit, are cut into `sk_workers` contiguous ranges of equal length, one per cluster, so the last
// partial wave is spread over every cluster instead of leaving most of them idle. Each worker
// walks its range backwards, from its last k-block to its first. A unit whose k-blocks fall into
// several ranges is finished by the range that holds its last k-block (the owner; that piece is
// the owner's last work); every range that ends inside the unit (a contributor; that piece is its
// first work) publishes partial sums for the owner. So an owner only waits for workers with a
// lower index, which start no later than it does and finished their piece first.
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"

namespace coda::sm90 {

struct TileCoord {
  int32_t m_block; // tile index along M (may be past the end for the idle half of a cluster)
  int32_t n_block; // tile index along N
};

// k-blocks [k_begin, k_end) of one unit's tiles, loaded from k_begin + k_rotation on (wrapping
// around to k_begin; the order does not change the sum beyond fp32 rounding).
struct WorkItem {
  int64_t unit;
  int32_t k_begin, k_end;
  int32_t k_rotation = 0;
};

// The most units one launch may have (tile<uint32_t>() computes in 32 bits).
constexpr int64_t kMaxUnits = (int64_t(1) << 31) - 1;

struct TileScheduler {
  int32_t tiles_m = 0, tiles_n = 0;  // tiles of the output
  int32_t cluster_m = 1;             // CTAs per cluster, along M
  int32_t group_m = 8;               // unit-rows per raster group
  int32_t k_blocks = 1;              // k-blocks per tile
  int64_t sk_first_unit = INT64_MAX; // first stream-K unit (num_units() or more: none)
  int32_t sk_workers = 0;            // clusters sharing the stream-K units (0: none)

  CODA_HD int32_t units_m() const { return ceil_div(tiles_m, cluster_m); }
  CODA_HD int64_t num_units() const { return int64_t(units_m()) * tiles_n; }
  CODA_HD int64_t dp_units() const {
    return sk_first_unit < num_units() ? sk_first_unit : num_units();
  }
  CODA_HD bool has_stream_k() const { return sk_workers > 0 && dp_units() < num_units(); }

  // Tile of CTA `cta_rank` (0 .. cluster_m-1) in unit `unit` (0 .. num_units()-1). Index is
  // the integer type of the arithmetic: int64_t, or uint32_t where the launcher keeps
  // num_units() within kMaxUnits.
  // NOTE: a 64-bit division is a subroutine in SASS shared by the kernel's roles; with the
  // staged schedule's register split it spilled in the roles with the fewest registers, so that
  // schedule divides in 32 bits. The others keep the 64-bit form: inline 32-bit division made
  // the register-bound cooperative K2 spill 4-16 bytes (ptxas at its limit is not monotonic).
  template <class Index = int64_t> CODA_HD TileCoord tile(int64_t unit, int32_t cta_rank) const {
    const Index u = Index(unit);
    const Index group_size = Index(group_m) * Index(tiles_n);
    const Index group = u / group_size;
    const int32_t first_m = int32_t(group * Index(group_m));
    const int32_t rows_in_group = units_m() - first_m < group_m ? units_m() - first_m : group_m;
    const Index in_group = u - group * group_size;
    const int32_t unit_m = first_m + int32_t(in_group % Index(rows_in_group));
    const int32_t unit_n = int32_t(in_group / Index(rows_in_group));
    return TileCoord{unit_m * cluster_m + cta_rank, unit_n};
  }

  // Stream-K space: k-block `i` is k-block i % k_blocks of unit dp_units() + i / k_blocks.
  // NOTE: 32-bit (the launcher keeps sk_blocks() * sk_workers below 2^31): 64-bit divisions are
  // calls in SASS, and the registers they clobber do not exist beside the accumulators.
  CODA_HD int32_t sk_blocks() const { return int32_t(num_units() - dp_units()) * k_blocks; }
  // First k-block of worker w's range (w = sk_workers gives the end of the space).
  CODA_HD int32_t sk_begin(int32_t worker) const { return sk_blocks() * worker / sk_workers; }

  // Worker `worker` publishes partial sums: its range is not empty and ends inside a unit.
  CODA_HD bool sk_contributes(int32_t worker) const {
    return sk_begin(worker) < sk_begin(worker + 1) && sk_begin(worker + 1) % k_blocks != 0;
  }
  // The contributors to stream-K unit `sk_unit` (its index in the stream-K space) whose owner is
  // `owner`: the workers in [begin, owner) for which sk_contributes() holds.
  CODA_HD int32_t sk_contributors_begin(int32_t owner, int32_t sk_unit) const {
    int32_t w = owner;
    while (w > 0 && sk_begin(w) > sk_unit * k_blocks) --w;
    return w;
  }
};

// Global scratch of the stream-K units: per (worker, CTA rank, consumer warpgroup) slot, one
// warpgroup's fp32 partial sums and a flag (stream_k.cuh).
struct StreamKWorkspace {
  float* partials = nullptr; // [slot][register / 4][thread] float4
  int32_t* flags = nullptr;  // [slot]; zero between launches
};

// The work of one cluster, in order: its data-parallel units, then its stream-K range backwards.
struct WorkIterator {
  const TileScheduler& s; // in the kernel: the __grid_constant__ parameter (no register copy)
  int64_t clusters;
  int64_t next_unit;    // next data-parallel unit
  int32_t sk_lo, sk_hi; // stream-K k-blocks [sk_lo, sk_hi) not yet handed out
  int32_t sk_end;       // where this cluster's range ends

  CODA_HD WorkIterator(const TileScheduler& sched, int64_t cluster, int64_t num_clusters)
      : s(sched), clusters(num_clusters), next_unit(cluster), sk_lo(0), sk_hi(0), sk_end(0) {
    if (s.has_stream_k() && cluster < s.sk_workers) {
      sk_lo = s.sk_begin(int32_t(cluster));
      sk_hi = sk_end = s.sk_begin(int32_t(cluster) + 1);
    }
  }

  CODA_HD bool next(WorkItem& item) {
    if (next_unit < s.dp_units()) {
      item = WorkItem{next_unit, 0, s.k_blocks};
      next_unit += clusters;
      return true;
    }
    if (sk_hi <= sk_lo) return false;
    const int32_t unit = (sk_hi - 1) / s.k_blocks;
    const int32_t unit_start = unit * s.k_blocks;
    const int32_t k_begin = sk_lo > unit_start ? sk_lo - unit_start : 0;
    // A piece starts, where it holds it, at the k-block index equal to the stream-K time (k-blocks
    // done) modulo k_blocks. Clusters start stream-K together, their first pieces at k-block 0,
    // so at any time the clusters (mostly) work on the same k-block index of neighbouring units
    // and read the same k-slices of A and B, which L2 then serves once, as in a data-parallel
    // wave. (Measured without it: stream-K k-blocks ran ~12% slower than data-parallel ones.)
    const int32_t k_end = sk_hi - unit_start;
    const int32_t aligned = (sk_end - sk_hi) % s.k_blocks;
    const int32_t rotation = aligned >= k_begin && aligned < k_end ? aligned - k_begin : 0;
    item = WorkItem{s.dp_units() + unit, k_begin, k_end, rotation};
    sk_hi = unit_start + k_begin;
    return true;
  }
};

} // namespace coda::sm90
