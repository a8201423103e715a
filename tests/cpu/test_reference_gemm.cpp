// The reference GEMM is the ground truth of every other test, so it is checked against
// properties that do not depend on it: the three layouts against each other on transposed data,
// exact identities on integer-valued inputs, and the fp32 path against the classical error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/gemm.hpp"
#include "tests/common/check.hpp"

namespace {

using coda::ref::Layout;

std::vector<double> transpose(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

// Full fp64 mantissas, so nothing in the checks below is exact by accident.
std::vector<double> random_doubles(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Small integers: every product and partial sum is exact in fp64, so any summation order gives
// the same bits and a naive sum is an independent oracle.
std::vector<double> random_integers(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-9, 9);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {{1, 1, 1}, {3, 5, 7}, {17, 8, 33}, {129, 72, 65}, {2, 260, 3}};

TEST(ReferenceGemm, LayoutsAgreeOnTransposedData) {
  uint64_t seed = coda::test::test_seed();
  for (const Shape& s : kShapes) {
    const auto a = random_doubles(size_t(s.M * s.K), seed++); // [M, K]
    const auto w = random_doubles(size_t(s.N * s.K), seed++); // [N, K]
    const auto a_t = transpose(a, s.M, s.K);                  // [K, M]
    const auto w_t = transpose(w, s.N, s.K);                  // [K, N]
    std::vector<double> fwd(size_t(s.M * s.N), NAN), dgrad = fwd, wgrad = fwd;
    coda::ref::gemm(Layout::fwd, s.M, s.N, s.K, a.data(), w.data(), fwd.data());
    coda::ref::gemm(Layout::dgrad, s.M, s.N, s.K, a.data(), w_t.data(), dgrad.data());
    coda::ref::gemm(Layout::wgrad, s.M, s.N, s.K, a_t.data(), w_t.data(), wgrad.data());
    EXPECT_LE(coda::test::max_rel_error(dgrad, fwd), 1e-14) << s.M << "x" << s.N << "x" << s.K;
    EXPECT_LE(coda::test::max_rel_error(wgrad, fwd), 1e-14) << s.M << "x" << s.N << "x" << s.K;
  }
}

TEST(ReferenceGemm, MatchesNaiveSumOnIntegers) {
  uint64_t seed = coda::test::test_seed() + 100;
  for (const Shape& s : kShapes) {
    const auto a = random_integers(size_t(s.M * s.K), seed++);
    const auto b = random_integers(size_t(s.N * s.K), seed++);
    for (Layout layout : {Layout::fwd, Layout::dgrad, Layout::wgrad}) {
      // Interpret the same buffers in each layout; the oracle indexes them by hand.
      std::vector<double> d(size_t(s.M * s.N), NAN);
      coda::ref::gemm(layout, s.M, s.N, s.K, a.data(), b.data(), d.data());
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          double expect = 0;
          for (int64_t k = 0; k < s.K; ++k) {
            const double av =
                layout == Layout::wgrad ? a[size_t(k * s.M + m)] : a[size_t(m * s.K + k)];
            const double bv =
                layout == Layout::fwd ? b[size_t(n * s.K + k)] : b[size_t(k * s.N + n)];
            expect += av * bv;
          }
          ASSERT_EQ(d[size_t(m * s.N + n)], expect)
              << "layout " << int(layout) << " m " << m << " n " << n;
        }
    }
  }
}

// Large products run on several threads, each row on one of them: every output must have the
// bits of the sequential sum over k in order, whatever the split (full mantissas, so any other
// order shows).
TEST(ReferenceGemm, ThreadedRowsSumInTheSequentialOrder) {
  const int64_t M = 257, N = 96, K = 320; // 7.9M terms: split over threads where there are any
  for (const Layout layout : {Layout::fwd, Layout::dgrad, Layout::wgrad}) {
    const std::vector<double> a = random_doubles(size_t(M * K), 11),
                              b = random_doubles(size_t(K * N), 12);
    // A(m, k) and B(k, n) as each layout stores them (coda/reference/gemm.hpp).
    auto a_at = [&](int64_t m, int64_t k) {
      return layout == Layout::wgrad ? a[size_t(k * M + m)] : a[size_t(m * K + k)];
    };
    auto b_at = [&](int64_t k, int64_t n) {
      return layout == Layout::fwd ? b[size_t(n * K + k)] : b[size_t(k * N + n)];
    };
    std::vector<double> d(size_t(M * N));
    coda::ref::gemm(layout, M, N, K, a.data(), b.data(), d.data());
    int64_t differing = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += a_at(m, k) * b_at(k, n);
        differing += acc != d[size_t(m * N + n)];
      }
    EXPECT_EQ(differing, 0) << "layout " << int(layout);
  }
}

TEST(ReferenceGemm, IdentityAndTransposeIdentities) {
  uint64_t seed = coda::test::test_seed() + 200;
  const int64_t M = 13, K = 9, N = 6;
  const auto a = random_doubles(size_t(M * K), seed++);
  std::vector<double> eye(size_t(K * K), 0.0);
  for (int64_t i = 0; i < K; ++i) eye[size_t(i * K + i)] = 1.0;
  std::vector<double> d(size_t(M * K), NAN);
  for (Layout layout : {Layout::fwd, Layout::dgrad}) {
    coda::ref::gemm(layout, M, K, K, a.data(), eye.data(), d.data());
    EXPECT_EQ(d, a) << "A * I must be A (layout " << int(layout) << ")";
  }
  // (A Bᵀ)ᵀ = B Aᵀ.
  const auto b = random_doubles(size_t(N * K), seed++);
  std::vector<double> ab(size_t(M * N), NAN), ba(size_t(N * M), NAN);
  coda::ref::gemm(Layout::fwd, M, N, K, a.data(), b.data(), ab.data());
  coda::ref::gemm(Layout::fwd, N, M, K, b.data(), a.data(), ba.data());
  EXPECT_LE(coda::test::max_rel_error(transpose(ab, M, N), ba), 1e-14);
  // K = 1 is an outer product.
  std::vector<double> outer(size_t(M * N), NAN);
  coda::ref::gemm(Layout::fwd, M, N, 1, a.data(), b.data(), outer.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      ASSERT_EQ(outer[size_t(m * N + n)], a[size_t(m)] * b[size_t(n)]);
}

TEST(ReferenceGemm, EmptyReductionGivesZerosAndEmptyOutputIsUntouched) {
  std::vector<double> d(6, NAN);
  coda::ref::gemm(Layout::fwd, 2, 3, 0, nullptr, nullptr, d.data());
  for (double v : d) EXPECT_EQ(v, 0.0);
  coda::ref::gemm(Layout::wgrad, 0, 3, 4, nullptr, nullptr, nullptr); // must not touch memory
  std::vector<float> f(6, NAN);
  coda::ref::gemm_fp32(Layout::dgrad, 2, 3, 0, nullptr, nullptr, f.data());
  for (float v : f) EXPECT_EQ(v, 0.0f);
}

// Sequential fp32 summation of K products errs by at most about K * 2^-24 * sum_k |a_k b_k|
// (Higham's gamma_K bound, plus one rounding per product); the inputs are exact in both.
TEST(ReferenceGemm, Fp32AccumulationWithinClassicalBound) {
  uint64_t seed = coda::test::test_seed() + 300;
  for (const Shape& s : kShapes) {
    for (Layout layout : {Layout::fwd, Layout::dgrad, Layout::wgrad}) {
      const auto a32 = coda::test::random_vector<float>(size_t(s.M * s.K), seed++);
      const auto b32 = coda::test::random_vector<float>(size_t(s.N * s.K), seed++);
      const auto a = coda::test::to_double(a32), b = coda::test::to_double(b32);
      std::vector<double> d64(size_t(s.M * s.N), NAN), abs_sum(d64.size(), NAN);
      std::vector<float> d32(d64.size(), NAN);
      std::vector<double> a_abs(a.size()), b_abs(b.size());
      for (size_t i = 0; i < a.size(); ++i) a_abs[i] = std::fabs(a[i]);
      for (size_t i = 0; i < b.size(); ++i) b_abs[i] = std::fabs(b[i]);
      coda::ref::gemm(layout, s.M, s.N, s.K, a.data(), b.data(), d64.data());
      coda::ref::gemm(layout, s.M, s.N, s.K, a_abs.data(), b_abs.data(), abs_sum.data());
      coda::ref::gemm_fp32(layout, s.M, s.N, s.K, a32.data(), b32.data(), d32.data());
      const double unit = std::ldexp(1.0, -24);
      for (size_t i = 0; i < d64.size(); ++i) {
        const double bound = double(s.K + 1) * unit * abs_sum[i] * 1.01;
        ASSERT_LE(std::fabs(double(d32[i]) - d64[i]), bound) << "index " << i;
      }
    }
  }
}

} // namespace
