// Device side of ResidualAdd (coda/epilogue/ops/residual_add.hpp): value + scale * tile[m, n],
// the tile (the residual stream) loaded by TMA through the epilogue-load pipeline of
// load_ring.cuh: a ring of kSlots subtile buffers per warpgroup, the tile's first kSlots subtiles
// loaded before the mainloop, the rest kSlots - 1 subtiles ahead of their use. kSlots is 4 for
// K0; K6 takes 2 for its dx, to leave shared memory for a third pipeline stage. The ring's
// bookkeeping wants the rolled subtile loop: unrolled, K0 spilled 204-288 bytes (ptxas).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/load_ring.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"

namespace coda::epilogue::device {

template <class Shape, class T, int kSlots_ = 4> struct ResidualAdd : OpBase {
  using Layout = SubtileLayout<T>;
  static_assert(sizeof(T) == 2, "16-bit residual tiles");
  static constexpr int kSlots = kSlots_;
  using Ring = SubtileLoadRing<Shape, Layout::kBytes, kSlots>;
  static constexpr bool kRollSubtiles = true;

  struct Params {
    CUtensorMap map; // subtile_map of the residual [M, N]
    float scale = 1.f;
  };
  using SharedStorage = typename Ring::SharedStorage;
  using Ctx = OpContext<Params, SharedStorage>;

  Ring ring;

  __device__ static void init(SharedStorage& s) { Ring::init(s); }
  __device__ void begin_kernel(const Ctx&) { ring.begin_kernel(); }
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    ring.begin_tile(c.smem, c.params.map, c.wg, tile);
  }
  __device__ void prefetch(const Ctx& c, const Subtile& next) {
    ring.prefetch(c.smem, c.params.map, c.wg, next);
  }

  __device__ void visit(const Ctx& c, const Subtile&, float (&v)[16]) {
    const uint8_t* tile = ring.acquire(c.smem, c.wg);
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
};

} // namespace coda::epilogue::device
