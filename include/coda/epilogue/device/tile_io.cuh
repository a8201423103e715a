// Moving one 64 x 32 subtile between a thread's 16 fragment values and a swizzled shared-memory
// buffer laid out as TMA reads and writes it, and between that buffer and global memory. Shared
// by the ops that load tiles (ResidualAdd) and store them (TileStore), the load ring, the staged
// tile (staged_tile.cuh's Subtile16) and the plain GEMM's LinearEpilogue.
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
#include "coda/gemm/pipeline.cuh"

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
  // 16-bit: lane l of warp w addresses row 16 w + (l & 15), column 16 j + 8 (l >> 4) for the
  // j-th stmatrix / ldmatrix.x4 of a subtile (j = 0, 1, a 16-column block): four 8 x 8
  // matrices, registers 4j .. 4j + 3 of the thread's 8 packed pairs (PTX ISA "stmatrix":
  // register r_i of lane l is row l / 4, columns 2 (l % 4), +1 of matrix i, whose row addresses
  // lanes 8i .. 8i + 7 give).
  __device__ static uint32_t lane_address(uint32_t base, int thread, int j) {
    const int warp = thread / 32, lane = thread % 32;
    return base + offset(16 * warp + (lane & 15), 16 * j + 8 * (lane >> 4));
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

// One thread: the TMA load of one box at (col, row) into `smem`, completing on the mbarrier
// `full` armed for its `bytes` (one arrival: the caller's).
__device__ __forceinline__ void load_subtile(const CUtensorMap* map, void* smem, int32_t col,
                                             int32_t row, uint64_t* full, uint32_t bytes) {
  namespace ptx = cuda::ptx;
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full, bytes);
  const int32_t coords[2] = {col, row};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, smem, map, coords, full);
}

// Every thread: waits until the load of `slot` (completing on `full`) has landed. Bit `slot` of
// `phases` is the parity of that barrier's next phase.
__device__ __forceinline__ void wait_loaded(uint64_t* full, uint32_t& phases, uint32_t slot) {
  sm90::mbarrier_wait(full, (phases >> slot) & 1);
  phases ^= 1u << slot;
}

using SubtileMap = AccumulatorMap<32>; // registers 0..15 of a subtile: the map of a 32-wide block

// Writes this thread's 16 values of the subtile into `buffer` (all 128 threads together write
// the whole subtile). 16-bit: two stmatrix.x4 per warp (SubtileLayout::lane_address). fp32:
// column pairs directly.
template <class T>
__device__ __forceinline__ void write_subtile(uint8_t* buffer, int thread, const float (&v)[16]) {
  using L = SubtileLayout<T>;
  if constexpr (sizeof(T) == 2) {
    const uint32_t base = uint32_t(__cvta_generic_to_shared(buffer));
#pragma unroll
    for (int j = 0; j < 2; ++j)
      arch::stmatrix_x4(L::lane_address(base, thread, j), pack2<T>(v[8 * j], v[8 * j + 1]),
                        pack2<T>(v[8 * j + 2], v[8 * j + 3]), pack2<T>(v[8 * j + 4], v[8 * j + 5]),
                        pack2<T>(v[8 * j + 6], v[8 * j + 7]));
  } else {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t off = L::offset(SubtileMap::row(thread, i), SubtileMap::col(thread, i));
      *reinterpret_cast<float2*>(buffer + off) = make_float2(v[i], v[i + 1]);
    }
  }
}

// The same for 16-bit values already packed: packed[i] = pack2<T>(v[2i], v[2i + 1]).
template <class T>
__device__ __forceinline__ void write_subtile(uint8_t* buffer, int thread,
                                              const uint32_t (&packed)[8]) {
  static_assert(sizeof(T) == 2, "16-bit pairs");
  const uint32_t base = uint32_t(__cvta_generic_to_shared(buffer));
#pragma unroll
  for (int j = 0; j < 2; ++j)
    arch::stmatrix_x4(SubtileLayout<T>::lane_address(base, thread, j), packed[4 * j],
                      packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
}

// Reads this thread's 16 values of a 16-bit subtile back as 8 packed pairs, from the lane
// addresses write_subtile stored them at (two ldmatrix.x4 per warp).
template <class T>
__device__ __forceinline__ void read_subtile(const uint8_t* buffer, int thread,
                                             uint32_t (&packed)[8]) {
  static_assert(sizeof(T) == 2, "16-bit pairs");
  const uint32_t base = uint32_t(__cvta_generic_to_shared(buffer));
#pragma unroll
  for (int j = 0; j < 2; ++j)
    arch::ldmatrix_x4(SubtileLayout<T>::lane_address(base, thread, j), packed[4 * j],
                      packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
}

// The column pair (col, col + 1) of `row` from a 16-bit subtile buffer, as fp32.
template <class T>
__device__ __forceinline__ float2 read_pair(const uint8_t* buffer, int row, int col) {
  static_assert(sizeof(T) == 2, "16-bit tiles");
  return unpack2<T>(
      *reinterpret_cast<const uint32_t*>(buffer + SubtileLayout<T>::offset(row, col)));
}

} // namespace coda::epilogue::device
