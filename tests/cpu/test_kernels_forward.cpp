// The forward kernels (plain GEMM, K0, K1, K2, K2g, K4, K5) through the public API on host memory,
// each output and partial held to the fp64 reference by the tolerance rule (check.hpp): no worse
// than twice the error of the ordinary unfused bf16 / f16 path. Inputs are fresh per run,
// outputs poisoned with NaN and fenced by guard bytes; M, N are ragged against the 128 tile.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "reference/kernels.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {
namespace {

struct Shape {
  int64_t M, N, K;
};
std::string label(const Shape& s) {
  return "M" + std::to_string(s.M) + "_N" + std::to_string(s.N) + "_K" + std::to_string(s.K);
}
// GoogleTest's printer for a Shape parameter (--gtest_list_tests, failures): its label.
void PrintTo(const Shape& s, std::ostream* os) { *os << label(s); }

// Ragged M (1, 37, 129, 200) and N (8, 136, 264, one exact tile), K multiples of 8.
const Shape kShapes[] = {{1, 8, 16}, {37, 136, 64}, {200, 264, 32}, {129, 128, 8}};
const DType kHalfTypes[] = {DType::bf16, DType::f16};
// The unfused path with fp32 tensors: the bar for statistics the fused kernels keep in fp32.
const ref::Rounding kFp32{ref::Rounding::Kind::f32};

using DtypeShape = std::tuple<DType, Shape>;
std::string dtype_shape_name(const testing::TestParamInfo<DtypeShape>& info) {
  return dtype_label(std::get<0>(info.param)) + "_" + label(std::get<1>(info.param));
}
const auto kDtypeShapes =
    testing::Combine(testing::ValuesIn(kHalfTypes), testing::ValuesIn(kShapes));

// ---- plain GEMM: D = alpha op(A) op(B) + beta C in every layout, D in the input type or f32.

using GemmParam = std::tuple<DType, GemmLayout, bool /*f32 output*/, bool /*with C*/>;

class Gemm : public testing::TestWithParam<GemmParam> {};

TEST_P(Gemm, MatchesReferenceInEveryLayout) {
  const auto [dtype, layout, f32_out, with_c] = GetParam();
  const ref::Layout ref_layout = layout == GemmLayout::fwd     ? ref::Layout::fwd
                                 : layout == GemmLayout::dgrad ? ref::Layout::dgrad
                                                               : ref::Layout::wgrad;
  const DType d_type = f32_out ? DType::f32 : dtype;
  Seeds seeds;
  const bool wgrad = layout == GemmLayout::wgrad, fwd = layout == GemmLayout::fwd;
  std::vector<Shape> shapes{{40, 136, 64}, {8, 8, 24}, {200, 24, 8}};
  if (wgrad) shapes.push_back({40, 136, 37}); // K = tokens, an outer dimension: any count
  for (const Shape s : shapes) {
    auto a = HostTensor::random(dtype, wgrad ? std::vector{s.K, s.M} : std::vector{s.M, s.K},
                                seeds.next());
    auto b = HostTensor::random(dtype, fwd ? std::vector{s.N, s.K} : std::vector{s.K, s.N},
                                seeds.next());
    HostTensor c = with_c ? HostTensor::random(d_type, {s.M, s.N}, seeds.next()) : HostTensor();
    HostTensor d(d_type, {s.M, s.N});
    GemmArgs args{.layout = layout, .a = a.view(), .b = b.view(), .d = d.view(), .c = c.view()};
    args.alpha = with_c ? 0.75f : 1.f;
    args.beta = with_c ? -1.5f : 0.f;
    gemm(args);

    const ref::GemmInputs in{
        ref_layout, s.M, s.N, s.K, a.values(), b.values(), c.values(), args.alpha.value, args.beta};
    CODA_EXPECT_PASSES(
        check_output("d " + label(s), d, ref::gemm({}, in), ref::gemm(lowp(d_type), in)));
  }
}

std::string gemm_name(const testing::TestParamInfo<GemmParam>& info) {
  const GemmLayout layout = std::get<1>(info.param);
  return dtype_label(std::get<0>(info.param)) +
         (layout == GemmLayout::fwd     ? "_fwd"
          : layout == GemmLayout::dgrad ? "_dgrad"
                                        : "_wgrad") +
         (std::get<2>(info.param) ? "_f32out" : "_halfout") +
         (std::get<3>(info.param) ? "_alpha_beta_c" : "_plain");
}

INSTANTIATE_TEST_SUITE_P(Kernels, Gemm,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::Values(GemmLayout::fwd, GemmLayout::dgrad,
                                                          GemmLayout::wgrad),
                                          testing::Bool(), testing::Bool()),
                         gemm_name);

// An FP8 case whose outputs overflow the 16-bit type would pass the rule vacuously (inf against
// inf): the unfused outputs must be finite.
void expect_finite(const std::vector<double>& values, const char* what) {
  for (double v : values)
    ASSERT_TRUE(std::isfinite(v)) << what << " overflows: the check would be vacuous";
}

// ---- K0: out = a·wᵀ + residual, out_scaled = out * gamma, row partials of out².

struct ResidualRmsCase {
  HostTensor a, w, residual, gamma, out, out_scaled, partials;
  ResidualRmsCase(DType dtype, const Shape& s, Seeds& seeds)
      : a(HostTensor::random(dtype, {s.M, s.K}, seeds.next())),
        w(HostTensor::random(dtype, {s.N, s.K}, seeds.next())),
        residual(HostTensor::random(dtype, {s.M, s.N}, seeds.next())),
        gamma(HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5)), out(dtype, {s.M, s.N}),
        out_scaled(dtype, {s.M, s.N}), partials(DType::f32, {s.M, ref::partial_blocks(s.N)}) {}
  ref::ResidualRmsInputs inputs(const Shape& s) const {
    return {s.M, s.N, s.K, a.values(), w.values(), residual.values(), gamma.values()};
  }
  ResidualRmsArgs args() {
    return {.a = a.view(),
            .w = w.view(),
            .residual = residual.view(),
            .gamma = gamma.view(),
            .out = out.view(),
            .out_scaled = out_scaled.view(),
            .sumsq_partials = partials.view()};
  }
};

void expect_residual_rms_matches(DType dtype, const ref::ResidualRmsInputs& in, HostTensor& out,
                                 HostTensor& out_scaled, HostTensor& partials) {
  const auto exact = ref::residual_rms({}, in), unfused = ref::residual_rms(lowp(dtype), in);
  CODA_EXPECT_PASSES(check_output("out", out, exact.out, unfused.out));
  CODA_EXPECT_PASSES(check_output("out_scaled", out_scaled, exact.out_scaled, unfused.out_scaled));
  // (fp32 of the unrounded x: the unfused path's rounding may cancel below it on one partial)
  CODA_EXPECT_PASSES(check_output("sumsq_partials", partials, exact.sumsq_partials,
                                  unfused.sumsq_partials,
                                  1e-6 + sumsq_partials_floor(exact.sumsq_partials)));
}

class ResidualRms : public testing::TestWithParam<DtypeShape> {};

TEST_P(ResidualRms, OutputsAndPartialsMatchReference) {
  const auto [dtype, s] = GetParam();
  Seeds seeds;
  ResidualRmsCase c(dtype, s, seeds);
  gemm_residual_rms(c.args());
  expect_residual_rms_matches(dtype, c.inputs(s), c.out, c.out_scaled, c.partials);
}

TEST_P(ResidualRms, OutputMayAliasResidual) {
  const auto [dtype, s] = GetParam();
  Seeds seeds;
  ResidualRmsCase c(dtype, s, seeds);
  const ref::ResidualRmsInputs in = c.inputs(s);
  ResidualRmsArgs args = c.args();
  args.out = args.residual; // the residual stream updated in place
  gemm_residual_rms(args);
  expect_residual_rms_matches(dtype, in, c.residual, c.out_scaled, c.partials);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ResidualRms, kDtypeShapes, dtype_shape_name);

// Each 16-bit output type and three shapes (one k-block; ragged; several k-blocks), each with an
// FP8 case of fresh codes and scales: f(dtype, shape, case, seeds), for K0 and K1 on E4M3
// operands. f16 with blocks of 2^+-2, whose products stay in its range (the default 2^+-6
// overflows it after the GEMM, where the fp64 reference does not).
template <class F> void for_each_fp8_case(F&& f) {
  for (DType dtype : kHalfTypes)
    for (const Shape& s : {Shape{1, 16, 16}, Shape{37, 272, 144}, Shape{200, 528, 272}}) {
      SCOPED_TRACE(dtype_label(dtype) + " M " + std::to_string(s.M) + " N " + std::to_string(s.N) +
                   " K " + std::to_string(s.K));
      Seeds seeds;
      Fp8GemmCase g(s.M, s.N, s.K, seeds, {.max_binade = dtype == DType::f16 ? 2 : 6});
      f(dtype, s, g, seeds);
    }
}

// K0 on E4M3 operands with gemm_fp8's block scales: against the reference on the values the
// codes and scales stand for, the residual and gamma 16-bit as ever.
TEST(ResidualRmsFp8, OutputsOfE4m3OperandsMatchReference) {
  for_each_fp8_case([](DType dtype, const Shape& s, Fp8GemmCase& g, Seeds& seeds) {
    ResidualRmsCase c(dtype, s, seeds);
    ResidualRmsArgs args = c.args();
    args.a = g.a.view();
    args.w = g.b.view();
    args.a_scales = g.a_scales.view();
    args.w_scales = g.b_scales.view();
    gemm_residual_rms(args);
    ref::ResidualRmsInputs in = c.inputs(s);
    in.a = g.a_values();
    in.w = g.b_values();
    expect_finite(ref::residual_rms(lowp(dtype), in).out_scaled, "the unfused out_scaled");
    expect_residual_rms_matches(dtype, in, c.out, c.out_scaled, c.partials);
  });
}

// ---- The normalized GEMMs K1, K2, K4, K5: z = rstd[m] * (a·wᵀ), rstd from row partials.

struct NormedGemmCase {
  HostTensor a, w, partials, rstd;
  float eps;
  NormedGemmCase(DType dtype, int64_t M, int64_t N, int64_t K, Seeds& seeds, float eps = 1e-6f)
      : a(HostTensor::random(dtype, {M, K}, seeds.next())),
        w(HostTensor::random(dtype, {N, K}, seeds.next())),
        partials(random_sumsq_partials(M, K, seeds.next())), rstd(DType::f32, {M}), eps(eps) {}
  ref::NormedGemmInputs inputs() const {
    return {a.shape()[0], w.shape()[0],      a.shape()[1], a.values(),
            w.values(),   partials.values(), eps};
  }
};

class RmsScale : public testing::TestWithParam<DtypeShape> {};

TEST_P(RmsScale, OutputAndRstdMatchReference) {
  const auto [dtype, s] = GetParam();
  Seeds seeds;
  NormedGemmCase c(dtype, s.M, s.N, s.K, seeds);
  HostTensor out(dtype, {s.M, s.N});
  gemm_rms_scale({.a = c.a.view(),
                  .w = c.w.view(),
                  .sumsq_partials = c.partials.view(),
                  .eps = c.eps,
                  .out = out.view(),
                  .rstd_out = c.rstd.view()});
  const auto in = c.inputs();
  const auto exact = ref::rms_scale({}, in), unfused = ref::rms_scale(lowp(dtype), in);
  CODA_EXPECT_PASSES(check_output("out", out, exact.out, unfused.out));
  CODA_EXPECT_PASSES(check_output("rstd_out", c.rstd, exact.rstd, unfused.rstd));
}

// The first layer's statistics kernel may write a single partial column; eps is large enough
// to matter; rstd_out is optional.
TEST_P(RmsScale, AcceptsSingleColumnPartialsWithoutRstdOut) {
  const auto [dtype, s] = GetParam();
  Seeds seeds;
  NormedGemmCase c(dtype, s.M, s.N, s.K, seeds, 0.25f);
  const std::vector<double> x = random_doubles(size_t(s.M * s.K), seeds.next());
  c.partials = HostTensor::of(
      DType::f32, {s.M, 1},
      ref::rms_stats({}, s.M, s.K, x, std::vector<double>(size_t(s.K), 1.0), s.K).sumsq_partials);
  HostTensor out(dtype, {s.M, s.N});
  gemm_rms_scale({.a = c.a.view(),
                  .w = c.w.view(),
                  .sumsq_partials = c.partials.view(),
                  .eps = c.eps,
                  .out = out.view(),
                  .rstd_out = {}}); // absent
  const auto in = c.inputs();
  CODA_EXPECT_PASSES(
      check_output("out", out, ref::rms_scale({}, in).out, ref::rms_scale(lowp(dtype), in).out));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsScale, kDtypeShapes, dtype_shape_name);

// K1 on E4M3 operands with gemm_fp8's block scales, as K0's above.
TEST(RmsScaleFp8, OutputOfE4m3OperandsMatchesReference) {
  for_each_fp8_case([](DType dtype, const Shape& s, Fp8GemmCase& g, Seeds& seeds) {
    HostTensor partials = random_sumsq_partials(s.M, s.K, seeds.next());
    HostTensor out(dtype, {s.M, s.N}), rstd(DType::f32, {s.M});
    const float eps = 1e-6f;
    gemm_rms_scale({.a = g.a.view(),
                    .w = g.b.view(),
                    .sumsq_partials = partials.view(),
                    .eps = eps,
                    .out = out.view(),
                    .rstd_out = rstd.view(),
                    .a_scales = g.a_scales.view(),
                    .w_scales = g.b_scales.view()});
    const ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
    const auto exact = ref::rms_scale({}, in), unfused = ref::rms_scale(lowp(dtype), in);
    expect_finite(unfused.out, "the unfused out");
    CODA_EXPECT_PASSES(check_output("out", out, exact.out, unfused.out));
    CODA_EXPECT_PASSES(check_output("rstd_out", rstd, exact.rstd, unfused.rstd));
  });
}

// K2 and K2g: the fused interleaved gate/up GEMM, N = 2F with F = 8, 136, 264, 128; each against
// its reference (they differ in the gate's activation only).
const Shape kGatedShapes[] = {{1, 16, 16}, {37, 272, 64}, {200, 528, 32}, {129, 256, 8}};
const auto kGatedCases =
    testing::Combine(testing::ValuesIn(kHalfTypes), testing::ValuesIn(kGatedShapes));

template <class GatedArgs>
void check_rms_gated(void (*kernel)(const GatedArgs&, Stream),
                     ref::RmsGatedOutputs (*reference)(ref::Rounding, const ref::NormedGemmInputs&),
                     double (*activation)(double), DType dtype, const Shape& s) {
  Seeds seeds;
  NormedGemmCase c(dtype, s.M, s.N, s.K, seeds);
  HostTensor preact(dtype, {s.M, s.N}), act(dtype, {s.M, s.N / 2});
  kernel({.a = c.a.view(),
          .w = c.w.view(),
          .sumsq_partials = c.partials.view(),
          .eps = c.eps,
          .preact = preact.view(),
          .act = act.view(),
          .rstd_out = c.rstd.view()},
         nullptr);
  const auto in = c.inputs();
  const auto exact = reference({}, in), unfused = reference(lowp(dtype), in);
  CODA_EXPECT_PASSES(check_output("preact", preact, exact.preact, unfused.preact));
  CODA_EXPECT_PASSES(check_gate_of_stored("act", act, preact, activation));
  CODA_EXPECT_PASSES(check_output("rstd_out", c.rstd, exact.rstd, unfused.rstd));
}

class RmsSwiglu : public testing::TestWithParam<DtypeShape> {};
TEST_P(RmsSwiglu, PreactivationAndActivationMatchReference) {
  check_rms_gated(gemm_rms_swiglu, ref::rms_swiglu, ref::silu, std::get<0>(GetParam()),
                  std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Kernels, RmsSwiglu, kGatedCases, dtype_shape_name);

class RmsGeglu : public testing::TestWithParam<DtypeShape> {};
TEST_P(RmsGeglu, PreactivationAndActivationMatchReference) {
  check_rms_gated(gemm_rms_geglu, ref::rms_geglu, ref::gelu, std::get<0>(GetParam()),
                  std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Kernels, RmsGeglu, kGatedCases, dtype_shape_name);

// K2 and K2g on E4M3 operands with gemm_fp8's block scales, as K4's FP8 test below: each against
// its reference on the values the codes and scales stand for. K a multiple of 16.
template <class GatedArgs>
void check_rms_gated_fp8(void (*kernel)(const GatedArgs&, Stream),
                         ref::RmsGatedOutputs (*reference)(ref::Rounding,
                                                           const ref::NormedGemmInputs&),
                         double (*activation)(double)) {
  for (DType dtype : kHalfTypes)
    for (const Shape& s : {Shape{1, 16, 16}, Shape{37, 272, 144}, Shape{200, 528, 272}}) {
      SCOPED_TRACE(dtype_label(dtype) + " M " + std::to_string(s.M) + " 2F " + std::to_string(s.N) +
                   " K " + std::to_string(s.K));
      Seeds seeds;
      // act is about z squared: f16's range holds it for blocks of 2^0, not the default 2^+-6.
      Fp8GemmCase g(s.M, s.N, s.K, seeds, {.max_binade = dtype == DType::f16 ? 0 : 6});
      HostTensor partials = random_sumsq_partials(s.M, s.K, seeds.next());
      HostTensor preact(dtype, {s.M, s.N}), act(dtype, {s.M, s.N / 2}), rstd(DType::f32, {s.M});
      const float eps = 1e-6f;
      kernel({.a = g.a.view(),
              .w = g.b.view(),
              .sumsq_partials = partials.view(),
              .eps = eps,
              .preact = preact.view(),
              .act = act.view(),
              .rstd_out = rstd.view(),
              .a_scales = g.a_scales.view(),
              .w_scales = g.b_scales.view()},
             nullptr);
      const ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
      const auto exact = reference({}, in), unfused = reference(lowp(dtype), in);
      expect_finite(unfused.act, "the unfused act");
      CODA_EXPECT_PASSES(check_output("preact", preact, exact.preact, unfused.preact));
      CODA_EXPECT_PASSES(check_gate_of_stored("act", act, preact, activation));
      CODA_EXPECT_PASSES(check_output("rstd_out", rstd, exact.rstd, unfused.rstd));
    }
}

TEST(RmsGatedFp8, SwigluOfE4m3OperandsMatchesReference) {
  check_rms_gated_fp8(gemm_rms_swiglu, ref::rms_swiglu, ref::silu);
}
TEST(RmsGatedFp8, GegluOfE4m3OperandsMatchesReference) {
  check_rms_gated_fp8(gemm_rms_geglu, ref::rms_geglu, ref::gelu);
}

// ---- K4: RoPE on the Q and K heads of the fused QKV projection (GQA), per-token positions.

struct RopeCase {
  int32_t n_q_heads, n_kv_heads, head_dim;
  int64_t M, K;
  bool llama3_table;
};
std::string label(const RopeCase& r) {
  return "q" + std::to_string(r.n_q_heads) + "_kv" + std::to_string(r.n_kv_heads) + "_hd" +
         std::to_string(r.head_dim) + "_M" + std::to_string(r.M) + "_K" + std::to_string(r.K) +
         (r.llama3_table ? "_llama3" : "");
}
void PrintTo(const RopeCase& r, std::ostream* os) { *os << label(r); }
const RopeCase kRopeCases[] = {{4, 2, 16, 37, 64, false},
                               {4, 2, 64, 200, 32, false},
                               {4, 2, 64, 1, 16, false},
                               {3, 1, 8, 130, 24, false},
                               {4, 2, 64, 67, 64, true}};

ref::RopeTable rope_table(const RopeCase& rc) {
  ref::RopeTable t;
  t.shape = {rc.n_q_heads, rc.n_kv_heads, rc.head_dim};
  // Packed sequences of 23 tokens; the first continues a sequence at position 1000.
  t.positions = packed_positions(rc.M, 23, 1000);
  if (rc.llama3_table) {
    t.inv_freq = ref::rope_inv_freq_llama3(rc.head_dim, 500000.0, {});
    for (double& f : t.inv_freq) f = double(float(f));
  } else {
    t.inv_freq = rope_inv_freq_f32(rc.head_dim);
  }
  return t;
}

using DtypeRope = std::tuple<DType, RopeCase>;
class RmsRope : public testing::TestWithParam<DtypeRope> {};

TEST_P(RmsRope, RotatedQkvMatchesReference) {
  const auto [dtype, rc] = GetParam();
  const ref::RopeTable table = rope_table(rc);
  const int64_t N = table.shape.width();
  Seeds seeds;
  NormedGemmCase c(dtype, rc.M, N, rc.K, seeds);
  auto positions = HostTensor::of_ints({rc.M}, table.positions);
  auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
  HostTensor out(dtype, {rc.M, N});
  gemm_rms_rope({.a = c.a.view(),
                 .w = c.w.view(),
                 .sumsq_partials = c.partials.view(),
                 .eps = c.eps,
                 .rope = {.positions = positions.view(),
                          .inv_freq = inv_freq.view(),
                          .n_q_heads = rc.n_q_heads,
                          .n_kv_heads = rc.n_kv_heads,
                          .head_dim = rc.head_dim},
                 .out = out.view(),
                 .rstd_out = c.rstd.view()});
  const auto in = c.inputs();
  const auto exact = ref::rms_rope({}, in, table), unfused = ref::rms_rope(lowp(dtype), in, table);
  CODA_EXPECT_PASSES(check_output("out", out, exact.out, unfused.out));
  CODA_EXPECT_PASSES(check_output("rstd_out", c.rstd, exact.rstd, unfused.rstd));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsRope,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kRopeCases)),
                         [](const testing::TestParamInfo<DtypeRope>& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  label(std::get<1>(info.param));
                         });

// K4 on E4M3 operands with gemm_fp8's block scales (docs/fp8.md): the same op list on the FP8
// product. The reference is K4's own on the values the codes and scales stand for (exact in
// fp64), so the fp64 path is the whole FP8 product and the unfused one an FP8 GEMM whose output
// is rounded before the row scale and RoPE, as any FP8 projection stores it. Ragged K against
// the 128-deep scale blocks, and scales that change from block to block (Fp8GemmCase).
TEST(RmsRopeFp8, RotatedQkvOfE4m3OperandsMatchesReference) {
  for (DType dtype : kHalfTypes)
    for (const RopeCase& rc :
         {RopeCase{4, 2, 64, 200, 144, false}, RopeCase{3, 1, 8, 37, 272, false},
          RopeCase{4, 2, 16, 1, 16, false}}) {
      SCOPED_TRACE(dtype_label(dtype) + "_" + label(rc));
      const ref::RopeTable table = rope_table(rc);
      const int64_t N = table.shape.width();
      Seeds seeds;
      // f16's range holds the product of 2^±2 blocks (the default 2^±6 overflows it after the
      // GEMM, where the fp64 reference does not).
      Fp8GemmCase g(rc.M, N, rc.K, seeds, {.max_binade = dtype == DType::f16 ? 2 : 6});
      HostTensor partials = random_sumsq_partials(rc.M, rc.K, seeds.next());
      auto positions = HostTensor::of_ints({rc.M}, table.positions);
      auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
      HostTensor out(dtype, {rc.M, N}), rstd(DType::f32, {rc.M});
      const float eps = 1e-6f;
      gemm_rms_rope({.a = g.a.view(),
                     .w = g.b.view(),
                     .sumsq_partials = partials.view(),
                     .eps = eps,
                     .rope = {.positions = positions.view(),
                              .inv_freq = inv_freq.view(),
                              .n_q_heads = rc.n_q_heads,
                              .n_kv_heads = rc.n_kv_heads,
                              .head_dim = rc.head_dim},
                     .out = out.view(),
                     .rstd_out = rstd.view(),
                     .a_scales = g.a_scales.view(),
                     .w_scales = g.b_scales.view()});
      const ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
      const auto exact = ref::rms_rope({}, in, table),
                 unfused = ref::rms_rope(lowp(dtype), in, table);
      expect_finite(unfused.out, "the unfused out");
      CODA_EXPECT_PASSES(check_output("out", out, exact.out, unfused.out));
      CODA_EXPECT_PASSES(check_output("rstd_out", rstd, exact.rstd, unfused.rstd));
    }
}

// ---- K5: logits, logsumexp row partials and the fp32 target logit; a vocabulary that is not
// a multiple of 128, targets that are ignore_index or out of range (target_logit 0).

struct LseCase {
  int64_t M, V, K;
};
void PrintTo(const LseCase& c, std::ostream* os) {
  *os << "M " << c.M << ", V " << c.V << ", K " << c.K;
}
const LseCase kLseCases[] = {{37, 296, 64}, {200, 136, 32}, {1, 1000, 16}, {64, 8, 8}};

using DtypeLse = std::tuple<DType, LseCase>;
class RmsLse : public testing::TestWithParam<DtypeLse> {};

// One K5 call on fresh inputs, with its inputs as the reference reads them.
struct RmsLseRun {
  NormedGemmCase c;
  std::vector<int32_t> targets;
  HostTensor logits, lse_partials, target_logit;

  RmsLseRun(DType dtype, const LseCase& lc, Seeds& seeds)
      : c(dtype, lc.M, lc.V, lc.K, seeds), targets(size_t(lc.M)), logits(dtype, {lc.M, lc.V}),
        lse_partials(DType::f32, {lc.M, ref::partial_blocks(lc.V, ref::kStagedPartialBlock)}),
        target_logit(DType::f32, {lc.M}) {
    const std::vector<double> u = random_doubles(targets.size(), seeds.next(), 0, 1);
    for (size_t m = 0; m < targets.size(); ++m)
      targets[m] = m % 5 == 1 ? -100 : m % 7 == 3 ? int32_t(lc.V) : int32_t(u[m] * double(lc.V));
    if (lc.M > 2) targets[2] = int32_t(lc.V) - 1; // the last (ragged) column
    auto target_tensor = HostTensor::of_ints({lc.M}, targets);
    gemm_rms_lse({.a = c.a.view(),
                  .w = c.w.view(),
                  .sumsq_partials = c.partials.view(),
                  .eps = c.eps,
                  .targets = target_tensor.view(),
                  .logits = logits.view(),
                  .lse_partials = lse_partials.view(),
                  .target_logit = target_logit.view(),
                  .rstd_out = c.rstd.view()});
  }
};

TEST_P(RmsLse, LogitsPartialsAndTargetLogitMatchReference) {
  const auto [dtype, lc] = GetParam();
  Seeds seeds;
  RmsLseRun run(dtype, lc, seeds);
  const auto in = run.c.inputs();
  const auto exact = ref::rms_lse({}, in, run.targets),
             unfused = ref::rms_lse(lowp(dtype), in, run.targets);
  CODA_EXPECT_PASSES(check_output("logits", run.logits, exact.logits, unfused.logits));
  CODA_EXPECT_PASSES(
      check_output("lse_partials", run.lse_partials, exact.lse_partials, unfused.lse_partials));
  CODA_EXPECT_PASSES(
      check_output("target_logit", run.target_logit, exact.target_logit, unfused.target_logit));
  CODA_EXPECT_PASSES(check_output("rstd_out", run.c.rstd, exact.rstd, unfused.rstd));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsLse,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kLseCases)),
                         [](const testing::TestParamInfo<DtypeLse>& info) {
                           const LseCase& c = std::get<1>(info.param);
                           return dtype_label(std::get<0>(info.param)) + "_M" +
                                  std::to_string(c.M) + "_V" + std::to_string(c.V) + "_K" +
                                  std::to_string(c.K);
                         });

// ---- Statistics the fused kernels keep in fp32 (args.hpp: K0's partials square the unrounded
// sum acc + residual; K5's partials are the fp32 log-sum-exp of its stored logits) are held to the
// fp32 unfused path, about 10^4 times tighter than the bf16 one. Shapes with hundreds of
// partials, so that the worst fp32 rounding error of either side is a stable statistic.

class Fp32Statistics : public testing::TestWithParam<DType> {};

TEST_P(Fp32Statistics, ResidualRmsPartialsComeFromUnroundedSum) {
  const DType dtype = GetParam();
  const Shape s{200, 264, 64};
  Seeds seeds;
  ResidualRmsCase c(dtype, s, seeds);
  gemm_residual_rms(c.args());
  const ref::ResidualRmsInputs in = c.inputs(s);
  CODA_EXPECT_PASSES(check_output("sumsq_partials", c.partials,
                                  ref::residual_rms({}, in).sumsq_partials,
                                  ref::residual_rms(kFp32, in).sumsq_partials));
}

// K5's partials and target logit are those of the logits as stored (rounded), the numbers the
// cross-entropy reads (coda/epilogue/ops/round.hpp): the target logit is the stored one exactly,
// and the partials are the fp32 log-sum-exp of the stored logits.
TEST_P(Fp32Statistics, RmsLsePartialsAndTargetLogitComeFromStoredLogits) {
  const DType dtype = GetParam();
  Seeds seeds;
  const LseCase lc{200, 296, 32};
  RmsLseRun run(dtype, lc, seeds);
  const std::vector<double> stored = run.logits.values();
  CODA_EXPECT_PASSES(
      check_output("lse_partials", run.lse_partials,
                   ref::lse_row_partials({}, lc.M, lc.V, stored, ref::kStagedPartialBlock),
                   ref::lse_row_partials(kFp32, lc.M, lc.V, stored, ref::kStagedPartialBlock)));
  const std::vector<double> target_logit = run.target_logit.values();
  for (int64_t m = 0; m < lc.M; ++m) {
    const int32_t t = run.targets[size_t(m)];
    const double expected = t >= 0 && t < lc.V ? stored[size_t(m * lc.V + t)] : 0.0;
    EXPECT_EQ(target_logit[size_t(m)], expected) << "row " << m << ", target " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Fp32Statistics, testing::ValuesIn(kHalfTypes),
                         [](const testing::TestParamInfo<DType>& info) {
                           return dtype_label(info.param);
                         });

} // namespace
} // namespace coda::test
