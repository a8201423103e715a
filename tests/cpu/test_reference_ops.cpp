// The reference ops are checked against properties that do not depend on their own formulas:
// backward passes against central finite differences of the forward (fp64), RoPE against
// complex multiplication and orthogonality, the Llama-3 table against its defining bands, and
// the low-precision policy against coda::round_to applied to the exact result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "reference/ops.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"

namespace {

using coda::ref::Rounding;
using Vec = std::vector<double>;

Vec random_doubles(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_positions(size_t n, uint64_t seed, int32_t max_pos) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, max_pos);
  std::vector<int32_t> p(n);
  for (auto& x : p) x = dist(rng);
  return p;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences: O(h^2) truncation, O(ulp / h) cancellation; h = 1e-5 on O(1) data keeps
// both near 1e-10 relative, far below the 1e-7 the tests accept.
Vec numerical_gradient(const std::function<double(const Vec&)>& loss, Vec x, double h = 1e-5) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss(x);
    x[i] = saved - h;
    const double down = loss(x);
    x[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

constexpr double kFdTolerance = 1e-7;

const Rounding kExact{};
const Rounding kLowPrecision[] = {Rounding{Rounding::Kind::bf16}, Rounding{Rounding::Kind::f16},
                                  Rounding{Rounding::Kind::f32}};

// What the policy must equal: coda::round_to of the value first rounded to fp32.
double expected_rounding(Rounding r, double x) {
  switch (r.kind) {
  case Rounding::Kind::none:
    return x;
  case Rounding::Kind::bf16:
    return coda::round_to<coda::bf16>(float(x));
  case Rounding::Kind::f16:
    return coda::round_to<coda::f16>(float(x));
  case Rounding::Kind::f32:
    return float(x);
  }
  return NAN;
}

// An op run under policy r must give exactly the rounded exact result.
void expect_rounded_from(Rounding r, const Vec& low, const Vec& exact, const char* what) {
  ASSERT_EQ(low.size(), exact.size());
  for (size_t i = 0; i < low.size(); ++i)
    ASSERT_EQ(low[i], expected_rounding(r, exact[i])) << what << " index " << i;
}

TEST(ReferenceOps, RoundingMatchesRoundTo) {
  EXPECT_EQ(Rounding::for_dtype(coda::DType::bf16).kind, Rounding::Kind::bf16);
  EXPECT_EQ(Rounding::for_dtype(coda::DType::f16).kind, Rounding::Kind::f16);
  EXPECT_EQ(Rounding::for_dtype(coda::DType::f32).kind, Rounding::Kind::f32);
  EXPECT_THROW(Rounding::for_dtype(coda::DType::i32), std::invalid_argument);
  const Vec x = random_doubles(4096, coda::test::test_seed(), -300.0, 300.0);
  for (double v : x) {
    EXPECT_EQ(kExact(v), v);
    EXPECT_EQ(kExact.stat(v), v);
    for (Rounding r : kLowPrecision) {
      ASSERT_EQ(r(v), expected_rounding(r, v));
      ASSERT_EQ(r(r(v)), r(v)) << "rounding must be idempotent";
      ASSERT_EQ(r.stat(v), double(float(v)));
    }
  }
  // bf16 keeps 8 significant bits: the low 16 bits of the fp32 pattern are zero.
  for (double v : x) {
    const float b = float(Rounding{Rounding::Kind::bf16}(v));
    ASSERT_EQ(coda::float_bits(b) & 0xffffu, 0u);
    ASSERT_LE(std::fabs(double(b) - v), std::fabs(v) * std::ldexp(1.0, -8));
  }
}

TEST(ReferenceOps, AddScaleAndLinearRoundTheirOutputs) {
  uint64_t seed = coda::test::test_seed() + 1;
  const int64_t M = 7, N = 9, K = 33;
  for (Rounding r : kLowPrecision) {
    const Vec a = coda::ref::rounded(r, random_doubles(size_t(M * K), seed++));
    const Vec b = coda::ref::rounded(r, random_doubles(size_t(N * K), seed++));
    Vec sum(a.size(), NAN), sum_exact(a.size(), NAN), scaled(a.size(), NAN), scaled_exact = scaled;
    const Vec a2 = coda::ref::rounded(r, random_doubles(a.size(), seed++));
    coda::ref::add(r, int64_t(a.size()), a.data(), a2.data(), sum.data());
    coda::ref::add(kExact, int64_t(a.size()), a.data(), a2.data(), sum_exact.data());
    expect_rounded_from(r, sum, sum_exact, "add");
    coda::ref::scale(r, int64_t(a.size()), 0.37, a.data(), scaled.data());
    coda::ref::scale(kExact, int64_t(a.size()), 0.37, a.data(), scaled_exact.data());
    expect_rounded_from(r, scaled, scaled_exact, "scale");

    // linear = fp32 accumulation of the same inputs, then one rounding.
    Vec d(size_t(M * N), NAN), d64(size_t(M * N), NAN);
    std::vector<float> a32(a.begin(), a.end()), b32(b.begin(), b.end()), d32(size_t(M * N));
    coda::ref::linear(r, coda::ref::Layout::fwd, M, N, K, a.data(), b.data(), d.data());
    coda::ref::gemm_fp32(coda::ref::Layout::fwd, M, N, K, a32.data(), b32.data(), d32.data());
    coda::ref::linear(kExact, coda::ref::Layout::fwd, M, N, K, a.data(), b.data(), d64.data());
    for (size_t i = 0; i < d.size(); ++i) {
      ASSERT_EQ(d[i], expected_rounding(r, d32[i]));
      // Close to fp64: one output rounding (relative 2^-8 for bf16) plus fp32 accumulation.
      ASSERT_NEAR(d[i], d64[i], std::fabs(d64[i]) * std::ldexp(1.0, -8) + K * 1e-6);
    }
  }
  Vec d(size_t(M * N), NAN);
  const Vec a = random_doubles(size_t(M * K), seed++), b = random_doubles(size_t(K * N), seed++);
  Vec expect(d.size(), NAN);
  coda::ref::linear(kExact, coda::ref::Layout::dgrad, M, N, K, a.data(), b.data(), d.data());
  coda::ref::gemm(coda::ref::Layout::dgrad, M, N, K, a.data(), b.data(), expect.data());
  EXPECT_EQ(d, expect);
}

// The FP8 recipe of linear() (Rounding::fp8) in the three layouts: dgrad reads the weight in the
// forward's 128 x 128 blocks (so it is the forward on the transposed weight), and wgrad quantizes
// dY along the tokens, 128 a block per column, and X in 128 x 128 blocks (tokens x columns),
// checked against the E4M3 format's own statement (tests/common/fp8_case.hpp).
TEST(ReferenceOps, Fp8LinearQuantizesAlongTheReduction) {
  uint64_t seed = coda::test::test_seed() + 7;
  const int64_t M = 130, N = 136, K = 260; // ragged blocks along every dimension
  // Magnitudes change by powers of two from row to row and from column block to column block, so
  // blocks along the rows and along the columns take different scales.
  const auto blocky = [&](int64_t rows, int64_t cols) {
    Vec v = random_doubles(size_t(rows * cols), seed++);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        v[size_t(i * cols + j)] = std::ldexp(v[size_t(i * cols + j)], int((i + j / 128) % 5) - 2);
    return v;
  };
  const auto transposed = [](const Vec& x, int64_t rows, int64_t cols) {
    Vec t(x.size());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = x[size_t(i * cols + j)];
    return t;
  };
  Rounding fp8;
  fp8.fp8 = true;
  const auto close = [](const Vec& got, const Vec& want, const char* what) {
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << what << " at " << i;
  };

  const Vec a = blocky(M, K), w = blocky(N, K);
  Vec fwd(size_t(M * N), NAN), dgrad(size_t(M * N), NAN), plain(size_t(M * N), NAN);
  coda::ref::linear(fp8, coda::ref::Layout::fwd, M, N, K, a.data(), w.data(), fwd.data());
  const Vec w_t = transposed(w, N, K);
  coda::ref::linear(fp8, coda::ref::Layout::dgrad, M, N, K, a.data(), w_t.data(), dgrad.data());
  close(dgrad, fwd, "dgrad against the forward");
  coda::ref::linear(kExact, coda::ref::Layout::fwd, M, N, K, a.data(), w.data(), plain.data());
  double moved = 0; // quantization did happen
  for (size_t i = 0; i < plain.size(); ++i) moved = std::max(moved, std::fabs(plain[i] - fwd[i]));
  EXPECT_GT(moved, 1e-4);

  // wgrad: D [M, N] = dYᵀ X over K tokens, dY [K, M] and X [K, N].
  const Vec dy = blocky(K, M), x = blocky(K, N);
  Vec wgrad(size_t(M * N), NAN);
  coda::ref::linear(fp8, coda::ref::Layout::wgrad, M, N, K, dy.data(), x.data(), wgrad.data());
  // Column j of a [K, cols] matrix, quantized 128 tokens a block by the format's definition.
  const auto column_values = [&](const Vec& v, int64_t cols) {
    Vec q(v.size());
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t k0 = 0; k0 < K; k0 += 128) {
        const int64_t n = std::min<int64_t>(128, K - k0);
        std::vector<float> block(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) block[size_t(k)] = float(v[size_t((k0 + k) * cols + j)]);
        const int e = coda::test::e4m3_block_exponent(block.data(), n);
        for (int64_t k = 0; k < n; ++k)
          q[size_t((k0 + k) * cols + j)] =
              std::ldexp(coda::test::e4m3_grid_value(coda::test::e4m3_nearest_code(
                             float(std::ldexp(double(block[size_t(k)]), -e)))),
                         e);
      }
    return q;
  };
  // X [K, cols] in 128 x 128 blocks, the same way.
  const auto block_values = [&](const Vec& v, int64_t cols) {
    Vec q(v.size());
    for (int64_t k0 = 0; k0 < K; k0 += 128)
      for (int64_t j0 = 0; j0 < cols; j0 += 128) {
        const int64_t nk = std::min<int64_t>(128, K - k0), nj = std::min<int64_t>(128, cols - j0);
        std::vector<float> block;
        for (int64_t k = 0; k < nk; ++k)
          for (int64_t j = 0; j < nj; ++j) block.push_back(float(v[size_t((k0 + k) * cols + j0 + j)]));
        const int e = coda::test::e4m3_block_exponent(block.data(), int64_t(block.size()));
        for (int64_t k = 0; k < nk; ++k)
          for (int64_t j = 0; j < nj; ++j)
            q[size_t((k0 + k) * cols + j0 + j)] =
                std::ldexp(coda::test::e4m3_grid_value(coda::test::e4m3_nearest_code(float(
                               std::ldexp(double(block[size_t(k * nj + j)]), -e)))),
                           e);
      }
    return q;
  };
  const Vec qdy = column_values(dy, M), qx = block_values(x, N);
  Vec want(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        want[size_t(m * N + n)] += qdy[size_t(k * M + m)] * qx[size_t(k * N + n)];
  close(wgrad, want, "wgrad against the format's quantization");
}

// ---- RMSNorm

TEST(ReferenceOps, RmsNormForwardProperties) {
  uint64_t seed = coda::test::test_seed() + 10;
  const int64_t M = 5, N = 24;
  const double eps = 1e-6;
  const Vec x = random_doubles(size_t(M * N), seed++);
  const Vec ones(size_t(N), 1.0);
  Vec out(x.size(), NAN), rstd(size_t(M), NAN);
  coda::ref::rmsnorm_forward(kExact, M, N, x.data(), ones.data(), eps, out.data(), rstd.data());
  for (int64_t m = 0; m < M; ++m) {
    // With gamma = 1 the output has mean square 1 / (1 + eps / mean(x^2)).
    double out_sq = 0, x_sq = 0;
    for (int64_t n = 0; n < N; ++n) out_sq += out[size_t(m * N + n)] * out[size_t(m * N + n)];
    for (int64_t n = 0; n < N; ++n) x_sq += x[size_t(m * N + n)] * x[size_t(m * N + n)];
    EXPECT_NEAR(out_sq / N, (x_sq / N) / (x_sq / N + eps), 1e-13);
    EXPECT_NEAR(rstd[size_t(m)] * rstd[size_t(m)] * (x_sq / N + eps), 1.0, 1e-13);
  }
  // Invariant to scaling the row (eps = 0) and linear in gamma.
  Vec x3 = x;
  for (auto& v : x3) v *= 3.0;
  const Vec gamma = random_doubles(size_t(N), seed++);
  Vec out_a(x.size(), NAN), out_b(x.size(), NAN);
  coda::ref::rmsnorm_forward(kExact, M, N, x.data(), gamma.data(), 0.0, out_a.data(), rstd.data());
  coda::ref::rmsnorm_forward(kExact, M, N, x3.data(), gamma.data(), 0.0, out_b.data(), rstd.data());
  EXPECT_LE(coda::test::max_rel_error(out_b, out_a), 1e-14);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      EXPECT_NEAR(out_a[i], x[i] * gamma[size_t(n)] * rstd[size_t(m)] * 3.0, 1e-14);
    }
}

TEST(ReferenceOps, RmsNormBackwardMatchesFiniteDifferences) {
  uint64_t seed = coda::test::test_seed() + 20;
  const int64_t M = 3, N = 11;
  const double eps = 1e-5;
  const Vec x = random_doubles(size_t(M * N), seed++);
  const Vec gamma = random_doubles(size_t(N), seed++, 0.5, 1.5);
  const Vec weight = random_doubles(size_t(M * N), seed++); // loss = <weight, out>
  auto loss = [&](const Vec& xv, const Vec& gv) {
    Vec out(xv.size()), rstd(static_cast<size_t>(M));
    coda::ref::rmsnorm_forward(kExact, M, N, xv.data(), gv.data(), eps, out.data(), rstd.data());
    return dot(weight, out);
  };
  Vec out(x.size()), rstd(static_cast<size_t>(M)), dx(x.size(), NAN), dgamma(size_t(N), NAN);
  coda::ref::rmsnorm_forward(kExact, M, N, x.data(), gamma.data(), eps, out.data(), rstd.data());
  coda::ref::rmsnorm_backward(kExact, M, N, x.data(), gamma.data(), rstd.data(), weight.data(),
                              dx.data(), dgamma.data());
  EXPECT_LE(coda::test::max_rel_error(
                dx, numerical_gradient([&](const Vec& v) { return loss(v, gamma); }, x)),
            kFdTolerance);
  EXPECT_LE(coda::test::max_rel_error(
                dgamma, numerical_gradient([&](const Vec& v) { return loss(x, v); }, gamma)),
            kFdTolerance);
  // dx may alias dout.
  Vec inplace = weight;
  coda::ref::rmsnorm_backward(kExact, M, N, x.data(), gamma.data(), rstd.data(), inplace.data(),
                              inplace.data(), dgamma.data());
  EXPECT_EQ(inplace, dx);
}

TEST(ReferenceOps, RmsNormLowPrecisionRoundsExactResult) {
  uint64_t seed = coda::test::test_seed() + 30;
  const int64_t M = 4, N = 40;
  for (Rounding r : kLowPrecision) {
    const Vec x = coda::ref::rounded(r, random_doubles(size_t(M * N), seed++));
    const Vec gamma = coda::ref::rounded(r, random_doubles(size_t(N), seed++));
    const Vec dout = coda::ref::rounded(r, random_doubles(size_t(M * N), seed++));
    Vec out(x.size()), out_exact(x.size()), rstd(static_cast<size_t>(M)),
        rstd_exact(static_cast<size_t>(M));
    coda::ref::rmsnorm_forward(r, M, N, x.data(), gamma.data(), 1e-6, out.data(), rstd.data());
    coda::ref::rmsnorm_forward(kExact, M, N, x.data(), gamma.data(), 1e-6, out_exact.data(),
                               rstd_exact.data());
    expect_rounded_from(r, out, out_exact, "rmsnorm out");
    for (int64_t m = 0; m < M; ++m)
      EXPECT_EQ(rstd[size_t(m)], double(float(rstd_exact[size_t(m)])));
    Vec dx(x.size()), dx_exact(x.size()), dg(static_cast<size_t>(N)),
        dg_exact(static_cast<size_t>(N));
    coda::ref::rmsnorm_backward(r, M, N, x.data(), gamma.data(), rstd.data(), dout.data(),
                                dx.data(), dg.data());
    coda::ref::rmsnorm_backward(kExact, M, N, x.data(), gamma.data(), rstd.data(), dout.data(),
                                dx_exact.data(), dg_exact.data());
    expect_rounded_from(r, dx, dx_exact, "rmsnorm dx");
    expect_rounded_from(r, dg, dg_exact, "rmsnorm dgamma");
  }
}

// ---- RoPE

struct RopeCase {
  coda::ref::RopeShape shape;
  int64_t M;
};
const RopeCase kRopeCases[] = {{{1, 1, 2}, 3}, {{4, 2, 8}, 5}, {{3, 1, 16}, 7}, {{2, 2, 6}, 1}};

TEST(ReferenceOps, RopeIsHuggingFaceRotateHalfByPlusTheta) {
  uint64_t seed = coda::test::test_seed() + 40;
  for (const RopeCase& c : kRopeCases) {
    const int64_t width = c.shape.width(), hd = c.shape.head_dim, half = hd / 2;
    const Vec x = random_doubles(size_t(c.M * width), seed++);
    const auto pos = random_positions(size_t(c.M), seed++, 5000);
    const Vec inv_freq = coda::ref::rope_inv_freq(hd, 10000.0);
    Vec y(x.size(), NAN);
    coda::ref::rope_forward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), x.data(), y.data());
    // Pair (i, i + hd/2) as the complex number x[i] + j x[i + hd/2], multiplied by e^{+j t}.
    const int64_t rotated = (c.shape.n_q_heads + c.shape.n_kv_heads) * hd;
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t col = 0; col < width; ++col) {
        const size_t at = size_t(m * width + col);
        if (col >= rotated) {
          ASSERT_EQ(y[at], x[at]) << "V must pass through";
          continue;
        }
        const int64_t head = col / hd, i = col % hd % half;
        const size_t lo = size_t(m * width + head * hd + i), hi = lo + size_t(half);
        const double t = double(pos[size_t(m)]) * std::pow(10000.0, -2.0 * double(i) / double(hd));
        const std::complex<double> z = std::complex<double>(x[lo], x[hi]) * std::polar(1.0, t);
        ASSERT_NEAR(y[at], col % hd < half ? z.real() : z.imag(), 1e-12);
      }
    }
  }
}

TEST(ReferenceOps, RopeIsOrthogonalAndBackwardInvertsForward) {
  uint64_t seed = coda::test::test_seed() + 50;
  for (const RopeCase& c : kRopeCases) {
    const int64_t width = c.shape.width();
    const Vec x = random_doubles(size_t(c.M * width), seed++);
    const Vec g = random_doubles(x.size(), seed++);
    const auto pos = random_positions(size_t(c.M), seed++, 100000);
    const Vec inv_freq = coda::ref::rope_inv_freq_llama3(c.shape.head_dim, 500000.0, {});
    Vec y(x.size(), NAN), back(x.size(), NAN), gx(x.size(), NAN);
    coda::ref::rope_forward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), x.data(), y.data());
    coda::ref::rope_backward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), y.data(),
                             back.data());
    EXPECT_LE(coda::test::max_rel_error(back, x), 1e-14);
    for (int64_t m = 0; m < c.M; ++m) {
      double nx = 0, ny = 0;
      for (int64_t n = 0; n < width; ++n) nx += x[size_t(m * width + n)] * x[size_t(m * width + n)];
      for (int64_t n = 0; n < width; ++n) ny += y[size_t(m * width + n)] * y[size_t(m * width + n)];
      EXPECT_NEAR(ny, nx, 1e-13 * nx) << "row norm preserved";
    }
    // Backward is the transpose: <g, R x> = <Rᵀ g, x>, which is also the gradient check of a
    // linear map (finite differences of a linear function are exact up to rounding).
    coda::ref::rope_backward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), g.data(),
                             gx.data());
    EXPECT_NEAR(dot(g, y), dot(gx, x), 1e-13 * double(x.size()));
    auto loss = [&](const Vec& v) {
      Vec out(v.size());
      coda::ref::rope_forward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), v.data(),
                              out.data());
      return dot(g, out);
    };
    EXPECT_LE(coda::test::max_rel_error(gx, numerical_gradient(loss, x)), kFdTolerance);
    // In place gives the same bits; position 0 is the identity.
    Vec inplace = x;
    coda::ref::rope_forward(kExact, c.M, c.shape, pos.data(), inv_freq.data(), inplace.data(),
                            inplace.data());
    EXPECT_EQ(inplace, y);
    const std::vector<int32_t> zeros(size_t(c.M), 0);
    coda::ref::rope_forward(kExact, c.M, c.shape, zeros.data(), inv_freq.data(), x.data(),
                            y.data());
    EXPECT_EQ(y, x);
  }
}

TEST(ReferenceOps, RopeLowPrecisionAndBadShapes) {
  uint64_t seed = coda::test::test_seed() + 60;
  const coda::ref::RopeShape shape{4, 2, 8};
  const int64_t M = 6;
  const auto pos = random_positions(size_t(M), seed++, 2048);
  const Vec inv_freq = coda::ref::rope_inv_freq(8, 10000.0);
  for (Rounding r : kLowPrecision) {
    const Vec x = coda::ref::rounded(r, random_doubles(size_t(M * shape.width()), seed++));
    Vec y(x.size()), y_exact(x.size()), d(x.size()), d_exact(x.size());
    coda::ref::rope_forward(r, M, shape, pos.data(), inv_freq.data(), x.data(), y.data());
    coda::ref::rope_forward(kExact, M, shape, pos.data(), inv_freq.data(), x.data(),
                            y_exact.data());
    expect_rounded_from(r, y, y_exact, "rope forward");
    coda::ref::rope_backward(r, M, shape, pos.data(), inv_freq.data(), x.data(), d.data());
    coda::ref::rope_backward(kExact, M, shape, pos.data(), inv_freq.data(), x.data(),
                             d_exact.data());
    expect_rounded_from(r, d, d_exact, "rope backward");
  }
  Vec buf(64, NAN);
  EXPECT_THROW(coda::ref::rope_forward(kExact, 1, {1, 1, 3}, pos.data(), inv_freq.data(),
                                       buf.data(), buf.data()),
               std::invalid_argument);
  EXPECT_THROW(coda::ref::rope_forward(kExact, 1, {2, -1, 4}, pos.data(), inv_freq.data(),
                                       buf.data(), buf.data()),
               std::invalid_argument);
}

TEST(ReferenceOps, Llama3FrequencyTableKeepsItsBands) {
  const coda::ref::Llama3RopeScaling scaling{}; // Llama 3.1: 8, 1, 4, 8192
  for (int64_t hd : {64, 128}) {
    const Vec base = coda::ref::rope_inv_freq(hd, 500000.0);
    const Vec scaled = coda::ref::rope_inv_freq_llama3(hd, 500000.0, scaling);
    ASSERT_EQ(base.size(), size_t(hd / 2));
    ASSERT_EQ(scaled.size(), base.size());
    const double low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor;
    const double high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor;
    int kept = 0, divided = 0, blended = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_NEAR(base[i] * std::pow(500000.0, 2.0 * double(i) / double(hd)), 1.0, 1e-12);
      const double wavelen = 2 * std::numbers::pi / base[i];
      if (wavelen < high_wavelen) {
        EXPECT_EQ(scaled[i], base[i]);
        ++kept;
      } else if (wavelen > low_wavelen) {
        EXPECT_NEAR(scaled[i], base[i] / scaling.factor, 1e-15);
        ++divided;
      } else {
        // The blend lies between the two and moves monotonically across the band.
        EXPECT_LE(scaled[i], base[i]);
        EXPECT_GE(scaled[i], base[i] / scaling.factor);
        if (i > 0) {
          EXPECT_LT(scaled[i], scaled[i - 1]);
        }
        ++blended;
      }
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(blended, 0);
  }
  // The blend is continuous at both band edges: a wavelength exactly on an edge.
  const coda::ref::Llama3RopeScaling edges{4.0, 1.0, 4.0, 2 * std::numbers::pi * 4.0};
  const Vec at_edges = coda::ref::rope_inv_freq_llama3(2, 1.0, edges); // inv_freq[0] = 1
  EXPECT_NEAR(at_edges[0], 1.0, 1e-15);                                // wavelen = high edge
  const coda::ref::Llama3RopeScaling low_edge{4.0, 1.0, 4.0, 2 * std::numbers::pi};
  EXPECT_NEAR(coda::ref::rope_inv_freq_llama3(2, 1.0, low_edge)[0], 0.25, 1e-15); // = low edge
}

// ---- SwiGLU

TEST(ReferenceOps, SwigluBackwardMatchesFiniteDifferences) {
  uint64_t seed = coda::test::test_seed() + 70;
  const int64_t M = 3, F = 7;
  const Vec gate = random_doubles(size_t(M * F), seed++, -4.0, 4.0);
  const Vec up = random_doubles(size_t(M * F), seed++);
  const Vec weight = random_doubles(size_t(M * F), seed++);
  auto loss = [&](const Vec& g, const Vec& u) {
    Vec out(g.size());
    coda::ref::swiglu_forward(kExact, M, F, g.data(), u.data(), out.data());
    return dot(weight, out);
  };
  Vec out(gate.size(), NAN), dgate(gate.size(), NAN), dup(gate.size(), NAN);
  coda::ref::swiglu_forward(kExact, M, F, gate.data(), up.data(), out.data());
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], gate[i] / (1 + std::exp(-gate[i])) * up[i], 1e-15);
  coda::ref::swiglu_backward(kExact, M, F, gate.data(), up.data(), weight.data(), dgate.data(),
                             dup.data());
  EXPECT_LE(coda::test::max_rel_error(
                dgate, numerical_gradient([&](const Vec& v) { return loss(v, up); }, gate)),
            kFdTolerance);
  EXPECT_LE(coda::test::max_rel_error(
                dup, numerical_gradient([&](const Vec& v) { return loss(gate, v); }, up)),
            kFdTolerance);
  for (Rounding r : kLowPrecision) {
    const Vec g = coda::ref::rounded(r, gate), u = coda::ref::rounded(r, up),
              w = coda::ref::rounded(r, weight);
    Vec o(g.size()), o_exact(g.size()), dg(g.size()), dg_exact(g.size()), du(g.size()),
        du_exact(g.size());
    coda::ref::swiglu_forward(r, M, F, g.data(), u.data(), o.data());
    coda::ref::swiglu_forward(kExact, M, F, g.data(), u.data(), o_exact.data());
    expect_rounded_from(r, o, o_exact, "swiglu out");
    coda::ref::swiglu_backward(r, M, F, g.data(), u.data(), w.data(), dg.data(), du.data());
    coda::ref::swiglu_backward(kExact, M, F, g.data(), u.data(), w.data(), dg_exact.data(),
                               du_exact.data());
    expect_rounded_from(r, dg, dg_exact, "swiglu dgate");
    expect_rounded_from(r, du, du_exact, "swiglu dup");
  }
}

// ---- Cross-entropy

TEST(ReferenceOps, CrossEntropyMatchesDefinitionAndFiniteDifferences) {
  uint64_t seed = coda::test::test_seed() + 80;
  const int64_t M = 6, V = 13;
  const int32_t ignore = -100;
  const Vec logits = random_doubles(size_t(M * V), seed++, -3.0, 3.0);
  std::vector<int32_t> targets = random_positions(size_t(M), seed++, int32_t(V - 1));
  targets[1] = ignore;
  targets[4] = ignore;
  for (auto reduction : {coda::ref::Reduction::mean, coda::ref::Reduction::sum}) {
    Vec lse(size_t(M), NAN), dlogits(logits.size(), NAN);
    const auto res = coda::ref::cross_entropy(kExact, M, V, logits.data(), targets.data(), ignore,
                                              reduction, lse.data(), dlogits.data());
    EXPECT_EQ(res.valid_rows, M - 2);
    EXPECT_EQ(res.grad_scale, reduction == coda::ref::Reduction::sum ? 1.0 : 1.0 / double(M - 2));
    double expect_loss = 0;
    for (int64_t m = 0; m < M; ++m) {
      double z = 0; // softmax normalizer, summed without the max shift
      for (int64_t n = 0; n < V; ++n) z += std::exp(logits[size_t(m * V + n)]);
      EXPECT_NEAR(lse[size_t(m)], std::log(z), 1e-13);
      if (targets[size_t(m)] != ignore)
        expect_loss += std::log(z) - logits[size_t(m * V + targets[size_t(m)])];
      double row_sum = 0;
      for (int64_t n = 0; n < V; ++n) row_sum += dlogits[size_t(m * V + n)];
      EXPECT_NEAR(row_sum, 0.0, 1e-15) << "softmax - onehot sums to zero";
    }
    EXPECT_NEAR(res.loss, expect_loss * res.grad_scale, 1e-13);
    auto loss = [&](const Vec& l) {
      return coda::ref::cross_entropy(kExact, M, V, l.data(), targets.data(), ignore, reduction,
                                      nullptr, nullptr)
          .loss;
    };
    EXPECT_LE(coda::test::max_rel_error(dlogits, numerical_gradient(loss, logits)), kFdTolerance);
  }
  // Large logits do not overflow.
  Vec big = logits;
  for (auto& v : big) v += 1000.0;
  Vec lse(static_cast<size_t>(M));
  const auto res = coda::ref::cross_entropy(kExact, M, V, big.data(), targets.data(), ignore,
                                            coda::ref::Reduction::mean, lse.data(), nullptr);
  EXPECT_TRUE(std::isfinite(res.loss));
}

TEST(ReferenceOps, CrossEntropyEdgeCasesAndLowPrecision) {
  uint64_t seed = coda::test::test_seed() + 90;
  const int64_t M = 4, V = 9;
  const Vec logits = random_doubles(size_t(M * V), seed++, -3.0, 3.0);
  const std::vector<int32_t> all_ignored(size_t(M), -1);
  Vec lse(size_t(M), NAN), dlogits(logits.size(), NAN);
  auto res = coda::ref::cross_entropy(kExact, M, V, logits.data(), all_ignored.data(), -1,
                                      coda::ref::Reduction::mean, lse.data(), dlogits.data());
  EXPECT_EQ(res.valid_rows, 0);
  EXPECT_EQ(res.loss, 0.0);
  for (double d : dlogits) EXPECT_EQ(d, 0.0);
  // A target out of range is an error, raised before any output is written.
  std::vector<int32_t> bad = {0, 1, int32_t(V), 2};
  Vec poisoned(logits.size(), NAN), lse_poisoned(size_t(M), NAN);
  EXPECT_THROW(coda::ref::cross_entropy(kExact, M, V, logits.data(), bad.data(), -100,
                                        coda::ref::Reduction::sum, lse_poisoned.data(),
                                        poisoned.data()),
               std::invalid_argument);
  for (double d : poisoned) EXPECT_TRUE(std::isnan(d));
  for (double d : lse_poisoned) EXPECT_TRUE(std::isnan(d));

  const std::vector<int32_t> targets = {3, -100, 0, 8};
  for (Rounding r : kLowPrecision) {
    const Vec l = coda::ref::rounded(r, logits);
    Vec d(l.size()), d_exact(l.size()), s(static_cast<size_t>(M)), s_exact(static_cast<size_t>(M));
    const auto low = coda::ref::cross_entropy(r, M, V, l.data(), targets.data(), -100,
                                              coda::ref::Reduction::mean, s.data(), d.data());
    const auto exact =
        coda::ref::cross_entropy(kExact, M, V, l.data(), targets.data(), -100,
                                 coda::ref::Reduction::mean, s_exact.data(), d_exact.data());
    expect_rounded_from(r, d, d_exact, "dlogits");
    EXPECT_EQ(low.loss, double(float(exact.loss)));
    for (int64_t m = 0; m < M; ++m) EXPECT_EQ(s[size_t(m)], double(float(s_exact[size_t(m)])));
  }
}

} // namespace
