// FP8 E4M3 (OCP 8-bit floating point, the "fn" variant Hopper's tensor cores read): 1 sign,
// 4 exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111 is NaN, so the
// largest finite value is S.1111.110 = 448; subnormals reach 2^-9. And the block scaling of the
// FP8 recipe (docs/fp8.md): a block of values shares one power-of-two scale chosen from its
// largest magnitude.
//
// The conversion from fp32 is the hardware's `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA, "cvt"):
// round to nearest even; a magnitude that rounds past 448, or an infinity, saturates to 448 with
// its sign; NaN gives 0x7F. Bit-exact on host and device, so the CPU backend quantizes exactly
// where the GPU will.
#pragma once

#include <cmath>
#include <cstdint>

#include "coda/core/types.hpp"

namespace coda {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3MaxBits = 0x7E;
inline constexpr uint8_t kE4m3NanBits = 0x7F;

CODA_HD uint8_t float_to_e4m3_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return kE4m3NanBits;
  if (abs >= 0x43e00000u) return uint8_t(sign | kE4m3MaxBits); // >= 448, or infinite
  const uint32_t exponent = abs >> 23;                         // fp32's, biased by 127
  if (exponent >= 121) {                                       // >= 2^-6: an e4m3 normal
    // The exponent rebased to e4m3's bias (127 - 7 = 120) above the top 3 mantissa bits; a
    // round-up carries into the exponent, as the encoding is ordered. Below 448 the largest
    // result is 448's code.
    uint32_t code = ((exponent - 120u) << 3) | ((abs >> 20) & 7u);
    const uint32_t rest = abs & 0xfffffu, half = 0x80000u;
    if (rest > half || (rest == half && (code & 1u))) ++code;
    return uint8_t(sign | code);
  }
  // Below 2^-6: a multiple of 2^-9 (code = the multiple; 8 is the smallest normal, 2^-6, whose
  // code is also 8). |f| * 512 is exact (a power of two; |f| is far from fp32's subnormals here
  // or rounds to 0 anyway), and below 8, so its integer part and fraction are exact too.
  const float scaled = bits_float(abs) * 512.0f;
  uint32_t code = uint32_t(scaled);
  const float fraction = scaled - float(code);
  if (fraction > 0.5f || (fraction == 0.5f && (code & 1u))) ++code;
  return uint8_t(sign | code);
}

CODA_HD float e4m3_bits_to_float(uint8_t c) {
  if ((c & 0x7fu) == kE4m3NanBits) return bits_float((uint32_t(c & 0x80u) << 24) | 0x7fc00000u);
  return finite_narrow_bits_to_float<4, 3>(c); // S.1111.110 = 448 is finite: no infinities
}

// The 8-bit storage type, as bf16 and f16 are 16-bit ones (core/types.hpp).
struct e4m3 {
  uint8_t bits;
  CODA_HD static e4m3 from(float f) { return e4m3{float_to_e4m3_bits(f)}; }
  CODA_HD float to_float() const { return e4m3_bits_to_float(bits); }
};

// ---- Block scales: power-of-two scales from a block's largest magnitude (docs/fp8.md).

// The exponent k of a block's scale 2^k: the smallest k with amax <= 448 * 2^k, so the block's
// largest magnitude lands in (224, 448] and nothing saturates; at least -126 (a block whose amax
// is below 2^-118 keeps 2^-126), and at most 120 for a finite amax, so 2^k and 2^-k are normal
// fp32 numbers. A block of zeros gets the smallest exponent; an amax that is not finite has none:
// kNoScale, whose scale is NaN and whose values quantize to NaN.
inline constexpr int kNoScale = 128;
CODA_HD int e4m3_scale_exponent(float amax) {
  const uint32_t abs = float_bits(amax) & 0x7fffffffu;
  if (abs >= 0x7f800000u) return kNoScale;
  if (abs < 0x00800000u) return -126; // zero or fp32-subnormal amax
  const int e = int(abs >> 23) - 127; // amax = 1.m * 2^e
  // 448 * 2^k = 1.75 * 2^(8 + k): 1.m <= 1.75 needs 8 + k >= e, else 8 + k >= e + 1.
  const int k = (abs & 0x7fffffu) <= 0x600000u ? e - 8 : e - 7;
  return k < -126 ? -126 : k;
}

// 2^k as fp32 for k in [-126, 127]; NaN for kNoScale.
CODA_HD float scale_exp2(int k) {
  return k >= kNoScale ? bits_float(0x7fc00000u) : bits_float(uint32_t(k + 127) << 23);
}

// One value of a block with scale exponent k: x * 2^-k rounded to e4m3. The product is exact (a
// power of two; |x| 2^-k <= 448 within the block), except where it falls below fp32's normals,
// far under e4m3's smallest subnormal, where both roundings give 0.
CODA_HD e4m3 quantize_e4m3(float x, int k) {
  return k >= kNoScale ? e4m3{kE4m3NanBits} : e4m3::from(x * scale_exp2(-k));
}
// And back: q * 2^k, exact.
CODA_HD float dequantize_e4m3(e4m3 q, int k) { return q.to_float() * scale_exp2(k); }

// A block of n values quantized with its own scale, as host loops (the CPU backend's ops and
// kernels): value(i) gives the i-th value as fp32 and store(i, code) takes its code; returns the
// block's exponent (kNoScale where a value is a NaN or an infinity: fmaxf would drop a NaN, so a
// non-finite magnitude is kept apart).
template <class Value, class Store>
int quantize_block_e4m3(int64_t n, const Value& value, const Store& store) {
  float amax = 0.f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(value(i));
    finite = finite && std::isfinite(a);
    amax = a > amax ? a : amax;
  }
  const int k = finite ? e4m3_scale_exponent(amax) : kNoScale;
  for (int64_t i = 0; i < n; ++i) store(i, quantize_e4m3(value(i), k));
  return k;
}

// ---- E8M0: a block's scale 2^k stored as one byte (OCP MX's scale format): the byte is k + 127,
// 0xFF is NaN. Exponents -127..127 take 0..254; e4m3_scale_exponent's (-126..120) all fit, and
// kNoScale takes 0xFF.

inline constexpr uint8_t kE8m0NanBits = 0xFF;

CODA_HD uint8_t e8m0_bits_of_exponent(int k) {
  return k >= kNoScale ? kE8m0NanBits : uint8_t(k + 127);
}

// The byte's value as fp32: exact (byte 0, 2^-127, is an fp32 subnormal). b << 23 is the value's
// exponent field for bytes 1..254; bytes 0 and 0xFF also set bit 22, which makes byte 0 the
// subnormal 2^-127 (0x00400000) and 0xFF, whose exponent field is all ones, the quiet NaN
// 0x7fc00000. No branch: the FP8 consumers convert their scales every k-block, and the form with
// two branches compiled to divergent regions there (ncu, 2026-12-06: three BSSY/BSYNC pairs per
// k-block in the staged FP8 tile's consumers).
CODA_HD float e8m0_bits_to_float(uint8_t b) {
  const uint32_t edge = uint8_t(b + 1) < 2 ? 0x00400000u : 0u; // b == 0 or b == 0xFF
  return bits_float((uint32_t(b) << 23) | edge);
}

// The storage type of a scale, as e4m3 is of a value.
struct e8m0 {
  uint8_t bits;
  CODA_HD static e8m0 of_exponent(int k) { return e8m0{e8m0_bits_of_exponent(k)}; }
  CODA_HD int exponent() const { return bits == kE8m0NanBits ? kNoScale : int(bits) - 127; }
  CODA_HD float to_float() const { return e8m0_bits_to_float(bits); }
};

// ---- The block-scaled FP8 GEMM (docs/fp8.md): blocks of kFp8ScaleBlock along K for both
// operands; A (activations, [M, K]) has one scale per row and K block, B (weights, [N, K]) one
// per kFp8ScaleBlock rows and K block.
inline constexpr int kFp8ScaleBlock = 128;
constexpr int64_t num_fp8_scale_blocks(int64_t n) {
  return (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
}

// Output element (m, n) is accumulated K block by K block: the block's products of codes are
// summed (by the tensor cores, into fp32), and that partial sum is promoted into the fp32
// accumulator, times the block's scale. The GPU kernel and the CPU backend both call these two,
// so they scale and add with the same fp32 operations; only the partial sums differ (the tensor
// cores' own accumulation against the CPU's exact one).
//
// The scale of block kb of element (m, n): 2^(ka + kb) as the fp32 product of the two scales.
// Exact, except where ka + kb leaves fp32's range (underflow to a subnormal or 0, overflow to
// infinity, as the true product would); NaN when either is a NaN scale.
CODA_HD float fp8_block_scale(uint8_t a_scale, uint8_t b_scale) {
  return e8m0_bits_to_float(a_scale) * e8m0_bits_to_float(b_scale);
}
// acc + partial * scale with one rounding (the kernel's FFMA). Starting from acc = 0, the first
// block's result is partial * scale, exact for a scale in fp32's normal range.
CODA_HD float fp8_promote(float acc, float partial, float scale) {
  return fmaf(partial, scale, acc);
}

} // namespace coda
