// Ops that read and write 16-bit [M, N] tensors in global memory from the thread's fragment, with
// no shared-memory buffers of their own: what the staged_wide schedule's epilogue warps can run
// (its staged 128 x 256 tile and three pipeline stages fill shared memory, and its warps visit
// 16-row strips on their own: driver.cuh, kStrips). They are warp-local ops (empty storage).
//
// A thread's 16 values of a 64 x 32 subtile are 8 column pairs (AccumulatorMap): pair i / 2
// (i even) at row `row + 8 ((i / 2) % 2)`, columns `col + 8 (i / 4)` and the next, where (row,
// col) is register 0's place; N is a multiple of 8, so a pair is wholly inside or past the edge.
// The four lanes of a quad cover 16 contiguous bytes of a row: one 4-byte access per pair.
//   ResidualAddGlobal   x + scale * residual[m, n], one subtile of residual pairs loaded ahead
//   ScalePerColGlobal   x * s[n], the factors read per subtile (L1-resident: 512 bytes a tile)
//   DirectStore         the fragment rounded to T, stored pair by pair
#pragma once

#include <cstdint>

#include "coda/arch/prefetch.cuh"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/scale_per_col.hpp"

namespace coda::epilogue::device {

// Where this thread's pairs of the subtile at (row0, col0) lie in a [rows, cols] tensor.
struct GlobalPairs {
  int32_t row, col; // of register pair 0
  __device__ GlobalPairs(int thread, int32_t row0, int32_t col0)
      : row(row0 + SubtileMap::row(thread, 0)), col(col0 + SubtileMap::col(thread, 0)) {}
  __device__ static constexpr int row_offset(int i) { return (i / 2) % 2 * 8; }
  __device__ static constexpr int col_offset(int i) { return i / 4 * 8; }
  __device__ int64_t offset(int i, int64_t stride) const {
    return int64_t(row + row_offset(i)) * stride + col + col_offset(i);
  }
  __device__ bool in(int i, int32_t rows, int32_t cols) const {
    return row + row_offset(i) < rows && col + col_offset(i) < cols;
  }
  // The whole subtile lies inside: its accesses go unpredicated (the same test for every
  // thread, so the warp does not diverge).
  __device__ static bool interior(int32_t row0, int32_t col0, int32_t rows, int32_t cols) {
    return row0 + SubtileLayout<uint16_t>::kRows <= rows &&
           col0 + SubtileLayout<uint16_t>::kCols <= cols;
  }
};
static_assert(SubtileMap::row(0, 2) == SubtileMap::row(0, 0) + 8 &&
                  SubtileMap::col(0, 4) == SubtileMap::col(0, 0) + 8,
              "GlobalPairs' offsets follow the accumulator map (fragment.hpp)");

// This thread's 8 pairs of the 16-bit tensor `base` (row stride `stride`) at subtile (row0,
// col0): zero past the edges.
__device__ __forceinline__ void load_global_pairs(const uint32_t* base, int64_t stride, int32_t rows,
                                                  int32_t cols, int thread, int32_t row0,
                                                  int32_t col0, uint32_t (&to)[8]) {
  const GlobalPairs at(thread, row0, col0);
  if (GlobalPairs::interior(row0, col0, rows, cols)) {
#pragma unroll
    for (int i = 0; i < 16; i += 2) to[i / 2] = __ldg(base + at.offset(i, stride) / 2);
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; i += 2)
    to[i / 2] = at.in(i, rows, cols) ? __ldg(base + at.offset(i, stride) / 2) : 0u;
}

template <class Shape, class T> struct ResidualAddGlobal : OpBase {
  static_assert(sizeof(T) == 2, "16-bit residual tensors");
  static constexpr bool kBulkStores = false;
  struct Params {
    const uint32_t* residual = nullptr; // [M, N] 16-bit, as pairs
    int64_t stride = 0;                 // row stride in elements (even: 16-byte aligned rows)
    int32_t rows = 0, cols = 0;
    float scale = 1.f;
  };
  using Ctx = OpContext<Params, SharedStorage>;

  // The residual pairs of the next subtile of the same rows (the driver visits a strip's or a
  // block's subtiles left to right), loaded while this one is computed.
  uint32_t pending[8];

  // From a consumer warpgroup starting the tile's mainloop: its 64 rows into L2, so that the
  // epilogue's loads a mainloop later hit there.
  __device__ void prefetch_tile(const Ctx& c, sm90::EpilogueTile rows) {
    const Params& p = c.params;
    constexpr int kLinesPerRow = Shape::kCols * int(sizeof(T)) / 128;
    constexpr int kLines = Shape::kSubRows * kLinesPerRow;
    static_assert(kLines % arch::kWarpgroupSize == 0, "whole lines per thread");
#pragma unroll
    for (int k = 0; k < kLines / arch::kWarpgroupSize; ++k) {
      const int line = k * arch::kWarpgroupSize + c.wg.thread;
      const int32_t row = rows.row0 + line / kLinesPerRow;
      const int32_t col = rows.col0 + line % kLinesPerRow * (128 / int(sizeof(T)));
      if (row < p.rows && col < p.cols)
        arch::prefetch_l2(p.residual + (int64_t(row) * p.stride + col) / 2);
    }
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    uint32_t r[8];
    if (st.slab == 0) {
      load_global_pairs(p.residual, p.stride, p.rows, p.cols, c.wg.thread, st.row0, st.col0, r);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = pending[i];
    }
    if (st.slab + 1 < Shape::kSubtilesN)
      load_global_pairs(p.residual, p.stride, p.rows, p.cols, c.wg.thread, st.row0,
                        st.col0 + Shape::kSubCols, pending);
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const float2 f = unpack2<T>(r[i / 2]);
      v[i] = residual_add(v[i], f.x, p.scale);
      v[i + 1] = residual_add(v[i + 1], f.y, p.scale);
    }
  }

  static Params params(const TensorView& residual, float scale) {
    return Params{residual.ptr<const uint32_t>(), residual.stride[0], int32_t(residual.shape[0]),
                  int32_t(residual.shape[1]), scale};
  }
};

template <class Shape, class T> struct ScalePerColGlobal : OpBase {
  static_assert(sizeof(T) == 2, "16-bit factors (the dtype of the call's tensors)");
  static constexpr bool kBulkStores = false;
  struct Params {
    const uint32_t* factors = nullptr; // [N] 16-bit, as pairs
    int32_t cols = 0;                  // N, a multiple of 8
  };
  using Ctx = OpContext<Params, SharedStorage>;

  // Registers 4j, 4j + 1 (row slot 0) and 4j + 2, 4j + 3 (row slot 1) share a column pair.
  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    const int32_t col = st.col0 + SubtileMap::col(c.wg.thread, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int32_t at = col + 8 * j;
      const float2 f = unpack2<T>(at < p.cols ? __ldg(p.factors + at / 2) : 0u);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        v[4 * j + 2 * s] = scale_per_col(v[4 * j + 2 * s], f.x);
        v[4 * j + 2 * s + 1] = scale_per_col(v[4 * j + 2 * s + 1], f.y);
      }
    }
  }

  static Params params(const TensorView& factors) {
    return Params{factors.ptr<const uint32_t>(), int32_t(factors.shape[0])};
  }
};

template <class Shape, class T> struct DirectStore : OpBase {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static constexpr bool kBulkStores = false;
  struct Params {
    uint32_t* out = nullptr; // [M, N] 16-bit, as pairs
    int64_t stride = 0;      // row stride in elements
    int32_t rows = 0, cols = 0;
  };
  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    const GlobalPairs at(c.wg.thread, st.row0, st.col0);
    if (GlobalPairs::interior(st.row0, st.col0, p.rows, p.cols)) {
#pragma unroll
      for (int i = 0; i < 16; i += 2) p.out[at.offset(i, p.stride) / 2] = pack2<T>(v[i], v[i + 1]);
      return;
    }
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      if (at.in(i, p.rows, p.cols)) p.out[at.offset(i, p.stride) / 2] = pack2<T>(v[i], v[i + 1]);
  }

  static Params params(const TensorView& out) {
    return Params{out.ptr<uint32_t>(), out.stride[0], int32_t(out.shape[0]),
                  int32_t(out.shape[1])};
  }
};

} // namespace coda::epilogue::device
