// A weight's FP8 codes and 128 x 128 block scales (QuantizeWeightFp8Args), its transposed copy,
// or both (an absent copy's pointers are null and it is skipped): one CTA per block. Its 16 warps
// read the block's rows, each lane 4 consecutive values of a row in one vector load (8 rows per
// warp); the block's largest magnitude is the maximum of |w|'s bits compared as unsigned
// integers (the order of the finite magnitudes, with an infinity and every NaN above them all:
// such a block gets kNoScale, as the CPU backend gives); each lane
// converts its values with cvt.rn.satfinite.e4m3x2.f32 (the host's float_to_e4m3_bits is its
// twin) and stores its 4 codes as one 32-bit word, and, for the transposed copy, writes them
// into a shared 128 x 128 byte tile whose columns the warps then read, 4 codes a lane, as
// words of codes_t's rows. (The block's activation twin, quantize_activation_fp8.cu, shares the
// vector accesses and why they are aligned: quantize_fp8.cuh.)
#include <algorithm>
#include <cstdint>

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
// 16 warps of 8 rows, 2 CTAs an SM (__launch_bounds__: at most 64 registers a thread; ptxas -v:
// 48 for bf16 and f16, 64 for f32, no spills): 32 warps an SM, where 8 warps of 16 rows at 3 CTAs
// (bf16) had 24 and 2 (f16, f32) 16. The kernel is bound by memory and runs load, reduce, store
// per CTA: more warps overlap one CTA's stores with another's loads.
constexpr int kThreads = 512;
constexpr int kCtasPerSm = 2;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kBlock / kWarps; // 8
constexpr int kValuesPerLane = kBlock / 32;   // 4 consecutive columns of a row

template <class T>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    quantize_weight_kernel(const QuantizeFp8Params<T> p) {
  // codes [row][col]; +4: rows 4 bytes apart in banks (and 4-byte aligned, for word writes)
  __shared__ alignas(16) uint8_t tile[kBlock][kBlock + 4];
  __shared__ uint32_t warp_magnitude[kWarps];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int32_t n0 = int32_t(blockIdx.y) * kBlock, k0 = int32_t(blockIdx.x) * kBlock;
  const int32_t col = k0 + kValuesPerLane * lane;

  Lane4<T> v[kRowsPerWarp]; // the lane's 4 values of each of its rows, as loaded
  uint32_t magnitude = 0;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t row = n0 + warp * kRowsPerWarp + i;
    if (row < p.rows && col < p.cols) // the lane's 4 columns are all in or all out
      v[i].load(p.in + int64_t(row) * p.in_stride + col);
    else
      v[i].zero();
    magnitude = max(magnitude, v[i].magnitude());
  }
  magnitude = __reduce_max_sync(0xffffffffu, magnitude);
  if (lane == 0) warp_magnitude[warp] = magnitude;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) magnitude = max(magnitude, warp_magnitude[w]);
  const int exponent = e4m3_scale_exponent(bits_float(magnitude));
  if (threadIdx.x == 0) {
    const uint8_t byte = e8m0_bits_of_exponent(exponent);
    if (p.codes != nullptr) p.scales[blockIdx.y * p.scales_stride + blockIdx.x] = byte;
    if (p.codes_t != nullptr) p.scales_t[blockIdx.x * p.scales_t_stride + blockIdx.y] = byte;
  }

  const float scale = scale_exp2(-exponent); // exact (a power of two); NaN for kNoScale
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    const int32_t row = n0 + r;
    const uint32_t q = exponent == kNoScale ? 0x01010101u * kE4m3NanBits
                                            : e4m3x4(v[i].at(0) * scale, v[i].at(1) * scale,
                                                     v[i].at(2) * scale, v[i].at(3) * scale);
    *reinterpret_cast<uint32_t*>(&tile[r][kValuesPerLane * lane]) = q;
    if (p.codes != nullptr && row < p.rows && col < p.cols)
      *reinterpret_cast<uint32_t*>(p.codes + int64_t(row) * p.codes_stride + col) = q;
  }
  if (p.codes_t == nullptr) return;
  __syncthreads();
  // Wᵀ: warp w writes columns k0 + 8 w .. + 7 of W as rows of codes_t, each lane 4 of their
  // 128 entries (rows n0 + 4 lane ..: all in or all out, N being a multiple of 16) as one word.
  const int r = kValuesPerLane * lane;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int c = warp * kRowsPerWarp + i;
    const int32_t k = k0 + c;
    if (k >= p.cols || n0 + r >= p.rows) continue;
    const uint32_t word = uint32_t(tile[r][c]) | uint32_t(tile[r + 1][c]) << 8 |
                          uint32_t(tile[r + 2][c]) << 16 | uint32_t(tile[r + 3][c]) << 24;
    *reinterpret_cast<uint32_t*>(p.codes_t + int64_t(k) * p.codes_t_stride + n0 + r) = word;
  }
}

} // namespace
} // namespace aux

void quantize_weight_fp8(const QuantizeWeightFp8Args& args, Stream stream) {
  // A CTA per 128 x 128 block of w: x along K, y along N.
  const dim3 grid(unsigned(num_fp8_scale_blocks(args.k())),
                  unsigned(num_fp8_scale_blocks(args.n())));
  aux::run_quantizer("quantize_weight_fp8", args.w, args, "N", args.n(), grid, aux::kThreads,
                     stream, [](auto t) { return &aux::quantize_weight_kernel<decltype(t)>; });
}

} // namespace coda::gpu
