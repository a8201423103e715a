// Device side of a pairwise 2 -> 1 op on the interleaved layout (coda/epilogue/ops/swiglu.hpp):
// columns (2j, 2j + 1) hold (gate, up) of feature j, in registers (i, i + 1) of one thread, and
// out[m, j] = Gate{}(gate, up) goes to a half-width [M, N / 2] output. The fragment is left as
// it is (the pre-activation is usually stored too). Each subtile's 64 x 16 outputs are staged in
// an unswizzled shared buffer and TMA-stored.
//
// Gate is a functor `float operator()(float gate, float up) const`: SwigluGate for SwiGLU, or
// any other gated activation (examples/ has GeGLU).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/swiglu.hpp"

namespace coda::epilogue::device {

struct SwigluGate {
  __device__ float operator()(float gate, float up) const { return swiglu(gate, up); }
};

template <class Shape, class T, class Gate> struct GatedPairStore : OpBase {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static constexpr int kOutCols = Shape::kSubCols / 2;

  struct Params {
    CUtensorMap map; // half_subtile_map of the [M, N / 2] output
  };
  struct SharedStorage {
    alignas(128) uint16_t tile[Shape::kWarpgroups][2][Shape::kSubRows][kOutCols];
  };

  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    auto& tile = c.smem.tile[c.wg.index][st.slot];
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      tile[SubtileMap::row(c.wg.thread, i)][SubtileMap::col(c.wg.thread, i) / 2] =
          from_float<T>(Gate{}(v[i], v[i + 1]));
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    namespace ptx = cuda::ptx;
    const int32_t coords[2] = {st.col0 / 2, st.row0};
    ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &c.params.map, coords,
                              &c.smem.tile[c.wg.index][st.slot][0][0]);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{half_subtile_map(what, out)};
  }
};

} // namespace coda::epilogue::device
