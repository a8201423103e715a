// The backward kernels (K6, K7, rope_backward, cross_entropy) through the public API on host
// memory, held to the fp64 references by the tolerance rule; and the algebra that makes the
// fused RMSNorm backward valid: with zeta from K7, rope_backward or cross_entropy, K6 equals the
// textbook RMSNorm backward (reference/ops.hpp), which finite differences confirm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "reference/fp8.hpp"
#include "reference/gemm.hpp"
#include "reference/kernels.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {
namespace {

const DType kHalfTypes[] = {DType::bf16, DType::f16};
// The unfused path with fp32 tensors: the bar for statistics the fused kernels keep in fp32.
const ref::Rounding kFp32{ref::Rounding::Kind::f32};

struct Shape {
  int64_t M, N, K;
};
std::string label(const Shape& s) {
  return "M" + std::to_string(s.M) + "_N" + std::to_string(s.N) + "_K" + std::to_string(s.K);
}
// GoogleTest's printer for a Shape parameter (--gtest_list_tests, failures): its label.
void PrintTo(const Shape& s, std::ostream* os) { *os << label(s); }

// rstd of each row of x [M, N] in fp64, as K0 + rstd_from_partials would hand it over (f32).
std::vector<double> rstd_of(const std::vector<double>& x, int64_t M, int64_t N, double eps) {
  const auto partials =
      ref::rms_stats({}, M, N, x, std::vector<double>(size_t(N), 1.0)).sumsq_partials;
  return ref::rstd_from_partials({}, M, partials, N, eps);
}

// ---- K6: dx (+)= rstd (g gamma - xh zeta), h_hat, column partials of g * xh.
// N is the RMSNorm width, K the consumer's output width; M = 200 spans two column blocks.

// K6's tensors besides its GEMM operands dz and w, drawn from `seeds` in this order (x, gamma,
// zeta, then dx's input when accumulating), its outputs poisoned.
struct RmsBackwardRest {
  Shape s;
  bool accumulate;
  HostTensor x, gamma, rstd, zeta, dx, h_hat, partials;
  std::vector<double> dx_in; // dx before the call (accumulating), else empty
  RmsBackwardRest(DType dtype, const Shape& s_, bool accumulate_, Seeds& seeds)
      : s(s_), accumulate(accumulate_), x(HostTensor::random(dtype, {s.M, s.N}, seeds.next())),
        gamma(HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5)),
        rstd(HostTensor::of(DType::f32, {s.M}, rstd_of(x.values(), s.M, s.N, 1e-6))),
        zeta(HostTensor::random(DType::f32, {s.M}, seeds.next(), -0.5, 0.5)),
        dx(accumulate ? HostTensor::random(dtype, {s.M, s.N}, seeds.next())
                      : HostTensor(dtype, {s.M, s.N})),
        h_hat(dtype, {s.M, s.N}), partials(DType::f32, {s.N, ref::partial_blocks(s.M)}),
        dx_in(accumulate ? dx.values() : std::vector<double>{}) {}
  // The call on these tensors; dz_scales and w_scales with E4M3 dz and w.
  RmsBackwardArgs args(const TensorView& dz, const TensorView& w, const Scalar& alpha,
                       const TensorView& dz_scales = {}, const TensorView& w_scales = {}) {
    return {.dz = dz,
            .w = w,
            .x = x.view(),
            .rstd = rstd.view(),
            .zeta = zeta.view(),
            .gamma = gamma.view(),
            .alpha = alpha,
            .accumulate = accumulate,
            .dx = dx.view(),
            .h_hat = h_hat.view(),
            .dgamma_partials = partials.view(),
            .dz_scales = dz_scales,
            .w_scales = w_scales};
  }
  // The reference's inputs for dz [M, K], w [K, N] and alpha.
  ref::RmsBackwardInputs inputs(std::vector<double> dz, std::vector<double> w, double alpha) const {
    return {s.M,        s.N,           s.K,           std::move(dz),  std::move(w),
            x.values(), rstd.values(), zeta.values(), gamma.values(), alpha,
            accumulate, dx_in};
  }
};

using RmsBackwardParam = std::tuple<DType, Shape, bool /*accumulate*/, bool /*alpha tensor*/>;
class RmsBackward : public testing::TestWithParam<RmsBackwardParam> {};

TEST_P(RmsBackward, OutputsAndDgammaPartialsMatchReference) {
  const auto [dtype, s, accumulate, alpha_tensor] = GetParam();
  Seeds seeds;
  // dz and w in sixteenths: g as K6 stores it is known exactly here (for dx, below).
  auto dz = sixteenths(dtype, s.M, s.K, seeds.next());
  auto w = sixteenths(dtype, s.K, s.N, seeds.next());
  RmsBackwardRest r(dtype, s, accumulate, seeds);
  // alpha = 0.46875 either as a value or as value * [1] tensor (e.g. dloss on the device).
  auto alpha_t = HostTensor::of(DType::f32, {1}, {0.3125});
  const Scalar alpha = alpha_tensor ? Scalar{1.5f, alpha_t.view()} : Scalar{0.46875f, {}};
  gemm_rms_backward(r.args(dz.view(), w.view(), alpha));
  const HostTensor &dx = r.dx, &h_hat = r.h_hat, &partials = r.partials;

  const ref::RmsBackwardInputs in = r.inputs(dz.values(), w.values(), 0.46875);
  const auto exact = ref::rms_backward({}, in), unfused = ref::rms_backward(lowp(dtype), in);
  if (s.K >= kRmsBackwardRoundedGradientMinK) {
    // dx from g as stored (rounded to the 16-bit type, as an unfused dgrad stores it): after
    // that, fp32 and one rounding. Against the unrounded g its error is the stored g's, as
    // large as the unfused path's, so there the 2x rule fails at random on small outputs
    // (M1_N8 with g rounded at every K: 4 of 8000 runs, each element's own rounding allowed).
    const StoredGradientDx from_stored = rms_backward_dx_from_stored_g(in, dtype);
    CODA_EXPECT_PASSES(check_rounded_output("dx", dx, from_stored.exact, from_stored.unfused));
  } else {
    CODA_EXPECT_PASSES(check_output("dx", dx, exact.dx, unfused.dx));
  }
  CODA_EXPECT_PASSES(check_output("h_hat", h_hat, exact.h_hat, unfused.h_hat));
  CODA_EXPECT_PASSES(
      check_output("dgamma_partials", partials, exact.dgamma_partials, unfused.dgamma_partials));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsBackward,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          // K = 4096: g rounded (from 3072, args.hpp)
                                          testing::Values(Shape{1, 8, 16}, Shape{37, 136, 64},
                                                          Shape{200, 264, 32},
                                                          Shape{37, 136, 4096}),
                                          testing::Bool(), testing::Bool()),
                         [](const testing::TestParamInfo<RmsBackwardParam>& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  label(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_accumulate" : "_overwrite") +
                                  (std::get<3>(info.param) ? "_alpha_tensor" : "_alpha_value");
                         });

// K6 on E4M3 operands (docs/fp8.md): dz as codes with row-block scales and w the weight's
// transposed copy [N, K] with 128 x 128 block scales (gemm_fp8's forward form), g fp32 below
// kRmsBackwardRoundedGradientMinK (every K here; from there RoundsGradientFromRoundingK, below);
// against the reference on the values they stand for (w back in [K, N]). f16 with blocks of
// 2^+-2, whose products stay in its range.
TEST(RmsBackwardFp8, OutputsOfE4m3OperandsMatchReference) {
  for (DType dtype : kHalfTypes)
    for (const bool accumulate : {false, true})
      for (const Shape& s : {Shape{1, 8, 16}, Shape{37, 136, 144}, Shape{200, 264, 272}}) {
        SCOPED_TRACE(dtype_label(dtype) + "_" + label(s) + (accumulate ? "_accumulate" : ""));
        Seeds seeds;
        Fp8GemmCase g(s.M, s.N, s.K, seeds, {.max_binade = dtype == DType::f16 ? 2 : 6});
        RmsBackwardRest r(dtype, s, accumulate, seeds);
        gemm_rms_backward(r.args(g.a.view(), g.b.view(), Scalar{0.46875f, {}}, g.a_scales.view(),
                                 g.b_scales.view()));
        const HostTensor &dx = r.dx, &h_hat = r.h_hat, &partials = r.partials;
        const ref::RmsBackwardInputs in = r.inputs(g.a_values(), g.b_values_transposed(), 0.46875);
        const auto exact = ref::rms_backward({}, in), unfused = ref::rms_backward(lowp(dtype), in);
        CODA_EXPECT_PASSES(check_output("dx", dx, exact.dx, unfused.dx));
        CODA_EXPECT_PASSES(check_output("h_hat", h_hat, exact.h_hat, unfused.h_hat));
        CODA_EXPECT_PASSES(check_output("dgamma_partials", partials, exact.dgamma_partials,
                                        unfused.dgamma_partials));
      }
}

// ---- K7: recomputed act, interleaved dpreact, row partials of g dg + u du over j.

using SwigluBackwardParam = std::tuple<DType, Shape /* N = F */>;
class SwigluBackward : public testing::TestWithParam<SwigluBackwardParam> {};

TEST_P(SwigluBackward, ActGradientsAndZetaPartialsMatchReference) {
  const auto [dtype, s] = GetParam();
  const int64_t F = s.N;
  Seeds seeds;
  auto dx = HostTensor::random(dtype, {s.M, s.K}, seeds.next());
  auto w = HostTensor::random(dtype, {s.K, F}, seeds.next());
  auto preact = HostTensor::random(dtype, {s.M, 2 * F}, seeds.next(), -4, 4);
  SwigluBackwardCall k7(dx, w, preact);
  gemm_swiglu_backward(k7.args());
  const ref::SwigluBackwardInputs in = k7.inputs();
  const auto exact = ref::swiglu_backward({}, in), unfused = ref::swiglu_backward(lowp(dtype), in);
  CODA_EXPECT_PASSES(check_output("act", k7.act, exact.act, unfused.act));
  CODA_EXPECT_PASSES(check_output("dpreact", k7.dpreact, exact.dpreact, unfused.dpreact));
  expect_zeta_within_dy_rounding(k7.zeta_partials, exact.zeta_partials,
                                 zeta_dy_rounding(in, dtype));
}

INSTANTIATE_TEST_SUITE_P(Kernels, SwigluBackward,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::Values(Shape{1, 8, 16}, Shape{37, 136, 64},
                                                          Shape{200, 264, 32})),
                         [](const testing::TestParamInfo<SwigluBackwardParam>& info) {
                           const Shape& s = std::get<1>(info.param);
                           return dtype_label(std::get<0>(info.param)) + "_M" +
                                  std::to_string(s.M) + "_F" + std::to_string(s.N) + "_K" +
                                  std::to_string(s.K);
                         });

// K7 on E4M3 operands (docs/fp8.md), as K6's above: dx as codes with row-block scales and w the
// down weight's transposed copy [F, K] with 128 x 128 block scales, dy still rounded at the Stage;
// against the reference on the values they stand for (w back in [K, F]). F = N; f16 with blocks
// of 2^+-2, whose products stay in its range.
TEST(SwigluBackwardFp8, OutputsOfE4m3OperandsMatchReference) {
  for (DType dtype : kHalfTypes)
    for (const Shape& s : {Shape{1, 8, 16}, Shape{37, 136, 144}, Shape{200, 264, 272}}) {
      SCOPED_TRACE(dtype_label(dtype) + "_" + label(s));
      const int64_t F = s.N;
      Seeds seeds;
      Fp8GemmCase g(s.M, F, s.K, seeds, {.max_binade = dtype == DType::f16 ? 2 : 6});
      auto preact = HostTensor::random(dtype, {s.M, 2 * F}, seeds.next(), -4, 4);
      HostTensor act(dtype, {s.M, F}), dpreact(dtype, {s.M, 2 * F});
      HostTensor zeta_partials(DType::f32, {s.M, ref::partial_blocks(F, ref::kStagedPartialBlock)});
      gemm_swiglu_backward({.dx = g.a.view(),
                            .w = g.b.view(),
                            .preact = preact.view(),
                            .act = act.view(),
                            .dpreact = dpreact.view(),
                            .zeta_partials = zeta_partials.view(),
                            .dx_scales = g.a_scales.view(),
                            .w_scales = g.b_scales.view()});
      const ref::SwigluBackwardInputs in{
          s.M, F, s.K, g.a_values(), g.b_values_transposed(), preact.values()};
      const auto exact = ref::swiglu_backward({}, in);
      const auto unfused = ref::swiglu_backward(lowp(dtype), in);
      for (double v : unfused.dpreact) ASSERT_TRUE(std::isfinite(v)) << "a vacuous check";
      CODA_EXPECT_PASSES(check_output("act", act, exact.act, unfused.act));
      CODA_EXPECT_PASSES(check_output("dpreact", dpreact, exact.dpreact, unfused.dpreact));
      expect_zeta_within_dy_rounding(zeta_partials, exact.zeta_partials,
                                     zeta_dy_rounding(in, dtype));
    }
}

// ---- Partials the epilogue reduces in fp32, not from rounded terms: held to the fp32 path,
// about 10^4 times tighter than the bf16 one. K6's g xh from the fp32 g below
// kRmsBackwardRoundedGradientMinK and from g as stored from there (args.hpp); K7's dg, du from
// dy as stored (K7 rounds dy = dx · w first: its staged schedule hands it over so). For the
// stored gradients, dz (dx) and w are sixteenths, so every fp32 sum of the GEMM is exact and the
// stored gradient is the same in the kernel and here; the references get it: dz = g, w = I.

class Fp32Partials : public testing::TestWithParam<DType> {};

// The reference's view of a dgrad GEMM's stored output g = round(a · w): a = g, w = I.
void feed_stored_gradient(DType dtype, int64_t M, int64_t N, int64_t K, std::vector<double>& a,
                          std::vector<double>& w, int64_t& k) {
  std::vector<double> g(size_t(M * N));
  ref::gemm(ref::Layout::dgrad, M, N, K, a.data(), w.data(), g.data());
  a = ref::rounded(lowp(dtype), g);
  k = N;
  w.assign(size_t(N * N), 0.0);
  for (int64_t n = 0; n < N; ++n) w[size_t(n * N + n)] = 1.0;
}

// K6's dgamma partials against the reference on `in`, whose gradient is the one K6 sums (the
// fp32 g, or g as stored fed by feed_stored_gradient).
void expect_dgamma_partials_within_fp32_sum(const HostTensor& partials,
                                            const ref::RmsBackwardInputs& in) {
  const Shape s{in.M, in.N, in.K};
  // Held to the classical bound of an fp32 sum (any order) of k terms, each the product of two
  // fp32 roundings (xh = x rstd, then g xh): |out - exact| <= gamma_{k+2} sum |terms|, with
  // gamma_n = n u / (1 - n u), u = 2^-24. An fp32 implementation cannot fail it, one that
  // rounded the terms to 16 bits would by far. (The 2x rule against the fp32 reference, which
  // sums in another order, compared two independent errors of one size: up to 0.99 of its bound
  // over seeds 1-1000 and 5001-5100.)
  std::vector<double> g(size_t(s.M * s.N));
  ref::gemm(ref::Layout::dgrad, s.M, s.N, in.K, in.dz.data(), in.w.data(), g.data());
  const std::vector<double> exact = ref::rms_backward({}, in).dgamma_partials;
  const std::vector<double> out = partials.values();
  const int64_t blocks = ref::partial_blocks(s.M);
  const double u = std::ldexp(1.0, -24);
  int64_t violations = 0;
  std::string first;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t m0 = b * ref::kPartialBlock, m1 = std::min(s.M, m0 + ref::kPartialBlock);
      double magnitude = 0;
      for (int64_t m = m0; m < m1; ++m)
        magnitude +=
            std::abs(g[size_t(m * s.N + n)] * in.x[size_t(m * s.N + n)] * in.rstd[size_t(m)]);
      const double k = double(m1 - m0 + 2), bound = k * u / (1 - k * u) * magnitude;
      const size_t i = size_t(n * blocks + b);
      if (!(std::abs(out[i] - exact[i]) <= bound) && violations++ == 0)
        first = "dgamma_partials[" + std::to_string(n) + ", " + std::to_string(b) +
                "] = " + std::to_string(out[i]) + ", exact " + std::to_string(exact[i]) +
                ", fp32 sum bound " + std::to_string(bound);
    }
  EXPECT_EQ(violations, 0) << first;
}

void expect_fp32_dgamma_partials(DType dtype, const Shape& s) {
  Seeds seeds;
  auto dz = sixteenths(dtype, s.M, s.K, seeds.next());
  auto w = sixteenths(dtype, s.K, s.N, seeds.next());
  auto x = HostTensor::random(dtype, {s.M, s.N}, seeds.next());
  auto gamma = HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5);
  auto rstd = HostTensor::of(DType::f32, {s.M}, rstd_of(x.values(), s.M, s.N, 1e-6));
  auto zeta = HostTensor::random(DType::f32, {s.M}, seeds.next(), -0.5, 0.5);
  RmsBackwardCall k6(dz, w, x, rstd, zeta, gamma);
  gemm_rms_backward(k6.args());
  ref::RmsBackwardInputs in = k6.inputs();
  if (s.K >= kRmsBackwardRoundedGradientMinK)
    feed_stored_gradient(dtype, s.M, s.N, s.K, in.dz, in.w, in.K);
  expect_dgamma_partials_within_fp32_sum(k6.dgamma_partials, in);
}

TEST_P(Fp32Partials, RmsBackwardDgammaPartialsUseUnroundedGradient) {
  expect_fp32_dgamma_partials(GetParam(), {200, 264, 32});
}

TEST_P(Fp32Partials, RmsBackwardDgammaPartialsUseStoredGradientFromRoundingK) {
  expect_fp32_dgamma_partials(GetParam(), {130, 136, kRmsBackwardRoundedGradientMinK});
}

TEST_P(Fp32Partials, SwigluBackwardZetaPartialsUseStoredGradient) {
  const DType dtype = GetParam();
  const int64_t M = 200, F = 264, K = 32;
  Seeds seeds;
  auto dx = sixteenths(dtype, M, K, seeds.next());
  auto w = sixteenths(dtype, K, F, seeds.next());
  auto preact = HostTensor::random(dtype, {M, 2 * F}, seeds.next(), -4, 4);
  SwigluBackwardCall k7(dx, w, preact);
  gemm_swiglu_backward(k7.args());
  ref::SwigluBackwardInputs in = k7.inputs();
  feed_stored_gradient(dtype, M, F, K, in.dx, in.w, in.K);
  CODA_EXPECT_PASSES(check_output("zeta_partials", k7.zeta_partials,
                                  ref::swiglu_backward({}, in).zeta_partials,
                                  ref::swiglu_backward(kFp32, in).zeta_partials));
}

// K6 on E4M3 operands from K = kRmsBackwardRoundedGradientMinK: g rounded to the 16-bit type,
// as the GPU's default there (the staged FP8 tile) hands it over. dz and w are sixteenths
// quantized by the recipe (at most 4 significant bits, so exact in E4M3 under any power-of-two
// scale), so the fp32 product is exact and g as stored is known here: dx is held to it
// (rms_backward_dx_from_stored_g) and the dgamma partials to the fp32 sum of the stored g's
// terms (which g left unrounded would miss by far), as for 16-bit operands above.
TEST(RmsBackwardFp8, RoundsGradientFromRoundingK) {
  for (DType dtype : kHalfTypes)
    for (const bool accumulate : {false, true})
      for (const Shape& s : {Shape{1, 8, kRmsBackwardRoundedGradientMinK}, Shape{200, 264, 3200}}) {
        SCOPED_TRACE(dtype_label(dtype) + "_" + label(s) + (accumulate ? "_accumulate" : ""));
        Seeds seeds;
        const std::vector<double> dz_values = sixteenths(dtype, s.M, s.K, seeds.next()).values();
        const std::vector<double> w_t_values = sixteenths(dtype, s.N, s.K, seeds.next()).values();
        const ref::Fp8Blocks qdz = ref::quantize_fp8_blocks(
            std::vector<float>(dz_values.begin(), dz_values.end()), s.M, s.K, 1);
        const ref::Fp8Blocks qw = ref::quantize_fp8_blocks(
            std::vector<float>(w_t_values.begin(), w_t_values.end()), s.N, s.K, kFp8ScaleBlock);
        ASSERT_EQ(ref::dequantize_fp8_blocks(qdz, s.M, s.K, 1), dz_values) << "dz not exact";
        ASSERT_EQ(ref::dequantize_fp8_blocks(qw, s.N, s.K, kFp8ScaleBlock), w_t_values)
            << "w not exact";
        const int64_t blocks_k = num_fp8_scale_blocks(s.K);
        auto bytes = [](DType dtype, int64_t rows, int64_t cols, const std::vector<uint8_t>& v) {
          HostTensor t(dtype, {rows, cols});
          std::memcpy(t.host_view().data, v.data(), v.size());
          return t;
        };
        HostTensor dz = bytes(DType::e4m3, s.M, s.K, qdz.codes);
        HostTensor dz_scales = bytes(DType::e8m0, s.M, blocks_k, qdz.scales);
        HostTensor w = bytes(DType::e4m3, s.N, s.K, qw.codes);
        HostTensor w_scales = bytes(DType::e8m0, num_fp8_scale_blocks(s.N), blocks_k, qw.scales);
        RmsBackwardRest r(dtype, s, accumulate, seeds);
        gemm_rms_backward(
            r.args(dz.view(), w.view(), Scalar{0.46875f, {}}, dz_scales.view(), w_scales.view()));
        const HostTensor &dx = r.dx, &h_hat = r.h_hat, &partials = r.partials;
        std::vector<double> w_values(size_t(s.K * s.N)); // the reference's w is [K, N]
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t k = 0; k < s.K; ++k)
            w_values[size_t(k * s.N + n)] = w_t_values[size_t(n * s.K + k)];
        ref::RmsBackwardInputs in = r.inputs(dz_values, w_values, 0.46875);
        const auto exact = ref::rms_backward({}, in), unfused = ref::rms_backward(lowp(dtype), in);
        const StoredGradientDx from_stored = rms_backward_dx_from_stored_g(in, dtype);
        CODA_EXPECT_PASSES(check_rounded_output("dx", dx, from_stored.exact, from_stored.unfused));
        CODA_EXPECT_PASSES(check_output("h_hat", h_hat, exact.h_hat, unfused.h_hat));
        // The reference's view of g as stored, round(alpha dz · w): dz = g, w = I, alpha = 1.
        std::vector<double> g(size_t(s.M * s.N));
        ref::gemm(ref::Layout::dgrad, s.M, s.N, s.K, in.dz.data(), in.w.data(), g.data());
        for (double& v : g) v *= in.alpha;
        in.dz = ref::rounded(lowp(dtype), g);
        in.K = s.N, in.alpha = 1;
        in.w.assign(size_t(s.N * s.N), 0.0);
        for (int64_t n = 0; n < s.N; ++n) in.w[size_t(n * s.N + n)] = 1.0;
        expect_dgamma_partials_within_fp32_sum(partials, in);
      }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Fp32Partials, testing::ValuesIn(kHalfTypes),
                         [](const testing::TestParamInfo<DType>& info) {
                           return dtype_label(info.param);
                         });

// ---- rope_backward: dz = RoPEᵀ(dqkv), zeta = scale * sum qkv dqkv (GQA, packed positions).

struct RopeCase {
  int32_t n_q_heads, n_kv_heads, head_dim;
  int64_t M;
};
std::string label(const RopeCase& r) {
  return "q" + std::to_string(r.n_q_heads) + "_kv" + std::to_string(r.n_kv_heads) + "_hd" +
         std::to_string(r.head_dim) + "_M" + std::to_string(r.M);
}
void PrintTo(const RopeCase& r, std::ostream* os) { *os << label(r); }

ref::RopeTable rope_table(const RopeCase& rc) {
  ref::RopeTable t;
  t.shape = {rc.n_q_heads, rc.n_kv_heads, rc.head_dim};
  t.positions = packed_positions(rc.M, 29, 517); // sequences of 29 restarting at 0
  t.inv_freq = rope_inv_freq_f32(rc.head_dim);
  return t;
}

using RopeBackwardParam = std::tuple<DType, RopeCase, bool /*dz aliases dqkv*/>;
class RopeBackward : public testing::TestWithParam<RopeBackwardParam> {};

TEST_P(RopeBackward, GradientAndZetaMatchReference) {
  const auto [dtype, rc, in_place] = GetParam();
  const ref::RopeTable table = rope_table(rc);
  const int64_t width = table.shape.width();
  const double scale = 1.0 / 256; // 1 / hidden
  Seeds seeds;
  auto dqkv = HostTensor::random(dtype, {rc.M, width}, seeds.next());
  auto qkv = HostTensor::random(dtype, {rc.M, width}, seeds.next());
  auto positions = HostTensor::of_ints({rc.M}, table.positions);
  auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
  HostTensor dz(dtype, {rc.M, width}), zeta(DType::f32, {rc.M});
  const std::vector<double> dqkv_in = dqkv.values();
  HostTensor& dz_out = in_place ? dqkv : dz;
  rope_backward({.dqkv = dqkv.view(),
                 .qkv = qkv.view(),
                 .rope = {.positions = positions.view(),
                          .inv_freq = inv_freq.view(),
                          .n_q_heads = rc.n_q_heads,
                          .n_kv_heads = rc.n_kv_heads,
                          .head_dim = rc.head_dim},
                 .scale = float(scale),
                 .dz = dz_out.view(),
                 .zeta = zeta.view()});
  const auto exact = ref::rope_backward({}, rc.M, table, dqkv_in, qkv.values(), scale);
  const auto unfused = ref::rope_backward(lowp(dtype), rc.M, table, dqkv_in, qkv.values(), scale);
  CODA_EXPECT_PASSES(check_output("dz", dz_out, exact.dz, unfused.dz));
  CODA_EXPECT_PASSES(check_output("zeta", zeta, exact.zeta, unfused.zeta));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RopeBackward,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::Values(RopeCase{4, 2, 16, 37},
                                                          RopeCase{4, 2, 64, 200},
                                                          RopeCase{3, 1, 8, 1}),
                                          testing::Bool()),
                         [](const testing::TestParamInfo<RopeBackwardParam>& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  label(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_in_place" : "");
                         });

// ---- cross_entropy from K5-style inputs (make_cross_entropy_inputs in
// tests/common/kernel_fixtures.hpp).

// zeta[m] = sum_n l * dl is an fp32 sum of V products on every path (coda's and the unfused
// one's). Its rounding floor is the size of fp32 recursive-summation error, sqrt(V) u sum|l dl|
// (u = 2^-24; Higham, Accuracy and Stability of Numerical Algorithms, 4.2), which for V = 1000 is
// above the rule's fixed 1e-6 (4 fp32 ulps at |zeta| ~ 3.6). With 3 rows the unfused path's
// error, a sum of f16 roundings of dlogits, can nearly cancel: at CODA_TEST_SEED=764 it was
// 6.3e-7 while coda's fp32 error was 2.7e-6 (7e-7 relative), and the 1e-6 floor failed a
// correct result (1 of 1000 seeds, tools/seed_sweep.sh, 2026-12-02; docs/reliability.md).
double zeta_rounding_floor(const ref::CrossEntropyInputs& in, const std::vector<double>& dlogits) {
  double floor = 1e-6;
  for (int64_t m = 0; m < in.M; ++m) {
    double sum = 0;
    for (int64_t n = 0; n < in.V; ++n)
      sum += std::fabs(in.logits[size_t(m * in.V + n)] * dlogits[size_t(m * in.V + n)]);
    floor = std::max(floor, std::sqrt(double(in.V)) * 0x1p-24 * sum);
  }
  return floor;
}

void expect_cross_entropy_matches(DType dtype, const ref::CrossEntropyInputs& in,
                                  const CrossEntropyOutputs& out, const HostTensor& dlogits) {
  const auto exact = ref::cross_entropy({}, in), unfused = ref::cross_entropy(lowp(dtype), in);
  CODA_EXPECT_PASSES(check_output("loss", out.loss, exact.loss, unfused.loss));
  CODA_EXPECT_PASSES(
      check_output("grad_scale", out.grad_scale, exact.grad_scale, unfused.grad_scale));
  CODA_EXPECT_PASSES(check_output("dlogits", dlogits, exact.dlogits, unfused.dlogits));
  CODA_EXPECT_PASSES(check_output("zeta", out.zeta, exact.zeta, unfused.zeta,
                                  zeta_rounding_floor(in, exact.dlogits)));
}

using CrossEntropyParam = std::tuple<DType, CrossEntropyCase, LossReduction>;
class CrossEntropy : public testing::TestWithParam<CrossEntropyParam> {};

TEST_P(CrossEntropy, LossGradientAndZetaMatchReference) {
  const auto [dtype, c, reduction] = GetParam();
  Seeds seeds;
  CrossEntropyInputs in = make_cross_entropy_inputs(dtype, c, -100, reduction, seeds);
  CrossEntropyOutputs out(dtype, c);
  cross_entropy(cross_entropy_args(in, out, reduction));
  expect_cross_entropy_matches(dtype, in.ref, out, out.dlogits);
}

// HEAD writes dlogits over the logits buffer; here also with ignore_index -1.
TEST_P(CrossEntropy, GradientMayOverwriteLogits) {
  const auto [dtype, c, reduction] = GetParam();
  Seeds seeds;
  CrossEntropyInputs in = make_cross_entropy_inputs(dtype, c, -1, reduction, seeds);
  CrossEntropyOutputs out(dtype, c);
  CrossEntropyArgs args = cross_entropy_args(in, out, reduction);
  args.dlogits = args.logits;
  cross_entropy(args);
  expect_cross_entropy_matches(dtype, in.ref, out, in.logits);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CrossEntropy,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::Values(CrossEntropyCase{37, 296},
                                                          CrossEntropyCase{200, 136},
                                                          CrossEntropyCase{3, 1000}),
                                          testing::Values(LossReduction::mean, LossReduction::sum)),
                         [](const testing::TestParamInfo<CrossEntropyParam>& info) {
                           const CrossEntropyCase& c = std::get<1>(info.param);
                           return dtype_label(std::get<0>(info.param)) + "_M" +
                                  std::to_string(c.M) + "_V" + std::to_string(c.V) +
                                  (std::get<2>(info.param) == LossReduction::mean ? "_mean"
                                                                                  : "_sum");
                         });

TEST(CrossEntropyErrors, TargetOutsideVocabularyIsRejectedBeforeAnyOutputIsWritten) {
  Seeds seeds;
  const CrossEntropyCase c{37, 136};
  CrossEntropyInputs in =
      make_cross_entropy_inputs(DType::bf16, c, -100, LossReduction::mean, seeds);
  std::vector<int32_t> targets = in.targets.ints();
  targets[5] = int32_t(c.V); // neither a class nor ignore_index
  in.targets = HostTensor::of_ints({c.M}, targets);
  CrossEntropyOutputs out(DType::bf16, c);
  EXPECT_THROW(cross_entropy(cross_entropy_args(in, out, LossReduction::mean)), Error);
  for (const HostTensor* t : {&out.loss, &out.dlogits, &out.grad_scale, &out.zeta})
    for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
}

// A micro-batch that is all padding: the mean is defined as 0 with a zero gradient scale (not
// torch's NaN), and dlogits are zero, so the step contributes nothing instead of NaN.
TEST(CrossEntropyAllIgnored, MeanIsZeroWithZeroGradScaleAndZeroGradient) {
  Seeds seeds;
  const CrossEntropyCase c{9, 136};
  CrossEntropyInputs in =
      make_cross_entropy_inputs(DType::bf16, c, -100, LossReduction::mean, seeds);
  in.targets = HostTensor::of_ints({c.M}, std::vector<int32_t>(size_t(c.M), -100));
  in.ref.targets = in.targets.ints();
  CrossEntropyOutputs out(DType::bf16, c);
  cross_entropy(cross_entropy_args(in, out, LossReduction::mean));
  EXPECT_EQ(out.loss.values()[0], 0.0);
  EXPECT_EQ(out.grad_scale.values()[0], 0.0);
  for (double v : out.dlogits.values()) ASSERT_EQ(v, 0.0);
  expect_cross_entropy_matches(DType::bf16, in.ref, out, out.dlogits);
}

// ---- The zeta identity, in fp64 on the references: with zeta = (1/D) sum_k z dz over the
// consumer's output (K7, rope_backward, cross_entropy), K6 equals the textbook RMSNorm backward
// of g = dz · W, and its h_hat and dgamma equal the textbook ones.

constexpr int64_t kM = 37, kD = 136; // tokens, hidden (the RMSNorm width)
constexpr double kEps = 1e-6;

struct NormedInput {
  std::vector<double> x, gamma, rstd, h_hat; // h_hat = x rstd gamma, the consumer's input
};
NormedInput normed_input(Seeds& seeds) {
  NormedInput n{random_doubles(size_t(kM * kD), seeds.next()),
                random_doubles(size_t(kD), seeds.next(), 0.5, 1.5), std::vector<double>(size_t(kM)),
                std::vector<double>(size_t(kM * kD))};
  ref::rmsnorm_forward({}, kM, kD, n.x.data(), n.gamma.data(), kEps, n.h_hat.data(), n.rstd.data());
  return n;
}

std::vector<double> matmul(ref::Layout layout, int64_t M, int64_t N, int64_t K,
                           const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(size_t(M * N));
  ref::gemm(layout, M, N, K, a.data(), b.data(), d.data());
  return d;
}

// K6 (dz, w [K, D], zeta, alpha) against the textbook backward of g = alpha dz · w.
void expect_k6_equals_textbook(const NormedInput& n, int64_t K, const std::vector<double>& dz,
                               const std::vector<double>& w, const std::vector<double>& zeta,
                               double alpha = 1) {
  const ref::RmsBackwardInputs in{kM, kD, K, dz, w, n.x, n.rstd, zeta, n.gamma, alpha, false, {}};
  const ref::RmsBackwardOutputs fused = ref::rms_backward({}, in);
  std::vector<double> g = matmul(ref::Layout::dgrad, kM, kD, K, dz, w);
  for (double& v : g) v *= alpha;
  std::vector<double> dx(g.size()), dgamma(static_cast<size_t>(kD));
  ref::rmsnorm_backward({}, kM, kD, n.x.data(), n.gamma.data(), n.rstd.data(), g.data(), dx.data(),
                        dgamma.data());
  EXPECT_LE(max_rel_error(fused.dx, dx), 1e-12);
  EXPECT_LE(max_rel_error(fused.h_hat, n.h_hat), 1e-14);
  EXPECT_LE(
      max_rel_error(ref::reduce_col_partials({}, kD, fused.dgamma_partials, false, {}), dgamma),
      1e-12);
}

TEST(ZetaIdentity, FromSwigluBackwardK6EqualsTextbookRmsNormBackward) {
  Seeds seeds;
  const int64_t F = 72;
  const NormedInput n = normed_input(seeds);
  const auto w_gate_up = random_doubles(size_t(2 * F * kD), seeds.next()); // [2F, D] interleaved
  const auto w_down = random_doubles(size_t(kD * F), seeds.next());        // [D, F]
  const auto dres = random_doubles(size_t(kM * kD), seeds.next());         // dL/d(residual)
  const auto preact = matmul(ref::Layout::fwd, kM, 2 * F, kD, n.h_hat, w_gate_up);
  const auto k7 = ref::swiglu_backward({}, {kM, F, kD, dres, w_down, preact});
  const auto zeta = ref::reduce_row_partials({}, kM, k7.zeta_partials, 1.0 / kD);
  expect_k6_equals_textbook(n, 2 * F, k7.dpreact, w_gate_up, zeta);
}

TEST(ZetaIdentity, FromRopeBackwardK6EqualsTextbookRmsNormBackward) {
  Seeds seeds;
  const NormedInput n = normed_input(seeds);
  ref::RopeTable table{{4, 2, 16}, packed_positions(kM, 11, 40), rope_inv_freq_f32(16)};
  const int64_t width = table.shape.width();
  const auto w_qkv = random_doubles(size_t(width * kD), seeds.next()); // [width, D]
  const auto z = matmul(ref::Layout::fwd, kM, width, kD, n.h_hat, w_qkv);
  std::vector<double> qkv(z.size());
  ref::rope_forward({}, kM, table.shape, table.positions.data(), table.inv_freq.data(), z.data(),
                    qkv.data());
  const auto dqkv = random_doubles(qkv.size(), seeds.next());
  const auto rb = ref::rope_backward({}, kM, table, dqkv, qkv, 1.0 / kD);
  expect_k6_equals_textbook(n, width, rb.dz, w_qkv, rb.zeta);
}

TEST(ZetaIdentity, FromCrossEntropyK6EqualsTextbookRmsNormBackward) {
  Seeds seeds;
  const int64_t V = 296;
  const NormedInput n = normed_input(seeds);
  const auto w_lm = random_doubles(size_t(V * kD), seeds.next()); // [V, D]
  const auto logits = matmul(ref::Layout::fwd, kM, V, kD, n.h_hat, w_lm);
  std::vector<int32_t> targets(static_cast<size_t>(kM));
  for (int64_t m = 0; m < kM; ++m) targets[size_t(m)] = m % 6 == 4 ? -100 : int32_t((m * 53) % V);
  std::vector<double> target_logit(size_t(kM), 0.0);
  for (int64_t m = 0; m < kM; ++m)
    if (targets[size_t(m)] >= 0)
      target_logit[size_t(m)] = logits[size_t(m * V + targets[size_t(m)])];
  const auto ce = ref::cross_entropy(
      {}, {kM, V, logits, ref::lse_row_partials({}, kM, V, logits), target_logit, targets});
  // The partial logsumexps combine to the full one: the loss is the textbook loss.
  const auto textbook = ref::cross_entropy({}, kM, V, logits.data(), targets.data(), -100,
                                           ref::Reduction::mean, nullptr, nullptr);
  EXPECT_NEAR(ce.loss, textbook.loss, 1e-12 * std::fabs(textbook.loss));
  const double dloss = 0.7, alpha = dloss * ce.grad_scale;
  std::vector<double> zeta = ce.zeta;
  for (double& v : zeta) v *= alpha / double(kD);
  expect_k6_equals_textbook(n, V, ce.dlogits, w_lm, zeta, alpha);
}

// Finite differences of the textbook forward (RMSNorm -> LM head -> mean cross-entropy) confirm
// the gradient that the fused path (K5 partials -> cross_entropy -> K6 with zeta) computes.
TEST(ZetaIdentity, FusedLossGradientMatchesFiniteDifferences) {
  Seeds seeds;
  const int64_t M = 3, D = 16, V = 24;
  const auto x = random_doubles(size_t(M * D), seeds.next());
  const auto gamma = random_doubles(size_t(D), seeds.next(), 0.5, 1.5);
  const auto w_lm = random_doubles(size_t(V * D), seeds.next());
  const std::vector<int32_t> targets = {5, -100, 23};
  const auto loss_of = [&](const std::vector<double>& xs) {
    std::vector<double> h(xs.size()), rstd(static_cast<size_t>(M));
    ref::rmsnorm_forward({}, M, D, xs.data(), gamma.data(), kEps, h.data(), rstd.data());
    const auto logits = matmul(ref::Layout::fwd, M, V, D, h, w_lm);
    return ref::cross_entropy({}, M, V, logits.data(), targets.data(), -100, ref::Reduction::mean,
                              nullptr, nullptr)
        .loss;
  };
  // The fused path: rms_stats -> K5 -> cross_entropy -> K6 with zeta = alpha zeta_L / D.
  const auto stats = ref::rms_stats({}, M, D, x, gamma);
  const auto k5 =
      ref::rms_lse({}, {M, V, D, stats.out_scaled, w_lm, stats.sumsq_partials, kEps}, targets);
  const auto ce =
      ref::cross_entropy({}, {M, V, k5.logits, k5.lse_partials, k5.target_logit, targets});
  EXPECT_NEAR(ce.loss, loss_of(x), 1e-12);
  std::vector<double> zeta = ce.zeta;
  for (double& v : zeta) v *= ce.grad_scale / double(D);
  const auto k6 = ref::rms_backward(
      {}, {M, D, V, ce.dlogits, w_lm, x, k5.rstd, zeta, gamma, ce.grad_scale, false, {}});
  std::vector<double> fd(x.size());
  const double step = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = x, down = x;
    up[i] += step;
    down[i] -= step;
    fd[i] = (loss_of(up) - loss_of(down)) / (2 * step);
  }
  EXPECT_LE(max_rel_error(k6.dx, fd), 1e-7);
}

// ---- The same identity through the CPU backend: K7 -> reduce_row_partials (scale 1/D) -> K6
// gives the RMSNorm input gradient of the textbook backward (dy = dres · W_down, SwiGLU backward,
// g = dpreact · W_gate_up, RMSNorm backward), no worse than the textbook in bf16 / f16.

struct MlpBackwardInputs {
  int64_t M, D, F;
  std::vector<double> x, gamma, rstd; // the RMSNorm input [M, D], weight [D] and rstd [M]
  std::vector<double> dres;           // [M, D] gradient of the residual stream
  std::vector<double> w_down;         // [D, F]
  std::vector<double> w_gate_up;      // [2F, D] interleaved
  std::vector<double> preact;         // [M, 2F] interleaved (g, u)
};

// The textbook gradient at the RMSNorm input: dy = dres · W_down, the SwiGLU backward of the
// saved pre-activation, g = dpreact · W_gate_up, then the RMSNorm backward (ops.hpp), each op
// rounding as r says.
std::vector<double> textbook_rmsnorm_input_gradient(ref::Rounding r, const MlpBackwardInputs& in) {
  const int64_t M = in.M, D = in.D, F = in.F;
  std::vector<double> dy(size_t(M * F)), gate(size_t(M * F)), up(size_t(M * F));
  ref::linear(r, ref::Layout::dgrad, M, F, D, in.dres.data(), in.w_down.data(), dy.data());
  for (int64_t i = 0; i < M * F; ++i) {
    gate[size_t(i)] = in.preact[size_t(2 * i)];
    up[size_t(i)] = in.preact[size_t(2 * i + 1)];
  }
  std::vector<double> dgate(dy.size()), dup(dy.size()), dpreact(2 * dy.size());
  ref::swiglu_backward(r, M, F, gate.data(), up.data(), dy.data(), dgate.data(), dup.data());
  for (int64_t i = 0; i < M * F; ++i) {
    dpreact[size_t(2 * i)] = dgate[size_t(i)];
    dpreact[size_t(2 * i + 1)] = dup[size_t(i)];
  }
  std::vector<double> g(in.x.size()), dx(in.x.size()), dgamma(in.gamma.size());
  ref::linear(r, ref::Layout::dgrad, M, D, 2 * F, dpreact.data(), in.w_gate_up.data(), g.data());
  ref::rmsnorm_backward(r, M, D, in.x.data(), in.gamma.data(), in.rstd.data(), g.data(), dx.data(),
                        dgamma.data());
  return dx;
}

class ZetaChain : public testing::TestWithParam<DType> {};

TEST_P(ZetaChain, SwigluBackwardThenRmsBackwardEqualsTextbookGradient) {
  const DType dtype = GetParam();
  const int64_t M = 37, D = 136, F = 72;
  Seeds seeds;
  auto x = HostTensor::random(dtype, {M, D}, seeds.next());
  auto gamma = HostTensor::random(dtype, {D}, seeds.next(), 0.5, 1.5);
  auto rstd = HostTensor::of(DType::f32, {M}, rstd_of(x.values(), M, D, 1e-6));
  auto w_gate_up = HostTensor::random(dtype, {2 * F, D}, seeds.next()); // interleaved
  auto w_down = HostTensor::random(dtype, {D, F}, seeds.next());
  auto dres = HostTensor::random(dtype, {M, D}, seeds.next());
  // The saved pre-activation: the gate/up GEMM of the normalized x, as K2 stores it.
  std::vector<double> h_hat = x.values();
  for (int64_t i = 0; i < M * D; ++i)
    h_hat[size_t(i)] *= rstd.values()[size_t(i / D)] * gamma.values()[size_t(i % D)];
  auto preact = HostTensor::of(dtype, {M, 2 * F},
                               matmul(ref::Layout::fwd, M, 2 * F, D, h_hat, w_gate_up.values()));

  HostTensor zeta(DType::f32, {M});
  SwigluBackwardCall k7(dres, w_down, preact);
  gemm_swiglu_backward(k7.args());
  reduce_row_partials(
      {.partials = k7.zeta_partials.view(), .scale = 1.f / float(D), .out = zeta.view()});
  RmsBackwardCall k6(k7.dpreact, w_gate_up, x, rstd, zeta, gamma);
  gemm_rms_backward(k6.args());

  const MlpBackwardInputs in{M,
                             D,
                             F,
                             x.values(),
                             gamma.values(),
                             rstd.values(),
                             dres.values(),
                             w_down.values(),
                             w_gate_up.values(),
                             preact.values()};
  CODA_EXPECT_PASSES(check_output("dx", k6.dx, textbook_rmsnorm_input_gradient({}, in),
                                  textbook_rmsnorm_input_gradient(lowp(dtype), in)));
}

INSTANTIATE_TEST_SUITE_P(Kernels, ZetaChain, testing::ValuesIn(kHalfTypes),
                         [](const testing::TestParamInfo<DType>& info) {
                           return dtype_label(info.param);
                         });

} // namespace
} // namespace coda::test
