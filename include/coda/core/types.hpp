// Element types and the few scalar helpers every layer shares.
//
// This header compiles with a plain C++ compiler (the CPU backend, reference tests) and with
// nvcc (device code): CODA_HD marks functions that run on both sides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CODA_HD __host__ __device__ __forceinline__
#else
#define CODA_HD inline
#endif

namespace coda {

// The values match the C ABI's coda_dtype (coda.h). e4m3 and e8m0 are the FP8 recipe's
// (docs/fp8.md, coda/core/fp8.hpp): E4M3 codes, and the power-of-two block scales stored as one
// E8M0 byte each (the value 2^(byte - 127)).
enum class DType : int32_t { bf16 = 0, f16 = 1, f32 = 2, i32 = 3, e4m3 = 4, e8m0 = 5 };

constexpr int64_t dtype_size(DType t) {
  return t == DType::e4m3 || t == DType::e8m0 ? 1 : t == DType::bf16 || t == DType::f16 ? 2 : 4;
}

// One row of a table that names an enum's values (dtype_name, sm90::kernel_name, ...).
template <class E> struct EnumName {
  E value;
  const char* name;
};

// The name of `value` in `names`, or "unknown" for a value the table lacks (an out-of-range
// value cast from the C ABI, say).
template <class E, size_t N> constexpr const char* name_of(E value, const EnumName<E> (&names)[N]) {
  for (const EnumName<E>& row : names)
    if (row.value == value) return row.name;
  return "unknown";
}

constexpr const char* dtype_name(DType t) {
  return name_of(t, {{DType::bf16, "bf16"},
                     {DType::f16, "f16"},
                     {DType::f32, "f32"},
                     {DType::i32, "i32"},
                     {DType::e4m3, "e4m3"},
                     {DType::e8m0, "e8m0"}});
}

template <class T> CODA_HD constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

// Bit-exact float <-> bf16 / fp16 conversions, round-to-nearest-even, identical on host and
// device so that the CPU backend rounds exactly where the GPU does.
CODA_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
CODA_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

CODA_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return uint16_t((u >> 16) | 0x40u); // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
CODA_HD float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

CODA_HD uint16_t float_to_f16_bits(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                                 // result is subnormal (or zero)
    if (abs < 0x33000000u) return uint16_t(sign);          // below half the smallest subnormal
    uint32_t mant = (abs & 0x007fffffu) | 0x00800000u;
    int shift = 126 - int(abs >> 23); // 14 + (113 - exp)
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}
// The value of a finite narrow float (a sign bit, kExponentBits exponent bits with the IEEE
// bias, kMantissaBits mantissa bits: f16, e4m3) from its bits, exactly: fp32's exponent range
// and precision hold every such value. A normal value's fields move into fp32's, rebiased; a
// subnormal (exponent 0) is mantissa * 2^(1 - bias - kMantissaBits). Each format's decoder
// handles its own infinities and NaNs before calling this.
template <int kExponentBits, int kMantissaBits>
CODA_HD float finite_narrow_bits_to_float(uint32_t bits) {
  constexpr uint32_t kBias = (1u << (kExponentBits - 1)) - 1;
  const uint32_t sign = (bits >> (kExponentBits + kMantissaBits)) << 31;
  const uint32_t exponent = (bits >> kMantissaBits) & ((1u << kExponentBits) - 1);
  const uint32_t mantissa = bits & ((1u << kMantissaBits) - 1);
  if (exponent == 0) {
    constexpr float kUnit = 1.0f / float(1u << (kBias + kMantissaBits - 1)); // a power of two
    const float v = float(mantissa) * kUnit;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exponent + 127 - kBias) << 23) | (mantissa << (23 - kMantissaBits)));
}

CODA_HD float f16_bits_to_float(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u) // infinity, or NaN with its payload
    return bits_float((uint32_t(h & 0x8000u) << 16) | 0x7f800000u | (uint32_t(h & 0x3ffu) << 13));
  return finite_narrow_bits_to_float<5, 10>(h);
}

// Storage types for 16-bit floats: plain 16-bit payloads, so host code never depends on CUDA's
// __nv_bfloat16 / __half. Device code reinterprets them as the CUDA types where it needs the
// hardware instructions; the bits are the same.
struct bf16 {
  uint16_t bits;
  CODA_HD static bf16 from(float f) { return bf16{float_to_bf16_bits(f)}; }
  CODA_HD float to_float() const { return bf16_bits_to_float(bits); }
};
struct f16 {
  uint16_t bits;
  CODA_HD static f16 from(float f) { return f16{float_to_f16_bits(f)}; }
  CODA_HD float to_float() const { return f16_bits_to_float(bits); }
};

// Round a float to the precision of storage type T (identity for float).
template <class T> CODA_HD float round_to(float x) { return T::from(x).to_float(); }
template <> CODA_HD float round_to<float>(float x) { return x; }

template <class T> CODA_HD float load_as_float(const T& v) { return v.to_float(); }
template <> CODA_HD float load_as_float<float>(const float& v) { return v; }
template <class T> CODA_HD T store_from_float(float x) { return T::from(x); }
template <> CODA_HD float store_from_float<float>(float x) { return x; }

template <class T> struct dtype_of;
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };

} // namespace coda
