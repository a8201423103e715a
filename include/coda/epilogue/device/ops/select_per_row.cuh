// Device side of SelectPerRow (coda/epilogue/ops/select_per_row.hpp): out[m] = value[m, index[m]]
// in fp32, written by the one thread that holds that column; 0 where index[m] is outside [0, N),
// written by the tiles at column 0.
#pragma once

#include <cstdint>

#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/ops/select_per_row.hpp"

namespace coda::epilogue::device {

template <class Shape> struct SelectPerRow : OpBase {
  struct Params {
    const int32_t* index = nullptr; // [M]
    float* out = nullptr;           // [M]
    int32_t rows = 0;               // M
    int32_t cols = 0;               // N
  };

  using Ctx = OpContext<Params, SharedStorage>;

  int32_t column[Shape::kBlocks][2]; // of this thread's two rows per block; -1: none

  __device__ static int32_t row_of(const Ctx& c, int32_t row0, int block, int slot) {
    return row0 + 64 * block + Shape::Fragment::slot_row(c.wg.thread, slot);
  }

  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
#pragma unroll
    for (int b = 0; b < Shape::kBlocks; ++b)
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int32_t row = row_of(c, tile.row0, b, s);
        column[b][s] = row < c.params.rows ? c.params.index[row] : -1;
      }
  }

  __device__ void begin_visit(const Ctx& c, sm90::EpilogueTile tile) {
    const Params& p = c.params;
#pragma unroll
    for (int b = 0; b < Shape::kBlocks; ++b)
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int32_t row = row_of(c, tile.row0, b, s);
        const bool selects = selects_column(column[b][s], p.cols);
        if (!selects && row < p.rows && tile.col0 == 0 && c.wg.quad_lane() == 0) p.out[row] = 0.f;
        if (!selects) column[b][s] = -1;
      }
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (st.col0 + SubtileMap::col(c.wg.thread, i) == column[st.block][SubtileMap::row_slot(i)])
        c.params.out[st.row0 + SubtileMap::row(c.wg.thread, i)] = v[i];
  }

  // index [M] (int32 column per row), out [M] (f32); the GEMM's M and N.
  static Params params(const TensorView& index, const TensorView& out, int64_t rows,
                       int64_t cols) {
    return Params{index.ptr<const int32_t>(), out.ptr<float>(), int32_t(rows), int32_t(cols)};
  }
};

} // namespace coda::epilogue::device
