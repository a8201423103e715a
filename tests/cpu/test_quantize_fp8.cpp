// quantize_weight_fp8 and quantize_activation_fp8 through the public API on host tensors (the
// CPU backend): codes, scales and the transposed copies against the format's definition applied
// block by block (tests/common/fp8_case.hpp), on ragged shapes, bf16 / f16 / f32 inputs and
// blocks poisoned by a NaN or an infinity; every copy as the gemm_fp8 operand it is made for (the
// weight's in the forward and the input gradient, the activations' in the forward and the weight
// gradient) against the fp64 products of the values they stand for; bad arguments rejected
// before any byte changes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "reference/fp8.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"

namespace coda::test {
namespace {

struct Shape {
  int64_t n, k;
};
// One block, short blocks in both dimensions, the smallest shape, and several blocks.
const Shape kShapes[] = {{128, 128}, {208, 304}, {16, 16}, {272, 528}};

TEST(QuantizeWeightFp8, CodesScalesAndTransposeFollowTheFormat) {
  for (const Shape& s : kShapes)
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      for (Fp8Copies copies : {Fp8Copies::both, Fp8Copies::rows, Fp8Copies::transposed})
        for (bool non_finite : {false, true}) {
          SCOPED_TRACE("N " + std::to_string(s.n) + " K " + std::to_string(s.k) + " " +
                       dtype_name(dtype) + ", " + copies_name(copies) +
                       (non_finite ? ", NaN and infinity" : ""));
          Seeds seeds;
          Fp8WeightCase c(s.n, s.k, dtype, non_finite, seeds, dtype == DType::f16 ? 10 : 20);
          quantize_weight_fp8(c.args(copies));
          EXPECT_EQ(c.check(copies), "");
          // A copy not asked for is untouched: still its poison.
          const auto untouched = [](const HostTensor& t) {
            for (double v : t.values()) EXPECT_TRUE(std::isnan(v));
          };
          if (!has_transposed(copies)) untouched(c.codes_t), untouched(c.scales_t);
          if (!has_rows(copies)) untouched(c.codes), untouched(c.scales);
        }
}

// codes and scales as the forward GEMM's b (Y = X Wᵀ), codes_t and scales_t as the input
// gradient's (dX = dY W): each against the fp64 product of the values the operands stand for.
TEST(QuantizeWeightFp8, BothCopiesAreGemmFp8Operands) {
  constexpr int64_t M = 70, N = 272, K = 400;
  Seeds seeds;
  Fp8WeightCase weight(N, K, DType::bf16, false, seeds);
  quantize_weight_fp8(weight.args(Fp8Copies::both));
  const std::vector<double> w = [&] {
    std::vector<double> v(size_t(N * K));
    const std::vector<double> codes = weight.codes.values(), scales = weight.scales.values();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        v[size_t(n * K + k)] =
            codes[size_t(n * K + k)] * scales[size_t(n / 128 * num_fp8_scale_blocks(K) + k / 128)];
    return v;
  }();
  // Activations of both GEMMs quantized in 1 x 128 blocks by the reference.
  const auto activations = [&](int64_t cols) {
    const std::vector<double> x = random_doubles(size_t(M * cols), seeds.next(), -3, 3);
    const ref::Fp8Blocks q =
        ref::quantize_fp8_blocks(std::vector<float>(x.begin(), x.end()), M, cols, 1);
    HostTensor codes(DType::e4m3, {M, cols}), scales(DType::e8m0, {M, num_fp8_scale_blocks(cols)});
    std::memcpy(codes.host_view().data, q.codes.data(), q.codes.size());
    std::memcpy(scales.host_view().data, q.scales.data(), q.scales.size());
    return std::make_tuple(std::move(codes), std::move(scales),
                           ref::dequantize_fp8_blocks(q, M, cols, 1));
  };
  for (bool input_gradient : {false, true}) {
    SCOPED_TRACE(input_gradient ? "dX = dY W (codes_t)" : "Y = X Wᵀ (codes)");
    const int64_t reduce = input_gradient ? N : K, out = input_gradient ? K : N;
    auto [a, a_scales, a_values] = activations(reduce);
    HostTensor d(DType::bf16, {M, out});
    gemm_fp8({.a = a.view(),
              .a_scales = a_scales.view(),
              .b = input_gradient ? weight.codes_t.view() : weight.codes.view(),
              .b_scales = input_gradient ? weight.scales_t.view() : weight.scales.view(),
              .d = d.view()});
    std::vector<double> exact(size_t(M * out)), unfused(exact.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < out; ++o) {
        double sum = 0;
        float sum32 = 0.f;
        for (int64_t r = 0; r < reduce; ++r) {
          const double wv = input_gradient ? w[size_t(r * K + o)] : w[size_t(o * K + r)];
          sum += a_values[size_t(m * reduce + r)] * wv;
          sum32 += float(a_values[size_t(m * reduce + r)]) * float(wv);
        }
        exact[size_t(m * out + o)] = sum;
        unfused[size_t(m * out + o)] = double(bf16::from(sum32).to_float());
      }
    CODA_EXPECT_PASSES(check_output("d", d, exact, unfused));
  }
}

// Each bad argument is reported by name, and no output byte changes.
TEST(QuantizeWeightFp8, RejectsBadArgumentsBeforeWritingAnything) {
  Seeds seeds;
  Fp8WeightCase c(208, 304, DType::bf16, false, seeds);
  HostTensor wrong_scales(DType::e8m0, {2, 2}); // ceil(304/128) = 3 columns needed
  HostTensor bf16_codes(DType::bf16, {208, 304});
  HostTensor i32_weight(DType::i32, {208, 304});
  HostTensor ragged_weight(DType::bf16, {208, 300});
  struct Case {
    const char* name;
    std::function<void(QuantizeWeightFp8Args&)> spoil;
    const char* message;
  };
  const Case cases[] = {
      {"scales of the wrong shape", [&](auto& a) { a.scales = wrong_scales.view(); }, "scales"},
      {"codes of the wrong dtype", [&](auto& a) { a.codes = bf16_codes.view(); }, "codes"},
      {"an integer weight", [&](auto& a) { a.w = i32_weight.view(); }, "w"},
      {"scales_t without codes_t", [&](auto& a) { a.codes_t = TensorView{}; }, "scales_t"},
      {"scales without codes", [&](auto& a) { a.codes = TensorView{}; }, "scales is given"},
      {"neither copy",
       [&](auto& a) { a.codes = a.scales = a.codes_t = a.scales_t = TensorView{}; },
       "neither codes nor codes_t"},
      {"codes_t the shape of codes", [&](auto& a) { a.codes_t = c.codes.view(); }, "codes_t"},
      {"K not a multiple of 16", [&](auto& a) { a.w = ragged_weight.view(); }, "multiple of"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.name);
    QuantizeWeightFp8Args args = c.args(Fp8Copies::both);
    bad.spoil(args);
    try {
      quantize_weight_fp8(args);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos) << e.what();
    }
    for (const HostTensor* t : {&c.codes, &c.scales, &c.codes_t, &c.scales_t})
      for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
  }
}

// ---- quantize_activation_fp8

struct ActivationShape {
  int64_t m, k;
};
// One block each way, short last blocks both ways, the smallest shape, several blocks, and (row
// copy only: M need not be a multiple of 16 without codes_t) one row and a ragged M.
const ActivationShape kActivationShapes[] = {{128, 128}, {208, 304}, {16, 16},
                                             {272, 528}, {1, 144},   {131, 400}};

// The number of distinct blocks the infinity at (0, 0) and the NaN at (M-1, K-1) fall in: the
// row copy's blocks are (row, column / 128), the transposed copy's (column, row / 128).
size_t poisoned_blocks(int64_t m, int64_t k, bool transposed) {
  if (transposed)
    return std::set<std::pair<int64_t, int64_t>>{{0, 0}, {k - 1, (m - 1) / 128}}.size();
  return std::set<std::pair<int64_t, int64_t>>{{0, 0}, {m - 1, (k - 1) / 128}}.size();
}
size_t nan_count(const HostTensor& t) {
  size_t n = 0;
  for (double v : t.values()) n += std::isnan(v) ? 1 : 0;
  return n;
}

TEST(QuantizeActivationFp8, CodesScalesAndTransposeFollowTheFormat) {
  for (const ActivationShape& s : kActivationShapes)
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      for (bool transposed : {true, false})
        for (bool non_finite : {false, true}) {
          if (transposed && s.m % 16 != 0) continue;
          SCOPED_TRACE("M " + std::to_string(s.m) + " K " + std::to_string(s.k) + " " +
                       dtype_name(dtype) + (transposed ? " with" : " without") + " the transpose" +
                       (non_finite ? ", NaN and infinity" : ""));
          Seeds seeds;
          // f16's range (2^-24 .. 65504) holds the row and column shifts (+-8) and +-4 more.
          Fp8ActivationCase c(s.m, s.k, dtype, non_finite, seeds, dtype == DType::f16 ? 4 : 20);
          quantize_activation_fp8(c.args(transposed));
          EXPECT_EQ(c.check(transposed), "");
          // Each non-finite value poisons its own block of each copy and no other.
          EXPECT_EQ(nan_count(c.scales), non_finite ? poisoned_blocks(s.m, s.k, false) : 0);
          if (transposed) {
            EXPECT_EQ(nan_count(c.scales_t), non_finite ? poisoned_blocks(s.m, s.k, true) : 0);
          } else { // codes_t and scales_t untouched: still their poison
            for (double v : c.codes_t.values()) EXPECT_TRUE(std::isnan(v));
            for (double v : c.scales_t.values()) EXPECT_TRUE(std::isnan(v));
          }
        }
}

// The transposed copy has blocks of its own: on values whose magnitude varies along rows and
// columns, it is not the row copy transposed (so a kernel that wrote that would fail the format
// check above, whatever the data).
TEST(QuantizeActivationFp8, TheTransposedCopyIsNotTheTransposedCodes) {
  Seeds seeds;
  Fp8ActivationCase c(208, 304, DType::bf16, false, seeds);
  quantize_activation_fp8(c.args(true));
  ASSERT_EQ(c.check(true), "");
  const std::vector<double> codes = c.codes.values(), codes_t = c.codes_t.values();
  int64_t differ = 0;
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t k = 0; k < c.k; ++k)
      differ += codes[size_t(r * c.k + k)] != codes_t[size_t(k * c.m + r)] ? 1 : 0;
  EXPECT_GT(differ, c.m * c.k / 2);
}

// The copies as the operands they are made for, against the fp64 product of the values they stand
// for:
//  - forward Y = X Wᵀ: a = X's row copy, b = a weight from quantize_weight_fp8 (by blocks), d bf16;
//  - weight gradient dW = dYᵀ X: a = dY's transposed copy, b = X's transposed copy, b scaled by
//    rows, M (the tokens, which it reduces over) ending in a short block; d bf16, and f32.
// A bf16 d by the tolerance rule of tests/common/check.hpp (the baseline multiplies those values in
// fp32 in the reduction's order and rounds to bf16). An f32 d by the documented order instead:
// each of the ceil(M/128) = 2 block partials rounded once to fp32 and each promotion one fused
// multiply-add, so |d - exact| <= (2 + 2) 2^-24 sum|a b| < 2^-22 sum|a b| per element. (Held to
// the fp32 baseline, the rule breaks by chance here: products of E4M3 values of nearby scales
// add up in fp32 almost exactly, so the baseline's largest error is a coin flip of one rounding.)
TEST(QuantizeActivationFp8, BothCopiesAreGemmFp8Operands) {
  constexpr int64_t M = 208, N = 272, K = 400;
  Seeds seeds;
  // Magnitudes within 2^-2 .. 2^2 of each other from block to block (enough for a scale read from
  // the wrong block to show): the tolerance is set by the baseline's largest error, which with
  // a few rows or columns far above the rest would rest on a handful of elements.
  Fp8ActivationCase x(M, K, DType::bf16, false, seeds, 1, 1);
  Fp8ActivationCase dy(M, N, DType::bf16, false, seeds, 1, 1);
  quantize_activation_fp8(x.args(true));
  quantize_activation_fp8(dy.args(true));
  ASSERT_EQ(x.check(true), "");
  ASSERT_EQ(dy.check(true), "");
  // out [rows, cols] = sum over r of a(i, r) b(j, r) (both operands reduced along their rows):
  // exact in fp64, the baseline (fp32 in r order, rounded to bf16), and sum |a b|.
  struct Products {
    std::vector<double> exact, unfused, magnitude;
  };
  const auto products = [](const std::vector<double>& a, const std::vector<double>& b, int64_t rows,
                           int64_t cols, int64_t reduce) {
    Products p;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double sum = 0, magnitude = 0;
        float sum32 = 0.f;
        for (int64_t r = 0; r < reduce; ++r) {
          const double ab = a[size_t(i * reduce + r)] * b[size_t(j * reduce + r)];
          sum += ab;
          magnitude += std::fabs(ab);
          sum32 += float(a[size_t(i * reduce + r)]) * float(b[size_t(j * reduce + r)]);
        }
        p.exact.push_back(sum);
        p.unfused.push_back(double(bf16::from(sum32).to_float()));
        p.magnitude.push_back(magnitude);
      }
    return p;
  };
  {
    SCOPED_TRACE("Y = X Wᵀ (codes)");
    Fp8WeightCase w(N, K, DType::bf16, false, seeds, 2);
    quantize_weight_fp8(w.args(Fp8Copies::rows));
    ASSERT_EQ(w.check(Fp8Copies::rows), "");
    std::vector<double> wv = w.codes.values();
    const std::vector<double> ws = w.scales.values();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        wv[size_t(n * K + k)] *= ws[size_t(n / 128 * num_fp8_scale_blocks(K) + k / 128)];
    HostTensor d(DType::bf16, {M, N});
    gemm_fp8({.a = x.codes.view(),
              .a_scales = x.scales.view(),
              .b = w.codes.view(),
              .b_scales = w.scales.view(),
              .d = d.view()});
    const Products p = products(x.dequantized(false), wv, M, N, K);
    CODA_EXPECT_PASSES(check_output("d", d, p.exact, p.unfused));
  }
  const Products p = products(dy.dequantized(true), x.dequantized(true), N, K, M);
  for (DType d_dtype : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(std::string("dW = dYᵀ X (codes_t, b by rows), d ") + dtype_name(d_dtype));
    HostTensor d(d_dtype, {N, K});
    gemm_fp8({.a = dy.codes_t.view(),
              .a_scales = dy.scales_t.view(),
              .b = x.codes_t.view(),
              .b_scales = x.scales_t.view(),
              .d = d.view(),
              .b_scaling = Fp8BScaling::rows});
    if (d_dtype == DType::bf16) {
      CODA_EXPECT_PASSES(check_output("d", d, p.exact, p.unfused));
      continue;
    }
    ASSERT_TRUE(d.guard_intact());
    const std::vector<double> got = d.values();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - p.exact[i]) <= std::ldexp(p.magnitude[i], -22)) && ++bad <= 4)
        ADD_FAILURE() << "dW[" << i << "] = " << got[i] << ", exact " << p.exact[i]
                      << ", sum |a b| " << p.magnitude[i];
    EXPECT_EQ(bad, 0);
  }
}

// Each bad argument is reported by the rule it breaks, and no output byte changes.
TEST(QuantizeActivationFp8, RejectsBadArgumentsBeforeWritingAnything) {
  Seeds seeds;
  Fp8ActivationCase c(208, 304, DType::bf16, false, seeds);
  Fp8ActivationCase square(128, 128, DType::f32, false, seeds);
  Fp8ActivationCase ragged_m(200, 304, DType::bf16, false, seeds);
  HostTensor wrong_scales(DType::e8m0, {208, 2});  // ceil(304/128) = 3 columns needed
  HostTensor weight_scales_t(DType::e8m0, {3, 2}); // the weight's layout, not [K, ceil(M/128)]
  HostTensor bf16_codes(DType::bf16, {208, 304});
  HostTensor i32_x(DType::i32, {208, 304});
  HostTensor ragged_x(DType::bf16, {208, 296}); // 16-byte rows, K not a multiple of 16
  struct Case {
    const char* name;
    Fp8ActivationCase* target;
    std::function<void(QuantizeActivationFp8Args&)> spoil;
    const char* message;
  };
  const Case cases[] = {
      {"scales of the wrong shape", &c, [&](auto& a) { a.scales = wrong_scales.view(); }, "scales"},
      {"codes of the wrong dtype", &c, [&](auto& a) { a.codes = bf16_codes.view(); }, "codes"},
      {"an integer x", &c, [&](auto& a) { a.x = i32_x.view(); }, "x must be"},
      {"scales_t without codes_t", &c, [&](auto& a) { a.codes_t = TensorView{}; },
       "scales_t is given but codes_t is absent"},
      {"codes_t without scales_t", &c, [&](auto& a) { a.scales_t = TensorView{}; }, "scales_t"},
      {"codes_t the shape of codes", &c, [&](auto& a) { a.codes_t = c.codes.view(); }, "codes_t"},
      {"scales_t in the weight's layout", &c, [&](auto& a) { a.scales_t = weight_scales_t.view(); },
       "scales_t"},
      {"K not a multiple of 16", &c, [&](auto& a) { a.x = ragged_x.view(); }, "multiple of 16"},
      {"M not a multiple of 16 with codes_t", &ragged_m, [](auto&) {},
       "M must be a multiple of 16 when codes_t is given"},
      {"codes_t overlapping codes", &square, [&](auto& a) { a.codes_t = square.codes.view(); },
       "share memory"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.name);
    QuantizeActivationFp8Args args = bad.target->args(true);
    bad.spoil(args);
    try {
      quantize_activation_fp8(args);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.message), std::string::npos) << e.what();
    }
    for (Fp8ActivationCase* t : {&c, &square, &ragged_m})
      for (const HostTensor* out : {&t->codes, &t->scales, &t->codes_t, &t->scales_t})
        for (double v : out->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
  }
  // Without codes_t, M is arbitrary: the ragged case's row copy is accepted.
  quantize_activation_fp8(ragged_m.args(false));
  EXPECT_EQ(ragged_m.check(false), "");
}

} // namespace
} // namespace coda::test
