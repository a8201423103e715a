// quantize_weight_fp8 through the public API on host tensors (the CPU backend): codes, scales and
// the transposed copy against the format's definition applied block by block
// (tests/common/fp8_case.hpp), on ragged shapes, bf16 / f16 / f32 weights and blocks poisoned by
// a NaN or an infinity; both copies as gemm_fp8 operands (the forward and the input gradient)
// against the fp64 products of the values they stand for; bad arguments rejected before any byte
// changes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
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
      for (bool transposed : {true, false})
        for (bool non_finite : {false, true}) {
          SCOPED_TRACE("N " + std::to_string(s.n) + " K " + std::to_string(s.k) + " " +
                       dtype_name(dtype) + (transposed ? " with" : " without") + " the transpose" +
                       (non_finite ? ", NaN and infinity" : ""));
          Seeds seeds;
          Fp8WeightCase c(s.n, s.k, dtype, non_finite, seeds, dtype == DType::f16 ? 10 : 20);
          quantize_weight_fp8(c.args(transposed));
          EXPECT_EQ(c.check(transposed), "");
          if (!transposed) { // codes_t and scales_t untouched: still their poison
            for (double v : c.codes_t.values()) EXPECT_TRUE(std::isnan(v));
            for (double v : c.scales_t.values()) EXPECT_TRUE(std::isnan(v));
          }
        }
}

// codes and scales as the forward GEMM's b (Y = X Wᵀ), codes_t and scales_t as the input
// gradient's (dX = dY W): each against the fp64 product of the values the operands stand for.
TEST(QuantizeWeightFp8, BothCopiesAreGemmFp8Operands) {
  constexpr int64_t M = 70, N = 272, K = 400;
  Seeds seeds;
  Fp8WeightCase weight(N, K, DType::bf16, false, seeds);
  quantize_weight_fp8(weight.args(true));
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
      {"codes_t the shape of codes", [&](auto& a) { a.codes_t = c.codes.view(); }, "codes_t"},
      {"K not a multiple of 16", [&](auto& a) { a.w = ragged_weight.view(); }, "multiple of"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.name);
    QuantizeWeightFp8Args args = c.args(true);
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

} // namespace
} // namespace coda::test
