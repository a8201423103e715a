// Device side of ReduceOverM (coda/epilogue/ops/reduce_over_m.hpp): one partial per (column,
// kReduceBlock-row block), [N, ceil(M / kReduceBlock)] f32, e.g. the RMSNorm weight gradient.
//
// A tile's kReduceBlock rows are split over its warpgroups (64 rows each) and, within one, a
// column over the 8 row groups of each warp and its 4 warps. Per subtile, each thread folds its
// two rows of each of its 8 columns, the 8 row groups merge by shuffles (lane xor 4, 8, 16), and
// lanes 0-3 leave the warp's states in shared memory. At the tile's end both warpgroups meet at
// an mbarrier; thread t of the tile merges column t over the warps in a fixed order and writes
// the partial; a second meeting frees the buffer for the next tile. Rows at or past M are
// skipped. One writer per partial, fixed merge order: no atomics, bitwise reproducible.
#pragma once

#include <cstdint>

#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/ops/reduce_over_n.cuh"
#include "coda/epilogue/reduction.hpp"
#include "coda/kernels/args.hpp"

namespace coda::epilogue::device {

template <class Shape, template <class> class Reduction> struct ReduceOverM : OpBase {
  using R = Reduction<float>;
  using State = typename R::State;
  static constexpr int kWarps = arch::kWarpgroupSize / arch::kWarpSize;
  static constexpr int kThreads = Shape::kWarpgroups * arch::kWarpgroupSize;
  static_assert(Shape::kWarpgroups * Shape::kRows == kReduceBlock && Shape::kBlocks == 1,
                "a tile's warpgroups share one reduction block of rows (the cooperative tile)");
  // One column per thread of the tile in end_tile: every thread of a 256-column tile, the first
  // half of a 128-column one (the FP8 mainloop's; the others only meet).
  static_assert(Shape::kCols == kThreads || 2 * Shape::kCols == kThreads,
                "one column per thread of the tile in end_tile, or per thread of the first half");

  struct Params {
    float* partials = nullptr; // [cols, blocks], row stride `stride`
    int64_t stride = 0;
    int32_t rows = 0;   // M: rows at or past it are not reduced
    int32_t cols = 0;   // N
    int32_t blocks = 0; // ceil(M / kReduceBlock)
  };
  struct SharedStorage {
    State warp_states[Shape::kWarpgroups][kWarps][Shape::kCols];
    uint64_t meet; // both warpgroups of the tile, kThreads arrivals per phase
  };
  using Ctx = OpContext<Params, SharedStorage>;

  uint32_t phase;

  __device__ static void init(SharedStorage& s) { cuda::ptx::mbarrier_init(&s.meet, kThreads); }
  __device__ void begin_kernel(const Ctx&) { phase = 0; }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const int32_t row0 = st.row0 + SubtileMap::slot_row(c.wg.thread, 0);
    const bool valid[2] = {row0 < c.params.rows, row0 + 8 < c.params.rows};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        State s = R::identity();
#pragma unroll
        for (int slot = 0; slot < 2; ++slot)
          if (valid[slot]) R::add(s, v[4 * j + 2 * slot + e]);
#pragma unroll
        for (int mask = 4; mask <= 16; mask *= 2) s = R::merge(s, shuffle_xor(s, mask));
        if (c.wg.lane() < 4)
          c.smem.warp_states[c.wg.index][c.wg.warp()]
                            [st.slab * Shape::kSubCols + 8 * j + 2 * c.wg.quad_lane() + e] = s;
      }
  }

  __device__ void end_tile(const Ctx& c, sm90::EpilogueTile tile) {
    meet(c);
    const int col = c.wg.index * arch::kWarpgroupSize + c.wg.thread;
    if (col < Shape::kCols) {
      State s = R::identity();
#pragma unroll
      for (int w = 0; w < Shape::kWarpgroups; ++w)
#pragma unroll
        for (int warp = 0; warp < kWarps; ++warp) s = R::merge(s, c.smem.warp_states[w][warp][col]);
      const int32_t n = tile.col0 + col, block = tile.row0 / int32_t(kReduceBlock);
      if (n < c.params.cols && block < c.params.blocks)
        c.params.partials[int64_t(n) * c.params.stride + block] = R::finish(s);
    }
    meet(c); // everyone has read the states before the next tile writes them
  }

private:
  __device__ void meet(const Ctx& c) {
    (void)cuda::ptx::mbarrier_arrive(&c.smem.meet);
    sm90::mbarrier_wait(&c.smem.meet, phase);
    phase ^= 1;
  }
};

} // namespace coda::epilogue::device
