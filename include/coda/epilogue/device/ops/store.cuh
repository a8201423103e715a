// Device side of StoreTile (coda/epilogue/ops/store.hpp): the fragment's current values, rounded
// once to T, written to an [M, N] tensor: the main output or a side output taken at this point
// of the op chain. Registers -> swizzled shared memory (stmatrix for 16-bit) -> TMA store, which
// clips rows and columns past the edges. kReduceAdd stores by TMA reduce-add instead
// (out += value, in T: the existing value and the sum each round once; no atomics).
//
// kDeferred > 0 (16-bit, plain stores) holds the last kDeferred subtiles of each tile back as
// packed 16-bit pairs in registers (8 per subtile) and stores them one per k-block of the next
// tile's mainloop, while the tensor cores run, as the plain GEMM does (gemm/linear_epilogue.cuh):
// the cooperative schedule otherwise stores the whole tile while the tensor cores wait. Those
// stores go through buffer slot 0 alone, each after every earlier store has read its buffer
// (the previous one left a k-block earlier); what a short k-range leaves is stored at the next
// tile's begin_visit or at finish, which also wait for those reads before the driver's
// alternating slots are reused.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"

namespace coda::epilogue::device {

template <class Shape, class T, bool kReduceAdd = false, int kDeferred = 0>
struct TileStore : OpBase {
  using Layout = SubtileLayout<T>;
  static_assert(kDeferred == 0 || (sizeof(T) == 2 && !kReduceAdd),
                "deferred stores hold 16-bit pairs and store them plainly");
  static_assert(kDeferred <= Shape::kSubtilesN, "deferred subtiles are the last 64-row block's");

  struct Params {
    CUtensorMap map; // subtile_map of the output
  };
  struct SharedStorage {
    alignas(1024) uint8_t tile[Shape::kWarpgroups][2][Layout::kBytes];
  };

  using Ctx = OpContext<Params, SharedStorage>;

  // The held subtiles: a queue of packed pairs, head at held[0] (shifted, never indexed at run
  // time: a run-time index would put the array in local memory).
  uint32_t held[kDeferred > 0 ? kDeferred : 1][8];
  int32_t held_count;
  int32_t held_row0, held_col0; // where the head goes; the next ones follow 32 columns apart

  __device__ static bool deferred(const Subtile& st) {
    return kDeferred > 0 && st.block == Shape::kBlocks - 1 &&
           st.slab >= Shape::kSubtilesN - kDeferred;
  }

  __device__ void begin_kernel(const Ctx&) { held_count = 0; }

  // What the previous tile's (short) mainloop left, then every store has read its buffer.
  __device__ void begin_visit(const Ctx& c, sm90::EpilogueTile) {
    if constexpr (kDeferred > 0) {
      store_held(c, kDeferred);
      if (c.wg.thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      // (the driver's barrier before the first subtile orders this wait before any write)
    }
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    if (deferred(st)) {
      if constexpr (kDeferred > 0) {
        if (st.slab == Shape::kSubtilesN - kDeferred) held_row0 = st.row0, held_col0 = st.col0;
#pragma unroll
        for (int j = 0; j + 1 < kDeferred; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i) held[j][i] = held[j + 1][i];
        pack_subtile<T>(held[kDeferred - 1], v);
        ++held_count;
      }
      return;
    }
    write_subtile<T>(c.smem.tile[c.wg.index][st.slot], c.wg.thread, v);
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    if (deferred(st)) return;
    store(c, c.smem.tile[c.wg.index][st.slot], st.row0, st.col0);
  }

  __device__ void overlap_with_mainloop(const Ctx& c, int32_t) {
    if constexpr (kDeferred > 0) store_held(c, 1);
  }

  __device__ void finish(const Ctx& c) {
    if constexpr (kDeferred > 0) store_held(c, kDeferred);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{subtile_map(what, out)};
  }

private:
  // One thread: TMA-store (or reduce-add) a written and fenced buffer at (row0, col0).
  __device__ static void store(const Ctx& c, uint8_t* buffer, int32_t row0, int32_t col0) {
    namespace ptx = cuda::ptx;
    const int32_t coords[2] = {col0, row0};
    if constexpr (kReduceAdd)
      ptx::cp_reduce_async_bulk_tensor(ptx::space_global, ptx::space_shared, ptx::op_add,
                                       &c.params.map, coords, buffer);
    else
      ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &c.params.map, coords,
                                buffer);
  }

  // Stores up to `count` held subtiles, in order, each as its own bulk group through slot 0.
  __device__ void store_held(const Ctx& c, int count) {
    for (; count > 0 && held_count > 0; --count, --held_count) {
      uint8_t* buffer = c.smem.tile[c.wg.index][0];
      if (c.wg.thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      c.wg.sync();
      write_packed_subtile<T>(buffer, c.wg.thread, held[0]);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      c.wg.sync();
      if (c.wg.thread == 0) {
        store(c, buffer, held_row0, held_col0);
        cuda::ptx::cp_async_bulk_commit_group();
      }
      held_col0 += Shape::kSubCols;
#pragma unroll
      for (int j = 0; j + 1 < kDeferred; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) held[j][i] = held[j + 1][i];
    }
  }
};

} // namespace coda::epilogue::device
