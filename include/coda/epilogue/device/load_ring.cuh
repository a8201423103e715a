// An epilogue-load pipeline for ops that read a D-shaped tile (ResidualAdd's residual, the
// RMSNorm backward's x, the SwiGLU backward's pre-activation pairs): a ring of kSlots subtile
// buffers per consumer warpgroup, filled by TMA ahead of their use.
//
// The tile's first kSlots subtiles are loaded before the mainloop (begin_tile), the rest
// kSlots - 1 subtiles ahead of their use (prefetch, at the start of each subtile): one subtile's
// math is far shorter than a load's latency. A full mbarrier per slot (one arrival plus the
// transaction bytes) says when a slot has landed; subtile n of the warpgroup's stream waits on
// slot n % kSlots with the parity of its (n / kSlots)-th use. A slot is refilled only after every
// thread has read it (the driver's barrier at the start of the next subtile), so a barrier is
// never more than one phase ahead of its waiters. TMA zero-fills past the tensor's edges.
//
// The buffers are laid out as the TMA map of the tensor writes them (tensor_maps.hpp's
// subtile_map: 64 x 32 elements, swizzled by the row bytes), kBytes each.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/gemm/pipeline.cuh"

namespace coda::epilogue::device {

template <class Shape, uint32_t kBytes, int kSlots> struct SubtileLoadRing {
  static constexpr int kSubtiles = Shape::kBlocks * Shape::kSubtilesN; // of a warpgroup's tile
  static_assert(kSlots >= 2, "a ring of at least two slots (one read, one landing)");
  static_assert(kSubtiles >= kSlots, "a tile fills the ring");
  static_assert(kBytes % 1024 == 0, "whole swizzle atoms per slot, so every slot stays aligned");

  struct SharedStorage {
    alignas(1024) uint8_t tile[Shape::kWarpgroups][kSlots][kBytes];
    uint64_t full[Shape::kWarpgroups][kSlots];
  };

  // Only the ring position lives across the mainloop; where a load goes is recomputed from it
  // and from the subtiles the driver passes (every register held from begin_tile to the first
  // subtile competes with the accumulators: docs/epilogue.md, "Registers").
  uint32_t consumed; // subtiles this warpgroup has read: the ring position
  uint32_t phase;    // bit s: the parity the next wait on slot s expects

  __device__ static void init(SharedStorage& s) {
    for (int w = 0; w < Shape::kWarpgroups; ++w)
      for (int slot = 0; slot < kSlots; ++slot) cuda::ptx::mbarrier_init(&s.full[w][slot], 1);
  }
  __device__ void begin_kernel() { consumed = phase = 0; }

  // One thread: the tile's first kSlots subtiles, before the mainloop, into the slots that
  // follow the ring position (the previous tile has read them all).
  __device__ void begin_tile(SharedStorage& s, const CUtensorMap& map, Warpgroup wg,
                             sm90::EpilogueTile tile) {
    if (wg.thread == 0)
      for (int k = 0; k < kSlots; ++k)
        load(s, map, wg.index, (consumed + uint32_t(k)) % kSlots, tile.row0, tile.col0, k);
  }

  // One thread, at the start of subtile n (next = n + 1), before subtile n is acquired: everyone
  // has read subtile n - 1, so its slot (the one before the ring position) takes subtile
  // n + kSlots - 1. The tile's origin is the next subtile's, less its offset in the tile.
  __device__ void prefetch(SharedStorage& s, const CUtensorMap& map, Warpgroup wg,
                           const Subtile& next) {
    const int n = next.block * Shape::kSubtilesN + next.slab - 1;
    if (n >= 1 && n + kSlots - 1 < kSubtiles)
      load(s, map, wg.index, (consumed + kSlots - 1) % kSlots,
           next.row0 - next.block * Shape::kSubRows, next.col0 - next.slab * Shape::kSubCols,
           n + kSlots - 1);
  }

  // Every thread, once per subtile in order: waits until the subtile has landed; its buffer.
  __device__ const uint8_t* acquire(SharedStorage& s, Warpgroup wg) {
    const uint32_t slot = consumed % kSlots;
    wait_loaded(&s.full[wg.index][slot], phase, slot);
    ++consumed;
    return s.tile[wg.index][slot];
  }

private:
  // One thread: TMA-load subtile k of the tile at (row0, col0) into `slot`.
  __device__ static void load(SharedStorage& s, const CUtensorMap& map, int warpgroup,
                              uint32_t slot, int32_t row0, int32_t col0, int k) {
    // NOTE: not tile_io's load_subtile, whose arguments are computed before the barrier is armed:
    // that reorders K0's, K6's and K7's code.
    namespace ptx = cuda::ptx;
    uint64_t* bar = &s.full[warpgroup][slot];
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar,
                                   kBytes);
    const int32_t coords[2] = {col0 + (k % Shape::kSubtilesN) * Shape::kSubCols,
                               row0 + (k / Shape::kSubtilesN) * Shape::kSubRows};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, s.tile[warpgroup][slot], &map,
                              coords, bar);
  }
};

} // namespace coda::epilogue::device
