// Device side of ScalePerCol (coda/epilogue/ops/scale_per_col.hpp): x * s[n], e.g. the RMSNorm
// weight gamma. begin_tile copies the tile's kCols factors (16-bit, as stored) into shared
// memory by cp.async; each thread reads the pair of its column pair as one 32-bit word.
#pragma once

#include <cstdint>

#include <cuda_pipeline_primitives.h>

#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/scale_per_col.hpp"

namespace coda::epilogue::device {

template <class Shape, class T> struct ScalePerCol : OpBase {
  static_assert(sizeof(T) == 2, "16-bit factors (the dtype of the call's tensors)");
  static constexpr int kChunk = 8; // elements per 16-byte cp.async

  struct Params {
    const T* factors = nullptr; // [N], 16-byte aligned
    int32_t cols = 0;           // N, a multiple of 8
  };
  struct SharedStorage {
    alignas(16) T factors[Shape::kWarpgroups][Shape::kCols];
  };

  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    const Params& p = c.params;
    T* staged = c.smem.factors[c.wg.index];
    for (int col = c.wg.thread * kChunk; col < Shape::kCols; col += arch::kWarpgroupSize * kChunk) {
      const bool valid = tile.col0 + col < p.cols; // whole chunks: N is a multiple of 8
      __pipeline_memcpy_async(&staged[col], valid ? p.factors + tile.col0 + col : p.factors, 16,
                              valid ? 0 : 16);
    }
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const uint16_t* factors = reinterpret_cast<const uint16_t*>(c.smem.factors[c.wg.index]);
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int col = st.slab * Shape::kSubCols + SubtileMap::col(c.wg.thread, i);
      const float2 f = unpack2<T>(*reinterpret_cast<const uint32_t*>(factors + col));
      v[i] = scale_per_col(v[i], f.x);
      v[i + 1] = scale_per_col(v[i + 1], f.y);
    }
  }
  // The factors (N of them, as the GEMM's N) as the call stores them.
  static Params params(const TensorView& factors, int64_t cols) {
    return Params{factors.ptr<const T>(), int32_t(cols)};
  }
};

} // namespace coda::epilogue::device
