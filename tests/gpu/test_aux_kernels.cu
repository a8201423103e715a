// The auxiliary kernels on the GPU (rstd_from_partials, reduce_row_partials, reduce_col_partials,
// rope_backward, cross_entropy) through the public API on device memory, each output held
//  * to the fp64 reference by the tolerance rule (tests/common/check.hpp),
//  * to the CPU backend on the same inputs: bitwise where both sum the same partials in the same
//    order (reduce_row_partials, reduce_col_partials, grad_scale), otherwise within one ulp of a
//    16-bit output or max |gpu - cpu| <= 2 max |unfused - cpu| + 1e-6 (cpu_parity.hpp; the
//    cross-entropy's zeta with its CPU order's allowance on top), and
//  * to itself: every case runs twice and the second run is bitwise equal to the first (fixed
//    reduction orders, no atomics).
// Inputs are fresh per run, outputs poisoned with NaN and fenced by guard bytes on the device,
// the cross-entropy workspace holds garbage; M, V and the partial widths are ragged. Skipped (not
// passed) where there is no sm_90 device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "reference/kernels.hpp"
#include "tests/common/check.hpp"
#include "tests/common/kernel_fixtures.hpp"
#include "tests/gpu/cpu_parity.hpp"
#include "tests/gpu/device_tensor.hpp"
#include "tests/gpu/gpu_fixtures.hpp"

namespace coda::test {
namespace {

// Empty when a and b hold bitwise the same elements (as fp32 or 16-bit values, -0 != +0).
std::string bitwise_difference(const std::string& name, const HostTensor& a, const HostTensor& b) {
  const std::vector<double> x = a.values(), y = b.values();
  if (x.size() != y.size()) return name + ": sizes differ";
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0)
      return name + ": element " + std::to_string(i) + " differs bitwise: " + std::to_string(x[i]) +
             " vs " + std::to_string(y[i]) + " (seed " + std::to_string(test_seed()) + ")";
  return {};
}

// The first `cols` columns of a row-major [rows, stride] tensor, as a view and as values.
TensorView narrowed(TensorView v, int64_t cols) {
  v.shape[1] = cols;
  return v;
}
std::vector<double> narrowed(const std::vector<double>& v, int64_t rows, int64_t stride,
                             int64_t cols) {
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = v[size_t(r * stride + c)];
  return out;
}

const DType kHalfTypes[] = {DType::bf16, DType::f16};

// ---- rstd_from_partials and reduce_row_partials: partials [M, P] with a row stride of P + pad.
// P > 32 walks several 32-wide blocks per warp; M not a multiple of the 128 rows of a CTA.

struct PartialsCase {
  int64_t rows, P, pad;
};
std::string label(const PartialsCase& c) {
  return "M" + std::to_string(c.rows) + "_P" + std::to_string(c.P) +
         (c.pad ? "_pad" + std::to_string(c.pad) : "");
}
void PrintTo(const PartialsCase& x, std::ostream* os) { *os << label(x); }
const PartialsCase kPartialsCases[] = {{1, 1, 0},     {37, 3, 0},    {200, 1, 0}, {129, 5, 3},
                                       {1000, 33, 0}, {4100, 70, 2}, {33, 128, 0}};

void check_rstd(const PartialsCase& c) {
  Seeds seeds;
  const int64_t n = 128 * c.P - 40; // the RMSNorm width behind the partials
  const float eps = 1e-6f;
  auto partials = HostTensor::random(DType::f32, {c.rows, c.P + c.pad}, seeds.next(), 10, 50);
  HostTensor cpu(DType::f32, {c.rows});
  rstd_from_partials(
      {.partials = narrowed(partials.view(), c.P), .n = n, .eps = eps, .rstd = cpu.view()});
  const auto p = narrowed(partials.values(), c.rows, c.P + c.pad, c.P);
  const auto exact = ref::rstd_from_partials({}, c.rows, p, n, double(eps));
  const auto unfused = ref::rstd_from_partials(lowp(DType::f32), c.rows, p, n, double(eps));
  DeviceTensor dp(partials);
  HostTensor first;
  for (int run = 0; run < 2; ++run) {
    HostTensor gpu(DType::f32, {c.rows});
    DeviceTensor rstd(gpu);
    rstd_from_partials(
        {.partials = narrowed(dp.view(), c.P), .n = n, .eps = eps, .rstd = rstd.view()});
    synchronize_ok();
    EXPECT_TRUE(rstd.copy_back()) << "a write past the end of rstd";
    expect_matches("rstd", gpu, cpu, exact, unfused);
    if (run == 0)
      first = gpu;
    else
      CODA_EXPECT_PASSES(bitwise_difference("rstd, second run", gpu, first));
  }
}

// reduce_row_partials with scale = 1/384, or (with_tensor) 0.5 * tensor[0], tensor = 1/192.
void check_row_reduce(const PartialsCase& c, bool with_tensor) {
  Seeds seeds;
  auto partials = HostTensor::random(DType::f32, {c.rows, c.P + c.pad}, seeds.next(), -1, 1);
  auto scale_tensor = HostTensor::of(DType::f32, {1}, {double(1.f / 192)});
  const float value = with_tensor ? 0.5f : 1.f / 384;
  const double scale = with_tensor ? 0.5 * double(1.f / 192) : double(1.f / 384);
  HostTensor cpu(DType::f32, {c.rows});
  RowReduceArgs cpu_args{.partials = narrowed(partials.view(), c.P), .out = cpu.view()};
  cpu_args.scale = with_tensor ? Scalar{value, scale_tensor.view()} : Scalar{value};
  reduce_row_partials(cpu_args);
  const auto p = narrowed(partials.values(), c.rows, c.P + c.pad, c.P);
  const auto exact = ref::reduce_row_partials({}, c.rows, p, scale);
  const auto unfused = ref::reduce_row_partials(lowp(DType::f32), c.rows, p, scale);
  DeviceTensor dp(partials), dscale(scale_tensor);
  HostTensor first;
  for (int run = 0; run < 2; ++run) {
    HostTensor gpu(DType::f32, {c.rows});
    DeviceTensor out(gpu);
    RowReduceArgs args{.partials = narrowed(dp.view(), c.P), .out = out.view()};
    args.scale = with_tensor ? Scalar{value, dscale.view()} : Scalar{value};
    reduce_row_partials(args);
    synchronize_ok();
    EXPECT_TRUE(out.copy_back()) << "a write past the end of out";
    CODA_EXPECT_PASSES(check_output("out", gpu, exact, unfused));
    // One thread sums each row in the CPU's order, then one rounding by the same factor.
    CODA_EXPECT_PASSES(bitwise_difference("out vs the CPU backend", gpu, cpu));
    if (run == 0)
      first = gpu;
    else
      CODA_EXPECT_PASSES(bitwise_difference("out, second run", gpu, first));
  }
}

class GpuRowReduces : public testing::TestWithParam<PartialsCase> {};
TEST_P(GpuRowReduces, RstdFromPartialsMatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rstd(GetParam());
}
TEST_P(GpuRowReduces, ReduceRowPartialsIsBitwiseTheCpu) {
  CODA_REQUIRE_SM90();
  check_row_reduce(GetParam(), false);
}
TEST_P(GpuRowReduces, ReduceRowPartialsWithDeviceScaleIsBitwiseTheCpu) {
  CODA_REQUIRE_SM90();
  check_row_reduce(GetParam(), true);
}
INSTANTIATE_TEST_SUITE_P(Gpu, GpuRowReduces, testing::ValuesIn(kPartialsCases),
                         [](const testing::TestParamInfo<PartialsCase>& info) {
                           return label(info.param);
                         });

// ---- reduce_col_partials: [N, P] into f32, bf16 or f16, overwritten or accumulated.

const PartialsCase kColCases[] = {{136, 2, 0}, {8, 1, 0}, {264, 4, 0}, {4096, 128, 0}, {33, 45, 3}};

void check_col_reduce(DType out_type, bool accumulate, const PartialsCase& c) {
  SCOPED_TRACE(label(c));
  Seeds seeds;
  auto partials = HostTensor::random(DType::f32, {c.rows, c.P + c.pad}, seeds.next());
  const HostTensor out_in = accumulate ? HostTensor::random(out_type, {c.rows}, seeds.next())
                                       : HostTensor(out_type, {c.rows});
  const std::vector<double> before = accumulate ? out_in.values() : std::vector<double>{};
  HostTensor cpu = out_in;
  reduce_col_partials(
      {.partials = narrowed(partials.view(), c.P), .accumulate = accumulate, .out = cpu.view()});
  const auto p = narrowed(partials.values(), c.rows, c.P + c.pad, c.P);
  const auto exact = ref::reduce_col_partials({}, c.rows, p, accumulate, before);
  const auto unfused = ref::reduce_col_partials(lowp(out_type), c.rows, p, accumulate, before);
  DeviceTensor dp(partials);
  HostTensor first;
  for (int run = 0; run < 2; ++run) {
    HostTensor gpu = out_in;
    DeviceTensor out(gpu);
    reduce_col_partials(
        {.partials = narrowed(dp.view(), c.P), .accumulate = accumulate, .out = out.view()});
    synchronize_ok();
    EXPECT_TRUE(out.copy_back()) << "a write past the end of out";
    CODA_EXPECT_PASSES(check_output("out", gpu, exact, unfused));
    CODA_EXPECT_PASSES(bitwise_difference("out vs the CPU backend", gpu, cpu));
    if (run == 0)
      first = gpu;
    else
      CODA_EXPECT_PASSES(bitwise_difference("out, second run", gpu, first));
  }
}

using ColReduceParam = std::tuple<DType /*out*/, bool /*accumulate*/>;
class GpuColReduce : public testing::TestWithParam<ColReduceParam> {};
TEST_P(GpuColReduce, IsBitwiseTheCpu) {
  CODA_REQUIRE_SM90();
  const auto [out_type, accumulate] = GetParam();
  for (const PartialsCase& c : kColCases) check_col_reduce(out_type, accumulate, c);
}
INSTANTIATE_TEST_SUITE_P(Gpu, GpuColReduce,
                         testing::Combine(testing::Values(DType::f32, DType::bf16, DType::f16),
                                          testing::Bool()),
                         [](const testing::TestParamInfo<ColReduceParam>& info) {
                           return dtype_label(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_accumulate" : "_overwrite");
                         });

// ---- rope_backward: GQA; head_dim 64 and 128 (the fused K4's sizes), 32, 16, 96 (6 index
// groups per half head, which do not divide a warp), and the narrower vectors: 8 (4 elements),
// 12 (2) and 6 (1); long-context positions; dz written over dqkv or separately.

struct RopeCase {
  int32_t n_q_heads, n_kv_heads, head_dim;
  int64_t M;
  int64_t seq_len = 29;
  int32_t first_offset = 517;
};
std::string label(const RopeCase& r) {
  return "q" + std::to_string(r.n_q_heads) + "_kv" + std::to_string(r.n_kv_heads) + "_hd" +
         std::to_string(r.head_dim) + "_M" + std::to_string(r.M) +
         (r.first_offset > 100000 ? "_long" : "");
}
void PrintTo(const RopeCase& x, std::ostream* os) { *os << label(x); }
const RopeCase kRopeCases[] = {{4, 2, 64, 200}, {32, 8, 128, 67}, {3, 1, 128, 1},
                               {4, 2, 32, 37},  {4, 2, 16, 130},  {2, 1, 96, 50, 1 << 20, 120000},
                               {3, 1, 8, 9},    {2, 1, 12, 50},   {2, 1, 6, 33}};

void check_rope_backward(DType dtype, const RopeCase& rc, bool in_place) {
  ref::RopeTable table;
  table.shape = {rc.n_q_heads, rc.n_kv_heads, rc.head_dim};
  table.positions = packed_positions(rc.M, rc.seq_len, rc.first_offset);
  table.inv_freq = rope_inv_freq_f32(rc.head_dim);
  const int64_t width = table.shape.width();
  const double scale = 1.0 / 256; // 1 / hidden
  Seeds seeds;
  auto dqkv = HostTensor::random(dtype, {rc.M, width}, seeds.next());
  auto qkv = HostTensor::random(dtype, {rc.M, width}, seeds.next());
  auto positions = HostTensor::of_ints({rc.M}, table.positions);
  auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
  const std::vector<double> dqkv_in = dqkv.values();
  const auto exact = ref::rope_backward({}, rc.M, table, dqkv_in, qkv.values(), scale);
  const auto unfused = ref::rope_backward(lowp(dtype), rc.M, table, dqkv_in, qkv.values(), scale);

  HostTensor cpu_dqkv = dqkv, cpu_dz(dtype, {rc.M, width}), cpu_zeta(DType::f32, {rc.M});
  HostTensor& cpu_out = in_place ? cpu_dqkv : cpu_dz;
  rope_backward(
      {.dqkv = cpu_dqkv.view(),
       .qkv = qkv.view(),
       .rope = {positions.view(), inv_freq.view(), rc.n_q_heads, rc.n_kv_heads, rc.head_dim},
       .scale = float(scale),
       .dz = cpu_out.view(),
       .zeta = cpu_zeta.view()});

  DeviceTensor dq(qkv), dpos(positions), dfreq(inv_freq);
  HostTensor first_dz, first_zeta;
  for (int run = 0; run < 2; ++run) {
    HostTensor gpu_dqkv = dqkv, gpu_dz(dtype, {rc.M, width}), gpu_zeta(DType::f32, {rc.M});
    DeviceTensor d_dqkv(gpu_dqkv), d_dz(gpu_dz), d_zeta(gpu_zeta);
    DeviceTensor& d_out = in_place ? d_dqkv : d_dz;
    HostTensor& gpu_out = in_place ? gpu_dqkv : gpu_dz;
    rope_backward({.dqkv = d_dqkv.view(),
                   .qkv = dq.view(),
                   .rope = {dpos.view(), dfreq.view(), rc.n_q_heads, rc.n_kv_heads, rc.head_dim},
                   .scale = float(scale),
                   .dz = d_out.view(),
                   .zeta = d_zeta.view()});
    synchronize_ok();
    EXPECT_TRUE(d_out.copy_back() && d_zeta.copy_back()) << "a write past the end of an output";
    if (!in_place) {
      EXPECT_TRUE(d_dqkv.copy_back());
      CODA_EXPECT_PASSES(bitwise_difference("dqkv (an input)", gpu_dqkv, dqkv));
    }
    expect_matches("dz", gpu_out, cpu_out, exact.dz, unfused.dz);
    expect_matches("zeta", gpu_zeta, cpu_zeta, exact.zeta, unfused.zeta);
    if (run == 0) {
      first_dz = gpu_out;
      first_zeta = gpu_zeta;
    } else {
      CODA_EXPECT_PASSES(bitwise_difference("dz, second run", gpu_out, first_dz));
      CODA_EXPECT_PASSES(bitwise_difference("zeta, second run", gpu_zeta, first_zeta));
    }
  }
}

using RopeParam = std::tuple<DType, RopeCase, bool /*dz aliases dqkv*/>;
class GpuRopeBackward : public testing::TestWithParam<RopeParam> {};
TEST_P(GpuRopeBackward, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rope_backward(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, GpuRopeBackward,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kRopeCases), testing::Bool()),
                         [](const testing::TestParamInfo<RopeParam>& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  label(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_in_place" : "");
                         });

// ---- cross_entropy from K5-style inputs (make_cross_entropy_inputs in
// tests/common/kernel_fixtures.hpp, as the CPU tests build them).

std::string label(const CrossEntropyCase& c) {
  return "M" + std::to_string(c.M) + "_V" + std::to_string(c.V);
}
const CrossEntropyCase kCrossEntropyCases[] = {{37, 296}, {200, 136},  {3, 1000},
                                               {64, 8},   {130, 2056}, {4, 128256}};

// The CPU backend on in (dlogits over a copy of the logits when in_place).
CrossEntropyOutputs run_ce_cpu(DType dtype, const CrossEntropyCase& c,
                               const CrossEntropyInputs& in_const, LossReduction reduction,
                               bool in_place) {
  CrossEntropyInputs in = in_const;
  CrossEntropyOutputs out(dtype, c);
  CrossEntropyArgs args = cross_entropy_args(in, out, reduction);
  if (in_place) args.dlogits = args.logits;
  cross_entropy(args);
  if (in_place) out.dlogits = in.logits;
  return out;
}

// The GPU backend on in; the workspace starts as garbage (0x7fffffff words).
CrossEntropyOutputs run_ce_gpu(DType dtype, const CrossEntropyCase& c,
                               const CrossEntropyInputs& in_const, LossReduction reduction,
                               bool in_place) {
  CrossEntropyInputs in = in_const;
  CrossEntropyOutputs out(dtype, c);
  const auto workspace_bytes = int64_t(cross_entropy_workspace_size(c.M));
  HostTensor workspace(DType::i32, {workspace_bytes / 4});
  DeviceTensor logits(in.logits), partials(in.lse_partials), target_logit(in.target_logit),
      targets(in.targets), loss(out.loss), dlogits(out.dlogits), grad_scale(out.grad_scale),
      zeta(out.zeta), ws(workspace);
  cross_entropy({.logits = logits.view(),
                 .lse_partials = partials.view(),
                 .target_logit = target_logit.view(),
                 .targets = targets.view(),
                 .ignore_index = in.ref.ignore_index,
                 .reduction = reduction,
                 .loss = loss.view(),
                 .dlogits = in_place ? logits.view() : dlogits.view(),
                 .grad_scale = grad_scale.view(),
                 .zeta = zeta.view(),
                 .workspace = ws.view()});
  synchronize_ok();
  EXPECT_TRUE(loss.copy_back() && grad_scale.copy_back() && zeta.copy_back() && ws.copy_back())
      << "a write past the end of an output or the workspace";
  if (in_place) {
    EXPECT_TRUE(logits.copy_back()) << "a write past the end of dlogits (over logits)";
    out.dlogits = in.logits;
  } else {
    EXPECT_TRUE(dlogits.copy_back()) << "a write past the end of dlogits";
  }
  return out;
}

void expect_ce_matches(DType dtype, const ref::CrossEntropyInputs& in,
                       const CrossEntropyOutputs& gpu, const CrossEntropyOutputs& cpu) {
  const auto exact = ref::cross_entropy({}, in), unfused = ref::cross_entropy(lowp(dtype), in);
  expect_matches("loss", gpu.loss, cpu.loss, {exact.loss}, {unfused.loss});
  expect_matches("dlogits", gpu.dlogits, cpu.dlogits, exact.dlogits, unfused.dlogits);
  // zeta: the CPU backend's sequential fp32 sum over V terms drifts (zeta_order_allowance).
  expect_matches("zeta", gpu.zeta, cpu.zeta, exact.zeta, unfused.zeta, FinalRounding::counted,
                 DType::f32, zeta_order_allowance(in, exact.dlogits));
  CODA_EXPECT_PASSES(
      check_output("grad_scale", gpu.grad_scale, exact.grad_scale, unfused.grad_scale));
  CODA_EXPECT_PASSES(
      bitwise_difference("grad_scale vs the CPU backend", gpu.grad_scale, cpu.grad_scale));
}

void expect_ce_bitwise(const CrossEntropyOutputs& a, const CrossEntropyOutputs& b,
                       const std::string& what) {
  CODA_EXPECT_PASSES(bitwise_difference("loss, " + what, a.loss, b.loss));
  CODA_EXPECT_PASSES(bitwise_difference("grad_scale, " + what, a.grad_scale, b.grad_scale));
  CODA_EXPECT_PASSES(bitwise_difference("dlogits, " + what, a.dlogits, b.dlogits));
  CODA_EXPECT_PASSES(bitwise_difference("zeta, " + what, a.zeta, b.zeta));
}

void check_cross_entropy(DType dtype, const CrossEntropyCase& c, LossReduction reduction,
                         bool in_place, int32_t ignore_index = -100) {
  Seeds seeds;
  const CrossEntropyInputs in = make_cross_entropy_inputs(dtype, c, ignore_index, reduction, seeds);
  const CrossEntropyOutputs cpu = run_ce_cpu(dtype, c, in, reduction, in_place);
  const CrossEntropyOutputs gpu = run_ce_gpu(dtype, c, in, reduction, in_place);
  expect_ce_matches(dtype, in.ref, gpu, cpu);
  expect_ce_bitwise(run_ce_gpu(dtype, c, in, reduction, in_place), gpu, "second run");
}

using CeParam = std::tuple<DType, CrossEntropyCase, LossReduction>;
std::string ce_name(const testing::TestParamInfo<CeParam>& info) {
  return dtype_label(std::get<0>(info.param)) + "_" + label(std::get<1>(info.param)) +
         (std::get<2>(info.param) == LossReduction::mean ? "_mean" : "_sum");
}
class GpuCrossEntropy : public testing::TestWithParam<CeParam> {};
TEST_P(GpuCrossEntropy, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_cross_entropy(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam()),
                      false);
}
// dlogits over the logits buffer, as the block runs it; ignore_index -1 here.
TEST_P(GpuCrossEntropy, GradientMayOverwriteLogits) {
  CODA_REQUIRE_SM90();
  check_cross_entropy(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam()),
                      true, -1);
}
INSTANTIATE_TEST_SUITE_P(Gpu, GpuCrossEntropy,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kCrossEntropyCases),
                                          testing::Values(LossReduction::mean, LossReduction::sum)),
                         ce_name);

// A micro-batch that is all padding: mean 0 with grad_scale 0 (sum: 0 with grad_scale 1), zero
// dlogits and zeta, as on the CPU.
void check_all_ignored(DType dtype, const CrossEntropyCase& c, LossReduction reduction,
                       bool in_place) {
  Seeds seeds;
  const CrossEntropyInputs in = make_cross_entropy_inputs(dtype, c, -100, reduction, seeds,
                                                          std::vector<int32_t>(size_t(c.M), -100));
  const CrossEntropyOutputs cpu = run_ce_cpu(dtype, c, in, reduction, in_place);
  const CrossEntropyOutputs gpu = run_ce_gpu(dtype, c, in, reduction, in_place);
  EXPECT_EQ(gpu.loss.values()[0], 0.0);
  EXPECT_EQ(gpu.grad_scale.values()[0], reduction == LossReduction::mean ? 0.0 : 1.0);
  for (double v : gpu.dlogits.values()) ASSERT_EQ(v, 0.0);
  for (double v : gpu.zeta.values()) ASSERT_EQ(v, 0.0);
  expect_ce_bitwise(gpu, cpu, "vs the CPU backend");
}

TEST(GpuCrossEntropyAllIgnored, MeanIsZeroWithZeroGradScaleAndZeroGradient) {
  CODA_REQUIRE_SM90();
  check_all_ignored(DType::bf16, {9, 136}, LossReduction::mean, false);
  check_all_ignored(DType::f16, {130, 296}, LossReduction::mean, true);
  check_all_ignored(DType::bf16, {9, 136}, LossReduction::sum, false);
}

// Targets outside [0, V) that are not ignore_index: the CPU rejects them; the GPU cannot report
// from a kernel and treats such rows as ignored (args.hpp). Checked against the CPU on the same
// inputs with those rows ignored.
TEST(GpuCrossEntropyTargets, OutOfRangeTargetsAreTreatedAsIgnored) {
  CODA_REQUIRE_SM90();
  const CrossEntropyCase c{37, 296};
  for (const LossReduction reduction : {LossReduction::mean, LossReduction::sum}) {
    Seeds seeds;
    const CrossEntropyInputs valid =
        make_cross_entropy_inputs(DType::bf16, c, -100, reduction, seeds);
    std::vector<int32_t> targets = valid.ref.targets, ignored = valid.ref.targets;
    for (const size_t m : {size_t(0), size_t(6), size_t(36)}) { // rows 0 and 36: V + m; 6: -7
      targets[m] = m == 6 ? -7 : int32_t(c.V) + int32_t(m);
      ignored[m] = -100;
    }
    CrossEntropyInputs bad = valid, as_ignored = valid;
    bad.targets = HostTensor::of_ints({c.M}, targets);
    as_ignored.targets = HostTensor::of_ints({c.M}, ignored);
    as_ignored.ref.targets = ignored;
    const CrossEntropyOutputs cpu = run_ce_cpu(DType::bf16, c, as_ignored, reduction, false);
    const CrossEntropyOutputs gpu = run_ce_gpu(DType::bf16, c, bad, reduction, false);
    const CrossEntropyOutputs gpu_ignored =
        run_ce_gpu(DType::bf16, c, as_ignored, reduction, false);
    expect_ce_matches(DType::bf16, as_ignored.ref, gpu, cpu);
    expect_ce_bitwise(gpu, gpu_ignored, "out-of-range targets vs ignore_index");
  }
}

// ---- Small shapes for compute-sanitizer (a few rows, every code path once).

TEST(AuxSmallForSanitizer, Reductions) {
  CODA_REQUIRE_SM90();
  check_rstd({37, 3, 0});
  check_rstd({129, 40, 3});
  check_row_reduce({37, 3, 1}, false);
  check_col_reduce(DType::bf16, true, {33, 45, 3});
  check_col_reduce(DType::f32, false, {136, 2, 0});
}

TEST(AuxSmallForSanitizer, RopeBackward) {
  CODA_REQUIRE_SM90();
  check_rope_backward(DType::bf16, {4, 2, 64, 37}, true);
  check_rope_backward(DType::f16, {2, 1, 96, 9}, false);
  check_rope_backward(DType::bf16, {2, 1, 6, 9}, false);
}

TEST(AuxSmallForSanitizer, CrossEntropy) {
  CODA_REQUIRE_SM90();
  check_cross_entropy(DType::bf16, {37, 296}, LossReduction::mean, true);
  check_cross_entropy(DType::f16, {5, 2056}, LossReduction::sum, false);
  check_all_ignored(DType::bf16, {9, 136}, LossReduction::mean, false);
}

} // namespace
} // namespace coda::test
