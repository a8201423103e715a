// What the two FP8 quantizers' GPU kernels share (quantize_fp8.cu: a weight w [N, K] in 128 x 128
// blocks; quantize_activation_fp8.cu: an activation x [M, K] in 1 x 128 blocks both ways): the
// kernel parameters, filled from either call's Args, and the input dtype's dispatch.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "coda/core/convert.cuh"
#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/core/tensor.hpp"
#include "coda/core/types.hpp"
#include "gpu/auxiliary/common.cuh"

namespace coda::gpu::aux {

// Both kernels read 4 consecutive values a lane and store 4 consecutive codes: the GPU path's
// validation gives 16-byte aligned tensors with 16-byte row pitches and both dimensions of every
// copy a multiple of 16, so a lane's 4 values (or codes) are all inside the tensor or all outside,
// and these vector accesses are aligned.

// A lane's 4 consecutive values as loaded (16-byte aligned for f32, 8-byte for 16-bit types):
// four floats for f32, two words of 16-bit pairs for bf16 and f16, widened to fp32 (exactly) where
// they are used. Both kernels keep a 128 x 128 tile in registers for two passes; held as loaded,
// a 16-bit tile takes half the registers, which lets more CTAs share an SM (these kernels are
// bound by memory, and a CTA loads, then reduces, then stores: more CTAs overlap the phases).
template <class T> struct Lane4 {
  static constexpr bool kWide = std::is_same_v<T, float>;
  uint32_t word[kWide ? 4 : 2];

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kWide) {
      const uint4 f = *reinterpret_cast<const uint4*>(p);
      word[0] = f.x, word[1] = f.y, word[2] = f.z, word[3] = f.w;
    } else {
      const uint2 h = *reinterpret_cast<const uint2*>(p);
      word[0] = h.x, word[1] = h.y;
    }
  }
  __device__ __forceinline__ void zero() { // below every magnitude
#pragma unroll
    for (uint32_t& w : word) w = 0;
  }
  // Value j (0..3) as fp32.
  __device__ __forceinline__ float at(int j) const {
    if constexpr (kWide) {
      return __uint_as_float(word[j]);
    } else {
      const float2 f = dev::unpack2<T>(word[j / 2]);
      return j % 2 == 0 ? f.x : f.y;
    }
  }
  // The largest |value| of the four, as the bits of a non-negative float (NaN and infinity
  // above every finite magnitude when compared as unsigned integers).
  __device__ __forceinline__ uint32_t magnitude() const {
    if constexpr (kWide) {
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) m = max(m, word[j] & 0x7fffffffu);
      return m;
    } else {
      const uint32_t pair = __vmaxu2(word[0] & kMagnitudes2, word[1] & kMagnitudes2);
      return widened(max(pair & 0xffffu, pair >> 16));
    }
  }
  // The largest |value| of each of the 4 columns over `rows` (float bits, as magnitude()).
  template <int kRows>
  __device__ __forceinline__ static void column_magnitudes(const Lane4 (&rows)[kRows],
                                                           uint32_t (&out)[4]) {
    if constexpr (kWide) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[j] = 0;
#pragma unroll
        for (int i = 0; i < kRows; ++i) out[j] = max(out[j], rows[i].word[j] & 0x7fffffffu);
      }
    } else {
      uint32_t pair[2] = {0, 0}; // columns (0, 1) and (2, 3), two 16-bit maxima each
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int c = 0; c < 2; ++c) pair[c] = __vmaxu2(pair[c], rows[i].word[c] & kMagnitudes2);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        out[2 * c] = widened(pair[c] & 0xffffu);
        out[2 * c + 1] = widened(pair[c] >> 16);
      }
    }
  }

private:
  // A 16-bit type's sign bits cleared in a pair. Its magnitudes order as unsigned integers as
  // the values' magnitudes do (sign and magnitude formats, NaN and infinity above every finite
  // one), and widening to fp32 is exact and keeps that order: so the largest of the 16-bit
  // magnitudes (__vmaxu2, two at a time) widened is the largest of the widened magnitudes, bit
  // for bit, in fewer instructions and registers than widening each value first.
  static constexpr uint32_t kMagnitudes2 = 0x7fff7fffu;
  __device__ __forceinline__ static uint32_t widened(uint32_t magnitude16) {
    return float_bits(dev::to_float<T>(uint16_t(magnitude16)));
  }
};

// Four values already multiplied by 2^-k as E4M3 codes, the first in the low byte.
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  return uint32_t(e4m3x2(a, b)) | uint32_t(e4m3x2(c, d)) << 16;
}

// The input [rows, cols] and its codes [rows, cols] with their scales, and optionally the
// transposed copy (codes_t [cols, rows] and scales_t; null when absent). Strides in elements.
template <class T> struct QuantizeFp8Params {
  const T* in = nullptr;
  uint8_t *codes = nullptr, *scales = nullptr, *codes_t = nullptr, *scales_t = nullptr;
  int64_t in_stride = 0, codes_stride = 0, scales_stride = 0, codes_t_stride = 0,
          scales_t_stride = 0;
  int32_t rows = 0, cols = 0;
};

// From QuantizeWeightFp8Args (in = w) or QuantizeActivationFp8Args (in = x): the same output
// fields; the sizes were checked to fit 32 bits by the caller.
template <class T, class Args>
QuantizeFp8Params<T> quantize_fp8_params(const TensorView& in, const Args& args) {
  QuantizeFp8Params<T> p;
  p.in = in.ptr<const T>();
  p.in_stride = in.stride[0];
  p.codes = args.codes.template ptr<uint8_t>();
  p.scales = args.scales.template ptr<uint8_t>();
  p.codes_stride = args.codes.stride[0];
  p.scales_stride = args.scales.stride[0];
  if (args.codes_t.data != nullptr) {
    p.codes_t = args.codes_t.template ptr<uint8_t>();
    p.scales_t = args.scales_t.template ptr<uint8_t>();
    p.codes_t_stride = args.codes_t.stride[0];
    p.scales_t_stride = args.scales_t.stride[0];
  }
  p.rows = int32_t(in.shape[0]);
  p.cols = int32_t(in.shape[1]);
  return p;
}

// The sizes a quantizer's kernel takes: `rows` and `cols` in its 32-bit indices, and
// `grid_y_extent` (the dimension its grid's y covers in 128-wide blocks, named `grid_y_name`) in
// the 65535 blocks a grid's y dimension holds. Status::not_supported otherwise, before launching.
inline void require_quantizer_sizes(const char* kernel, int64_t rows, int64_t cols,
                                    const char* grid_y_name, int64_t grid_y_extent) {
  if (rows >= (int64_t(1) << 31) || cols >= (int64_t(1) << 31) ||
      num_fp8_scale_blocks(grid_y_extent) > 65535)
    throw Error(Status::not_supported, std::string(kernel) +
                                           ": the GPU kernel takes both dimensions < 2^31 and " +
                                           grid_y_name + " <= 65535 x 128");
}

// A quantizer's GPU entry point: the device and the sizes checked, then kernel_of(T{}) (the
// kernel for input type T) on `grid` CTAs of `threads` for the input's dtype, its parameters
// from the call's Args. (The validator has checked the dtype; anything else is an internal error
// here.)
template <class Args, class KernelOf>
void run_quantizer(const char* name, const TensorView& in, const Args& args,
                   const char* grid_y_name, int64_t grid_y_extent, dim3 grid, int threads,
                   Stream stream, KernelOf kernel_of) {
  require_device(name);
  require_quantizer_sizes(name, in.shape[0], in.shape[1], grid_y_name, grid_y_extent);
  const auto launch = [&](auto t) {
    using T = decltype(t);
    kernel_of(t)<<<grid, threads, 0, stream>>>(quantize_fp8_params<T>(in, args));
    check_launch(name);
  };
  switch (in.dtype) {
  case DType::bf16:
    return launch(bf16{});
  case DType::f16:
    return launch(f16{});
  case DType::f32:
    return launch(float{});
  default:
    throw Error(Status::internal, std::string(name) + ": the input must be bf16, f16 or f32");
  }
}

} // namespace coda::gpu::aux
