// The auxiliary kernels (rms_stats, rstd_from_partials, the row and column partial reduces)
// through the public API, held to the fp64 references by the tolerance rule; and the layout of
// every partial buffer: entry (m, b) of a row partial reduces exactly the columns of block b
// (entry (n, b) of a column partial exactly the rows of block b), checked by inputs that are
// zero outside one block.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "coda/coda.hpp"
#include "reference/kernels.hpp"
#include "tests/common/check.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {
namespace {

const DType kHalfTypes[] = {DType::bf16, DType::f16};

struct Dims {
  int64_t M, N;
};
std::string label(const Dims& d) { return "M" + std::to_string(d.M) + "_N" + std::to_string(d.N); }
// GoogleTest's printer for the parameter (--gtest_list_tests, failures): its label.
void PrintTo(const Dims& d, std::ostream* os) { *os << label(d); }

using DtypeDims = std::tuple<DType, Dims>;
std::string dtype_dims_name(const testing::TestParamInfo<DtypeDims>& info) {
  return dtype_label(std::get<0>(info.param)) + "_" + label(std::get<1>(info.param));
}

// ---- rms_stats: h = x * gamma and row partials of x² (the first layer's statistics).

class RmsStats : public testing::TestWithParam<DtypeDims> {};

TEST_P(RmsStats, ScaledInputAndPartialsMatchReference) {
  const auto [dtype, d] = GetParam();
  Seeds seeds;
  auto x = HostTensor::random(dtype, {d.M, d.N}, seeds.next());
  auto gamma = HostTensor::random(dtype, {d.N}, seeds.next(), 0.5, 1.5);
  HostTensor out_scaled(dtype, {d.M, d.N}), partials(DType::f32, {d.M, ref::partial_blocks(d.N)});
  rms_stats({.x = x.view(),
             .gamma = gamma.view(),
             .out_scaled = out_scaled.view(),
             .sumsq_partials = partials.view()});
  const auto exact = ref::rms_stats({}, d.M, d.N, x.values(), gamma.values());
  const auto unfused = ref::rms_stats(lowp(dtype), d.M, d.N, x.values(), gamma.values());
  CODA_EXPECT_PASSES(check_output("out_scaled", out_scaled, exact.out_scaled, unfused.out_scaled));
  CODA_EXPECT_PASSES(
      check_output("sumsq_partials", partials, exact.sumsq_partials, unfused.sumsq_partials));
}

// rms_stats then rstd_from_partials give the RMSNorm rstd of x, as eager RMSNorm computes it.
TEST_P(RmsStats, ComposedWithRstdFromPartialsGivesRowRstd) {
  const auto [dtype, d] = GetParam();
  Seeds seeds;
  auto x = HostTensor::random(dtype, {d.M, d.N}, seeds.next());
  auto gamma = HostTensor::random(dtype, {d.N}, seeds.next(), 0.5, 1.5);
  HostTensor out_scaled(dtype, {d.M, d.N}), partials(DType::f32, {d.M, ref::partial_blocks(d.N)});
  HostTensor rstd(DType::f32, {d.M});
  rms_stats({.x = x.view(),
             .gamma = gamma.view(),
             .out_scaled = out_scaled.view(),
             .sumsq_partials = partials.view()});
  rstd_from_partials({.partials = partials.view(), .n = d.N, .eps = 1e-5f, .rstd = rstd.view()});
  std::vector<double> exact(size_t(d.M)), unfused(size_t(d.M)), ignored(size_t(d.M * d.N));
  const auto xs = x.values(), gs = gamma.values();
  ref::rmsnorm_forward({}, d.M, d.N, xs.data(), gs.data(), double(1e-5f), ignored.data(),
                       exact.data());
  ref::rmsnorm_forward(lowp(dtype), d.M, d.N, xs.data(), gs.data(), double(1e-5f), ignored.data(),
                       unfused.data());
  CODA_EXPECT_PASSES(check_output("rstd", rstd, exact, unfused));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsStats,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::Values(Dims{1, 8}, Dims{37, 136},
                                                          Dims{200, 264})),
                         dtype_dims_name);

// ---- rstd_from_partials and reduce_row_partials over partial widths P = 1, 3 (ragged rows).

class RowReduces : public testing::TestWithParam<Dims /* M, P */> {};

TEST_P(RowReduces, RstdFromPartialsMatchesReference) {
  const Dims d = GetParam();
  Seeds seeds;
  const int64_t n = 128 * d.N - 40; // the RMSNorm width behind the partials
  auto partials = HostTensor::random(DType::f32, {d.M, d.N}, seeds.next(), 10, 50);
  HostTensor rstd(DType::f32, {d.M});
  rstd_from_partials({.partials = partials.view(), .n = n, .eps = 1e-6f, .rstd = rstd.view()});
  const auto p = partials.values();
  CODA_EXPECT_PASSES(
      check_output("rstd", rstd, ref::rstd_from_partials({}, d.M, p, n, double(1e-6f)),
                   ref::rstd_from_partials(lowp(DType::f32), d.M, p, n, double(1e-6f))));
}

TEST_P(RowReduces, ReduceRowPartialsMatchesReference) {
  const Dims d = GetParam();
  Seeds seeds;
  auto partials = HostTensor::random(DType::f32, {d.M, d.N}, seeds.next(), -1, 1);
  HostTensor out(DType::f32, {d.M});
  const float scale = 1.f / 384; // zeta = (1/hidden) sum of K7's partials
  reduce_row_partials({.partials = partials.view(), .scale = scale, .out = out.view()});
  const auto p = partials.values();
  CODA_EXPECT_PASSES(check_output("out", out, ref::reduce_row_partials({}, d.M, p, scale),
                                  ref::reduce_row_partials(lowp(DType::f32), d.M, p, scale)));
}

INSTANTIATE_TEST_SUITE_P(Kernels, RowReduces,
                         testing::Values(Dims{1, 1}, Dims{37, 3}, Dims{200, 1}, Dims{129, 5}),
                         [](const testing::TestParamInfo<Dims>& info) {
                           return "M" + std::to_string(info.param.M) + "_P" +
                                  std::to_string(info.param.N);
                         });

// ---- reduce_col_partials: dgamma = sum over row blocks, into f32, bf16 or f16, (+)=.

using ColReduceParam = std::tuple<DType /*out*/, bool /*accumulate*/>;
class ColReduce : public testing::TestWithParam<ColReduceParam> {};

TEST_P(ColReduce, MatchesReference) {
  const auto [out_type, accumulate] = GetParam();
  Seeds seeds;
  for (const Dims d : {Dims{136, 2}, Dims{8, 1}, Dims{264, 4}}) { // [N, P]
    auto partials = HostTensor::random(DType::f32, {d.M, d.N}, seeds.next());
    HostTensor out = accumulate ? HostTensor::random(out_type, {d.M}, seeds.next())
                                : HostTensor(out_type, {d.M});
    const std::vector<double> out_in = accumulate ? out.values() : std::vector<double>{};
    reduce_col_partials({.partials = partials.view(), .accumulate = accumulate, .out = out.view()});
    const auto p = partials.values();
    CODA_EXPECT_PASSES(check_output(
        "out " + label(d), out, ref::reduce_col_partials({}, d.M, p, accumulate, out_in),
        ref::reduce_col_partials(lowp(out_type), d.M, p, accumulate, out_in)));
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ColReduce,
                         testing::Combine(testing::Values(DType::f32, DType::bf16, DType::f16),
                                          testing::Bool()),
                         [](const testing::TestParamInfo<ColReduceParam>& info) {
                           return dtype_label(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_accumulate" : "_overwrite");
                         });

// ---- Partial layouts: inputs that are zero outside block `b` give exact zeros in every other
// partial, and the reference sums in block b. N = 264 has blocks of 128, 128 and 8 columns;
// M = 300 has row blocks of 128, 128 and 44.

constexpr int64_t kLayoutM = 300, kLayoutN = 264;

// Zero every column (row_major [rows, cols]) outside [b * 128, (b + 1) * 128).
std::vector<double> keep_column_block(std::vector<double> v, int64_t rows, int64_t cols,
                                      int64_t b) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (c / ref::kPartialBlock != b) v[size_t(r * cols + c)] = 0;
  return v;
}

// Every entry outside block `b` of a [rows, blocks] partial is exactly zero.
void expect_only_block_nonzero(const HostTensor& partials, int64_t b) {
  const auto v = partials.values();
  const int64_t blocks = partials.shape()[1];
  for (size_t i = 0; i < v.size(); ++i)
    if (int64_t(i) % blocks != b) {
      ASSERT_EQ(v[i], 0.0) << "entry " << i << " outside block " << b;
    }
}

class PartialLayout : public testing::TestWithParam<int64_t /* block */> {};

TEST_P(PartialLayout, RmsStatsRowPartialReducesItsColumnBlock) {
  const int64_t b = GetParam();
  Seeds seeds;
  const auto x = keep_column_block(random_doubles(size_t(kLayoutM * kLayoutN), seeds.next()),
                                   kLayoutM, kLayoutN, b);
  auto xt = HostTensor::of(DType::bf16, {kLayoutM, kLayoutN}, x);
  auto gamma = HostTensor::random(DType::bf16, {kLayoutN}, seeds.next(), 0.5, 1.5);
  HostTensor out_scaled(DType::bf16, {kLayoutM, kLayoutN});
  HostTensor partials(DType::f32, {kLayoutM, ref::partial_blocks(kLayoutN)});
  rms_stats({.x = xt.view(),
             .gamma = gamma.view(),
             .out_scaled = out_scaled.view(),
             .sumsq_partials = partials.view()});
  expect_only_block_nonzero(partials, b);
  const auto in = xt.values(), g = gamma.values();
  CODA_EXPECT_PASSES(check_output(
      "sumsq_partials", partials, ref::rms_stats({}, kLayoutM, kLayoutN, in, g).sumsq_partials,
      ref::rms_stats(lowp(DType::bf16), kLayoutM, kLayoutN, in, g).sumsq_partials));
}

TEST_P(PartialLayout, ResidualRmsRowPartialReducesItsColumnBlock) {
  const int64_t b = GetParam(), K = 32;
  Seeds seeds;
  auto a = HostTensor::random(DType::bf16, {kLayoutM, K}, seeds.next());
  // Weight rows n (output columns) outside block b are zero, and so is the residual there.
  auto w = HostTensor::of(
      DType::bf16, {kLayoutN, K},
      transposed(
          keep_column_block(random_doubles(size_t(K * kLayoutN), seeds.next()), K, kLayoutN, b), K,
          kLayoutN));
  auto residual =
      HostTensor::of(DType::bf16, {kLayoutM, kLayoutN},
                     keep_column_block(random_doubles(size_t(kLayoutM * kLayoutN), seeds.next()),
                                       kLayoutM, kLayoutN, b));
  auto gamma = HostTensor::random(DType::bf16, {kLayoutN}, seeds.next(), 0.5, 1.5);
  HostTensor out(DType::bf16, {kLayoutM, kLayoutN}), out_scaled(DType::bf16, {kLayoutM, kLayoutN});
  HostTensor partials(DType::f32, {kLayoutM, ref::partial_blocks(kLayoutN)});
  gemm_residual_rms({.a = a.view(),
                     .w = w.view(),
                     .residual = residual.view(),
                     .gamma = gamma.view(),
                     .out = out.view(),
                     .out_scaled = out_scaled.view(),
                     .sumsq_partials = partials.view()});
  expect_only_block_nonzero(partials, b);
  const ref::ResidualRmsInputs in{kLayoutM,          kLayoutN,      K, a.values(), w.values(),
                                  residual.values(), gamma.values()};
  CODA_EXPECT_PASSES(check_output("sumsq_partials", partials,
                                  ref::residual_rms({}, in).sumsq_partials,
                                  ref::residual_rms(lowp(DType::bf16), in).sumsq_partials));
}

TEST_P(PartialLayout, SwigluBackwardZetaPartialReducesItsPairBlock) {
  const int64_t b = GetParam(), F = kLayoutN, K = 16;
  Seeds seeds;
  auto dx = HostTensor::random(DType::bf16, {kLayoutM, K}, seeds.next());
  auto w = HostTensor::random(DType::bf16, {K, F}, seeds.next());
  // Pairs j outside block b have g = u = 0, so g dg + u du vanishes there.
  std::vector<double> preact = random_doubles(size_t(kLayoutM * 2 * F), seeds.next(), -3, 3);
  for (size_t i = 0; i < preact.size(); ++i)
    if (int64_t(i % size_t(2 * F)) / 2 / ref::kStagedPartialBlock != b) preact[i] = 0;
  auto pre = HostTensor::of(DType::bf16, {kLayoutM, 2 * F}, preact);
  SwigluBackwardCall k7(dx, w, pre);
  gemm_swiglu_backward(k7.args());
  expect_only_block_nonzero(k7.zeta_partials, b);
  const ref::SwigluBackwardInputs in = k7.inputs();
  CODA_EXPECT_PASSES(check_output("zeta_partials", k7.zeta_partials,
                                  ref::swiglu_backward({}, in).zeta_partials,
                                  ref::swiglu_backward(lowp(DType::bf16), in).zeta_partials));
}

TEST_P(PartialLayout, RmsBackwardColumnPartialReducesItsRowBlock) {
  const int64_t b = GetParam(), N = 136, K = 24;
  Seeds seeds;
  auto dz = HostTensor::random(DType::bf16, {kLayoutM, K}, seeds.next());
  auto w = HostTensor::random(DType::bf16, {K, N}, seeds.next());
  // Rows m outside row block b have x = 0, so g * xh vanishes there.
  auto x = HostTensor::of(
      DType::bf16, {kLayoutM, N},
      transposed(keep_column_block(
                     transposed(random_doubles(size_t(kLayoutM * N), seeds.next()), kLayoutM, N), N,
                     kLayoutM, b),
                 N, kLayoutM));
  auto rstd = HostTensor::random(DType::f32, {kLayoutM}, seeds.next(), 0.5, 2);
  auto zeta = HostTensor::random(DType::f32, {kLayoutM}, seeds.next(), -0.5, 0.5);
  auto gamma = HostTensor::random(DType::bf16, {N}, seeds.next(), 0.5, 1.5);
  RmsBackwardCall k6(dz, w, x, rstd, zeta, gamma);
  gemm_rms_backward(k6.args());
  expect_only_block_nonzero(k6.dgamma_partials, b);
  const ref::RmsBackwardInputs in = k6.inputs();
  CODA_EXPECT_PASSES(check_output("dgamma_partials", k6.dgamma_partials,
                                  ref::rms_backward({}, in).dgamma_partials,
                                  ref::rms_backward(lowp(DType::bf16), in).dgamma_partials));
}

INSTANTIATE_TEST_SUITE_P(Kernels, PartialLayout, testing::Values(0, 1, 2),
                         [](const testing::TestParamInfo<int64_t>& info) {
                           return "block" + std::to_string(info.param);
                         });

} // namespace
} // namespace coda::test
