// Device side of StoreTile (coda/epilogue/ops/store.hpp): the fragment's current values, rounded
// once to T, written to an [M, N] tensor: the main output or a side output taken at this point
// of the op chain. Registers -> swizzled shared memory (stmatrix for 16-bit) -> TMA store, which
// clips rows and columns past the edges. kReduceAdd stores by TMA reduce-add instead
// (out += value, in T: the existing value and the sum each round once; no atomics). kInPlace
// (one store of a list, on the staged schedule) stores from the staged tile itself. DirectStore
// is StoreTile's other device twin: from registers straight to global memory, no buffers.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"

namespace coda::epilogue::device {

template <class Shape, class T, bool kReduceAdd = false, bool kInPlace = false>
struct TileStore : OpBase {
  using Layout = SubtileLayout<T>;
  // In place (the staged schedule's main output): the values go back into the staged subtile the
  // driver read them from, and the TMA store reads them there: no buffers of its own. Elsewhere,
  // or without kInPlace, two buffers per warpgroup (the driver alternates the slot per subtile).
  static constexpr bool kUsesStage = kInPlace && Shape::kStaged;
  static_assert(!kUsesStage || sizeof(T) == 2, "the staged tile holds 16-bit values");

  struct Params {
    CUtensorMap map; // subtile_map of the output
  };
  struct OwnBuffers {
    alignas(1024) uint8_t tile[Shape::kWarpgroups][2][Layout::kBytes];
  };
  using SharedStorage = std::conditional_t<kUsesStage, OpBase::SharedStorage, OwnBuffers>;

  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    write_subtile<T>(buffer(c, st), c.wg.thread, v);
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    namespace ptx = cuda::ptx;
    const int32_t coords[2] = {st.col0, st.row0};
    if constexpr (kReduceAdd)
      ptx::cp_reduce_async_bulk_tensor(ptx::space_global, ptx::space_shared, ptx::op_add,
                                       &c.params.map, coords, buffer(c, st));
    else
      store_subtile(&c.params.map, buffer(c, st), st.col0, st.row0);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{subtile_map(what, out)};
  }

private:
  __device__ static uint8_t* buffer(const Ctx& c, const Subtile& st) {
    if constexpr (kUsesStage)
      return st.staged;
    else
      return c.smem.tile[c.wg.index][st.slot];
  }
};

// StoreTile from registers straight to global memory, for a list whose shared memory is spoken
// for: K0's residual ring and two TMA-stored outputs left the cooperative 128 x 256 tile 3
// pipeline stages, and the 3-stage mainloop waited for operands on 17% of its consumers' samples
// (ncu, Llama-1B out-projection, 06a27c3); with one output stored here it keeps 4. Each thread
// stores its rounded pairs, 4 bytes per register pair: a quad covers 16 contiguous bytes of a row
// and its two column groups 8 apart a 32-byte sector. Subtiles inside the tensor (a test the
// warpgroup agrees on) store unpredicated; at the edges, rows and column groups past them are
// skipped (N is a multiple of 8, so a column group of 8 lies wholly inside or past the edge).
template <class Shape, class T> struct DirectStore : OpBase {
  static_assert(sizeof(T) == 2, "16-bit outputs: one 32-bit word per register pair");

  struct Params {
    uint32_t* out = nullptr; // [M, N] as pairs of T
    int64_t stride = 0;      // row stride in pairs
    int32_t rows = 0, cols = 0;
  };
  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    const int32_t row = st.row0 + SubtileMap::row(c.wg.thread, 0);
    const int32_t col = st.col0 + SubtileMap::col(c.wg.thread, 0);
    uint32_t* at = p.out + int64_t(row) * p.stride + col / 2;
    if (st.row0 + Shape::kSubRows <= p.rows && st.col0 + Shape::kSubCols <= p.cols) {
#pragma unroll
      for (int i = 0; i < 16; i += 2) at[offset(i, p.stride)] = pack2<T>(v[i], v[i + 1]);
      return;
    }
    bool row_in[2], col_in[4];
#pragma unroll
    for (int s = 0; s < 2; ++s) row_in[s] = row + 8 * s < p.rows;
#pragma unroll
    for (int g = 0; g < 4; ++g) col_in[g] = col + 8 * g < p.cols;
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      if (row_in[(i / 2) % 2] && col_in[i / 4]) at[offset(i, p.stride)] = pack2<T>(v[i], v[i + 1]);
  }

  static Params params(const TensorView& out) {
    Params p;
    p.out = out.ptr<uint32_t>();
    p.stride = out.stride[0] / 2; // rows are 16-byte aligned (api/rules.cpp)
    p.rows = int32_t(out.shape[0]);
    p.cols = int32_t(out.shape[1]);
    return p;
  }

private:
  // Register pair i (i even) of the subtile: row slot (i / 2) % 2 (8 rows down) and column group
  // i / 4 (8 columns, 4 pairs, right) of pair 0.
  __device__ static int64_t offset(int i, int64_t stride) {
    return (i / 2) % 2 * 8 * stride + i / 4 * 4;
  }
  static_assert(SubtileMap::row(0, 2) == SubtileMap::row(0, 0) + 8 &&
                    SubtileMap::col(0, 4) == SubtileMap::col(0, 0) + 8 &&
                    SubtileMap::col(0, 1) == SubtileMap::col(0, 0) + 1,
                "offsets follow the accumulator map (fragment.hpp)");
};

} // namespace coda::epilogue::device
