// Moving one 64 x 32 subtile between a thread's 16 fragment values and a swizzled shared-memory
// buffer laid out as TMA reads and writes it. Shared by the ops that load tiles (ResidualAdd) and
// store them (TileStore).
//
// A buffer holds the subtile row-major, 32 elements per row: 64-byte rows for 16-bit types
// (64-byte swizzle), 128-byte rows for fp32 (128-byte swizzle); 1024-byte aligned.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/smem_desc.hpp"
#include "coda/arch/stmatrix.cuh"
#include "coda/core/convert.cuh"
#include "coda/core/fragment.hpp"
#include "coda/core/types.hpp"

namespace coda::epilogue::device {

template <class T> struct SubtileLayout {
  static constexpr int kRows = 64, kCols = 32;
  static constexpr int kRowBytes = kCols * int(sizeof(T));
  static constexpr uint32_t kBytes = uint32_t(kRows * kRowBytes);
  static constexpr arch::Swizzle kSwizzle =
      kRowBytes == 128 ? arch::Swizzle::b128 : arch::Swizzle::b64;
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16-bit or fp32 elements");

  // Byte offset of (row, col) in the swizzled buffer.
  __device__ static uint32_t offset(int row, int col) {
    return arch::swizzle_offset(kSwizzle, uint32_t(row * kRowBytes + col * int(sizeof(T))));
  }
};

// The 16-bit conversions (coda/core/convert.cuh), also under this namespace's name (dev::pack2).
using coda::from_float;
using coda::pack2;
using coda::to_float;
using coda::unpack2;

// An epilogue output's TMA store of one box from `smem` at (col, row). (An L2 evict_first hint
// on these stores measured no difference: docs/epilogue.md, experiments.)
__device__ __forceinline__ void store_subtile(const CUtensorMap* map, const void* smem, int32_t col,
                                              int32_t row) {
  namespace ptx = cuda::ptx;
  const int32_t coords[2] = {col, row};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, smem);
}

using SubtileMap = AccumulatorMap<32>; // registers 0..15 of a subtile: the map of a 32-wide block

// Writes this thread's 16 values of the subtile into `buffer` (all 128 threads together write
// the whole subtile). 16-bit: two stmatrix.x4 per warp, each a 16-column block whose lane l
// addresses row 16 warp + (l & 15), column 16 j + 8 (l >> 4). fp32: column pairs directly.
template <class T>
__device__ __forceinline__ void write_subtile(uint8_t* buffer, int thread, const float (&v)[16]) {
  using L = SubtileLayout<T>;
  if constexpr (sizeof(T) == 2) {
    const int warp = thread / 32, lane = thread % 32;
    const uint32_t base = uint32_t(__cvta_generic_to_shared(buffer));
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t addr = base + L::offset(16 * warp + (lane & 15), 16 * j + 8 * (lane >> 4));
      arch::stmatrix_x4(addr, pack2<T>(v[8 * j], v[8 * j + 1]),
                        pack2<T>(v[8 * j + 2], v[8 * j + 3]), pack2<T>(v[8 * j + 4], v[8 * j + 5]),
                        pack2<T>(v[8 * j + 6], v[8 * j + 7]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t off = L::offset(SubtileMap::row(thread, i), SubtileMap::col(thread, i));
      *reinterpret_cast<float2*>(buffer + off) = make_float2(v[i], v[i + 1]);
    }
  }
}

// The column pair (col, col + 1) of `row` from a 16-bit subtile buffer, as fp32.
template <class T>
__device__ __forceinline__ float2 read_pair(const uint8_t* buffer, int row, int col) {
  static_assert(sizeof(T) == 2, "16-bit tiles");
  return unpack2<T>(
      *reinterpret_cast<const uint32_t*>(buffer + SubtileLayout<T>::offset(row, col)));
}

} // namespace coda::epilogue::device
