// FP8 E4M3 and its block scales (core/fp8.hpp), against independent statements of the format:
// the grid decoded from the OCP definition in fp64, and the conversion from fp32 as a search for
// the nearest grid value (ties to the even code, saturation at 448), over every grid value, every
// midpoint and its fp32 neighbours, the special values and random floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "coda/core/fp8.hpp"
#include "tests/common/fp8_case.hpp"

namespace {

using coda::e4m3;

using coda::test::e4m3_grid_value;
using coda::test::e4m3_nearest_code;

bool is_nan_code(int c) { return (c & 0x7f) == 0x7f; }

std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          448.0f,
                          464.0f,
                          480.0f,
                          1e30f,
                          std::ldexp(1.0f, -10),
                          3 * std::ldexp(1.0f, -10),
                          std::ldexp(1.0f, -6),
                          std::ldexp(1.0f, -7),
                          std::ldexp(1.0f, -130)};
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// Every finite grid value, every midpoint between neighbours (exact ties) and their fp32
// neighbours on both sides, with both signs.
std::vector<float> grid_floats() {
  std::vector<float> v;
  for (int c = 0; c <= 0x7e; ++c) {
    const float x = float(e4m3_grid_value(c));
    v.push_back(x);
    if (c < 0x7e) {
      const float mid = float((e4m3_grid_value(c) + e4m3_grid_value(c + 1)) / 2); // exact in fp32
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.0f));
      v.push_back(std::nextafter(mid, 1e9f));
    }
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(E4m3, DecodesTheGrid) {
  for (int c = 0; c < 256; ++c) {
    const float f = coda::e4m3_bits_to_float(uint8_t(c));
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(double(f), e4m3_grid_value(c)) << c;
    EXPECT_EQ(std::signbit(f), c >= 0x80) << c;
  }
  EXPECT_EQ(coda::e4m3_bits_to_float(coda::kE4m3MaxBits), coda::kE4m3Max);
  EXPECT_EQ(coda::e4m3_bits_to_float(1), std::ldexp(1.0f, -9)); // the smallest subnormal
  for (int c = 1; c <= 0x7e; ++c) {                             // ordered like the integers
    EXPECT_LT(coda::e4m3_bits_to_float(uint8_t(c - 1)), coda::e4m3_bits_to_float(uint8_t(c)));
  }
}

TEST(E4m3, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c)) continue;
    EXPECT_EQ(coda::float_to_e4m3_bits(coda::e4m3_bits_to_float(uint8_t(c))), c) << c;
  }
}

TEST(E4m3, ConvertsToTheNearestEvenCodeAndSaturates) {
  std::vector<float> inputs = special_floats();
  for (float x : grid_floats()) inputs.push_back(x);
  std::mt19937 rng(20261204);
  std::uniform_real_distribution<float> exponent(-14.0f, 11.0f), mantissa(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mantissa(rng), int(std::floor(exponent(rng))));
    inputs.push_back(i % 2 ? -x : x);
  }
  int mismatches = 0;
  for (float x : inputs) {
    const int got = coda::float_to_e4m3_bits(x), want = e4m3_nearest_code(x);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x << " (bits 0x" << std::hex << coda::float_bits(x) << "): got 0x"
                    << got << ", want 0x" << want;
  }
  EXPECT_EQ(mismatches, 0) << "of " << inputs.size() << " inputs";
}

TEST(E4m3, ScaleExponentIsTheSmallestThatAvoidsSaturation) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-130.0f, 127.0f), mantissa(1.0f, 2.0f);
  std::vector<float> amax = {0.0f,
                             448.0f,
                             448.5f,
                             224.0f,
                             1.0f,
                             1.75f,
                             1.7500001f,
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::min(),
                             std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 100000; ++i)
    amax.push_back(std::ldexp(mantissa(rng), int(std::floor(exponent(rng)))));
  for (float a : amax) {
    const int k = coda::e4m3_scale_exponent(a);
    ASSERT_GE(k, -126) << a;
    ASSERT_LE(k, 120) << a;
    EXPECT_LE(double(a), std::ldexp(448.0, k)) << a; // nothing saturates
    if (k > -126) {                                  // and no smaller one would do
      EXPECT_GT(double(a), std::ldexp(448.0, k - 1)) << a;
    }
  }
  EXPECT_EQ(coda::e4m3_scale_exponent(0.0f), -126);
  EXPECT_EQ(coda::e4m3_scale_exponent(std::numeric_limits<float>::infinity()), coda::kNoScale);
  EXPECT_EQ(coda::e4m3_scale_exponent(std::numeric_limits<float>::quiet_NaN()), coda::kNoScale);
}

// A block of 128 values of one magnitude range, quantized with its scale: each value is the
// nearest e4m3 value of x 2^-k (by the search), none saturates, the largest lands in
// [224, 448], and dequantizing multiplies by 2^k exactly.
TEST(E4m3, QuantizesABlockWithItsPowerOfTwoScale) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int magnitude : {-40, -12, -3, 0, 5, 17, 60}) {
    std::vector<float> x(128);
    float amax = 0.0f;
    for (float& v : x) {
      v = std::ldexp(normal(rng), magnitude);
      amax = std::max(amax, std::fabs(v));
    }
    const int k = coda::e4m3_scale_exponent(amax);
    float largest = 0.0f;
    for (float v : x) {
      const e4m3 q = coda::quantize_e4m3(v, k);
      EXPECT_EQ(q.bits, e4m3_nearest_code(float(std::ldexp(double(v), -k)))) << v << " k " << k;
      EXPECT_NE(q.bits & 0x7f, coda::kE4m3MaxBits + 1) << v; // never NaN
      const float back = coda::dequantize_e4m3(q, k);
      EXPECT_EQ(double(back), std::ldexp(double(q.to_float()), k)) << v;
      largest = std::max(largest, std::fabs(q.to_float()));
    }
    EXPECT_GE(largest, 224.0f) << "magnitude 2^" << magnitude;
    EXPECT_LE(largest, coda::kE4m3Max);
  }
}

TEST(E4m3, ABlockWithoutAFiniteScaleQuantizesToNan) {
  const int k = coda::e4m3_scale_exponent(std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(coda::scale_exp2(k)));
  const e4m3 q = coda::quantize_e4m3(1.0f, k);
  EXPECT_EQ(q.bits, coda::kE4m3NanBits);
  EXPECT_TRUE(std::isnan(coda::dequantize_e4m3(q, k)));
}

// E8M0 scale bytes: byte b stands for 2^(b - 127) exactly (0 is fp32's subnormal 2^-127), 0xFF
// for NaN; every exponent a block can get round-trips through its byte.
TEST(E8m0, DecodesEveryByteAndRoundTripsExponents) {
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(double(coda::e8m0_bits_to_float(uint8_t(b))), std::ldexp(1.0, b - 127)) << b;
    EXPECT_EQ(coda::e8m0{uint8_t(b)}.exponent(), b - 127);
  }
  const float nan = coda::e8m0_bits_to_float(coda::kE8m0NanBits);
  EXPECT_TRUE(std::isnan(nan));
  uint32_t nan_bits = 0;
  std::memcpy(&nan_bits, &nan, sizeof(nan));
  EXPECT_EQ(nan_bits, 0x7fc00000u); // the quiet NaN every backend writes for a NaN scale
  EXPECT_EQ(coda::e8m0{coda::kE8m0NanBits}.exponent(), coda::kNoScale);
  for (int k = -126; k <= 120; ++k) {
    const coda::e8m0 s = coda::e8m0::of_exponent(k);
    EXPECT_EQ(s.exponent(), k);
    EXPECT_EQ(s.to_float(), coda::scale_exp2(k)) << k;
  }
  EXPECT_EQ(coda::e8m0::of_exponent(coda::kNoScale).bits, coda::kE8m0NanBits);
}

// The promotion's scale is the fp32 product of the two scales: 2^(ka + kb) exactly while that is
// an fp32 number, the fp32 product's underflow and overflow outside, NaN from a NaN scale.
TEST(E8m0, BlockScaleIsTheFp32ProductOfTheScales) {
  using coda::e8m0_bits_of_exponent;
  for (int ka = -126; ka <= 120; ka += 7)
    for (int kb = -126; kb <= 120; kb += 5) {
      const float s = coda::fp8_block_scale(e8m0_bits_of_exponent(ka), e8m0_bits_of_exponent(kb));
      EXPECT_EQ(s, coda::scale_exp2(ka) * coda::scale_exp2(kb)) << ka << " " << kb;
      if (ka + kb >= -149 && ka + kb <= 127) {
        EXPECT_EQ(double(s), std::ldexp(1.0, ka + kb)) << ka << " " << kb;
      }
    }
  EXPECT_TRUE(std::isnan(coda::fp8_block_scale(coda::kE8m0NanBits, e8m0_bits_of_exponent(0))));
  EXPECT_TRUE(std::isnan(coda::fp8_block_scale(e8m0_bits_of_exponent(3), coda::kE8m0NanBits)));
}

} // namespace
