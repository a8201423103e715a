// The fused forward kernels on the GPU (K0, K1, K2, K2g, K4, K5, rms_stats) through the public API
// on device memory, each output held
//  * to the fp64 reference by the tolerance rule (tests/common/check.hpp): no worse than twice
//    the error of the ordinary unfused bf16 / f16 path, and
//  * to the CPU backend (the same op chains on the host): max |gpu - cpu| <= 2 max |unfused - cpu|
//    + 1e-6, i.e. the two backends agree to within the unfused path's error.
// Inputs are fresh per run, outputs poisoned with NaN and fenced by guard bytes on the device;
// M, N are ragged against the 128 x 256 tiles; some shapes take several waves of tiles.
// Skipped (not passed) where there is no sm_90 device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "gpu/backend.hpp"
#include "gpu/fused/kernels.hpp"
#include "reference/kernels.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/common/kernel_fixtures.hpp"
#include "tests/gpu/cpu_parity.hpp"
#include "tests/gpu/device_tensor.hpp"
#include "tests/gpu/fp8_product.hpp"
#include "tests/gpu/gpu_fixtures.hpp"

namespace coda::test {
namespace {

// Every kernel runs on every GEMM schedule (gpu/fused/kernels.hpp); the default one is one of
// them (a kernel without a staged variant runs its default for `staged`).
const gpu::FusedSchedule kSchedules[] = {gpu::FusedSchedule::cooperative,
                                         gpu::FusedSchedule::pingpong, gpu::FusedSchedule::staged};
std::string schedule_name(gpu::FusedSchedule s) {
  return s == gpu::FusedSchedule::cooperative ? "cooperative 128x256"
         : s == gpu::FusedSchedule::pingpong  ? "ping-pong 128x128"
                                              : "staged 128x192";
}

const DType kHalfTypes[] = {DType::bf16, DType::f16};

struct Shape {
  int64_t M, N, K;
};
std::string label(const Shape& s) {
  return "M" + std::to_string(s.M) + "_N" + std::to_string(s.N) + "_K" + std::to_string(s.K);
}
// GoogleTest's printer for a Shape parameter (--gtest_list_tests, failures): its label.
void PrintTo(const Shape& s, std::ostream* os) { *os << label(s); }
using DtypeShape = std::tuple<DType, Shape>;
std::string dtype_shape_name(const testing::TestParamInfo<DtypeShape>& info) {
  return dtype_label(std::get<0>(info.param)) + "_" + label(std::get<1>(info.param));
}

// Ragged M (1, 37, 129, 200, 300) and N (8, 136, 264, 520, 1000) against 128 x 256 tiles; K
// from one partial k-block (16) to many with a tail (1032); 2176 x 2048 takes more tiles than
// a wave of clusters, so CTAs carry their epilogue state from tile to tile.
const Shape kShapes[] = {{1, 8, 16},      {37, 136, 64},     {200, 264, 64},
                         {129, 520, 256}, {300, 1000, 1032}, {2176, 2048, 128}};

// ---- K0 gemm_residual_rms

struct ResidualRmsCase {
  HostTensor a, w, residual, gamma, out, out_scaled, partials;
  ResidualRmsCase(DType dtype, const Shape& s, Seeds& seeds)
      : a(HostTensor::random(dtype, {s.M, s.K}, seeds.next())),
        w(HostTensor::random(dtype, {s.N, s.K}, seeds.next())),
        residual(HostTensor::random(dtype, {s.M, s.N}, seeds.next())),
        gamma(HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5)), out(dtype, {s.M, s.N}),
        out_scaled(dtype, {s.M, s.N}), partials(DType::f32, {s.M, ref::partial_blocks(s.N)}) {}
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

void run_residual_rms(DType dtype, const Shape& s, bool alias_out) {
  Seeds seeds;
  const ResidualRmsCase inputs(dtype, s, seeds);
  const ref::ResidualRmsInputs in{s.M,
                                  s.N,
                                  s.K,
                                  inputs.a.values(),
                                  inputs.w.values(),
                                  inputs.residual.values(),
                                  inputs.gamma.values()};
  ResidualRmsCase cpu = inputs;
  gemm_residual_rms(cpu.args());
  const auto exact = ref::residual_rms({}, in), unfused = ref::residual_rms(lowp(dtype), in);

  for (const gpu::FusedSchedule schedule : kSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    const ScheduleScope scope(schedule);
    ResidualRmsCase gpu = inputs; // fresh NaN-poisoned outputs
    DeviceTensor a(gpu.a), w(gpu.w), residual(gpu.residual), gamma(gpu.gamma), out(gpu.out),
        out_scaled(gpu.out_scaled), partials(gpu.partials);
    ResidualRmsArgs args{.a = a.view(),
                         .w = w.view(),
                         .residual = residual.view(),
                         .gamma = gamma.view(),
                         .out = alias_out ? residual.view() : out.view(),
                         .out_scaled = out_scaled.view(),
                         .sumsq_partials = partials.view()};
    gemm_residual_rms(args);
    synchronize_ok();
    DeviceTensor& out_dev = alias_out ? residual : out;
    HostTensor& out_host = alias_out ? gpu.residual : gpu.out;
    EXPECT_TRUE(out_dev.copy_back() && out_scaled.copy_back() && partials.copy_back())
        << "a write past the end of an output";
    expect_matches("out", out_host, cpu.out, exact.out, unfused.out);
    expect_matches("out_scaled", gpu.out_scaled, cpu.out_scaled, exact.out_scaled,
                   unfused.out_scaled);
    expect_matches("sumsq_partials", gpu.partials, cpu.partials, exact.sumsq_partials,
                   unfused.sumsq_partials);
  }
}

class FusedResidualRms : public testing::TestWithParam<DtypeShape> {};
TEST_P(FusedResidualRms, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  run_residual_rms(std::get<0>(GetParam()), std::get<1>(GetParam()), false);
}
TEST_P(FusedResidualRms, OutputMayAliasResidual) {
  CODA_REQUIRE_SM90();
  run_residual_rms(std::get<0>(GetParam()), std::get<1>(GetParam()), true);
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedResidualRms,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kShapes)),
                         dtype_shape_name);

// ---- The normalized GEMMs K1, K2, K4, K5: z = rstd[m] * (a · wᵀ), rstd from row partials.

struct NormedInputs {
  HostTensor a, w, partials;
  float eps;
  NormedInputs(DType dtype, int64_t M, int64_t N, int64_t K, Seeds& seeds, float eps = 1e-6f)
      : a(HostTensor::random(dtype, {M, K}, seeds.next())),
        w(HostTensor::random(dtype, {N, K}, seeds.next())),
        partials(random_sumsq_partials(M, K, seeds.next())), eps(eps) {}
  ref::NormedGemmInputs inputs() const {
    return {a.shape()[0], w.shape()[0],      a.shape()[1], a.values(),
            w.values(),   partials.values(), eps};
  }
};

// The inputs on the device.
struct DeviceNormed {
  DeviceTensor a, w, partials;
  explicit DeviceNormed(NormedInputs& in) : a(in.a), w(in.w), partials(in.partials) {}
};

// K1 on `in`, on the CPU backend and on the GPU (both schedules); checks both outputs.
void check_rms_scale(DType dtype, NormedInputs& in, bool with_rstd) {
  const int64_t M = in.a.shape()[0], N = in.w.shape()[0];
  HostTensor cpu_out(dtype, {M, N});
  HostTensor cpu_rstd = with_rstd ? HostTensor(DType::f32, {M}) : HostTensor();
  gemm_rms_scale({.a = in.a.view(),
                  .w = in.w.view(),
                  .sumsq_partials = in.partials.view(),
                  .eps = in.eps,
                  .out = cpu_out.view(),
                  .rstd_out = cpu_rstd.view()});
  const auto exact = ref::rms_scale({}, in.inputs()),
             unfused = ref::rms_scale(lowp(dtype), in.inputs());
  DeviceNormed d(in);
  for (const gpu::FusedSchedule schedule : kSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    const ScheduleScope scope(schedule);
    HostTensor gpu_out(dtype, {M, N});
    HostTensor gpu_rstd = with_rstd ? HostTensor(DType::f32, {M}) : HostTensor();
    DeviceTensor out(gpu_out), rstd(gpu_rstd);
    gemm_rms_scale({.a = d.a.view(),
                    .w = d.w.view(),
                    .sumsq_partials = d.partials.view(),
                    .eps = in.eps,
                    .out = out.view(),
                    .rstd_out = rstd.view()});
    synchronize_ok();
    EXPECT_TRUE(out.copy_back() && rstd.copy_back()) << "a write past the end of an output";
    expect_matches("out", gpu_out, cpu_out, exact.out, unfused.out);
    if (with_rstd) expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
  }
}

class FusedRmsScale : public testing::TestWithParam<DtypeShape> {};
TEST_P(FusedRmsScale, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  const auto [dtype, s] = GetParam();
  Seeds seeds;
  NormedInputs in(dtype, s.M, s.N, s.K, seeds);
  check_rms_scale(dtype, in, true);
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsScale,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kShapes)),
                         dtype_shape_name);

// Partials wider than the shared-memory staging (K = 4224: 33 per row) are read from global
// memory; a single partial column (the first layer's statistics) and no rstd_out; a large eps.
TEST(FusedRmsScaleWidths, WidePartialsSingleColumnAndNoRstdOut) {
  CODA_REQUIRE_SM90();
  Seeds seeds;
  NormedInputs wide(DType::bf16, 130, 264, 4224, seeds);
  check_rms_scale(DType::bf16, wide, true);
  NormedInputs single(DType::f16, 200, 136, 64, seeds, 0.25f);
  const std::vector<double> x = random_doubles(size_t(200 * 64), seeds.next());
  single.partials = HostTensor::of(
      DType::f32, {200, 1},
      ref::rms_stats({}, 200, 64, x, std::vector<double>(64, 1.0), 64).sumsq_partials);
  check_rms_scale(DType::f16, single, false);
}

// ---- K2 gemm_rms_swiglu and K2g gemm_rms_geglu (K2 with GeGLU): N = 2F with F = 8, 136, 264,
// 520; K from 16 to 4200, so 1 to 33 rstd partials per row: the variant staging 16 of them, the
// one staging 32 (K = 2600: 21) and rows too wide for either, read from global memory
// (K = 4200: 33). The two differ in the gate's activation only; each against its reference.

const Shape kGatedShapes[] = {{1, 16, 16},     {37, 272, 64},   {200, 528, 512},
                              {129, 1040, 96}, {70, 272, 2600}, {33, 272, 4200}};
const auto kGatedCases =
    testing::Combine(testing::ValuesIn(kHalfTypes), testing::ValuesIn(kGatedShapes));

template <class GatedArgs>
void check_rms_gated(void (*kernel)(const GatedArgs&, Stream),
                     ref::RmsGatedOutputs (*reference)(ref::Rounding, const ref::NormedGemmInputs&),
                     double (*activation)(double), DType dtype, const Shape& s) {
  Seeds seeds;
  NormedInputs in(dtype, s.M, s.N, s.K, seeds);
  HostTensor cpu_pre(dtype, {s.M, s.N}), cpu_act(dtype, {s.M, s.N / 2}),
      cpu_rstd(DType::f32, {s.M});
  kernel({.a = in.a.view(),
          .w = in.w.view(),
          .sumsq_partials = in.partials.view(),
          .eps = in.eps,
          .preact = cpu_pre.view(),
          .act = cpu_act.view(),
          .rstd_out = cpu_rstd.view()},
         nullptr);
  const auto exact = reference({}, in.inputs()), unfused = reference(lowp(dtype), in.inputs());
  DeviceNormed d(in);
  for (const gpu::FusedSchedule schedule : kSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    const ScheduleScope scope(schedule);
    HostTensor gpu_pre(dtype, {s.M, s.N}), gpu_act(dtype, {s.M, s.N / 2}),
        gpu_rstd(DType::f32, {s.M});
    DeviceTensor pre(gpu_pre), act(gpu_act), rstd(gpu_rstd);
    kernel({.a = d.a.view(),
            .w = d.w.view(),
            .sumsq_partials = d.partials.view(),
            .eps = in.eps,
            .preact = pre.view(),
            .act = act.view(),
            .rstd_out = rstd.view()},
           nullptr);
    synchronize_ok();
    EXPECT_TRUE(pre.copy_back() && act.copy_back() && rstd.copy_back())
        << "a write past the end of an output";
    expect_matches("preact", gpu_pre, cpu_pre, exact.preact, unfused.preact);
    // act from preact as stored (check_gate_of_stored); the CPU backend's act is its own
    // preact's gate in the CPU suite, so the preacts' comparison above covers both backends.
    CODA_EXPECT_PASSES(check_gate_of_stored("act", gpu_act, gpu_pre, activation));
    expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
  }
}

// On E4M3 operands with gemm_fp8's block scales (Fp8Shape): against the reference on the
// dequantized operands (the unfused path from gemm_fp8's product, fp8_product) and against the
// CPU backend. K a multiple of 16.
template <class GatedArgs>
void check_rms_gated_fp8(void (*kernel)(const GatedArgs&, Stream),
                         ref::RmsGatedOutputs (*reference)(ref::Rounding,
                                                           const ref::NormedGemmInputs&),
                         double (*activation)(double), DType dtype, const Shape& s) {
  const int64_t K = (s.K + 15) / 16 * 16;
  Seeds seeds;
  // act is about z squared: f16's range holds it for blocks of 2^0, not the default 2^+-6.
  Fp8GemmCase g(s.M, s.N, K, seeds, {.max_binade = dtype == DType::f16 ? 0 : 6});
  HostTensor partials = random_sumsq_partials(s.M, K, seeds.next());
  const float eps = 1e-6f;
  const auto call = [&](const TensorView& a, const TensorView& as, const TensorView& w,
                        const TensorView& ws, const TensorView& p, HostTensor& pre, HostTensor& act,
                        HostTensor& rstd, bool device) {
    DeviceTensor dpre(pre), dact(act), drstd(rstd);
    kernel({.a = a,
            .w = w,
            .sumsq_partials = p,
            .eps = eps,
            .preact = device ? dpre.view() : pre.view(),
            .act = device ? dact.view() : act.view(),
            .rstd_out = device ? drstd.view() : rstd.view(),
            .a_scales = as,
            .w_scales = ws},
           nullptr);
    if (!device) return;
    synchronize_ok();
    EXPECT_TRUE(dpre.copy_back() && dact.copy_back() && drstd.copy_back())
        << "a write past the end of an output";
  };
  HostTensor cpu_pre(dtype, {s.M, s.N}), cpu_act(dtype, {s.M, s.N / 2}),
      cpu_rstd(DType::f32, {s.M});
  call(g.a.view(), g.a_scales.view(), g.b.view(), g.b_scales.view(), partials.view(), cpu_pre,
       cpu_act, cpu_rstd, false);
  const ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
  DeviceTensor a(g.a), as(g.a_scales), w(g.b), ws(g.b_scales), p(partials);
  ref::NormedGemmInputs on_fp8 = in;
  on_fp8.product = fp8_product(g, a.view(), as.view(), w.view(), ws.view());
  const auto exact = reference({}, in), unfused = reference(lowp(dtype), on_fp8);
  for (double v : unfused.act) ASSERT_TRUE(std::isfinite(v)) << "act overflows: a vacuous check";
  HostTensor gpu_pre(dtype, {s.M, s.N}), gpu_act(dtype, {s.M, s.N / 2}),
      gpu_rstd(DType::f32, {s.M});
  call(a.view(), as.view(), w.view(), ws.view(), p.view(), gpu_pre, gpu_act, gpu_rstd, true);
  expect_matches("preact", gpu_pre, cpu_pre, exact.preact, unfused.preact);
  CODA_EXPECT_PASSES(check_gate_of_stored("act", gpu_act, gpu_pre, activation));
  expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
}

TEST(FusedRmsGatedFp8, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  for (DType dtype : kHalfTypes)
    for (const Shape& s : {Shape{1, 16, 16}, Shape{37, 272, 144}, Shape{300, 528, 272}}) {
      SCOPED_TRACE(dtype_label(dtype) + " M " + std::to_string(s.M) + " 2F " + std::to_string(s.N) +
                   " K " + std::to_string(s.K));
      for (const gpu::FusedSchedule schedule : kFp8Schedules) {
        SCOPED_TRACE(fp8_schedule_name(schedule));
        const ScheduleScope scope(schedule);
        check_rms_gated_fp8(gemm_rms_swiglu, ref::rms_swiglu, ref::silu, dtype, s);
        check_rms_gated_fp8(gemm_rms_geglu, ref::rms_geglu, ref::gelu, dtype, s);
      }
    }
}

// K0 and K1 on E4M3 operands, as K2's above: against the reference on the dequantized operands
// (the unfused path from gemm_fp8's product) and against the CPU backend. K a multiple of 16; f16
// with blocks of 2^+-2, whose products stay in its range (the default 2^+-6 overflows it).
Fp8GemmCase fp8_case(DType dtype, const Shape& s, Seeds& seeds) {
  return Fp8GemmCase(s.M, s.N, (s.K + 15) / 16 * 16, seeds,
                     {.max_binade = dtype == DType::f16 ? 2 : 6});
}

void check_residual_rms_fp8(DType dtype, const Shape& s) {
  Seeds seeds;
  Fp8GemmCase g = fp8_case(dtype, s, seeds);
  HostTensor residual = HostTensor::random(dtype, {s.M, s.N}, seeds.next());
  HostTensor gamma = HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5);
  struct Outputs {
    HostTensor out, out_scaled, partials;
  };
  const auto outputs = [&] {
    return Outputs{HostTensor(dtype, {s.M, s.N}), HostTensor(dtype, {s.M, s.N}),
                   HostTensor(DType::f32, {s.M, ref::partial_blocks(s.N)})};
  };
  Outputs cpu = outputs();
  gemm_residual_rms({.a = g.a.view(),
                     .w = g.b.view(),
                     .residual = residual.view(),
                     .gamma = gamma.view(),
                     .out = cpu.out.view(),
                     .out_scaled = cpu.out_scaled.view(),
                     .sumsq_partials = cpu.partials.view(),
                     .a_scales = g.a_scales.view(),
                     .w_scales = g.b_scales.view()});
  DeviceTensor a(g.a), as(g.a_scales), w(g.b), ws(g.b_scales), r(residual), gm(gamma);
  ref::ResidualRmsInputs in{g.m,           g.n, g.k, g.a_values(), g.b_values(), residual.values(),
                            gamma.values()};
  const auto exact = ref::residual_rms({}, in);
  in.product = fp8_product(g, a.view(), as.view(), w.view(), ws.view());
  const auto unfused = ref::residual_rms(lowp(dtype), in);
  for (double v : unfused.out_scaled) ASSERT_TRUE(std::isfinite(v)) << "a vacuous check";
  // sumsq_partials, fp32 of the unrounded x, against the exact statistic of the mainloop's own
  // product (fp8_product holds that product to fp64): the kernel's error is then its fp32
  // arithmetic (sumsq_partials_floor) and the unfused path's its rounding. Against the fp64
  // product both carry the tensor cores' error and the unfused path's rounding may cancel it:
  // f16 M 1 N 16 K 16, seed 130 on the H100 (2026-12-06), one partial of 1731.3, the unfused path
  // 0.001 from fp64 and the kernel 0.020 (2^-16 of it, an FP8 product's error). The CPU backend
  // sums in fp32 (no FP8 product error), so its distance from the kernel is that error, within
  // twice the larger of the unfused path's distances from the two.
  const auto on_product = ref::residual_rms({}, in);
  const double floor = sumsq_partials_floor(on_product.sumsq_partials);
  Outputs gpu = outputs();
  DeviceTensor out(gpu.out), out_scaled(gpu.out_scaled), partials(gpu.partials);
  gemm_residual_rms({.a = a.view(),
                     .w = w.view(),
                     .residual = r.view(),
                     .gamma = gm.view(),
                     .out = out.view(),
                     .out_scaled = out_scaled.view(),
                     .sumsq_partials = partials.view(),
                     .a_scales = as.view(),
                     .w_scales = ws.view()});
  synchronize_ok();
  EXPECT_TRUE(out.copy_back() && out_scaled.copy_back() && partials.copy_back())
      << "a write past the end of an output";
  expect_matches("out", gpu.out, cpu.out, exact.out, unfused.out);
  expect_matches("out_scaled", gpu.out_scaled, cpu.out_scaled, exact.out_scaled,
                 unfused.out_scaled);
  CODA_EXPECT_PASSES(check_output("sumsq_partials", gpu.partials, on_product.sumsq_partials,
                                  unfused.sumsq_partials, 1e-6 + floor));
  CODA_EXPECT_PASSES(check_matches_cpu("sumsq_partials", gpu.partials, cpu.partials,
                                       on_product.sumsq_partials, unfused.sumsq_partials,
                                       DType::f32, 2 * floor));
}

void check_rms_scale_fp8(DType dtype, const Shape& s) {
  Seeds seeds;
  Fp8GemmCase g = fp8_case(dtype, s, seeds);
  HostTensor partials = random_sumsq_partials(g.m, g.k, seeds.next());
  const float eps = 1e-6f;
  HostTensor cpu_out(dtype, {s.M, s.N}), cpu_rstd(DType::f32, {s.M});
  gemm_rms_scale({.a = g.a.view(),
                  .w = g.b.view(),
                  .sumsq_partials = partials.view(),
                  .eps = eps,
                  .out = cpu_out.view(),
                  .rstd_out = cpu_rstd.view(),
                  .a_scales = g.a_scales.view(),
                  .w_scales = g.b_scales.view()});
  DeviceTensor a(g.a), as(g.a_scales), w(g.b), ws(g.b_scales), p(partials);
  ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
  const auto exact = ref::rms_scale({}, in);
  in.product = fp8_product(g, a.view(), as.view(), w.view(), ws.view());
  const auto unfused = ref::rms_scale(lowp(dtype), in);
  for (double v : unfused.out) ASSERT_TRUE(std::isfinite(v)) << "a vacuous check";
  HostTensor gpu_out(dtype, {s.M, s.N}), gpu_rstd(DType::f32, {s.M});
  DeviceTensor out(gpu_out), rstd(gpu_rstd);
  gemm_rms_scale({.a = a.view(),
                  .w = w.view(),
                  .sumsq_partials = p.view(),
                  .eps = eps,
                  .out = out.view(),
                  .rstd_out = rstd.view(),
                  .a_scales = as.view(),
                  .w_scales = ws.view()});
  synchronize_ok();
  EXPECT_TRUE(out.copy_back() && rstd.copy_back()) << "a write past the end of an output";
  expect_matches("out", gpu_out, cpu_out, exact.out, unfused.out);
  expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
}

// Ragged M and N against the 128 x 128 tile, K from one k-block to several with a tail.
TEST(FusedResidualRmsFp8, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  for (DType dtype : kHalfTypes)
    for (const Shape& s :
         {Shape{1, 16, 16}, Shape{37, 136, 144}, Shape{300, 528, 272}, Shape{2176, 2048, 128}}) {
      SCOPED_TRACE(dtype_label(dtype) + "_" + label(s));
      check_residual_rms_fp8(dtype, s);
    }
}
TEST(FusedRmsScaleFp8, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  for (DType dtype : kHalfTypes)
    for (const Shape& s : {Shape{1, 16, 16}, Shape{37, 136, 144}, Shape{300, 528, 4224}}) {
      SCOPED_TRACE(dtype_label(dtype) + "_" + label(s));
      for (const gpu::FusedSchedule schedule : kFp8Schedules) {
        SCOPED_TRACE(fp8_schedule_name(schedule));
        const ScheduleScope scope(schedule);
        check_rms_scale_fp8(dtype, s);
      }
    }
}

void check_rms_swiglu(DType dtype, const Shape& s) {
  check_rms_gated(gemm_rms_swiglu, ref::rms_swiglu, ref::silu, dtype, s);
}
void check_rms_geglu(DType dtype, const Shape& s) {
  check_rms_gated(gemm_rms_geglu, ref::rms_geglu, ref::gelu, dtype, s);
}

class FusedRmsSwiglu : public testing::TestWithParam<DtypeShape> {};
TEST_P(FusedRmsSwiglu, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rms_swiglu(std::get<0>(GetParam()), std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsSwiglu, kGatedCases, dtype_shape_name);

class FusedRmsGeglu : public testing::TestWithParam<DtypeShape> {};
TEST_P(FusedRmsGeglu, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rms_geglu(std::get<0>(GetParam()), std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsGeglu, kGatedCases, dtype_shape_name);

// ---- K4 gemm_rms_rope: GQA, head_dim 64 and 128, QKV widths that are not a multiple of 256.

struct RopeCase {
  int32_t n_q_heads, n_kv_heads, head_dim;
  int64_t M, K;
};
std::string label(const RopeCase& r) {
  return "q" + std::to_string(r.n_q_heads) + "_kv" + std::to_string(r.n_kv_heads) + "_hd" +
         std::to_string(r.head_dim) + "_M" + std::to_string(r.M) + "_K" + std::to_string(r.K);
}
void PrintTo(const RopeCase& x, std::ostream* os) { *os << label(x); }
const RopeCase kRopeCases[] = {{4, 2, 64, 200, 64},   {3, 1, 64, 37, 128}, {32, 8, 64, 67, 64},
                               {4, 1, 128, 130, 256}, {3, 1, 128, 1, 16},  {6, 2, 128, 300, 72}};

void check_rms_rope(DType dtype, const RopeCase& rc) {
  ref::RopeTable table;
  table.shape = {rc.n_q_heads, rc.n_kv_heads, rc.head_dim};
  table.positions = packed_positions(rc.M, 23, 1000); // packed sequences, one continued
  table.inv_freq = rope_inv_freq_f32(rc.head_dim);
  const int64_t N = table.shape.width();
  Seeds seeds;
  NormedInputs in(dtype, rc.M, N, rc.K, seeds);
  auto positions = HostTensor::of_ints({rc.M}, table.positions);
  auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
  HostTensor cpu_out(dtype, {rc.M, N}), cpu_rstd(DType::f32, {rc.M});
  const RopeSpec host_rope{positions.view(), inv_freq.view(), rc.n_q_heads, rc.n_kv_heads,
                           rc.head_dim};
  gemm_rms_rope({.a = in.a.view(),
                 .w = in.w.view(),
                 .sumsq_partials = in.partials.view(),
                 .eps = in.eps,
                 .rope = host_rope,
                 .out = cpu_out.view(),
                 .rstd_out = cpu_rstd.view()});
  const auto exact = ref::rms_rope({}, in.inputs(), table),
             unfused = ref::rms_rope(lowp(dtype), in.inputs(), table);
  DeviceNormed d(in);
  DeviceTensor pos(positions), freq(inv_freq);
  for (const gpu::FusedSchedule schedule : kSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    const ScheduleScope scope(schedule);
    HostTensor gpu_out(dtype, {rc.M, N}), gpu_rstd(DType::f32, {rc.M});
    DeviceTensor out(gpu_out), rstd(gpu_rstd);
    gemm_rms_rope({.a = d.a.view(),
                   .w = d.w.view(),
                   .sumsq_partials = d.partials.view(),
                   .eps = in.eps,
                   .rope = {pos.view(), freq.view(), rc.n_q_heads, rc.n_kv_heads, rc.head_dim},
                   .out = out.view(),
                   .rstd_out = rstd.view()});
    synchronize_ok();
    EXPECT_TRUE(out.copy_back() && rstd.copy_back()) << "a write past the end of an output";
    expect_matches("out", gpu_out, cpu_out, exact.out, unfused.out);
    expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
  }
}

using DtypeRope = std::tuple<DType, RopeCase>;
class FusedRmsRope : public testing::TestWithParam<DtypeRope> {};
TEST_P(FusedRmsRope, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rms_rope(std::get<0>(GetParam()), std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsRope,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kRopeCases)),
                         [](const testing::TestParamInfo<DtypeRope>& info) {
                           return dtype_label(std::get<0>(info.param)) + "_" +
                                  label(std::get<1>(info.param));
                         });

// K4 on E4M3 operands with gemm_fp8's block scales (the FP8 mainloop's Fp8Shape): against the
// fp64 reference on the values the codes and scales stand for (the unfused path from gemm_fp8's
// product, fp8_product) and against the CPU backend.
void check_rms_rope_fp8(DType dtype, const RopeCase& rc) {
  ref::RopeTable table;
  table.shape = {rc.n_q_heads, rc.n_kv_heads, rc.head_dim};
  table.positions = packed_positions(rc.M, 23, 1000);
  table.inv_freq = rope_inv_freq_f32(rc.head_dim);
  const int64_t N = table.shape.width(), K = (rc.K + 15) / 16 * 16;
  Seeds seeds;
  Fp8GemmCase g(rc.M, N, K, seeds, {.max_binade = dtype == DType::f16 ? 2 : 6});
  HostTensor partials = random_sumsq_partials(rc.M, K, seeds.next());
  auto positions = HostTensor::of_ints({rc.M}, table.positions);
  auto inv_freq = HostTensor::of(DType::f32, {rc.head_dim / 2}, table.inv_freq);
  const float eps = 1e-6f;
  const auto args = [&](const TensorView& a, const TensorView& as, const TensorView& w,
                        const TensorView& ws, const TensorView& p, const RopeSpec& rope,
                        const TensorView& out, const TensorView& rstd) {
    return RmsRopeArgs{.a = a,
                       .w = w,
                       .sumsq_partials = p,
                       .eps = eps,
                       .rope = rope,
                       .out = out,
                       .rstd_out = rstd,
                       .a_scales = as,
                       .w_scales = ws};
  };
  HostTensor cpu_out(dtype, {rc.M, N}), cpu_rstd(DType::f32, {rc.M});
  gemm_rms_rope(args(g.a.view(), g.a_scales.view(), g.b.view(), g.b_scales.view(), partials.view(),
                     {positions.view(), inv_freq.view(), rc.n_q_heads, rc.n_kv_heads, rc.head_dim},
                     cpu_out.view(), cpu_rstd.view()));
  const ref::NormedGemmInputs in = g.normed_inputs(partials, eps);
  DeviceTensor a(g.a), as(g.a_scales), w(g.b), ws(g.b_scales), p(partials), pos(positions),
      freq(inv_freq);
  ref::NormedGemmInputs on_fp8 = in;
  on_fp8.product = fp8_product(g, a.view(), as.view(), w.view(), ws.view());
  const auto exact = ref::rms_rope({}, in, table),
             unfused = ref::rms_rope(lowp(dtype), on_fp8, table);
  for (double v : unfused.out) ASSERT_TRUE(std::isfinite(v)) << "out overflows: a vacuous check";
  HostTensor gpu_out(dtype, {rc.M, N}), gpu_rstd(DType::f32, {rc.M});
  DeviceTensor out(gpu_out), rstd(gpu_rstd);
  gemm_rms_rope(args(a.view(), as.view(), w.view(), ws.view(), p.view(),
                     {pos.view(), freq.view(), rc.n_q_heads, rc.n_kv_heads, rc.head_dim},
                     out.view(), rstd.view()));
  synchronize_ok();
  EXPECT_TRUE(out.copy_back() && rstd.copy_back()) << "a write past the end of an output";
  expect_matches("out", gpu_out, cpu_out, exact.out, unfused.out);
  expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
}

TEST(FusedRmsRopeFp8, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  for (DType dtype : kHalfTypes)
    for (const RopeCase& rc : kRopeCases) {
      SCOPED_TRACE(dtype_label(dtype) + "_" + label(rc));
      for (const gpu::FusedSchedule schedule : kFp8Schedules) { // (head_dim 128: cooperative)
        SCOPED_TRACE(fp8_schedule_name(schedule));
        const ScheduleScope scope(schedule);
        check_rms_rope_fp8(dtype, rc);
      }
    }
}

// Head sizes whose heads a 256-column tile cannot hold whole: a clear error, no output written.
TEST(FusedRmsRopeLimits, OtherHeadDimsAreNotSupported) {
  CODA_REQUIRE_SM90();
  Seeds seeds;
  NormedInputs in(DType::bf16, 16, 96, 16, seeds); // 4 + 2 * 1 heads of 16
  auto positions = HostTensor::of_ints({16}, packed_positions(16, 16, 0));
  auto inv_freq = HostTensor::of(DType::f32, {8}, rope_inv_freq_f32(16));
  HostTensor out_host(DType::bf16, {16, 96});
  DeviceNormed d(in);
  DeviceTensor pos(positions), freq(inv_freq), out(out_host);
  try {
    gemm_rms_rope({.a = d.a.view(),
                   .w = d.w.view(),
                   .sumsq_partials = d.partials.view(),
                   .rope = {pos.view(), freq.view(), 4, 1, 16},
                   .out = out.view()});
    ADD_FAILURE() << "head_dim 16 ran on the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.status()), int(Status::not_supported)) << e.what();
    EXPECT_NE(std::string(e.what()).find("head_dim 64 and 128"), std::string::npos) << e.what();
  }
  synchronize_ok();
  EXPECT_TRUE(out.copy_back());
  for (double v : out_host.values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
}

// ---- K5 gemm_rms_lse: vocabularies that are not a multiple of 128 or 256, targets that are
// ignore_index, out of range, or the last (ragged) column.

struct LseCase {
  int64_t M, V, K;
};
void PrintTo(const LseCase& c, std::ostream* os) {
  *os << "M " << c.M << ", V " << c.V << ", K " << c.K;
}
const LseCase kLseCases[] = {{37, 296, 64}, {200, 136, 32},   {1, 1000, 16},
                             {64, 8, 8},    {130, 1000, 200}, {257, 2056, 64}};

void check_rms_lse(DType dtype, const LseCase& lc) {
  Seeds seeds;
  NormedInputs in(dtype, lc.M, lc.V, lc.K, seeds);
  std::vector<int32_t> targets(size_t(lc.M));
  const std::vector<double> u = random_doubles(targets.size(), seeds.next(), 0, 1);
  for (size_t m = 0; m < targets.size(); ++m)
    targets[m] = m % 5 == 1 ? -100 : m % 7 == 3 ? int32_t(lc.V) : int32_t(u[m] * double(lc.V));
  if (lc.M > 2) targets[2] = int32_t(lc.V) - 1;
  auto target_tensor = HostTensor::of_ints({lc.M}, targets);
  const int64_t P = ref::partial_blocks(lc.V, ref::kStagedPartialBlock);
  HostTensor cpu_logits(dtype, {lc.M, lc.V}), cpu_lse(DType::f32, {lc.M, P}),
      cpu_target(DType::f32, {lc.M}), cpu_rstd(DType::f32, {lc.M});
  gemm_rms_lse({.a = in.a.view(),
                .w = in.w.view(),
                .sumsq_partials = in.partials.view(),
                .eps = in.eps,
                .targets = target_tensor.view(),
                .logits = cpu_logits.view(),
                .lse_partials = cpu_lse.view(),
                .target_logit = cpu_target.view(),
                .rstd_out = cpu_rstd.view()});
  const auto exact = ref::rms_lse({}, in.inputs(), targets),
             unfused = ref::rms_lse(lowp(dtype), in.inputs(), targets);
  DeviceNormed d(in);
  DeviceTensor tgt(target_tensor);
  for (const gpu::FusedSchedule schedule : kSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    const ScheduleScope scope(schedule);
    HostTensor gpu_logits(dtype, {lc.M, lc.V}), gpu_lse(DType::f32, {lc.M, P}),
        gpu_target(DType::f32, {lc.M}), gpu_rstd(DType::f32, {lc.M});
    DeviceTensor logits(gpu_logits), lse(gpu_lse), target(gpu_target), rstd(gpu_rstd);
    gemm_rms_lse({.a = d.a.view(),
                  .w = d.w.view(),
                  .sumsq_partials = d.partials.view(),
                  .eps = in.eps,
                  .targets = tgt.view(),
                  .logits = logits.view(),
                  .lse_partials = lse.view(),
                  .target_logit = target.view(),
                  .rstd_out = rstd.view()});
    synchronize_ok();
    EXPECT_TRUE(logits.copy_back() && lse.copy_back() && target.copy_back() && rstd.copy_back())
        << "a write past the end of an output";
    expect_matches("logits", gpu_logits, cpu_logits, exact.logits, unfused.logits);
    // Statistics of the rounded logits: parity within one ulp of the logits' type.
    expect_matches("lse_partials", gpu_lse, cpu_lse, exact.lse_partials, unfused.lse_partials,
                   FinalRounding::counted, dtype);
    expect_matches("target_logit", gpu_target, cpu_target, exact.target_logit, unfused.target_logit,
                   FinalRounding::counted, dtype);
    expect_matches("rstd_out", gpu_rstd, cpu_rstd, exact.rstd, unfused.rstd);
  }
}

using DtypeLse = std::tuple<DType, LseCase>;
class FusedRmsLse : public testing::TestWithParam<DtypeLse> {};
TEST_P(FusedRmsLse, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rms_lse(std::get<0>(GetParam()), std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsLse,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kLseCases)),
                         [](const testing::TestParamInfo<DtypeLse>& info) {
                           const LseCase& c = std::get<1>(info.param);
                           return dtype_label(std::get<0>(info.param)) + "_M" +
                                  std::to_string(c.M) + "_V" + std::to_string(c.V) + "_K" +
                                  std::to_string(c.K);
                         });

// ---- rms_stats: h = round(x * gamma), row partials of x².

struct StatsShape {
  int64_t M, N;
};
void PrintTo(const StatsShape& s, std::ostream* os) { *os << "M " << s.M << ", N " << s.N; }
const StatsShape kStatsShapes[] = {{1, 8}, {37, 136}, {200, 264}, {129, 2048}, {5, 4104}};

void check_rms_stats(DType dtype, const StatsShape& s) {
  Seeds seeds;
  auto x = HostTensor::random(dtype, {s.M, s.N}, seeds.next());
  auto gamma = HostTensor::random(dtype, {s.N}, seeds.next(), 0.5, 1.5);
  const int64_t P = ref::partial_blocks(s.N);
  HostTensor gpu_h(dtype, {s.M, s.N}), gpu_p(DType::f32, {s.M, P});
  HostTensor cpu_h = gpu_h, cpu_p = gpu_p;
  rms_stats({x.view(), gamma.view(), cpu_h.view(), cpu_p.view()});
  DeviceTensor dx(x), dgamma(gamma), h(gpu_h), p(gpu_p);
  rms_stats({dx.view(), dgamma.view(), h.view(), p.view()});
  synchronize_ok();
  EXPECT_TRUE(h.copy_back() && p.copy_back()) << "a write past the end of an output";
  const auto exact = ref::rms_stats({}, s.M, s.N, x.values(), gamma.values()),
             unfused = ref::rms_stats(lowp(dtype), s.M, s.N, x.values(), gamma.values());
  expect_matches("out_scaled", gpu_h, cpu_h, exact.out_scaled, unfused.out_scaled);
  expect_matches("sumsq_partials", gpu_p, cpu_p, exact.sumsq_partials, unfused.sumsq_partials);
}

using DtypeStats = std::tuple<DType, StatsShape>;
class FusedRmsStats : public testing::TestWithParam<DtypeStats> {};
TEST_P(FusedRmsStats, MatchesReferenceAndCpu) {
  CODA_REQUIRE_SM90();
  check_rms_stats(std::get<0>(GetParam()), std::get<1>(GetParam()));
}
INSTANTIATE_TEST_SUITE_P(Gpu, FusedRmsStats,
                         testing::Combine(testing::ValuesIn(kHalfTypes),
                                          testing::ValuesIn(kStatsShapes)),
                         [](const testing::TestParamInfo<DtypeStats>& info) {
                           const StatsShape& s = std::get<1>(info.param);
                           return dtype_label(std::get<0>(info.param)) + "_M" +
                                  std::to_string(s.M) + "_N" + std::to_string(s.N);
                         });

// ---- Small shapes (two tiles along M and N each) for compute-sanitizer.

TEST(FusedSmallForSanitizer, EveryKernel) {
  CODA_REQUIRE_SM90();
  run_residual_rms(DType::bf16, {130, 264, 72}, false);
  Seeds seeds;
  NormedInputs in(DType::bf16, 130, 264, 72, seeds);
  check_rms_scale(DType::bf16, in, true);
  check_rms_swiglu(DType::f16, {130, 272, 72});
  check_rms_geglu(DType::bf16, {130, 272, 72});
  check_rms_rope(DType::bf16, {3, 1, 64, 130, 72});
  check_rms_lse(DType::bf16, {130, 296, 72});
  check_rms_stats(DType::f16, {37, 264});
}

} // namespace
} // namespace coda::test
