// A weight's FP8 codes and 128 x 128 block scales (QuantizeWeightFp8Args), and its transposed
// copy: one CTA per block. Its 8 warps read the block's rows, each lane 4 consecutive values of a
// row (16 rows per warp); the block's largest magnitude is the maximum of |w|'s bits compared as
// unsigned integers (the order of the finite magnitudes, with an infinity and every NaN above
// them all: such a block gets kNoScale, as the CPU backend gives); each lane converts its values
// with cvt.rn.satfinite.e4m3x2.f32 (the host's float_to_e4m3_bits is its twin) and stores its 4
// codes, and, for the transposed copy, writes them into a shared 128 x 128 byte tile that the
// warps then read by columns.
#include <algorithm>
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

constexpr int kBlock = kFp8ScaleBlock; // 128
constexpr int kWarps = kQuantizerThreads / 32;
constexpr int kRowsPerWarp = kBlock / kWarps; // 16
constexpr int kValuesPerLane = kBlock / 32;   // 4 consecutive columns of a row

template <class T> __device__ float to_float_value(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return dev::to_float<T>(x.bits);
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    quantize_weight_kernel(const QuantizeFp8Params<T> p) {
  __shared__ uint8_t tile[kBlock][kBlock + 4]; // codes [row][col]; +4: rows 4 bytes apart in banks
  __shared__ uint32_t warp_magnitude[kWarps];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int32_t n0 = int32_t(blockIdx.y) * kBlock, k0 = int32_t(blockIdx.x) * kBlock;
  const int32_t col = k0 + kValuesPerLane * lane;

  float v[kRowsPerWarp][kValuesPerLane];
  uint32_t magnitude = 0;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t row = n0 + warp * kRowsPerWarp + i;
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j) {
      const bool in = row < p.rows && col + j < p.cols;
      v[i][j] = in ? to_float_value(p.in[int64_t(row) * p.in_stride + col + j]) : 0.f;
      magnitude = max(magnitude, float_bits(v[i][j]) & 0x7fffffffu);
    }
  }
  magnitude = __reduce_max_sync(0xffffffffu, magnitude);
  if (lane == 0) warp_magnitude[warp] = magnitude;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) magnitude = max(magnitude, warp_magnitude[w]);
  const int exponent = e4m3_scale_exponent(bits_float(magnitude));
  if (threadIdx.x == 0) {
    const uint8_t byte = e8m0_bits_of_exponent(exponent);
    p.scales[blockIdx.y * p.scales_stride + blockIdx.x] = byte;
    if (p.codes_t != nullptr) p.scales_t[blockIdx.x * p.scales_t_stride + blockIdx.y] = byte;
  }

  const float scale = scale_exp2(-exponent); // exact (a power of two); NaN for kNoScale
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    const int32_t row = n0 + r;
    uint8_t q[kValuesPerLane];
#pragma unroll
    for (int j = 0; j < kValuesPerLane; j += 2) {
      const uint16_t pair = e4m3x2(v[i][j] * scale, v[i][j + 1] * scale);
      q[j] = exponent == kNoScale ? kE4m3NanBits : uint8_t(pair & 0xff);
      q[j + 1] = exponent == kNoScale ? kE4m3NanBits : uint8_t(pair >> 8);
    }
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j) {
      tile[r][kValuesPerLane * lane + j] = q[j];
      if (row < p.rows && col + j < p.cols) p.codes[int64_t(row) * p.codes_stride + col + j] = q[j];
    }
  }
  if (p.codes_t == nullptr) return;
  __syncthreads();
  // Wᵀ: warp w writes columns k0 + 16 w .. + 15 of W as rows of codes_t, each lane 4 of their
  // 128 entries (rows n0 + 4 lane ..).
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int c = warp * kRowsPerWarp + i;
    const int32_t k = k0 + c;
    if (k >= p.cols) continue;
#pragma unroll
    for (int j = 0; j < kValuesPerLane; ++j) {
      const int r = kValuesPerLane * lane + j;
      if (n0 + r < p.rows) p.codes_t[int64_t(k) * p.codes_t_stride + n0 + r] = tile[r][c];
    }
  }
}

} // namespace
} // namespace aux

void quantize_weight_fp8(const QuantizeWeightFp8Args& args, Stream stream) {
  // A CTA per 128 x 128 block of w: x along K, y along N.
  const dim3 grid(unsigned(num_fp8_scale_blocks(args.k())),
                  unsigned(num_fp8_scale_blocks(args.n())));
  aux::run_quantizer("quantize_weight_fp8", args.w, args, "N", args.n(), grid, stream,
                     [](auto t) { return &aux::quantize_weight_kernel<decltype(t)>; });
}

} // namespace coda::gpu
