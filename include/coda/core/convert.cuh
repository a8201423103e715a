// The 16-bit storage types (core/types.hpp) <-> fp32 on the device, with the hardware conversions
// (round to nearest even, as coda::bf16::from and f16::from round): one value, or two packed in a
// 32-bit word as the epilogues stage, store and load them. Device code only.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "coda/core/types.hpp"

namespace coda {

template <class T> __device__ __forceinline__ float to_float(uint16_t bits) {
  if constexpr (std::is_same_v<T, bf16>)
    return __uint_as_float(uint32_t(bits) << 16);
  else
    return __half2float(__ushort_as_half(bits));
}
template <class T> __device__ __forceinline__ uint16_t from_float(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else
    return __half_as_ushort(__float2half_rn(x));
}
// Two values as one 32-bit word: lo at the lower address.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <class T> __device__ __forceinline__ float2 unpack2(uint32_t word) {
  return make_float2(to_float<T>(uint16_t(word & 0xffffu)), to_float<T>(uint16_t(word >> 16)));
}

// Two values already multiplied by their block's 2^-k (core/fp8.hpp) as E4M3 codes, the first
// in the low byte (the lower address once stored): cvt.rn.satfinite.e4m3x2.f32 (PTX ISA, "cvt"),
// whose host twin is float_to_e4m3_bits.
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

} // namespace coda
