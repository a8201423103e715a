// Device side of ResidualAdd (coda/epilogue/ops/residual_add.hpp): value + scale * tile[m, n],
// the tile (the residual stream) loaded by TMA through an epilogue-load pipeline: a ring of
// kSlots subtile buffers per warpgroup. The tile's first kSlots subtiles are loaded before the
// mainloop; the rest kSlots - 1 subtiles ahead of their use, since one subtile's math is far
// shorter than a load's latency. A full mbarrier per slot (one arrival + the transaction bytes)
// says when a slot has landed. TMA zero-fills past the tensor's edges. kSlots is 4 for K0; K6
// takes 2 for its dx, to leave shared memory for a third pipeline stage.
//
// NOTE: load_ring.cuh's SubtileLoadRing is this ring with fewer registers held across the
// mainloop (the tile's origin and first slot are recomputed, not kept); it serves the backward
// ops. ResidualAdd keeps its own so that K0's tuned code stays as measured; moving it onto
// SubtileLoadRing is a change to measure.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"

namespace coda::epilogue::device {

template <class Shape, class T, int kSlots_ = 4> struct ResidualAdd : OpBase {
  using Layout = SubtileLayout<T>;
  static_assert(sizeof(T) == 2, "16-bit residual tiles");
  static constexpr int kSlots = kSlots_;
  // Unrolled, the ring's bookkeeping per subtile runs the consumer out of registers.
  static constexpr bool kRollSubtiles = true;
  static constexpr int kSubtiles = Shape::kBlocks * Shape::kSubtilesN; // of a tile
  static_assert(kSubtiles >= kSlots, "a tile fills the ring");

  struct Params {
    CUtensorMap map; // subtile_map of the residual [M, N]
    float scale = 1.f;
  };
  struct SharedStorage {
    alignas(1024) uint8_t tile[Shape::kWarpgroups][kSlots][Layout::kBytes];
    uint64_t full[Shape::kWarpgroups][kSlots];
  };
  using Ctx = OpContext<Params, SharedStorage>;

  uint32_t consumed;   // subtiles this warpgroup has visited: the ring position
  uint32_t tile_first; // `consumed` when the current tile began
  uint32_t phase;      // bit s: the parity the next wait on slot s expects
  int32_t tile_row0, tile_col0;

  __device__ static void init(SharedStorage& s) {
    for (int w = 0; w < Shape::kWarpgroups; ++w)
      for (int slot = 0; slot < kSlots; ++slot) cuda::ptx::mbarrier_init(&s.full[w][slot], 1);
  }
  __device__ void begin_kernel(const Ctx&) { consumed = phase = 0; }

  // The tile's first kSlots subtiles, before the mainloop (the previous tile has read them all).
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    tile_row0 = tile.row0, tile_col0 = tile.col0, tile_first = consumed;
    if (c.wg.thread == 0)
      for (int k = 0; k < kSlots; ++k) load(c, k);
  }
  // At the start of subtile n (next = n + 1), everyone has read subtile n - 1: its slot takes
  // subtile n + kSlots - 1.
  __device__ void prefetch(const Ctx& c, const Subtile& next) {
    const int n = next.block * Shape::kSubtilesN + next.slab - 1;
    if (n >= 1 && n + kSlots - 1 < kSubtiles) load(c, n + kSlots - 1);
  }

  __device__ void visit(const Ctx& c, const Subtile&, float (&v)[16]) {
    const uint32_t slot = consumed % kSlots;
    sm90::mbarrier_wait(&c.smem.full[c.wg.index][slot], (phase >> slot) & 1);
    phase ^= 1u << slot;
    ++consumed;
    const uint8_t* tile = c.smem.tile[c.wg.index][slot];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const float2 r =
          read_pair<T>(tile, SubtileMap::row(c.wg.thread, i), SubtileMap::col(c.wg.thread, i));
      v[i] = residual_add(v[i], r.x, c.params.scale);
      v[i + 1] = residual_add(v[i + 1], r.y, c.params.scale);
    }
  }

  static Params params(const TensorView& residual, float scale) {
    Params out;
    out.map = subtile_map("residual", residual);
    out.scale = scale;
    return out;
  }

private:
  // One thread: TMA-load subtile k of the current tile into its ring slot.
  __device__ void load(const Ctx& c, int k) {
    namespace ptx = cuda::ptx;
    const uint32_t slot = (tile_first + uint32_t(k)) % kSlots;
    uint64_t* bar = &c.smem.full[c.wg.index][slot];
    const uint32_t bytes = Layout::kBytes;
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
    const int32_t coords[2] = {tile_col0 + (k % Shape::kSubtilesN) * Shape::kSubCols,
                               tile_row0 + (k / Shape::kSubtilesN) * Shape::kSubRows};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, c.smem.tile[c.wg.index][slot],
                              &c.params.map, coords, bar);
  }
};

} // namespace coda::epilogue::device
