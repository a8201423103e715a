// The block-scaled FP8 GEMM through the public API on host tensors (the CPU backend): against
// the fp64 GEMM of the dequantized operands by the tolerance rule (tests/common/check.hpp, the
// baseline being the dequantized operands multiplied in fp32 and rounded to bf16), on ragged
// shapes; its order of accumulation (Fp8GemmArgs); NaN scales; and bad arguments, rejected
// before any byte of memory changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"

namespace coda::test {
namespace {

struct Shape {
  int64_t m, n, k;
};

// Ragged M and N against 128-row tiles and 128 x 128 weight blocks; K from one short block (16)
// to several with a short last one (528 = 4 x 128 + 16).
const Shape kShapes[] = {{1, 8, 16}, {127, 264, 1024}, {300, 136, 528}, {129, 392, 128}};

// The call's variants: B scaled by blocks (forward, input gradient) or by rows (weight gradient),
// d bf16 or f32, overwritten or accumulated into.
const Fp8GemmCase::Options kVariants[] = {
    {Fp8BScaling::blocks, DType::bf16, false}, {Fp8BScaling::rows, DType::bf16, false},
    {Fp8BScaling::rows, DType::f32, true},     {Fp8BScaling::blocks, DType::f32, false},
    {Fp8BScaling::blocks, DType::bf16, true},
};
std::string label(const Fp8GemmCase::Options& o) {
  return std::string(o.b_scaling == Fp8BScaling::rows ? "b by rows" : "b by blocks") + ", d " +
         dtype_name(o.d) + (o.accumulate ? ", accumulating" : "");
}

// An f32 d against the fp64 product. No rounding to a 16-bit type hides the summation there, and
// the unfused fp32 path sums as accurately as the documented order does, so the 2x rule between
// two equally accurate fp32 sums would hold only by chance (seed 88 of a 300-seed sweep used
// 0.895 of it). The bound is the order's own instead: each of its fp32 roundings (a block's
// sum, each block's promotion, the addition of d's old value) errs by at most 2^-24 of what it
// rounds, which is at most the element's sum of |A B| over K plus |d's old value|.
void expect_within_the_orders_bound(const Fp8GemmCase& c) {
  const std::vector<double> got = c.d.values(), exact = c.exact(), magnitude = c.magnitude();
  const double roundings = double(2 * num_fp8_scale_blocks(c.k) + 1);
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double old = c.d_before.empty() ? 0.0 : std::fabs(c.d_before[i]);
    const double bound = roundings * std::ldexp(magnitude[i] + old, -24);
    if (!(std::fabs(got[i] - exact[i]) <= bound) && ++bad <= 5)
      ADD_FAILURE() << "d[" << i << "] = " << got[i] << ", fp64 " << exact[i] << ", bound " << bound
                    << " (seed " << test_seed() << ")";
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp8Gemm, MatchesTheFp64ReferenceOnRaggedShapes) {
  for (const Fp8GemmCase::Options& o : kVariants)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(o) + ": M " + std::to_string(s.m) + " N " + std::to_string(s.n) + " K " +
                   std::to_string(s.k));
      Seeds seeds;
      Fp8GemmCase c(s.m, s.n, s.k, seeds, o);
      gemm_fp8(c.args());
      if (o.d == DType::f32)
        expect_within_the_orders_bound(c);
      else
        CODA_EXPECT_PASSES(check_output("d", c.d, c.exact(), c.unfused()));
      EXPECT_TRUE(c.d.guard_intact());
    }
}

// The documented order, restated: per element, each 128-deep block's exact sum of code products
// rounded to fp32, promoted into an fp32 accumulator with one fused multiply-add by the product
// of the two scales (B's by block or by row), block after block; with accumulate, d's old value
// added in fp32; D is that sum rounded to its dtype. Bit for bit: the GPU kernel scales and adds
// with these operations (only its block sums are the tensor cores').
// The operands make the order visible through the rounding: block 2 cancels block 0 (the same A
// codes against negated B codes) and both are scaled 2^30 above block 1, so an fp32 sum in K
// order loses block 1 where an fp64 or reordered sum keeps it.
void check_order(const Fp8GemmCase::Options& o) {
  SCOPED_TRACE(label(o));
  constexpr int64_t M = 37, N = 264, K = 400; // 3 full blocks and one of 16
  const bool by_rows = o.b_scaling == Fp8BScaling::rows;
  const int64_t kbs = num_fp8_scale_blocks(K), b_scale_rows = by_rows ? N : num_fp8_scale_blocks(N);
  Seeds seeds;
  const std::vector<double> x = random_doubles(size_t((M + N) * K), seeds.next(), -2, 2);
  std::vector<uint8_t> a(size_t(M * K)), b(size_t(N * K));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float_to_e4m3_bits(float(x[i]));
  for (size_t i = 0; i < b.size(); ++i) b[i] = float_to_e4m3_bits(float(x[a.size() + i]));
  for (int64_t k = 256; k < 384; ++k) {
    for (int64_t m = 0; m < M; ++m) a[size_t(m * K + k)] = a[size_t(m * K + k - 256)];
    for (int64_t n = 0; n < N; ++n) b[size_t(n * K + k)] = b[size_t(n * K + k - 256)] ^ 0x80;
  }
  // B's scales change from scale row to scale row (by rows: from column to column of D), so a
  // scale read from the wrong row moves the result by a power of two.
  const int a_exponent[] = {30, 0, 30, -3}, b_exponent[] = {0, 1, -1};
  std::vector<uint8_t> sa(size_t(M * kbs)), sb(size_t(b_scale_rows * kbs));
  for (int64_t kb = 0; kb < kbs; ++kb) {
    for (int64_t m = 0; m < M; ++m)
      sa[size_t(m * kbs + kb)] = e8m0_bits_of_exponent(a_exponent[kb]);
    for (int64_t r = 0; r < b_scale_rows; ++r)
      sb[size_t(r * kbs + kb)] = e8m0_bits_of_exponent(b_exponent[r % 3]);
  }
  auto tensor = [](DType t, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
    HostTensor h(t, {rows, cols});
    std::memcpy(h.host_view().data, bytes.data(), bytes.size());
    return h;
  };
  HostTensor ta = tensor(DType::e4m3, M, K, a), tsa = tensor(DType::e8m0, M, kbs, sa);
  HostTensor tb = tensor(DType::e4m3, N, K, b), tsb = tensor(DType::e8m0, b_scale_rows, kbs, sb);
  // Accumulating: old values of the result's size (the blocks 0 and 2 cancel), so both terms of
  // the fp32 addition count.
  HostTensor d = o.accumulate ? HostTensor::of(o.d, {M, N},
                                               random_doubles(size_t(M * N), seeds.next(), -64, 64))
                              : HostTensor(o.d, {M, N});
  const std::vector<double> old = d.values();
  gemm_fp8({.a = ta.view(),
            .a_scales = tsa.view(),
            .b = tb.view(),
            .b_scales = tsb.view(),
            .d = d.view(),
            .b_scaling = o.b_scaling,
            .accumulate = o.accumulate});

  const std::vector<double> got = d.values();
  const auto rounded = [&](float v) {
    return o.d == DType::f32 ? double(v) : double(round_to<bf16>(v));
  };
  int mismatches = 0, order_visible = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f;
      double exact = 0;
      const int64_t b_row = by_rows ? n : n / 128;
      for (int64_t kb = 0; kb < kbs; ++kb) {
        double block = 0;
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k)
          block += double(e4m3_bits_to_float(a[size_t(m * K + k)])) *
                   double(e4m3_bits_to_float(b[size_t(n * K + k)]));
        const float scale = e8m0_bits_to_float(sa[size_t(m * kbs + kb)]) *
                            e8m0_bits_to_float(sb[size_t(b_row * kbs + kb)]);
        acc = std::fma(float(block), scale, acc);
        exact += block * double(scale);
      }
      const size_t i = size_t(m * N + n);
      if (o.accumulate) acc += float(old[i]), exact += old[i];
      const double want = rounded(acc);
      order_visible += want != rounded(float(exact));
      if (got[i] != want && ++mismatches <= 5)
        ADD_FAILURE() << "d[" << m << ", " << n << "] = " << got[i] << ", want " << want
                      << " (seed " << test_seed() << ")";
    }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(order_visible, M * N / 2) << "the operands no longer tell the orders apart";
}

TEST(Fp8Gemm, PromotesEachKBlockInFp32InKOrder) {
  check_order({Fp8BScaling::blocks, DType::bf16, false});
  check_order({Fp8BScaling::rows, DType::bf16, false});
  check_order({Fp8BScaling::rows, DType::f32, true});
}

// A NaN scale (0xFF) makes exactly what it scales NaN: an A scale its row, a B scale the 128
// columns of its block (by rows: its column); every other element keeps its bits.
TEST(Fp8Gemm, ANanScaleMakesItsRowOrColumnBlockNan) {
  for (Fp8BScaling scaling : {Fp8BScaling::blocks, Fp8BScaling::rows}) {
    const bool by_rows = scaling == Fp8BScaling::rows;
    SCOPED_TRACE(by_rows ? "b by rows" : "b by blocks");
    Seeds seeds;
    const Shape s{40, 264, 384};
    Fp8GemmCase clean(s.m, s.n, s.k, seeds, {scaling, DType::bf16, false});
    gemm_fp8(clean.args());
    const std::vector<double> before = clean.d.values();

    Fp8GemmCase c = clean;
    c.d.poison();
    const int64_t kb_count = num_fp8_scale_blocks(s.k), row = 17, b_row = by_rows ? 150 : 1;
    static_cast<uint8_t*>(c.a_scales.host_view().data)[row * kb_count + 2] = kE8m0NanBits;
    static_cast<uint8_t*>(c.b_scales.host_view().data)[b_row * kb_count + 0] = kE8m0NanBits;
    gemm_fp8(c.args());
    const std::vector<double> after = c.d.values();
    for (int64_t m = 0; m < s.m; ++m)
      for (int64_t n = 0; n < s.n; ++n) {
        const size_t i = size_t(m * s.n + n);
        if (m == row || (by_rows ? n : n / 128) == b_row)
          EXPECT_TRUE(std::isnan(after[i])) << m << ", " << n;
        else
          EXPECT_EQ(after[i], before[i]) << m << ", " << n;
      }
  }
}

// ---- Bad arguments: each case breaks one thing of a valid call; the call throws with `status`
// and a message naming what is wrong, and no byte of any tensor (guard bytes included) changes.

struct Rejection {
  const char* name;
  std::function<void(Fp8GemmArgs&, Fp8GemmCase&)> breaks;
  Status status;
  const char* message;
};

std::vector<uint8_t> bytes_of(HostTensor& t) {
  const TensorView v = t.host_view();
  const auto* p = static_cast<const uint8_t*>(v.data);
  return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype()));
}

TEST(Fp8Gemm, RejectsBadArgumentsBeforeTouchingMemory) {
  const Rejection kRejections[] = {
      {"K not a multiple of 16",
       [](Fp8GemmArgs& g, Fp8GemmCase&) {
         g.a.shape[1] = g.b.shape[1] = 136; // strides stay 144: still 16-byte rows
       },
       Status::not_supported,
       "gemm_fp8: K must be a multiple of 16 (16-byte rows for TMA); got 136"},
      {"N not a multiple of 8",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b.shape[0] = g.d.shape[1] = 20; },
       Status::not_supported, "N must be a multiple of 8"},
      {"a_scales of floor(K/128) blocks",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.a_scales.shape[1] = 1; }, Status::invalid_argument,
       "a_scales must have shape [M, ceil(K/128)] = [5, 2]; got [5, 1]"},
      {"b_scales with a row per 128 x 128 block missing",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b_scales.shape[0] = 1; }, Status::invalid_argument,
       "b_scales must have shape [ceil(N/128), ceil(K/128)] = [2, 2]; got [1, 2]"},
      {"b of another K", [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b.shape[1] = 128; },
       Status::invalid_argument, "b must have shape [N, K] = [N, 144]; got [136, 128]"},
      {"16-bit operand", [](Fp8GemmArgs& g, Fp8GemmCase&) { g.a.dtype = DType::bf16; },
       Status::type_error, "gemm_fp8: a must be e4m3; got bf16"},
      {"fp32 scales", [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b_scales.dtype = DType::f32; },
       Status::type_error, "b_scales must be e8m0; got f32"},
      {"f16 output", [](Fp8GemmArgs& g, Fp8GemmCase&) { g.d.dtype = DType::f16; },
       Status::type_error, "d must be bf16 or f32; got f16"},
      {"b scaled by rows with a scale per 128 x 128 block",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b_scaling = Fp8BScaling::rows; },
       Status::invalid_argument,
       "b_scales must have shape [N, ceil(K/128)] = [136, 2]; got [2, 2]"},
      {"unknown B scaling",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.b_scaling = static_cast<Fp8BScaling>(2); },
       Status::invalid_argument, "b_scaling must be blocks (0) or rows (1); got 2"},
      {"missing scales", [](Fp8GemmArgs& g, Fp8GemmCase&) { g.a_scales.data = nullptr; },
       Status::invalid_argument, "a_scales is required; got a null data pointer"},
      {"unaligned rows of a",
       [](Fp8GemmArgs& g, Fp8GemmCase&) {
         g.a.shape[0] = g.a_scales.shape[0] = g.d.shape[0] = 2;
         g.a.stride[0] = 152;
       },
       Status::invalid_argument, "a must have a row stride (stride[0]) that is a multiple of 16"},
      {"d overlapping a scale tensor",
       [](Fp8GemmArgs& g, Fp8GemmCase&) { g.d.data = g.b_scales.data; }, Status::invalid_argument,
       "d overlaps"},
  };
  for (const Rejection& r : kRejections) {
    SCOPED_TRACE(r.name);
    Seeds seeds;
    Fp8GemmCase c(5, 136, 144, seeds);
    Fp8GemmArgs args = c.args();
    r.breaks(args, c);
    HostTensor* tensors[] = {&c.a, &c.a_scales, &c.b, &c.b_scales, &c.d};
    std::vector<std::vector<uint8_t>> before;
    for (HostTensor* t : tensors) before.push_back(bytes_of(*t));
    std::string message;
    try {
      gemm_fp8(args);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      message = e.what();
      EXPECT_EQ(int(e.status()), int(r.status)) << message;
    }
    EXPECT_NE(message.find(r.message), std::string::npos)
        << "message lacks \"" << r.message << "\": " << message;
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(bytes_of(*tensors[i]), before[i]) << "tensor " << i << " changed";
      EXPECT_TRUE(tensors[i]->guard_intact()) << "tensor " << i;
    }
  }
}

} // namespace
} // namespace coda::test
