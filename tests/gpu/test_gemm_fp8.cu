// The block-scaled FP8 GEMM on the GPU through coda::gemm_fp8 on device memory, each D held
//  * to the fp64 GEMM of the dequantized operands by the tolerance rule (tests/common/check.hpp;
//    the baseline: those operands multiplied in fp32 and rounded to bf16), and
//  * to the CPU backend on the same inputs (the same promotion in the same order; only the
//    128-deep block sums differ, the tensor cores' against exact ones): within one bf16 ulp, or
//    the rule with the CPU as the reference (tests/gpu/cpu_parity.hpp).
// Inputs are fresh per run (CODA_TEST_SEED replays one), with scales that change from block to
// block; D is poisoned with NaN and fenced by guard bytes, and one case surrounds it with
// poisoned padding (a wider row stride, rows past M) that must keep its bytes; M and N are
// ragged against the 128 x 128 tiles and K against the 128-deep blocks. The 128 x 192 tiles
// (gpu::gemm_fp8_with_tile) are held to the same and to the 128 x 128 kernel's D bit for bit, on
// N ragged against them and against the B scale blocks they straddle. Skipped (not passed)
// where there is no sm_90 device. And quantize_weight_fp8 and quantize_activation_fp8 on the GPU
// against the CPU backend, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/fp8.cuh"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/gpu/cpu_parity.hpp"
#include "tests/gpu/device_tensor.hpp"
#include "tests/gpu/gpu_fixtures.hpp"

namespace coda::test {
namespace {

struct Shape {
  int64_t m, n, k;
};
std::string label(const Shape& s) {
  return "M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k);
}
// GoogleTest's printer for a Shape parameter (--gtest_list_tests, failures): its label.
void PrintTo(const Shape& s, std::ostream* os) { *os << label(s); }

// The case's tensors on the device (D a fresh copy: NaN-poisoned, or the old values it
// accumulates into; guard bytes after each).
struct DeviceFp8 {
  DeviceTensor a, a_scales, b, b_scales, d;
  Fp8GemmCase::Options options;
  explicit DeviceFp8(Fp8GemmCase& c)
      : a(c.a), a_scales(c.a_scales), b(c.b), b_scales(c.b_scales), d(c.d), options(c.options) {}
  Fp8GemmArgs args() const {
    return {.a = a.view(),
            .a_scales = a_scales.view(),
            .b = b.view(),
            .b_scales = b_scales.view(),
            .d = d.view(),
            .b_scaling = options.b_scaling,
            .accumulate = options.accumulate};
  }
};

std::string label(const Fp8GemmCase::Options& o) {
  return std::string(o.b_scaling == Fp8BScaling::rows ? "b by rows" : "b by blocks") + ", d " +
         dtype_name(o.d) + (o.accumulate ? ", accumulating" : "");
}

// An fp32 D against the CPU backend's. Both promote the same block sums in the same order, but
// the tensor cores sum a block's products with fewer bits than fp32 (about 14 kept, DeepSeek-V3
// measured), where the CPU sums them exactly; no fp32 rounding hides that, so the bound is the
// scale of those sums' errors: 2^-8 of the element's sum of |A B| over K (the dequantized
// products, so the block scales are counted), which leaves 6 bits for the additions inside a
// block, plus a few fp32 ulps of the value for the promotion's own rounding. A scale read from the
// wrong block or row moves a block's whole contribution by a power of two; the bf16 variants hold
// the indexing to the fp64 rule too.
void expect_f32_matches_cpu(const HostTensor& gpu, const HostTensor& cpu,
                            const std::vector<double>& magnitude) {
  const std::vector<double> x = gpu.values(), y = cpu.values();
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double bound = std::ldexp(magnitude[i], -8) + 4 * ulp_of(DType::f32, std::fabs(y[i]));
    const bool ok = std::isnan(y[i]) ? std::isnan(x[i]) : std::fabs(x[i] - y[i]) <= bound;
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << "d[" << i << "]: GPU " << x[i] << ", CPU " << y[i] << ", bound " << bound
                    << " (seed " << test_seed() << ")";
  }
  EXPECT_EQ(bad, 0);
}

using sm90::Fp8Tile;

// gemm_fp8 on device tensors: automatic is the public entry point (validation, dispatch, the
// tile heuristic); a forced tile is the GPU backend's gemm_fp8_with_tile on the same (valid)
// arguments.
void run_gemm_fp8(const Fp8GemmArgs& args, Fp8Tile tile) {
  if (tile == Fp8Tile::automatic)
    gemm_fp8(args);
  else
    gpu::gemm_fp8_with_tile(args, tile, nullptr);
}

// The GPU (on `tile`) against the fp64 reference and the CPU backend; a second launch on the
// same inputs (d as it was before the first) must give the same bits (no atomics, no order that
// changes run to run), and any other tile than 128 x 128 the 128 x 128 kernel's bits (each
// element's promotions are the same fmaf's in the same order, and the tensor cores' partial of
// an element does not depend on the wgmma's N).
void check_shape(const Shape& s, Fp8GemmCase::Options o = {}, Fp8Tile tile = Fp8Tile::automatic) {
  SCOPED_TRACE(label(s) + ", " + label(o) + ", tile " + sm90::fp8_tile_name(tile));
  Seeds seeds;
  Fp8GemmCase cpu(s.m, s.n, s.k, seeds, o);
  Fp8GemmCase gpu = cpu, second = cpu, tile128 = cpu; // d: the same old values, or NaN
  gemm_fp8(cpu.args());                               // host tensors: the CPU backend
  DeviceFp8 dev(gpu);
  run_gemm_fp8(dev.args(), tile);
  synchronize_ok();
  EXPECT_TRUE(dev.d.copy_back()) << "a write past the end of d";
  if (o.d == DType::f32)
    expect_f32_matches_cpu(gpu.d, cpu.d, cpu.magnitude());
  else
    expect_matches("d", gpu.d, cpu.d, cpu.exact(), cpu.unfused());

  const size_t d_bytes = size_t(s.m * s.n) * dtype_size(o.d);
  DeviceFp8 again(second);
  run_gemm_fp8(again.args(), tile);
  synchronize_ok();
  EXPECT_TRUE(again.d.copy_back());
  EXPECT_EQ(std::memcmp(gpu.d.host_view().data, second.d.host_view().data, d_bytes), 0)
      << "two launches on the same inputs differ";

  if (tile == Fp8Tile::n128) return;
  DeviceFp8 base(tile128);
  gpu::gemm_fp8_with_tile(base.args(), Fp8Tile::n128, nullptr);
  synchronize_ok();
  EXPECT_TRUE(base.d.copy_back());
  EXPECT_EQ(std::memcmp(gpu.d.host_view().data, tile128.d.host_view().data, d_bytes), 0)
      << "D differs from the 128 x 128 kernel's";
}

// Ragged M (1, 127, 129, 300, 1000) and N (8, 136, 264, 392, 1032) against 128 x 128 tiles; K
// from one short block (16) through short last blocks (528, 2064) to many full ones; the last
// shape has more tiles (17 x 16) than a wave of clusters, so CTAs run several tiles each.
const Shape kShapes[] = {{1, 8, 16},      {127, 264, 1024},   {300, 136, 528},
                         {129, 392, 128}, {1000, 1032, 2064}, {2176, 2048, 256}};

class GpuFp8Gemm : public testing::TestWithParam<Shape> {};
TEST_P(GpuFp8Gemm, MatchesTheReferenceAndTheCpuBackend) {
  CODA_REQUIRE_SM90();
  check_shape(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuFp8Gemm, testing::ValuesIn(kShapes),
                         [](const testing::TestParamInfo<Shape>& info) {
                           return label(info.param);
                         });

// The 128 x 192 tiles: both mainloop forms (the halves' overlapped promotion and one partial) on
// N ragged against them and against the B scale blocks. A tile from n0 = 192 t spans two blocks,
// split at its column 128 (t even) or 64 (t odd); N's last block ends inside the first of them
// (N 200, 584: the second is past N) or the second (264, 392, 1032, 2112). M ragged as above,
// K from one short block to many; the last shape has more units (9 x 11) than a wave.
const Shape kTile192Shapes[] = {{1, 8, 16},       {127, 200, 1024},  {300, 264, 528},
                                {129, 392, 128},  {1000, 584, 2064}, {255, 1032, 400},
                                {2176, 2112, 256}};

// Forcing `tile` on c's call is not_supported, and d keeps every value it had.
void expect_refused(Fp8GemmCase& c, Fp8Tile tile) {
  SCOPED_TRACE(label(c.options) + ", tile " + sm90::fp8_tile_name(tile));
  const std::vector<double> before = c.d.values();
  DeviceFp8 dev(c);
  try {
    gpu::gemm_fp8_with_tile(dev.args(), tile, nullptr);
    ADD_FAILURE() << sm90::fp8_tile_name(tile) << " ran";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.status()), int(Status::not_supported)) << e.what();
  }
  synchronize_ok();
  EXPECT_TRUE(dev.d.copy_back());
  const std::vector<double> after = c.d.values();
  for (size_t i = 0; i < after.size(); ++i)
    ASSERT_TRUE(after[i] == before[i] || (std::isnan(after[i]) && std::isnan(before[i])))
        << "d was written at " << i;
}

class GpuFp8GemmTile192 : public testing::TestWithParam<Shape> {};
TEST_P(GpuFp8GemmTile192, MatchesTheReferenceTheCpuBackendAndThe128Tile) {
  CODA_REQUIRE_SM90();
  for (Fp8Tile tile : {Fp8Tile::n192, Fp8Tile::n192_one_partial}) check_shape(GetParam(), {}, tile);
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuFp8GemmTile192, testing::ValuesIn(kTile192Shapes),
                         [](const testing::TestParamInfo<Shape>& info) {
                           return label(info.param);
                         });

// The 192-column tiles' other forms: an fp32 d, and d accumulated into (bf16 and fp32). B scaled
// by rows runs the 128 x 128 tile only: forcing a 192-column tile is not_supported, and nothing
// is written.
TEST(GpuFp8GemmTile192, OtherFormsAndBByRows) {
  CODA_REQUIRE_SM90();
  const Fp8GemmCase::Options kForms[] = {{Fp8BScaling::blocks, DType::f32, false},
                                         {Fp8BScaling::blocks, DType::bf16, true},
                                         {Fp8BScaling::blocks, DType::f32, true}};
  for (const Fp8GemmCase::Options& o : kForms) {
    for (const Shape& s : {Shape{127, 264, 1024}, Shape{300, 584, 528}})
      check_shape(s, o, Fp8Tile::n192);
    check_shape({127, 264, 1024}, o, Fp8Tile::n192_one_partial);
  }

  Seeds seeds;
  Fp8GemmCase c(129, 264, 256, seeds, {Fp8BScaling::rows, DType::bf16, false});
  for (Fp8Tile tile : {Fp8Tile::n192, Fp8Tile::n192_one_partial}) expect_refused(c, tile);
  for (double v : c.d.values()) ASSERT_TRUE(std::isnan(v)) << "d was written";
}

// The 128 x 128 tile's consumers on the staged schedule (sm90::Fp8Tile::n128_staged): each
// rounds its 64 x 128 to bf16 into the staged tile and a fourth warpgroup stores it, so D must be
// the cooperative kernel's bit for bit (check_shape); M and N ragged against the tile, K from one
// short block to many, more tiles than a wave (kShapes). The same for the study kernel with one
// partial (the fused kernels' staged FP8 consumers): the same promotions in the same order, so
// the same bits.
const Fp8Tile kStagedTiles[] = {Fp8Tile::n128_staged, Fp8Tile::n128_staged_one_partial};
class GpuFp8GemmStaged : public testing::TestWithParam<Shape> {};
TEST_P(GpuFp8GemmStaged, MatchesTheReferenceTheCpuBackendAndTheCooperativeKernel) {
  CODA_REQUIRE_SM90();
  for (Fp8Tile tile : kStagedTiles) check_shape(GetParam(), {}, tile);
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuFp8GemmStaged, testing::ValuesIn(kShapes),
                         [](const testing::TestParamInfo<Shape>& info) {
                           return label(info.param);
                         });

// Its staged tile holds the rounded bf16 result: an f32 d, a d accumulated into and B scaled by
// rows are not_supported, and nothing is written.
TEST(GpuFp8GemmStaged, RefusesOtherForms) {
  CODA_REQUIRE_SM90();
  const Fp8GemmCase::Options kForms[] = {{Fp8BScaling::blocks, DType::f32, false},
                                         {Fp8BScaling::blocks, DType::bf16, true},
                                         {Fp8BScaling::rows, DType::bf16, false}};
  for (const Fp8GemmCase::Options& o : kForms) {
    Seeds seeds;
    Fp8GemmCase c(129, 264, 256, seeds, o);
    for (Fp8Tile tile : kStagedTiles) expect_refused(c, tile);
  }
}

// The other forms of the call on ragged shapes: B scaled by rows (the weight gradient's b), an
// fp32 d, and d accumulated into (the weight gradient over micro-batches), each with its kernel.
TEST(GpuFp8GemmForms, MatchTheReferenceAndTheCpuBackend) {
  CODA_REQUIRE_SM90();
  const Fp8GemmCase::Options kForms[] = {
      {Fp8BScaling::rows, DType::bf16, false},  {Fp8BScaling::rows, DType::f32, true},
      {Fp8BScaling::blocks, DType::f32, false}, {Fp8BScaling::blocks, DType::bf16, true},
      {Fp8BScaling::rows, DType::f32, false},
  };
  for (const Fp8GemmCase::Options& o : kForms)
    for (const Shape& s : {Shape{127, 264, 1024}, Shape{300, 136, 528}, Shape{1000, 1032, 2064}})
      check_shape(s, o);
}

// D inside a larger poisoned buffer (row stride N + 72, 9 rows past M), scales with padded row
// strides: the kernel writes exactly D's [M, N] and reads the scales by their strides (each
// tile: a 192-column one reads two rows of B scales).
void check_padded(Fp8Tile tile) {
  SCOPED_TRACE(std::string("tile ") + sm90::fp8_tile_name(tile));
  const Shape s{300, 264, 528};
  Seeds seeds;
  Fp8GemmCase cpu(s.m, s.n, s.k, seeds);
  gemm_fp8(cpu.args());

  const int64_t kbs = num_fp8_scale_blocks(s.k), nbs = num_fp8_scale_blocks(s.n);
  const int64_t d_pitch = s.n + 72, d_rows = s.m + 9, as_pitch = kbs + 13, bs_pitch = kbs + 3;
  std::vector<uint16_t> d_host(size_t(d_rows * d_pitch), 0x7fc0); // bf16 NaN
  std::vector<uint8_t> as_host(size_t(s.m * as_pitch), 0xff), bs_host(size_t(nbs * bs_pitch), 0xff);
  for (int64_t r = 0; r < s.m; ++r)
    std::memcpy(&as_host[size_t(r * as_pitch)], &cpu.qa.scales[size_t(r * kbs)], size_t(kbs));
  for (int64_t r = 0; r < nbs; ++r)
    std::memcpy(&bs_host[size_t(r * bs_pitch)], &cpu.qb.scales[size_t(r * kbs)], size_t(kbs));
  void *d = nullptr, *as = nullptr, *bs = nullptr;
  ASSERT_EQ(cudaMalloc(&d, d_host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&as, as_host.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bs, bs_host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, d_host.data(), d_host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(as, as_host.data(), as_host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bs, bs_host.data(), bs_host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  DeviceTensor a(cpu.a), b(cpu.b);
  Fp8GemmArgs args{.a = a.view(),
                   .a_scales = make_view(as, DType::e8m0, s.m, kbs, Device::cuda),
                   .b = b.view(),
                   .b_scales = make_view(bs, DType::e8m0, nbs, kbs, Device::cuda),
                   .d = make_view(d, DType::bf16, s.m, s.n, Device::cuda)};
  args.a_scales.stride[0] = as_pitch;
  args.b_scales.stride[0] = bs_pitch;
  args.d.stride[0] = d_pitch;
  run_gemm_fp8(args, tile);
  synchronize_ok();
  std::vector<uint16_t> out(d_host.size());
  ASSERT_EQ(cudaMemcpy(out.data(), d, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d), cudaFree(as), cudaFree(bs);

  HostTensor got(DType::bf16, {s.m, s.n});
  int touched = 0;
  for (int64_t r = 0; r < d_rows; ++r)
    for (int64_t c = 0; c < d_pitch; ++c) {
      const uint16_t bits = out[size_t(r * d_pitch + c)];
      if (r < s.m && c < s.n)
        std::memcpy(static_cast<uint16_t*>(got.host_view().data) + r * s.n + c, &bits, 2);
      else
        touched += bits != 0x7fc0;
    }
  EXPECT_EQ(touched, 0) << "elements outside D changed";
  expect_matches("d", got, cpu.d, cpu.exact(), cpu.unfused());
}

TEST(GpuFp8GemmPadded, WritesOnlyDAndReadsScalesByTheirStrides) {
  CODA_REQUIRE_SM90();
  for (Fp8Tile tile : {Fp8Tile::n128, Fp8Tile::n192, Fp8Tile::n192_one_partial}) check_padded(tile);
}

// A NaN scale (0xFF) makes exactly its row (A) or 128-column block (B; by rows, its column)
// NaN, as on the CPU. Block 2 (columns 256 .. 383) is the second block of the second 192-column
// tile (columns 192 .. 383, split at its column 64).
TEST(GpuFp8GemmNanScales, PoisonOnlyWhatTheyScale) {
  CODA_REQUIRE_SM90();
  const std::pair<Fp8BScaling, Fp8Tile> kRuns[] = {{Fp8BScaling::blocks, Fp8Tile::n128},
                                                   {Fp8BScaling::blocks, Fp8Tile::n192},
                                                   {Fp8BScaling::blocks, Fp8Tile::n192_one_partial},
                                                   {Fp8BScaling::rows, Fp8Tile::n128}};
  for (const auto& [scaling, tile] : kRuns) {
    const bool by_rows = scaling == Fp8BScaling::rows;
    SCOPED_TRACE(std::string(by_rows ? "b by rows" : "b by blocks") + ", tile " +
                 sm90::fp8_tile_name(tile));
    const Shape s{200, 392, 384};
    Seeds seeds;
    Fp8GemmCase c(s.m, s.n, s.k, seeds, {scaling, DType::bf16, false});
    const int64_t kbs = num_fp8_scale_blocks(s.k), b_row = by_rows ? 300 : 2;
    static_cast<uint8_t*>(c.a_scales.host_view().data)[131 * kbs + 1] = kE8m0NanBits;
    static_cast<uint8_t*>(c.b_scales.host_view().data)[b_row * kbs + 2] = kE8m0NanBits;
    Fp8GemmCase gpu = c;
    gemm_fp8(c.args());
    DeviceFp8 dev(gpu);
    run_gemm_fp8(dev.args(), tile);
    synchronize_ok();
    EXPECT_TRUE(dev.d.copy_back());
    const std::vector<double> want = c.d.values(), got = gpu.d.values();
    int nan_mismatch = 0;
    for (size_t i = 0; i < got.size(); ++i)
      nan_mismatch += std::isnan(got[i]) != std::isnan(want[i]);
    EXPECT_EQ(nan_mismatch, 0);
    EXPECT_TRUE(std::isnan(got[size_t(131 * s.n + 5)]) && std::isnan(got[size_t(7 * s.n + 300)]));
    if (by_rows) EXPECT_FALSE(std::isnan(got[size_t(7 * s.n + 301)])); // only its column
  }
}

// Small shapes (up to three tiles along M, N and a short K block) for compute-sanitizer.
TEST(GpuFp8GemmSmallForSanitizer, RaggedTiles) {
  CODA_REQUIRE_SM90();
  check_shape({1, 8, 16});
  check_shape({257, 264, 400});
  check_shape({1, 8, 16}, {Fp8BScaling::rows, DType::f32, true});
  check_shape({257, 264, 400}, {Fp8BScaling::rows, DType::f32, true});
}

// The same for the 128 x 192 tiles (two tiles along N, the second straddling blocks 1 and 2),
// the study kernel with one partial on one shape.
TEST(GpuFp8GemmSmallForSanitizer, Tile192RaggedTiles) {
  CODA_REQUIRE_SM90();
  check_shape({1, 8, 16}, {}, Fp8Tile::n192);
  check_shape({257, 264, 400}, {}, Fp8Tile::n192);
  check_shape({257, 264, 400}, {Fp8BScaling::blocks, DType::f32, true}, Fp8Tile::n192);
  check_shape({257, 264, 400}, {}, Fp8Tile::n192_one_partial);
}

// The staged 128 x 128 kernel (three tiles along N, two along M, the last ragged in both): its
// hand-over through the staged tile and the fourth warpgroup's stores under the sanitizers.
// The study kernel with one partial too.
TEST(GpuFp8GemmSmallForSanitizer, StagedRaggedTiles) {
  CODA_REQUIRE_SM90();
  for (Fp8Tile tile : kStagedTiles) {
    check_shape({1, 8, 16}, {}, tile);
    check_shape({257, 264, 400}, {}, tile);
  }
}

// Host side of the kernel (no GPU needed): the operands' tensor maps (the stored shapes, one
// 128-byte swizzle span of codes deep, boxes whose bytes are exactly what the producer arms each
// stage with: a mismatch hangs the kernel), and k-blocks that are the scale blocks the consumer
// indexes its scales by.
// ---- quantize_weight_fp8: the GPU's codes, scales and transposed copy are the CPU backend's, bit
// for bit (both are the format's conversion of the same values: cvt on the device, its host twin
// float_to_e4m3_bits on the CPU), which is the format's definition (Fp8WeightCase::check); no
// byte past an output is written; with and without the transposed copy; a NaN and an infinity
// each poison their block.

// One quantizer case (Fp8WeightCase or Fp8ActivationCase, its input `source`, the copies to write:
// Fp8Copies for a weight, with the transposed copy or not for an activation): the CPU backend's
// outputs are the format's definition; the GPU's, from poisoned outputs, are the CPU's bit for
// bit, no byte past an output is written, and a copy not asked for is not touched.
template <class Case, class Args, class Copies>
void check_quantizer(Case cpu, HostTensor Case::*source, Args (Case::*host_args)(Copies),
                     void (*quantize)(const Args&, Stream), Copies copies) {
  quantize((cpu.*host_args)(copies), nullptr); // host tensors: the CPU backend
  ASSERT_EQ(cpu.check(copies), "");
  Case gpu = cpu;
  for (HostTensor* t : {&gpu.codes, &gpu.scales, &gpu.codes_t, &gpu.scales_t}) t->poison();
  DeviceTensor in(gpu.*source), codes(gpu.codes), scales(gpu.scales), codes_t(gpu.codes_t),
      scales_t(gpu.scales_t);
  Args args{in.view()}; // the input (w or x) is either Args' first field
  if (has_rows(copies)) args.codes = codes.view(), args.scales = scales.view();
  if (has_transposed(copies)) args.codes_t = codes_t.view(), args.scales_t = scales_t.view();
  quantize(args, nullptr);
  synchronize_ok();
  for (DeviceTensor* t : {&codes, &scales, &codes_t, &scales_t})
    EXPECT_TRUE(t->copy_back()) << "a write past the end of an output";
  const auto same = [](HostTensor& a, HostTensor& b) {
    const size_t bytes = size_t(a.numel() * dtype_size(a.dtype()));
    return std::memcmp(a.host_view().data, b.host_view().data, bytes) == 0;
  };
  // A copy asked for is the CPU's bit for bit; one not asked for still holds its poison.
  const auto check_output = [&](bool written, HostTensor Case::*t, const char* name) {
    if (written) {
      EXPECT_TRUE(same(gpu.*t, cpu.*t)) << name;
      return;
    }
    for (double v : (gpu.*t).values()) ASSERT_TRUE(std::isnan(v)) << name << " written";
  };
  check_output(has_rows(copies), &Case::codes, "codes");
  check_output(has_rows(copies), &Case::scales, "scales");
  check_output(has_transposed(copies), &Case::codes_t, "codes_t");
  check_output(has_transposed(copies), &Case::scales_t, "scales_t");
}

void check_weight(int64_t n, int64_t k, DType dtype, Fp8Copies copies) {
  SCOPED_TRACE("N " + std::to_string(n) + " K " + std::to_string(k) + " " + dtype_name(dtype) +
               ", " + copies_name(copies));
  Seeds seeds;
  check_quantizer(
      Fp8WeightCase(n, k, dtype, /*non_finite=*/true, seeds, dtype == DType::f16 ? 10 : 20),
      &Fp8WeightCase::w, &Fp8WeightCase::args, &quantize_weight_fp8, copies);
}

TEST(GpuQuantizeWeightFp8, MatchesTheCpuBackendBitForBit) {
  CODA_REQUIRE_SM90();
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{16, 16}, {208, 304}, {1040, 2064}})
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      for (Fp8Copies copies : {Fp8Copies::both, Fp8Copies::rows, Fp8Copies::transposed})
        check_weight(n, k, dtype, copies);
}

// A tiny case for compute-sanitizer, each copy alone.
TEST(GpuFp8GemmSmallForSanitizer, QuantizeWeight) {
  CODA_REQUIRE_SM90();
  check_weight(144, 272, DType::bf16, Fp8Copies::both);
  check_weight(144, 272, DType::bf16, Fp8Copies::transposed);
}

// ---- quantize_activation_fp8: the GPU's codes and scales, and its transposed copy with blocks of
// its own, are the CPU backend's, bit for bit (which is the format's definition:
// Fp8ActivationCase::check); no byte past an output is written; with and without the transposed
// copy (then M may be ragged); an infinity and a NaN each poison their block of each copy.

void check_activation(int64_t m, int64_t k, DType dtype, bool transposed) {
  SCOPED_TRACE("M " + std::to_string(m) + " K " + std::to_string(k) + " " + dtype_name(dtype) +
               (transposed ? " with the transpose" : ""));
  Seeds seeds;
  check_quantizer(
      Fp8ActivationCase(m, k, dtype, /*non_finite=*/true, seeds, dtype == DType::f16 ? 4 : 20),
      &Fp8ActivationCase::x, &Fp8ActivationCase::args, &quantize_activation_fp8, transposed);
}

TEST(GpuQuantizeActivationFp8, MatchesTheCpuBackendBitForBit) {
  CODA_REQUIRE_SM90();
  // One tile, short tiles both ways, several tiles each way with short last ones.
  for (const auto& [m, k] : {std::pair<int64_t, int64_t>{16, 16}, {208, 304}, {1040, 2064}})
    for (DType dtype : {DType::bf16, DType::f16, DType::f32})
      for (bool transposed : {true, false}) check_activation(m, k, dtype, transposed);
  // Without the transposed copy M is arbitrary: a row past a tile's last 16-row group.
  for (DType dtype : {DType::bf16, DType::f32}) check_activation(131, 400, dtype, false);
}

// A tiny case for compute-sanitizer: two tiles of rows, the second short; two of columns.
TEST(GpuFp8GemmSmallForSanitizer, QuantizeActivation) {
  CODA_REQUIRE_SM90();
  check_activation(144, 272, DType::bf16, true);
}

template <class Kernel> void check_operand_boxes_and_k_blocks() {
  using Main = Kernel::Main;
  constexpr int64_t kTileN = Kernel::Main::kTileN;
  SCOPED_TRACE("tile N " + std::to_string(kTileN));
  for (const Shape& s : {Shape{1000, 776, 528}, Shape{1, 8, 16}, Shape{129, 392, 2048}}) {
    SCOPED_TRACE(label(s));
    const TensorView a = make_view(nullptr, DType::e4m3, s.m, s.k, Device::cuda);
    const TensorView b = make_view(nullptr, DType::e4m3, s.n, s.k, Device::cuda);
    const auto shapes = Kernel::operand_shapes(a, b, {s.m, s.n, s.k});
    EXPECT_EQ(shapes.a.rows, uint64_t(s.m));
    EXPECT_EQ(shapes.a.cols, uint64_t(s.k));
    EXPECT_EQ(shapes.b.rows, uint64_t(s.n));
    EXPECT_EQ(shapes.b.cols, uint64_t(s.k));
    EXPECT_EQ(shapes.a.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
    EXPECT_EQ(shapes.b.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
    EXPECT_EQ(sm90::tensor_map_dtype(shapes.a.dtype), CU_TENSOR_MAP_DATA_TYPE_UINT8);
    EXPECT_EQ(shapes.a.box_cols, uint32_t(kFp8ScaleBlock)); // 128 codes = 128 bytes
    EXPECT_EQ(shapes.b.box_cols, uint32_t(kFp8ScaleBlock));
    EXPECT_EQ(shapes.b.box_rows, uint32_t(kTileN / 2)); // each CTA of the pair multicasts half
    EXPECT_EQ(uint64_t(shapes.a.box_cols) * shapes.a.box_rows * Main::kBoxesA +
                  uint64_t(shapes.b.box_cols) * shapes.b.box_rows * Main::kBoxesB,
              uint64_t(Main::kStageBytes));
    const sm90::TileScheduler sched = Kernel::make_scheduler({s.m, s.n, s.k}, sm90::GemmPlan{});
    EXPECT_EQ(sched.k_blocks, num_fp8_scale_blocks(s.k));
    EXPECT_EQ(sched.tiles_n, ceil_div<int64_t>(s.n, kTileN));
  }
}

TEST(Fp8GemmHost, OperandBoxesFillTheStageAndKBlocksAreScaleBlocks) {
  check_operand_boxes_and_k_blocks<gpu::fp8::Kernel<Fp8BScaling::blocks, bf16, 128>>();
  check_operand_boxes_and_k_blocks<gpu::fp8::Kernel<Fp8BScaling::blocks, bf16, 192>>();
  check_operand_boxes_and_k_blocks<gpu::fp8::Kernel<Fp8BScaling::blocks, float, 192, false>>();
}

// The tile heuristic (no GPU needed): the cooperative 128 x 128 tile wherever the staged one
// does not apply (B by rows, an f32 D or one accumulated into); where it does, the staged tile
// unless the one-partial 128 x 192 tile saves waves enough to pay for its slower tiles
// (heuristic.hpp): at Llama-8B's shapes (the 8192-token GEMMs, 66 clusters of an H100), not at
// short K with the same waves, nor where the 192-column tiles leave a wave as long as the
// 128-column ones'.
TEST(Fp8GemmHost, TileHeuristic) {
  for (int64_t n : {8, 2048, 3072, 4096, 28672}) {
    EXPECT_EQ(sm90::choose_fp8_tile(8192, n, 4096, Fp8BScaling::blocks, false, 66), Fp8Tile::n128)
        << n;
    for (bool bf16_store : {false, true})
      EXPECT_EQ(sm90::choose_fp8_tile(8192, n, 4096, Fp8BScaling::rows, bf16_store, 66),
                Fp8Tile::n128)
          << n;
  }
  struct Shape {
    int64_t m, n, k;
    Fp8Tile tile;
  };
  for (const Shape& s : {Shape{8192, 28672, 4096, Fp8Tile::n192_one_partial}, // 8B gate/up
                         Shape{8192, 4096, 28672, Fp8Tile::n192_one_partial}, // its dgrad
                         Shape{6144, 4096, 8192, Fp8Tile::n192_one_partial},  // 8B qkv wgrad
                         Shape{8192, 2048, 8192, Fp8Tile::n128_staged}, // 1B down: 6 vs 8 waves
                         Shape{2048, 2048, 8192, Fp8Tile::n128_staged}, // 2 waves either way
                         Shape{8192, 8192, 2048, Fp8Tile::n128_staged}, // short K
                         Shape{128, 8, 128, Fp8Tile::n128_staged}})     // one tile
    EXPECT_EQ(sm90::choose_fp8_tile(s.m, s.n, s.k, Fp8BScaling::blocks, true, 66), s.tile)
        << s.m << " x " << s.n << " x " << s.k;
  // The cost a 192-column tile carries falls with K and stays within its fitted range.
  EXPECT_GT(sm90::fp8_tile_192_cost(2048), sm90::fp8_tile_192_cost(8192));
  EXPECT_DOUBLE_EQ(sm90::fp8_tile_192_cost(1), 1.50);
  EXPECT_DOUBLE_EQ(sm90::fp8_tile_192_cost(int64_t(1) << 20), 1.32);
}

} // namespace
} // namespace coda::test
