// Each epilogue op alone: its math against the straightforward formula in fp64 (several ops also
// instantiate their math in fp64 to check algebraic identities exactly), and its host lifecycle
// on a fragment, including partial (edge) tiles: what it writes, where, and what it leaves alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "coda/epilogue/ops/gated_pair.hpp"
#include "coda/epilogue/ops/geglu.hpp"
#include "coda/epilogue/ops/multiply_tile.hpp"
#include "coda/epilogue/ops/quantize_row_blocks.hpp"
#include "coda/epilogue/ops/reduce_over_m.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/rms_norm_backward.hpp"
#include "coda/epilogue/ops/rope.hpp"
#include "coda/epilogue/ops/scalar.hpp"
#include "coda/epilogue/ops/scale_per_col.hpp"
#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/ops/select_per_row.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "coda/epilogue/ops/swiglu.hpp"
#include "coda/epilogue/ops/swiglu_backward.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"

namespace {

using namespace coda;
using namespace coda::epilogue;
using coda::test::e4m3_block_exponent;
using coda::test::e4m3_nearest_code;

std::mt19937_64& rng() {
  static std::mt19937_64 engine(test::test_seed());
  return engine;
}
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng()); }

// A host tensor of one dtype, every element NaN until written.
struct Tensor {
  DType dtype;
  int64_t rows, cols;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<int32_t> i32;

  Tensor(DType type, int64_t r, int64_t c = 1) : dtype(type), rows(r), cols(c) {
    const size_t n = size_t(r * c);
    if (type == DType::f32) f32.assign(n, NAN);
    if (type == DType::i32) i32.assign(n, 0);
    if (type == DType::bf16) half.assign(n, float_to_bf16_bits(NAN));
    if (type == DType::f16) half.assign(n, float_to_f16_bits(NAN));
  }
  void* data() {
    return dtype == DType::f32   ? static_cast<void*>(f32.data())
           : dtype == DType::i32 ? static_cast<void*>(i32.data())
                                 : static_cast<void*>(half.data());
  }
  TensorView view() {
    return cols == 1 ? make_view(data(), dtype, rows) : make_view(data(), dtype, rows, cols);
  }
  TensorView view2d() { return make_view(data(), dtype, rows, cols); }
  float at(int64_t r, int64_t c = 0) { return load_float(view2d(), r, c); }
  void set(int64_t r, int64_t c, float x) { store_float(view2d(), r, c, x); }
  void fill_random(float lo = -1.f, float hi = 1.f) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set(r, c, uniform(lo, hi));
  }
};

// A tile of a larger output at (m0, n0), possibly partial, with random values.
struct TestTile {
  std::vector<float> values, aux;
  HostFragment frag;

  TestTile(TileCoord coord, int64_t ld) : values(size_t(coord.rows * ld)), aux(values.size(), NAN) {
    for (float& v : values) v = uniform(-2.f, 2.f);
    frag = {coord, values.data(), aux.data(), ld};
  }
  float& value(int64_t r, int64_t c) { return frag.value(r, c); }
};

// A partial edge tile: block (1, 2) of a 64 x 48 tiling, 37 rows x 30 columns valid.
TileCoord edge_tile() { return {1, 2, 64, 96, 37, 30}; }

template <class... Ops> void run_tile(const HostFragment& frag, Ops&... ops) {
  (ops.begin_tile(frag.tile), ...);
  (ops.visit(frag), ...);
  (ops.end_tile(frag.tile), ...);
}

double bf16_tolerance(double x) { return std::ldexp(std::fabs(x), -8) + 1e-30; }

TEST(EpilogueOps, ScalingByScalarRowAndColumn) {
  const TileCoord tile = edge_tile();
  Tensor dloss(DType::f32, 1);
  dloss.set(0, 0, 0.375f);
  Tensor row_factors(DType::f32, tile.m0 + tile.rows);
  row_factors.fill_random();
  Tensor gamma(DType::bf16, tile.n0 + tile.cols);
  gamma.fill_random();

  TestTile t(tile, 48);
  const std::vector<float> before = t.values;
  ScaleByScalar scalar({-1.5f, dloss.view()});
  ScalePerRow::Args row_args;
  row_args.factors = row_factors.view();
  ScalePerRow per_row(row_args);
  ScalePerCol per_col({gamma.view()});
  run_tile(t.frag, scalar, per_row, per_col);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c) {
      const double expect = double(before[size_t(r * 48 + c)]) * -1.5 * 0.375 *
                            row_factors.at(tile.m0 + r) * gamma.at(tile.n0 + c);
      EXPECT_NEAR(t.value(r, c), expect, 1e-6 * std::fabs(expect)) << r << "," << c;
    }
}

TEST(EpilogueOps, ScalePerRowFinishesRstdFromPartials) {
  TileCoord tile = edge_tile();
  tile.n_block = 0; // the first column block writes rstd
  const int64_t m = tile.m0 + tile.rows, width = 300;
  Tensor partials(DType::f32, m, 3);
  partials.fill_random(0.f, 100.f);
  Tensor rstd(DType::f32, m);
  ScalePerRow::Args args;
  args.sumsq_partials = partials.view();
  args.width = width;
  args.eps = 1e-5f;
  args.factors_out = rstd.view();
  ScalePerRow op(args);

  TestTile t(tile, 48);
  const std::vector<float> before = t.values;
  run_tile(t.frag, op);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const int64_t row = tile.m0 + r;
    double sum = 0;
    for (int b = 0; b < 3; ++b) sum += partials.at(row, b);
    const double expect = 1.0 / std::sqrt(sum / width + 1e-5);
    EXPECT_NEAR(rstd.at(row), expect, 1e-6 * expect);
    EXPECT_NEAR(t.value(r, 5), before[size_t(r * 48 + 5)] * expect, 1e-5 * expect);
  }
  EXPECT_TRUE(std::isnan(rstd.at(0))) << "rows outside the tile are not written";

  // Only the first column block writes rstd (once per row).
  Tensor rstd_again(DType::f32, m);
  args.factors_out = rstd_again.view();
  ScalePerRow second_block(args);
  TileCoord next = tile;
  next.n_block = 3;
  second_block.begin_tile(next);
  EXPECT_TRUE(std::isnan(rstd_again.at(tile.m0)));
}

TEST(EpilogueOps, ReductionsMatchTheirFormulasAndMerge) {
  std::vector<float> x(777);
  for (float& v : x) v = uniform(-30.f, 30.f);
  double sum = 0, sumsq = 0, max = -INFINITY;
  for (float v : x) sum += v, sumsq += double(v) * v, max = std::max(max, double(v));
  double sumexp = 0;
  for (float v : x) sumexp += std::exp(v - max);
  const double lse = max + std::log(sumexp);

  // Whole sequence, and two halves merged (the quad and partial-block paths).
  auto reduce = [&](auto reduction, size_t lo, size_t hi) {
    using R = decltype(reduction);
    auto s = R::identity();
    for (size_t i = lo; i < hi; ++i) R::add(s, x[i]);
    return s;
  };
  using Lse = LogSumExp<float>;
  // A sequential fp32 sum rounds each partial sum once: its error is at most 2^-24 times the sum
  // of the partials' magnitudes (about 1e-3 here, so a fixed 1e-3 was flaky).
  double sum_bound = 0, partial = 0;
  for (float v : x) partial += v, sum_bound += std::fabs(partial);
  sum_bound *= std::ldexp(1.0, -24);
  EXPECT_NEAR(Sum<float>::finish(reduce(Sum<float>{}, 0, x.size())), sum, sum_bound);
  EXPECT_NEAR(SumOfSquares<float>::finish(reduce(SumOfSquares<float>{}, 0, x.size())), sumsq,
              1e-5 * sumsq);
  EXPECT_NEAR(Lse::finish(reduce(Lse{}, 0, x.size())), lse, 1e-5 * std::fabs(lse));
  const auto merged = Lse::merge(reduce(Lse{}, 0, 300), reduce(Lse{}, 300, x.size()));
  EXPECT_NEAR(Lse::finish(merged), lse, 1e-5 * std::fabs(lse));
  const auto from_partials = Lse::merge(Lse::from_finished(Lse::finish(reduce(Lse{}, 0, 500))),
                                        Lse::from_finished(Lse::finish(reduce(Lse{}, 500, 777))));
  EXPECT_NEAR(Lse::finish(from_partials), lse, 1e-5 * std::fabs(lse));
  EXPECT_NEAR(Sum<float>::merge(reduce(Sum<float>{}, 0, 100), reduce(Sum<float>{}, 100, 777)), sum,
              2 * sum_bound); // two sequential sums and their merge

  // The empty state is the identity of merge and finishes to -inf; huge logits do not overflow.
  EXPECT_EQ(Lse::finish(Lse::merge(Lse::identity(), merged)), Lse::finish(merged));
  EXPECT_EQ(Lse::finish(Lse::identity()), -INFINITY);
  auto big = Lse::identity();
  Lse::add(big, 1e4f);
  Lse::add(big, 1e4f);
  EXPECT_NEAR(Lse::finish(big), 1e4 + std::log(2.0), 1e-3);
  auto with_nan = merged;
  Lse::add(with_nan, NAN);
  EXPECT_TRUE(std::isnan(Lse::finish(with_nan)));

  // The same math in fp64 is accurate to fp64.
  using Lse64 = LogSumExp<double>;
  auto s64 = Lse64::identity();
  for (float v : x) Lse64::add(s64, double(v));
  EXPECT_NEAR(Lse64::finish(s64), lse, 1e-12 * std::fabs(lse));
}

TEST(EpilogueOps, ReduceOverNWritesOnePartialPerRowAtItsBlock) {
  const TileCoord tile = edge_tile();
  const int64_t m = tile.m0 + tile.rows, blocks = 4;
  Tensor sums(DType::f32, m, blocks), lses(DType::f32, m, blocks);
  ReduceOverN<SumOfSquares> sumsq({sums.view2d(), Plane::value, 0.5f});
  ReduceOverN<LogSumExp> lse({lses.view2d()});
  TestTile t(tile, 48);
  run_tile(t.frag, sumsq, lse);
  for (int64_t r = 0; r < tile.rows; ++r) {
    double ss = 0, se = 0;
    for (int64_t c = 0; c < tile.cols; ++c) ss += double(t.value(r, c)) * t.value(r, c);
    for (int64_t c = 0; c < tile.cols; ++c) se += std::exp(double(t.value(r, c)));
    EXPECT_NEAR(sums.at(tile.m0 + r, tile.n_block), 0.5 * ss, 1e-5 * ss);
    EXPECT_NEAR(lses.at(tile.m0 + r, tile.n_block), std::log(se), 1e-5);
    for (int64_t b = 0; b < blocks; ++b)
      if (b != tile.n_block) {
        EXPECT_TRUE(std::isnan(sums.at(tile.m0 + r, b)));
      }
  }
  EXPECT_TRUE(std::isnan(sums.at(tile.m0 - 1, tile.n_block)));
}

// Rows of a 2-block tile (columns 256..511 of N = 456: one whole block, one short one at the
// row's end): each block's scale byte and codes against the search over the format, magnitudes
// changing from block to block (2^-40 .. 2^40), one block poisoned by a NaN and one by an
// infinity; and nothing written outside the tile's rows and blocks.
TEST(EpilogueOps, QuantizeRowBlocksScalesEachRowBlockAndCastsToE4m3) {
  constexpr int64_t kN = 456, kBlocks = 4;
  const TileCoord tile{1, 1, 5, 256, 3, kN - 256}; // rows 5..7, columns 256..455
  std::vector<uint8_t> codes(size_t(9 * kN), 0x55), scales(size_t(9 * kBlocks), 0x55);
  const TensorView codes_view = make_view(codes.data(), DType::e4m3, 9, kN);
  const TensorView scales_view = make_view(scales.data(), DType::e8m0, 9, kBlocks);
  TestTile t(tile, 256);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c)
      t.value(r, c) = std::ldexp(uniform(-1.f, 1.f), int(r * 23 + c / 128 * 17) - 40);
  t.value(1, 7) = NAN;         // row 6, first block
  t.value(2, 130) = -INFINITY; // row 7, second block
  t.value(0, 3) = 0.f, t.value(0, 4) = -0.f;
  const std::vector<float> values = t.values;
  QuantizeRowBlocks quantize({codes_view, scales_view});
  run_tile(t.frag, quantize);

  for (int64_t m = 0; m < 9; ++m)
    for (int64_t b = 0; b < kBlocks; ++b) {
      const bool in_tile = m >= tile.m0 && m < tile.m0 + tile.rows && b >= 2;
      const uint8_t scale = scales[size_t(m * kBlocks + b)];
      if (!in_tile) {
        EXPECT_EQ(scale, 0x55) << "scale written outside the tile: row " << m << " block " << b;
        for (int64_t n = b * 128; n < std::min<int64_t>(kN, (b + 1) * 128); ++n)
          EXPECT_EQ(codes[size_t(m * kN + n)], 0x55) << "code outside the tile: " << m << "," << n;
        continue;
      }
      const int64_t r = m - tile.m0, c0 = (b - 2) * 128,
                    c1 = std::min<int64_t>(c0 + 128, tile.cols);
      std::vector<float> block;
      for (int64_t c = c0; c < c1; ++c) block.push_back(values[size_t(r * 256 + c)]);
      const int k = e4m3_block_exponent(block.data(), int64_t(block.size()));
      if (k == kNoScale) {
        EXPECT_EQ(scale, 0xFF) << "row " << m << " block " << b;
      } else {
        EXPECT_EQ(scale, uint8_t(k + 127)) << "row " << m << " block " << b;
      }
      for (int64_t c = c0; c < c1; ++c) {
        const uint8_t got = codes[size_t(m * kN + tile.n0 + c)];
        const int want =
            k == kNoScale
                ? 0x7F
                : e4m3_nearest_code(float(std::ldexp(double(values[size_t(r * 256 + c)]), -k)));
        EXPECT_EQ(int(got), want) << "row " << m << " column " << tile.n0 + c;
        if (k != kNoScale) {
          EXPECT_NE(got & 0x7F, 0x7F) << "no NaN code in a finite block";
        }
      }
    }
  // Zero in a block with nonzero values stays a (signed) zero code.
  EXPECT_EQ(codes[size_t(5 * kN + 256 + 3)], 0x00);
  EXPECT_EQ(codes[size_t(5 * kN + 256 + 4)], 0x80);
}

// A block cut by a tile boundary would be scaled by a partial amax: refused.
TEST(EpilogueOps, QuantizeRowBlocksRefusesTilesThatCutABlock) {
  std::vector<uint8_t> codes(size_t(4 * 512)), scales(size_t(4 * 4));
  QuantizeRowBlocks quantize(
      {make_view(codes.data(), DType::e4m3, 4, 512), make_view(scales.data(), DType::e8m0, 4, 4)});
  TestTile offset({0, 1, 0, 192, 4, 192}, 192); // starts mid-block
  EXPECT_THROW(quantize.visit(offset.frag), Error);
  TestTile narrow({0, 0, 0, 0, 4, 192}, 192); // its second block is cut at 192 < N
  EXPECT_THROW(quantize.visit(narrow.frag), Error);
  const std::vector<uint8_t> untouched = codes;
  TestTile whole({0, 0, 0, 0, 4, 256}, 256);
  EXPECT_NO_THROW(quantize.visit(whole.frag));
  EXPECT_NE(codes, untouched);
}

// A tile of rows 128..327 (one whole 128-row block, one short one at M's end) and 40 columns:
// each column block's scale byte and the transposed codes against the format's definition,
// magnitudes changing by column and block, a NaN and an infinity each poisoning one column block;
// nothing written outside the tile's columns and blocks.
TEST(EpilogueOps, QuantizeTransposedScalesEachColumnBlockAndTransposes) {
  constexpr int64_t kM = 328, kN = 112, kBlocks = 3;
  const TileCoord tile{1, 1, 128, 64, 200, 40}; // rows 128..327, columns 64..103
  std::vector<uint8_t> codes_t(size_t(kN * kM), 0x55), scales_t(size_t(kN * kBlocks), 0x55);
  TestTile t(tile, 40);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c)
      t.value(r, c) = std::ldexp(uniform(-1.f, 1.f), int(c * 3 + r / 128 * 29) - 50);
  t.value(5, 7) = NAN;         // column 71, first block
  t.value(150, 30) = INFINITY; // column 94, second block
  t.value(0, 0) = -0.f;
  const std::vector<float> values = t.values;
  QuantizeTransposed quantize({make_view(codes_t.data(), DType::e4m3, kN, kM),
                               make_view(scales_t.data(), DType::e8m0, kN, kBlocks)});
  run_tile(t.frag, quantize);

  for (int64_t n = 0; n < kN; ++n)
    for (int64_t b = 0; b < kBlocks; ++b) {
      const bool in_tile = n >= tile.n0 && n < tile.n0 + tile.cols && b >= 1;
      const uint8_t scale = scales_t[size_t(n * kBlocks + b)];
      if (!in_tile) {
        EXPECT_EQ(scale, 0x55) << "scale written outside the tile: column " << n << " block " << b;
        for (int64_t m = b * 128; m < std::min<int64_t>(kM, (b + 1) * 128); ++m)
          EXPECT_EQ(codes_t[size_t(n * kM + m)], 0x55) << "outside the tile: " << n << "," << m;
        continue;
      }
      const int64_t c = n - tile.n0, r0 = (b - 1) * 128,
                    r1 = std::min<int64_t>(r0 + 128, tile.rows);
      std::vector<float> block;
      for (int64_t r = r0; r < r1; ++r) block.push_back(values[size_t(r * 40 + c)]);
      const int k = e4m3_block_exponent(block.data(), int64_t(block.size()));
      EXPECT_EQ(scale, k == kNoScale ? 0xFF : k + 127) << "column " << n << " block " << b;
      for (int64_t r = r0; r < r1; ++r) {
        const int want =
            k == kNoScale
                ? 0x7F
                : e4m3_nearest_code(float(std::ldexp(double(values[size_t(r * 40 + c)]), -k)));
        EXPECT_EQ(int(codes_t[size_t(n * kM + tile.m0 + r)]), want)
            << "column " << n << " row " << tile.m0 + r;
      }
    }
  EXPECT_EQ(codes_t[size_t(64 * kM + 128)], 0x80); // -0 stays a signed zero
}

TEST(EpilogueOps, QuantizeTransposedRefusesTilesThatCutABlock) {
  std::vector<uint8_t> codes_t(size_t(8 * 512)), scales_t(size_t(8 * 4));
  QuantizeTransposed quantize({make_view(codes_t.data(), DType::e4m3, 8, 512),
                               make_view(scales_t.data(), DType::e8m0, 8, 4)});
  TestTile offset({1, 0, 64, 0, 64, 8}, 8); // starts mid-block
  EXPECT_THROW(quantize.visit(offset.frag), Error);
  TestTile short_rows({0, 0, 0, 0, 100, 8}, 8); // a block cut at row 100 < M
  EXPECT_THROW(quantize.visit(short_rows.frag), Error);
  for (uint8_t b : codes_t) ASSERT_EQ(b, 0);
  TestTile whole({0, 0, 0, 0, 128, 8}, 8);
  EXPECT_NO_THROW(quantize.visit(whole.frag));
}

TEST(EpilogueOps, ReduceOverMWritesOnePartialPerColumnAtItsBlock) {
  const TileCoord tile = edge_tile();
  const int64_t n = tile.n0 + tile.cols, blocks = 2;
  Tensor partials(DType::f32, n, blocks);
  TestTile t(tile, 48);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c) t.frag.aux(r, c) = uniform(-1.f, 1.f);
  ReduceOverM<Sum> op({partials.view2d(), Plane::aux});
  run_tile(t.frag, op);
  for (int64_t c = 0; c < tile.cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < tile.rows; ++r) sum += t.frag.aux(r, c);
    EXPECT_NEAR(partials.at(tile.n0 + c, tile.m_block), sum, 1e-5);
    EXPECT_TRUE(std::isnan(partials.at(tile.n0 + c, 0)));
  }
}

// The angle in fp64 from the same fp32 inputs; positions up to 2^24 are exact in float.
void expect_accurate_rotation(int32_t position, float inv_freq) {
  const double theta = double(position) * double(inv_freq);
  const RopeRotation rot = rope_rotation(position, inv_freq);
  EXPECT_NEAR(rot.cos, std::cos(theta), 2e-6)
      << "position " << position << " inv_freq " << inv_freq;
  EXPECT_NEAR(rot.sin, std::sin(theta), 2e-6)
      << "position " << position << " inv_freq " << inv_freq;
}

TEST(EpilogueOps, RopeAngleIsAccurateAtLargePositions) {
  for (int i = 0; i < 64; ++i) {
    const float inv_freq = float(std::pow(500000.0, -double(i) / 64)); // a Llama-3 base table
    for (int32_t position : {0, 1, 7, 4095, 131071, 100000, 999983, 8388607, 16777215})
      expect_accurate_rotation(position, inv_freq);
  }
  for (int i = 0; i < 2000; ++i)
    expect_accurate_rotation(int32_t(uniform(0.f, 1.6e7f)), uniform(0.f, 1.f));
}

TEST(EpilogueOps, RopeRotationIsHuggingFaceRotateHalfAndInverts) {
  const int64_t head_dim = 16, half = 8, m = 70;
  const int64_t q_heads = 2, kv_heads = 1, n = (q_heads + 2 * kv_heads) * head_dim;
  Tensor positions(DType::i32, m);
  for (int64_t r = 0; r < m; ++r) positions.i32[size_t(r)] = int32_t(uniform(0.f, 200000.f));
  Tensor inv_freq(DType::f32, half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq.set(i, 0, float(std::pow(10000.0, -2.0 * i / head_dim)));

  // Two heads per tile; the second tile holds the last K head and the V head.
  for (bool inverse : {false, true}) {
    const TileCoord tile{1, 1, 64, 32, m - 64, n - 32};
    Rope::Args args{positions.view(), inv_freq.view(), head_dim, (q_heads + kv_heads) * head_dim,
                    inverse};
    Rope op(args);
    TestTile t(tile, 32);
    const std::vector<float> before = t.values;
    run_tile(t.frag, op);
    for (int64_t r = 0; r < tile.rows; ++r) {
      const double pos = positions.i32[size_t(tile.m0 + r)];
      for (int64_t c = 0; c < tile.cols; ++c) {
        const int64_t i = c % head_dim;
        const bool rotated = tile.n0 + c < (q_heads + kv_heads) * head_dim;
        const double x = before[size_t(r * 32 + c)];
        double expect = x;
        if (rotated) {
          const double theta = (inverse ? -1 : 1) * pos * double(inv_freq.at(i % half));
          const double partner = before[size_t(r * 32 + (i < half ? c + half : c - half))];
          expect = i < half ? x * std::cos(theta) - partner * std::sin(theta)
                            : x * std::cos(theta) + partner * std::sin(theta);
        }
        EXPECT_NEAR(t.value(r, c), expect, 1e-5) << "row " << r << " col " << c;
      }
    }
  }

  // The inverse undoes the rotation (fp64 instantiation: exactly up to fp64 rounding).
  double a = 0.3, b = -1.7;
  rope_rotate(a, b, std::cos(2.0), std::sin(2.0));
  rope_rotate_inverse(a, b, std::cos(2.0), std::sin(2.0));
  EXPECT_NEAR(a, 0.3, 1e-15);
  EXPECT_NEAR(b, -1.7, 1e-15);
}

double silu_double(double g) { return g / (1 + std::exp(-g)); }

// GatedPairStore<Gate> on an edge tile: the fragment is left as it is, act[m, j] =
// activation(gate) * up within bf16 rounding, and nothing is written left of the tile's columns.
template <class Gate> void check_gated_pair_store(double (*activation)(double)) {
  const TileCoord tile = edge_tile(); // 30 columns: 15 pairs
  Tensor act(DType::bf16, tile.m0 + tile.rows, (tile.n0 + tile.cols) / 2);
  GatedPairStore<Gate> op({act.view2d()});
  TestTile t(tile, 48);
  const std::vector<float> before = t.values;
  run_tile(t.frag, op);
  EXPECT_EQ(t.values, before) << "the fragment is left as it is";
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t j = 0; j < tile.cols / 2; ++j) {
      const double expect = activation(t.value(r, 2 * j)) * t.value(r, 2 * j + 1);
      EXPECT_NEAR(act.at(tile.m0 + r, tile.n0 / 2 + j), expect, bf16_tolerance(expect) + 1e-6);
    }
  EXPECT_TRUE(std::isnan(act.at(tile.m0, tile.n0 / 2 - 1)));
}

TEST(EpilogueOps, SwigluGatedPairIsSiluTimesUpAndHalvesTheWidth) {
  for (float g : {-100.f, -20.f, -1.f, 0.f, 0.5f, 3.f, 20.f, 100.f}) {
    const float u = uniform(-2.f, 2.f);
    const double expect = silu_double(g) * u;
    EXPECT_NEAR(swiglu(g, u), expect, 1e-6 * std::fabs(expect) + 1e-30) << g;
    EXPECT_TRUE(std::isfinite(swiglu(g, u)));
  }
  check_gated_pair_store<SwigluGate>(silu_double);
}

// gelu(x) = x Φ(x), with Φ the standard normal CDF from erfc (not the erf the op calls).
double gelu_double(double g) { return g * 0.5 * std::erfc(-g / std::sqrt(2.0)); }

TEST(EpilogueOps, GegluGatedPairIsGeluTimesUpAndHalvesTheWidth) {
  // Known values of GELU: 0 at 0, x for large x, 0 (from below) for very negative x, and
  // gelu(1) = Φ(1) = 0.8413447460685429.
  EXPECT_EQ(gelu(0.f), 0.f);
  EXPECT_NEAR(gelu(1.0), 0.8413447460685429, 1e-15);
  EXPECT_EQ(gelu(30.f), 30.f);
  EXPECT_LE(gelu(-30.f), 0.f);
  EXPECT_GT(gelu(-30.f), -1e-30f);
  // The erf form cancels for negative gates (1 + erf(g / sqrt 2) -> 0), as PyTorch's does, so
  // its error is a few ulp of erf times |g u| rather than relative to the result.
  for (float g : {-100.f, -20.f, -3.f, -1.f, -0.25f, 0.5f, 3.f, 20.f, 100.f}) {
    const float u = uniform(-2.f, 2.f);
    const double expect = gelu_double(g) * u, gu = std::fabs(double(g) * u);
    EXPECT_NEAR(geglu(g, u), expect, 2e-7 * gu + 1e-6 * std::fabs(expect)) << g;
    EXPECT_NEAR(GegluGate{}(double(g), double(u)), expect, 1e-15 * gu) << g;
  }
  check_gated_pair_store<GegluGate>(gelu_double);
}

TEST(EpilogueOps, SwigluBackwardMatchesDerivativesAndZetaTerm) {
  for (int i = 0; i < 200; ++i) {
    const double g = uniform(-8.f, 8.f), u = uniform(-2.f, 2.f), dy = uniform(-1.f, 1.f);
    const auto grad = swiglu_backward(g, u, dy); // fp64 instantiation
    const double h = 1e-6;
    const double dg = dy * (silu_double(g + h) - silu_double(g - h)) * u / (2 * h);
    EXPECT_NEAR(grad.dgate, dg, 1e-7);
    EXPECT_NEAR(grad.dup, dy * silu_double(g), 1e-12);
    EXPECT_NEAR(grad.act, silu_double(g) * u, 1e-12);
    EXPECT_NEAR(grad.zeta_term, g * grad.dgate + u * grad.dup, 1e-12);
    // fp32: the recomputed act equals the forward's bit for bit.
    const auto grad32 = swiglu_backward(float(g), float(u), float(dy));
    EXPECT_EQ(grad32.act, swiglu(float(g), float(u)));
    EXPECT_NEAR(grad32.dgate, grad.dgate, 1e-5);
  }

  const TileCoord tile = edge_tile();
  const int64_t m = tile.m0 + tile.rows, f = tile.n0 + tile.cols;
  Tensor preact(DType::bf16, m, 2 * f), dpreact(DType::bf16, m, 2 * f);
  preact.fill_random(-4.f, 4.f);
  SwigluBackward op({preact.view2d(), dpreact.view2d()});
  TestTile t(tile, 48);
  const std::vector<float> dy = t.values;
  run_tile(t.frag, op);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c) {
      const int64_t row = tile.m0 + r, j = tile.n0 + c;
      const double g = preact.at(row, 2 * j), u = preact.at(row, 2 * j + 1);
      const auto expect = swiglu_backward(g, u, double(dy[size_t(r * 48 + c)]));
      EXPECT_NEAR(dpreact.at(row, 2 * j), expect.dgate, bf16_tolerance(expect.dgate) + 1e-6);
      EXPECT_NEAR(dpreact.at(row, 2 * j + 1), expect.dup, bf16_tolerance(expect.dup) + 1e-6);
      EXPECT_NEAR(t.value(r, c), expect.act, 1e-5);
      EXPECT_NEAR(t.frag.aux(r, c), expect.zeta_term, 1e-4);
    }
}

TEST(EpilogueOps, ResidualAddAccumulateStoreAndMultiplyTile) {
  const TileCoord tile = edge_tile();
  const int64_t m = tile.m0 + tile.rows, n = tile.n0 + tile.cols;
  Tensor residual(DType::bf16, m, n), existing(DType::f16, m, n), other(DType::bf16, m, n);
  residual.fill_random();
  existing.fill_random();
  other.fill_random();
  Tensor existing_before = existing;
  ResidualAdd add({residual.view2d(), 0.5f});
  ResidualAdd acc({existing.view2d(), 1.f}); // accumulating into the output (K6's dx)
  MultiplyTile product({other.view2d()});
  TileStore store({existing.view2d()});
  TestTile t(tile, 48);
  const std::vector<float> before = t.values;
  run_tile(t.frag, add, acc, product, store);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c) {
      const int64_t row = tile.m0 + r, col = tile.n0 + c;
      const double value = double(before[size_t(r * 48 + c)]) + 0.5 * residual.at(row, col) +
                           existing_before.at(row, col);
      EXPECT_NEAR(t.value(r, c), value, 1e-6);
      EXPECT_NEAR(t.frag.aux(r, c), value * other.at(row, col), 1e-5);
      EXPECT_EQ(existing.at(row, col), f16::from(t.value(r, c)).to_float()) << "one rounding";
    }
  EXPECT_EQ(existing.half[0], existing_before.half[0]) << "outside the tile nothing is written";
}

TEST(EpilogueOps, SelectPerRowPicksTheTargetColumnOnce) {
  const TileCoord tile = edge_tile(); // columns [96, 126) of an N = 130 output
  const int64_t m = tile.m0 + tile.rows, n = 130;
  Tensor index(DType::i32, m), out(DType::f32, m);
  for (int64_t r = 0; r < m; ++r) {
    const int kind = int(r % 4);
    index.i32[size_t(r)] = kind == 0   ? int32_t(tile.n0 + r % tile.cols) // in this tile
                           : kind == 1 ? 3                                // in another tile
                           : kind == 2 ? -100                             // ignored
                                       : int32_t(n);                      // out of range
  }
  SelectPerRow op({index.view(), n, out.view()});
  TestTile t(tile, 48);
  run_tile(t.frag, op);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const int64_t row = tile.m0 + r;
    if (row % 4 == 0)
      EXPECT_EQ(out.at(row), t.value(r, index.i32[size_t(row)] - tile.n0));
    else
      EXPECT_TRUE(std::isnan(out.at(row))) << "not this tile's to write (n_block != 0)";
  }
  TileCoord first = tile;
  first.n_block = 0;
  first.n0 = 0;
  SelectPerRow first_block({index.view(), n, out.view()});
  TestTile t0(first, 48);
  run_tile(t0.frag, first_block);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const int64_t row = tile.m0 + r;
    if (row % 4 == 1) {
      EXPECT_EQ(out.at(row), t0.value(r, 3));
    } else if (row % 4 >= 2) {
      EXPECT_EQ(out.at(row), 0.f) << "no target column: 0";
    }
  }
}

TEST(EpilogueOps, RmsNormBackwardEqualsTheTextbookGradient) {
  // fp64 instantiation: with zeta = (1/N) sum_n g gamma x rstd, the reparameterized form equals
  // dx = rstd gamma g - x rstd^3 / N sum_n g gamma x exactly (to fp64 rounding).
  const int n = 40;
  std::vector<double> x(n), g(n), gamma(n);
  for (int i = 0; i < n; ++i)
    x[i] = uniform(-2, 2), g[i] = uniform(-1, 1), gamma[i] = uniform(0.5f, 1.5f);
  double sumsq = 0, dot = 0;
  for (int i = 0; i < n; ++i) sumsq += x[i] * x[i], dot += g[i] * gamma[i] * x[i];
  const double eps = 1e-6, rstd = 1 / std::sqrt(sumsq / n + eps), zeta = dot * rstd / n;
  for (int i = 0; i < n; ++i) {
    const auto grad = rms_norm_backward(g[i], x[i], rstd, zeta, gamma[i]);
    const double textbook = rstd * gamma[i] * g[i] - x[i] * rstd * rstd * rstd / n * dot;
    EXPECT_NEAR(grad.dx, textbook, 1e-13);
    EXPECT_NEAR(grad.h_hat, x[i] * rstd * gamma[i], 1e-13);
    EXPECT_NEAR(grad.dgamma_term, g[i] * x[i] * rstd, 1e-13);
  }

  // The op: dx in the value plane, g xh in aux, h_hat written rounded.
  const TileCoord tile = edge_tile();
  const int64_t m = tile.m0 + tile.rows, cols = tile.n0 + tile.cols;
  Tensor xs(DType::bf16, m, cols), rstds(DType::f32, m), zetas(DType::f32, m),
      gammas(DType::bf16, cols), h_hat(DType::bf16, m, cols);
  xs.fill_random(-2, 2);
  rstds.fill_random(0.5, 2);
  zetas.fill_random();
  gammas.fill_random(0.5, 1.5);
  RmsNormBackward op({xs.view2d(), rstds.view(), zetas.view(), gammas.view(), h_hat.view2d()});
  TestTile t(tile, 48);
  const std::vector<float> before = t.values;
  run_tile(t.frag, op);
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c) {
      const int64_t row = tile.m0 + r, col = tile.n0 + c;
      const double gg = before[size_t(r * 48 + c)], xh = double(xs.at(row, col)) * rstds.at(row);
      const double dx = rstds.at(row) * (gg * gammas.at(col) - xh * zetas.at(row));
      EXPECT_NEAR(t.value(r, c), dx, 1e-5);
      EXPECT_NEAR(t.frag.aux(r, c), gg * xh, 1e-5);
      EXPECT_NEAR(h_hat.at(row, col), xh * gammas.at(col),
                  bf16_tolerance(xh * gammas.at(col)) + 1e-6);
    }
}

} // namespace
