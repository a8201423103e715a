// An activation's FP8 codes with one scale per row and 128-column block
// (QuantizeActivationFp8Args), and its transposed copy with one scale per column and 128-row
// block: one CTA per 128 x 128 tile of x, which holds whole blocks of both kinds (a row's 128
// columns, a column's 128 rows), so both amaxes are tile-local. Its 8 warps read 16 rows each,
// every lane 4 consecutive columns of a row, and keep the tile in registers as loaded (Lane4:
// a 16-bit tile in 32 registers a thread) for both passes:
//  - rows: a row's amax is a warp reduce over its 32 lanes; the lane converts its 4 values with
//    cvt.rn.satfinite.e4m3x2.f32 (the host's float_to_e4m3_bits is its twin) and stores them as
//    one 32-bit word;
//  - columns: each thread's maxima over its 16 rows for its 4 columns meet in shared memory
//    (8 warps x 128 columns); each thread converts its 16 values of a column, consecutive codes
//    of a codes_t row, in pairs and puts them as one 16-byte word into a shared 128 x 128 byte
//    tile laid out as codes_t (a row per column of x), which the warps then store by rows of
//    codes_t, 128 bytes a row.
// Magnitudes are compared as the bits of |x| as unsigned integers (the order of the finite
// magnitudes, with an infinity and every NaN above them all: such a block gets kNoScale, as the
// CPU backend gives). The GPU path's validation guarantees 16-byte aligned tensors with 16-byte
// row pitches and K (and M, with codes_t) a multiple of 16, so a lane's 4 columns (or rows) are
// all inside the tensor or all outside, and its vector loads and stores are aligned.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "coda/core/convert.cuh"
#include "coda/core/fp8.hpp"
#include "gpu/auxiliary/common.cuh"
#include "gpu/auxiliary/quantize_fp8.cuh"

namespace coda::gpu {
namespace aux {
namespace {

constexpr int kTile = kFp8ScaleBlock; // 128: a block of either kind spans the tile
// 8 warps, and the CTAs an SM should hold at once (__launch_bounds__, so at most 85 registers a
// thread for the 16-bit types): a 16-bit tile held as loaded fits 3 (ptxas -v: 80 registers, no
// spills; 4 CTAs spill); an f32 tile needs twice the registers: 2. (16 warps of 8 rows at 2 CTAs,
// as the weight's kernel runs, spilled 12-16 bytes in 64 registers for the 16-bit types.)
constexpr int kThreads = 256;
template <class T> constexpr int kCtasPerSm = std::is_same_v<T, float> ? 2 : 3;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kTile / kWarps; // 16
constexpr int kValuesPerLane = kTile / 32;   // 4 consecutive columns of a row
constexpr uint32_t kNanCodes4 = 0x01010101u * kE4m3NanBits;
static_assert(kRowsPerWarp == 16, "a thread's codes of one column fill one 16-byte word");

// The byte offset of a codes_t row's 16-byte chunk in the shared tile: chunks swizzled by bits
// 2..4 of the row, so that the 8 threads of a quarter warp, which write rows 4 apart, hit 8
// distinct chunks (all 32 banks), and a warp reading one row reads 32 distinct words.
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * kTile + ((chunk ^ ((row >> 2) & 7)) << 4);
}

template <class T>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<T>)
    quantize_activation_kernel(const QuantizeFp8Params<T> p) {
  __shared__ __align__(16) uint8_t tile_t[kTile * kTile]; // codes_t's 128 x 128 bytes, swizzled
  __shared__ __align__(16) uint32_t column_magnitude[kWarps][kTile];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int32_t m0 = int32_t(blockIdx.x) * kTile, k0 = int32_t(blockIdx.y) * kTile;
  const int32_t col = k0 + kValuesPerLane * lane;
  const bool col_in = col < p.cols; // K % 16 == 0: the lane's 4 columns are all in or all out

  Lane4<T> v[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t row = m0 + warp * kRowsPerWarp + i;
    if (row < p.rows && col_in)
      v[i].load(p.in + int64_t(row) * p.in_stride + col);
    else
      v[i].zero();
  }

  // Rows: one block per row of the tile (the row's columns k0 .. k0 + 127).
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t row = m0 + warp * kRowsPerWarp + i;
    const uint32_t magnitude = __reduce_max_sync(0xffffffffu, v[i].magnitude());
    const int exponent = e4m3_scale_exponent(bits_float(magnitude));
    const float scale = scale_exp2(-exponent); // exact: a power of two (unused for kNoScale)
    const uint32_t q = exponent == kNoScale ? kNanCodes4
                                            : e4m3x4(v[i].at(0) * scale, v[i].at(1) * scale,
                                                     v[i].at(2) * scale, v[i].at(3) * scale);
    if (row < p.rows) {
      if (col_in) *reinterpret_cast<uint32_t*>(p.codes + int64_t(row) * p.codes_stride + col) = q;
      if (lane == 0)
        p.scales[int64_t(row) * p.scales_stride + blockIdx.y] = e8m0_bits_of_exponent(exponent);
    }
  }
  if (p.codes_t == nullptr) return; // uniform over the grid

  // Columns: one block per column of the tile (the column's rows m0 .. m0 + 127).
  uint32_t partial[kValuesPerLane];
  Lane4<T>::column_magnitudes(v, partial);
  *reinterpret_cast<uint4*>(&column_magnitude[warp][kValuesPerLane * lane]) =
      make_uint4(partial[0], partial[1], partial[2], partial[3]);
  __syncthreads();
  int exponent[kValuesPerLane];
  {
    uint32_t magnitude[kValuesPerLane] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const uint4 c = *reinterpret_cast<const uint4*>(&column_magnitude[w][kValuesPerLane * lane]);
      magnitude[0] = max(magnitude[0], c.x), magnitude[1] = max(magnitude[1], c.y);
      magnitude[2] = max(magnitude[2], c.z), magnitude[3] = max(magnitude[3], c.w);
    }
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j)
      exponent[j] = e4m3_scale_exponent(bits_float(magnitude[j]));
  }
  if (warp == 0 && col_in) {
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j)
      p.scales_t[int64_t(col + j) * p.scales_t_stride + blockIdx.x] =
          e8m0_bits_of_exponent(exponent[j]);
  }
  // This thread's 16 rows of column j are 16 consecutive codes of codes_t's row 4 lane + j:
  // chunk `warp` of that row in the tile.
#pragma unroll
  for (int j = 0; j < kValuesPerLane; ++j) {
    const float scale = scale_exp2(-exponent[j]);
    uint32_t word[4];
#pragma unroll
    for (int h = 0; h < 4; ++h)
      word[h] = exponent[j] == kNoScale
                    ? kNanCodes4
                    : e4m3x4(v[4 * h].at(j) * scale, v[4 * h + 1].at(j) * scale,
                             v[4 * h + 2].at(j) * scale, v[4 * h + 3].at(j) * scale);
    *reinterpret_cast<uint4*>(tile_t + tile_offset(kValuesPerLane * lane + j, warp)) =
        make_uint4(word[0], word[1], word[2], word[3]);
  }
  __syncthreads();
  // codes_t rows k0 + 16 warp .. + 15 (columns of x), each lane 4 of a row's 128 codes (rows
  // m0 + 4 lane .. of x): 128 contiguous bytes a row.
  const int32_t row_t = m0 + kValuesPerLane * lane; // M % 16 == 0 with codes_t: all 4 in or out
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int c = warp * kRowsPerWarp + i;
    if (k0 + c >= p.cols || row_t >= p.rows) continue;
    const uint32_t q =
        *reinterpret_cast<const uint32_t*>(tile_t + tile_offset(c, lane / 4) + 4 * (lane % 4));
    *reinterpret_cast<uint32_t*>(p.codes_t + int64_t(k0 + c) * p.codes_t_stride + row_t) = q;
  }
}

} // namespace
} // namespace aux

void quantize_activation_fp8(const QuantizeActivationFp8Args& args, Stream stream) {
  // A CTA per 128 x 128 tile of x; M (the tokens) on x, whose grid dimension reaches 2^31 - 1.
  const dim3 grid(unsigned(num_fp8_scale_blocks(args.m())),
                  unsigned(num_fp8_scale_blocks(args.k())));
  aux::run_quantizer("quantize_activation_fp8", args.x, args, "K", args.k(), grid, aux::kThreads,
                     stream, [](auto t) { return &aux::quantize_activation_kernel<decltype(t)>; });
}

} // namespace coda::gpu
