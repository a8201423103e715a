// Device side of a pairwise 2 -> 1 op on the interleaved layout (coda/epilogue/ops/swiglu.hpp):
// columns (2j, 2j + 1) hold (gate, up) of feature j, in registers (i, i + 1) of one thread, and
// out[m, j] = Gate{}(gate, up) goes to a half-width [M, N / 2] output. The fragment is left as
// it is (the pre-activation is usually stored too). Each subtile's 64 x 16 outputs are staged in
// a shared buffer (32-byte rows, 32-byte swizzle) and TMA-stored.
//
// A thread's outputs of a subtile are columns q, q + 4, q + 8, q + 12 (q its quad lane) of its
// two rows: 16-bit values 8 bytes apart. Stored one by one they were generic 16-bit stores at
// 3 wavefronts each (ncu, K2 at 1B). Instead, lanes q and q ^ 1 swap half of them (one shuffle
// per row), so that each holds two pairs of adjacent columns, and store those as two 32-bit words
// per row; with the swizzle (rows 4-7 of each 8 have their 16-byte halves swapped) a warp's
// store hits 32 distinct banks.
//
// Gate is a functor `float operator()(float gate, float up) const`, the host op's own (one
// definition for both backends): SwigluGate (ops/swiglu.hpp), GegluGate (ops/geglu.hpp), or any
// other gated activation.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/shared_memory.cuh"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/swiglu.hpp"

namespace coda::epilogue::device {

template <class Shape, class T, class Gate> struct GatedPairStore : OpBase {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static constexpr int kOutCols = Shape::kSubCols / 2;

  struct Params {
    CUtensorMap map; // half_subtile_map of the [M, N / 2] output
  };
  static constexpr int kRowBytes = kOutCols * 2;
  static_assert(kRowBytes == 32, "the exchange below lays out 64 x 16 output subtiles");
  static constexpr uint32_t kBytes = uint32_t(Shape::kSubRows * kRowBytes);
  struct SharedStorage {
    // 256-byte aligned: the 32-byte swizzle repeats every 8 rows of 32 bytes.
    alignas(256) uint8_t tile[Shape::kWarpgroups][2][kBytes];
  };

  using Ctx = OpContext<Params, SharedStorage>;

  // Byte offset of output (row, col) in a subtile buffer.
  __device__ static uint32_t offset(int row, int col) {
    return arch::swizzle_offset(arch::Swizzle::b32, uint32_t(row * kRowBytes + col * 2));
  }

  // Registers 4j + 2s, 4j + 2s + 1 hold the pair of output column 4j + q, row slot s.
  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const uint32_t base = uint32_t(__cvta_generic_to_shared(c.smem.tile[c.wg.index][st.slot]));
    const int q = c.wg.thread % 4;
    const bool odd = (q & 1) != 0;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        b[j] = from_float<T>(Gate{}(v[4 * j + 2 * s], v[4 * j + 2 * s + 1]));
      // Even lanes keep outputs 0 and 2 and take their odd neighbour's; odd lanes keep 1 and 3.
      const uint32_t give = odd ? (b[0] | (b[2] << 16)) : (b[1] | (b[3] << 16));
      const uint32_t got = __shfl_xor_sync(0xffffffffu, give, 1);
      // Even lane: columns (q, q + 1) and (q + 8, q + 9); odd: (q + 3, q + 4), (q + 11, q + 12).
      const uint32_t first = odd ? ((got & 0xffffu) | (b[1] << 16)) : (b[0] | (got << 16));
      const uint32_t second = odd ? ((got >> 16) | (b[3] << 16)) : (b[2] | (got & 0xffff0000u));
      const int row = SubtileMap::slot_row(c.wg.thread, s), col = odd ? q + 3 : q;
      arch::store_shared_u32(base + offset(row, col), first);
      arch::store_shared_u32(base + offset(row, col + 8), second);
    }
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    store_subtile(&c.params.map, c.smem.tile[c.wg.index][st.slot], st.col0 / 2, st.row0);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{half_subtile_map(what, out)};
  }
};

} // namespace coda::epilogue::device
