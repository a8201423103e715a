// Tile inputs and outputs of the staged_wide schedule's epilogue warps (driver.cuh, kStrips), by
// TMA in 16-row strips: each warp visits its own strips of the staged tile, so each has its own
// buffers and barriers, and its lane 0 issues its copies. Global loads and stores from registers
// measured far slower there (4-byte accesses, 8 rows per warp instruction: K0 1.3-3.4x the plain
// GEMM, docs/epilogue.md).
//   ResidualAddStrips<Shape, T, kSlots>   x + scale * residual, the residual's strips loaded
//                                         kSlots ahead of use into a per-warp ring
//   StripStore<Shape, T>                  a side output from two per-warp strip buffers
// A warp's stream of strip-subtiles, in the order the driver visits them: its strips (tile strip
// e, e + kEpilogueWarps, ... for epilogue warp e), each left to right over the tile's slabs.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/gemm/pipeline.cuh"

namespace coda::epilogue::device {

// Where the warp's stream goes: position n of epilogue warp e is slab n % kSlabs of the tile's
// strip e + kEpilogueWarps (n / kSlabs); strip s is rows 16 (s % 4) of 64-row block s / 4.
template <class Shape> struct StripStream {
  static constexpr int kSlabs = Shape::kSubtilesN;
  static constexpr int kStripsPerBlock = Shape::kSubRows / kStripRows;
  static constexpr int kStrips = Shape::kBlocks * kStripsPerBlock;
  // The tile strip of position n of epilogue warp `warp`, and how many positions it has.
  __device__ static int position_strip(int warp, int n) {
    return warp + Shape::kEpilogueWarps * (n / kSlabs);
  }
  __device__ static int positions(int warp) {
    const int strips = (kStrips - warp + Shape::kEpilogueWarps - 1) / Shape::kEpilogueWarps;
    return strips * kSlabs;
  }
  // The epilogue warp visiting the strip-subtile `st` as virtual warp w (its rows 16 w ..).
  __device__ static int owner(const Subtile& st, int w) {
    return (st.block * kStripsPerBlock + w) % Shape::kEpilogueWarps;
  }
  __device__ static int position(const Subtile& st, int w) {
    const int strip = st.block * kStripsPerBlock + w;
    return strip / Shape::kEpilogueWarps * kSlabs + st.slab;
  }
};

template <class Shape, class T, int kSlots = 3> struct ResidualAddStrips : OpBase {
  static_assert(sizeof(T) == 2, "16-bit residual tiles");
  static_assert(Shape::kStaged && Shape::kEpilogueWarps < 4, "the staged_wide epilogue's op");
  using Stream = StripStream<Shape>;
  static constexpr uint32_t kBytes = kStripRows * SubtileLayout<T>::kRowBytes; // one strip

  struct Params {
    CUtensorMap map; // subtile_map of the residual [M, N] in kStripRows-row boxes
    float scale = 1.f;
  };
  struct SharedStorage {
    alignas(1024) uint8_t strip[Shape::kEpilogueWarps][kSlots][kBytes];
    uint64_t full[Shape::kEpilogueWarps][kSlots];
  };
  using Ctx = OpContext<Params, SharedStorage>;
  // Each warp keeps to its own buffers: warp-local. The ring's bookkeeping wants the rolled
  // subtile loop: unrolled in the 88 registers of the producer warpgroup, K0 spilled 96-220 bytes.
  static constexpr bool kWarpLocal = true;
  static constexpr bool kBulkStores = false;
  static constexpr bool kRollSubtiles = true;

  uint32_t consumed; // positions this warp has read, over all tiles: the ring position
  uint32_t phase;    // bit s: the parity the next wait on slot s expects

  __device__ static void init(SharedStorage& s) {
    for (int w = 0; w < Shape::kEpilogueWarps; ++w)
      for (int slot = 0; slot < kSlots; ++slot) cuda::ptx::mbarrier_init(&s.full[w][slot], 1);
  }
  __device__ void begin_kernel(const Ctx&) { consumed = phase = 0; }

  // The tile's first kSlots positions, before the staged tile arrives (the previous tile's
  // positions are all read: the ring is free).
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    const int warp = epilogue_warp(c);
    if (c.wg.lane() != 0) return;
    const int count = Stream::positions(warp) < kSlots ? Stream::positions(warp) : kSlots;
    for (int k = 0; k < count; ++k)
      load(c, warp, (consumed + uint32_t(k)) % kSlots, tile.row0, tile.col0, k);
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const int w = c.wg.warp(); // the virtual warp: this strip's rows in its subtile
    const int warp = Stream::owner(st, w);
    const uint32_t slot = consumed % kSlots;
    sm90::mbarrier_wait(&c.smem.full[warp][slot], (phase >> slot) & 1);
    phase ^= 1u << slot;
    ++consumed;
    const uint8_t* strip = c.smem.strip[warp][slot];
    // The strip buffer holds rows 16 w .. of the subtile's layout (the swizzle repeats every 8
    // rows): address it as the subtile it is part of.
    const uint8_t* subtile = strip - w * int(kBytes);
    float r[16];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const float2 x =
          read_pair<T>(subtile, SubtileMap::row(c.wg.thread, i), SubtileMap::col(c.wg.thread, i));
      r[i] = x.x, r[i + 1] = x.y;
    }
    __syncwarp(); // every lane has read the slot
    const int next = Stream::position(st, w) + kSlots;
    if (c.wg.lane() == 0 && next < Stream::positions(warp))
      load(c, warp, slot, st.row0 - st.block * Shape::kSubRows,
           st.col0 - st.slab * Shape::kSubCols, next);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = residual_add(v[i], r[i], c.params.scale);
  }

  static Params params(const TensorView& residual, float scale) {
    return Params{subtile_map("residual", residual, kStripRows), scale};
  }

private:
  __device__ static int epilogue_warp(const Ctx& c) {
    return c.wg.warp() - (4 - Shape::kEpilogueWarps);
  }
  // Lane 0: position n of `warp`'s stream of the tile at (row0, col0) into `slot`.
  __device__ static void load(const Ctx& c, int warp, uint32_t slot, int32_t row0, int32_t col0,
                              int n) {
    namespace ptx = cuda::ptx;
    const int strip = Stream::position_strip(warp, n);
    uint64_t* bar = &c.smem.full[warp][slot];
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar,
                                   uint32_t(kBytes)); // a copy: the wrapper takes a reference
    const int32_t coords[2] = {col0 + n % Stream::kSlabs * Shape::kSubCols,
                               row0 + strip / Stream::kStripsPerBlock * Shape::kSubRows +
                                   strip % Stream::kStripsPerBlock * kStripRows};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, c.smem.strip[warp][slot],
                              &c.params.map, coords, bar);
  }
};

// A side output of the staged_wide epilogue: each warp writes its strip of a subtile into one of
// its two strip buffers (alternating: the driver's per-warp subtile parity) and TMA-stores it.
template <class Shape, class T> struct StripStore : OpBase {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static_assert(Shape::kStaged && Shape::kEpilogueWarps < 4, "the staged_wide epilogue's op");
  using Stream = StripStream<Shape>;
  static constexpr uint32_t kBytes = kStripRows * SubtileLayout<T>::kRowBytes;

  struct Params {
    CUtensorMap map; // subtile_map of the output in kStripRows-row boxes
  };
  struct SharedStorage {
    alignas(1024) uint8_t strip[Shape::kEpilogueWarps][2][kBytes];
  };
  using Ctx = OpContext<Params, SharedStorage>;
  static constexpr bool kWarpLocal = true;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    // The bulk store that last read this buffer (two strip-subtiles ago) is done; lane 0
    // committed it, so lane 0 waits and the warp follows.
    if (c.wg.lane() == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
    __syncwarp();
    const int w = c.wg.warp();
    write_subtile<T>(buffer(c, st) - w * int(kBytes), c.wg.thread, v);
  }

  // Lane 0, after the driver's fence: the strip (st.rows = kStripRows rows from st.row0).
  // The driver calls it with the thread still the strip's virtual one, so the buffer is found
  // as in visit().
  __device__ void issue(const Ctx& c, const Subtile& st) {
    store_subtile(&c.params.map, buffer(c, st), st.col0, st.row0);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{subtile_map(what, out, kStripRows)};
  }

private:
  __device__ static uint8_t* buffer(const Ctx& c, const Subtile& st) {
    return c.smem.strip[Stream::owner(st, c.wg.warp())][st.slot];
  }
};

} // namespace coda::epilogue::device
