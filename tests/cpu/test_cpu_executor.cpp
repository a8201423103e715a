// The CPU backend called directly (cpu::, so that tiles other than the public kReduceBlock can be
// asked for): the partial-reduction layouts of the tile executor on ragged shapes, and every
// output element of every backend function against its formula of coda/kernels/args.hpp written
// out here in fp64 on tiny shapes. Outputs start as NaN (HostTensor), so an element the backend
// forgets fails, and guard bytes catch writes past an output's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "coda/core/error.hpp"
#include "cpu/backend.hpp"
#include "reference/gemm.hpp"
#include "tests/common/check.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace {

using namespace coda;
using test::HostTensor;

// One rounding of the exact value to dtype (half an ulp, relative) plus `slack` for the fp32
// arithmetic before it.
double rounding_bound(DType dtype, double exact, double slack) {
  const double half_ulp = dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0x1p-24;
  return half_ulp * std::fabs(exact) + slack;
}

// `extra[i]` (optional) widens element i's bound: the error an earlier rounding of the math
// carries into it (K2's act and K4's RoPE take z rounded to the 16-bit type, as stored).
void expect_close(const std::string& what, const HostTensor& out, const std::vector<double>& exact,
                  double slack, const std::vector<double>& extra = {}) {
  ASSERT_TRUE(out.guard_intact()) << what << ": written past its end";
  const std::vector<double> got = out.values();
  ASSERT_EQ(got.size(), exact.size()) << what;
  ASSERT_TRUE(extra.empty() || extra.size() == exact.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size() && reported < 5; ++i) {
    const double bound =
        rounding_bound(out.dtype(), exact[i], slack) + (extra.empty() ? 0.0 : extra[i]);
    if (!(std::fabs(got[i] - exact[i]) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", expected " << exact[i] << " +- "
                    << bound << " (seed " << test::test_seed() << ")";
      ++reported;
    }
  }
}

std::vector<double> gemm_exact(ref::Layout layout, const HostTensor& a, const HostTensor& b,
                               int64_t m, int64_t n, int64_t k) {
  std::vector<double> d(static_cast<size_t>(m * n));
  const std::vector<double> av = a.values(), bv = b.values();
  ref::gemm(layout, m, n, k, av.data(), bv.data(), d.data());
  return d;
}

// rstd[i] = 1 / sqrt(sum_b partials[i, b] / width + eps).
std::vector<double> rstd_exact(const HostTensor& partials, int64_t width, double eps) {
  const int64_t m = partials.shape()[0], p = partials.shape()[1];
  const std::vector<double> v = partials.values();
  std::vector<double> rstd(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t b = 0; b < p; ++b) sum += v[size_t(i * p + b)];
    rstd[size_t(i)] = 1 / std::sqrt(sum / double(width) + eps);
  }
  return rstd;
}

// Block reductions of x [rows, cols] over columns: out[r, b] = reduce of x[r, b*block ...].
template <class Reduce>
std::vector<double> row_blocks(const std::vector<double>& x, int64_t rows, int64_t cols,
                               int64_t block, Reduce reduce) {
  const int64_t blocks = ceil_div(cols, block);
  std::vector<double> out(static_cast<size_t>(rows * blocks));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<double> part(x.begin() + r * cols + b * block,
                               x.begin() + r * cols + std::min(cols, (b + 1) * block));
      out[size_t(r * blocks + b)] = reduce(part);
    }
  return out;
}
double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double sumsq_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return s;
}
double logsumexp_of(const std::vector<double>& v) {
  const double max = *std::max_element(v.begin(), v.end());
  double s = 0;
  for (double x : v) s += std::exp(x - max);
  return max + std::log(s);
}

double sigmoid(double g) { return 1 / (1 + std::exp(-g)); }

// gamma_n = n u / (1 - n u), u = 2^-24: the relative error bound of n fp32 roundings in sequence
// (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
double gamma32(int64_t n) { return double(n) * 0x1p-24 / (1 - double(n) * 0x1p-24); }

// A bound on the fp32 error of the block sums of squares of v = acc + residual that the backend
// computes (tile.n columns a block): acc accumulates k products in fp32 (error at most
// gamma_k sum_k |a w|, Higham 3.5) and the add rounds once, so v's error is dv <= gamma_k S + u|v|;
// each square then errs by at most 2|v| dv + dv^2 + u v^2, and the block's fp32 sum of `count`
// squares adds gamma_(count - 1) sum v^2 (Higham 4.2). The fixed 1e-4 this replaces was exceeded
// by a correct fp32 sum of 128 squares near 600 (error 1.4e-4) at CODA_TEST_SEED=505, 1 of 1000
// seeds (tools/seed_sweep.sh, 2026-12-02); a misplaced element moves a block by O(1).
std::vector<double> sumsq_partial_bounds(const std::vector<double>& v, const std::vector<double>& s,
                                         int64_t rows, int64_t cols, int64_t block, int64_t k) {
  std::vector<double> term(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double dv = gamma32(k) * s[i] + 0x1p-24 * std::fabs(v[i]);
    term[i] = 2 * std::fabs(v[i]) * dv + dv * dv + 0x1p-24 * v[i] * v[i];
  }
  std::vector<double> bound = row_blocks(term, rows, cols, block, sum_of);
  const std::vector<double> sums = row_blocks(v, rows, cols, block, sumsq_of);
  for (size_t i = 0; i < bound.size(); ++i) bound[i] += gamma32(block - 1) * sums[i];
  return bound;
}

// sum_k |a[m, k] w[n, k]|: the scale of the fp32 GEMM's accumulation error.
std::vector<double> abs_gemm(const HostTensor& a, const HostTensor& w, int64_t m, int64_t n,
                             int64_t k) {
  std::vector<double> av = a.values(), wv = w.values(), s(static_cast<size_t>(m * n));
  for (double& x : av) x = std::fabs(x);
  for (double& x : wv) x = std::fabs(x);
  ref::gemm(ref::Layout::fwd, m, n, k, av.data(), wv.data(), s.data());
  return s;
}

constexpr DType kDtypes[] = {DType::bf16, DType::f16};
const cpu::Tile kTiles[] = {{64, 32}, {128, 128}, {32, 8}};

// Row partials of K0: one entry per (row, column block of the tile), each the block's sum of
// squares of acc + residual, and all of a row's entries together the full-row sum.
TEST(CpuExecutor, RowPartialsFollowTheTile) {
  test::Seeds seeds;
  const int64_t m = 150, n = 200, k = 24;
  for (cpu::Tile tile : kTiles) {
    SCOPED_TRACE("tile " + std::to_string(tile.m) + "x" + std::to_string(tile.n));
    const int64_t blocks = ceil_div(n, tile.n);
    HostTensor a = HostTensor::random(DType::bf16, {m, k}, seeds.next());
    HostTensor w = HostTensor::random(DType::bf16, {n, k}, seeds.next());
    HostTensor residual = HostTensor::random(DType::bf16, {m, n}, seeds.next());
    HostTensor gamma = HostTensor::random(DType::bf16, {n}, seeds.next(), 0.5, 1.5);
    HostTensor out(DType::bf16, {m, n}), scaled(DType::bf16, {m, n});
    HostTensor partials(DType::f32, {m, blocks});
    cpu::gemm_residual_rms({a.view(), w.view(), residual.view(), gamma.view(), out.view(),
                            scaled.view(), partials.view()},
                           tile);
    std::vector<double> v = gemm_exact(ref::Layout::fwd, a, w, m, n, k);
    const std::vector<double> r = residual.values(), g = gamma.values();
    for (size_t i = 0; i < v.size(); ++i) v[i] += r[i];
    expect_close("partials", partials, row_blocks(v, m, n, tile.n, sumsq_of), 0,
                 sumsq_partial_bounds(v, abs_gemm(a, w, m, n, k), m, n, tile.n, k));
    const std::vector<double> got = partials.values();
    for (int64_t i = 0; i < m; ++i) {
      double row = 0, total = 0;
      for (int64_t b = 0; b < blocks; ++b) row += got[size_t(i * blocks + b)];
      for (int64_t j = 0; j < n; ++j) total += v[size_t(i * n + j)] * v[size_t(i * n + j)];
      EXPECT_NEAR(row, total, 1e-5 * total + 1e-4) << "row " << i;
    }
    std::vector<double> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = v[i] * g[i % size_t(n)];
    expect_close("out", out, v, 1e-5);
    expect_close("out_scaled", scaled, h, 1e-5);
  }
}

// LSE partials of K5: the block's logsumexp; merged over blocks, the row's.
TEST(CpuExecutor, LogSumExpPartialsFollowTheTile) {
  test::Seeds seeds;
  const int64_t m = 70, n = 90, k = 16;
  for (cpu::Tile tile : kTiles) {
    SCOPED_TRACE("tile " + std::to_string(tile.m) + "x" + std::to_string(tile.n));
    const int64_t blocks = ceil_div(n, tile.n);
    HostTensor a = HostTensor::random(DType::f16, {m, k}, seeds.next(), -2, 2);
    HostTensor w = HostTensor::random(DType::f16, {n, k}, seeds.next(), -2, 2);
    HostTensor sumsq = HostTensor::random(DType::f32, {m, 1}, seeds.next(), 4, 12);
    std::vector<int32_t> targets(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) targets[size_t(i)] = int32_t(i % 3 == 0 ? -100 : (i * 7) % n);
    HostTensor target = HostTensor::of_ints({m}, targets);
    HostTensor logits(DType::f16, {m, n}), lse(DType::f32, {m, blocks}), picked(DType::f32, {m}),
        rstd(DType::f32, {m});
    RmsLseArgs args{a.view(),      w.view(),   sumsq.view(),  1e-5f,      target.view(),
                    logits.view(), lse.view(), picked.view(), rstd.view()};
    cpu::gemm_rms_lse(args, tile);
    std::vector<double> l = gemm_exact(ref::Layout::fwd, a, w, m, n, k);
    const std::vector<double> rs = rstd_exact(sumsq, k, 1e-5);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) l[size_t(i * n + j)] *= rs[size_t(i)];
    expect_close("logits", logits, l, 1e-5);
    expect_close("rstd", rstd, rs, 1e-6);
    // The partials and the target logit are those of the logits as stored (args.hpp, K5).
    const std::vector<double> stored = logits.values();
    expect_close("lse_partials", lse, row_blocks(stored, m, n, tile.n, logsumexp_of), 1e-5);
    std::vector<double> target_exact(static_cast<size_t>(m)),
        row_lse = row_blocks(stored, m, n, n, logsumexp_of);
    const std::vector<double> got = lse.values();
    for (int64_t i = 0; i < m; ++i) {
      const int32_t t = targets[size_t(i)];
      target_exact[size_t(i)] = t < 0 ? 0.0 : stored[size_t(i * n + t)];
      std::vector<double> parts(got.begin() + i * blocks, got.begin() + (i + 1) * blocks);
      EXPECT_NEAR(logsumexp_of(parts), row_lse[size_t(i)], 1e-5) << "row " << i;
    }
    expect_close("target_logit", picked, target_exact, 1e-5);
  }
}

// Column partials of K6: one entry per (column, row block of the tile).
TEST(CpuExecutor, ColumnPartialsFollowTheTile) {
  test::Seeds seeds;
  const int64_t m = 150, n = 40, k = 24;
  for (cpu::Tile tile : kTiles) {
    SCOPED_TRACE("tile " + std::to_string(tile.m) + "x" + std::to_string(tile.n));
    const int64_t blocks = ceil_div(m, tile.m);
    HostTensor dz = HostTensor::random(DType::bf16, {m, k}, seeds.next());
    HostTensor w = HostTensor::random(DType::bf16, {k, n}, seeds.next());
    HostTensor x = HostTensor::random(DType::bf16, {m, n}, seeds.next(), -2, 2);
    HostTensor rstd = HostTensor::random(DType::f32, {m}, seeds.next(), 0.5, 2);
    HostTensor zeta = HostTensor::random(DType::f32, {m}, seeds.next());
    HostTensor gamma = HostTensor::random(DType::bf16, {n}, seeds.next(), 0.5, 1.5);
    HostTensor dx(DType::bf16, {m, n}), h_hat(DType::bf16, {m, n});
    HostTensor partials(DType::f32, {n, blocks});
    RmsBackwardArgs args{dz.view(), w.view(), x.view(),  rstd.view(),  zeta.view(),    gamma.view(),
                         {1.f, {}}, false,    dx.view(), h_hat.view(), partials.view()};
    cpu::gemm_rms_backward(args, tile);
    const std::vector<double> g = gemm_exact(ref::Layout::dgrad, dz, w, m, n, k);
    const std::vector<double> xv = x.values(), rv = rstd.values();
    std::vector<double> terms(g.size()); // g xh, transposed to [n, m] for row_blocks
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        terms[size_t(j * m + i)] = g[size_t(i * n + j)] * xv[size_t(i * n + j)] * rv[size_t(i)];
    expect_close("dgamma_partials", partials, row_blocks(terms, n, m, tile.m, sum_of), 1e-4);
  }
}

// K7's zeta partials: per block of the F pairs, sum of g dg + u du.
TEST(CpuExecutor, ZetaPartialsFollowTheTile) {
  test::Seeds seeds;
  const int64_t m = 70, f = 100, k = 16;
  for (cpu::Tile tile : kTiles) {
    SCOPED_TRACE("tile " + std::to_string(tile.m) + "x" + std::to_string(tile.n));
    // Multiples of 1/16: the fp32 GEMM is exact, so dy as K7 stores it is known here.
    auto sixteenths = [&](int64_t rows, int64_t cols) {
      std::vector<double> v = test::random_doubles(size_t(rows * cols), seeds.next(), -1, 1);
      for (double& x : v) x = std::round(x * 16) / 16;
      return HostTensor::of(DType::bf16, {rows, cols}, v);
    };
    HostTensor dxin = sixteenths(m, k);
    HostTensor w = sixteenths(k, f);
    HostTensor preact = HostTensor::random(DType::bf16, {m, 2 * f}, seeds.next(), -4, 4);
    HostTensor act(DType::bf16, {m, f}), dpreact(DType::bf16, {m, 2 * f});
    HostTensor partials(DType::f32, {m, ceil_div(f, tile.n)});
    cpu::gemm_swiglu_backward(
        {dxin.view(), w.view(), preact.view(), act.view(), dpreact.view(), partials.view()}, tile);
    // dy rounded as K7 stores it (its Stage), then fp64.
    std::vector<double> dy = gemm_exact(ref::Layout::dgrad, dxin, w, m, f, k);
    for (double& d : dy) d = double(round_to<bf16>(float(d)));
    const std::vector<double> z = preact.values();
    std::vector<double> act_exact(static_cast<size_t>(m * f)), dz(static_cast<size_t>(m * 2 * f)),
        terms(static_cast<size_t>(m * f));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < f; ++j) {
        const double g = z[size_t(i * 2 * f + 2 * j)], u = z[size_t(i * 2 * f + 2 * j + 1)];
        const double d = dy[size_t(i * f + j)], sig = sigmoid(g), s = g * sig;
        const double dg = d * u * sig * (1 + g * (1 - sig)), du = d * s;
        act_exact[size_t(i * f + j)] = s * u;
        dz[size_t(i * 2 * f + 2 * j)] = dg;
        dz[size_t(i * 2 * f + 2 * j + 1)] = du;
        terms[size_t(i * f + j)] = g * dg + u * du;
      }
    expect_close("zeta_partials", partials, row_blocks(terms, m, f, tile.n, sum_of), 1e-4);
    expect_close("act", act, act_exact, 1e-5);
    expect_close("dpreact", dpreact, dz, 1e-5);
  }
}

TEST(CpuExecutor, RejectsTilesAndPartialsThatDoNotFit) {
  const int64_t m = 10, n = 20, k = 8;
  HostTensor a = HostTensor::random(DType::bf16, {m, k}, 1),
             w = HostTensor::random(DType::bf16, {n, k}, 2);
  HostTensor residual = HostTensor::random(DType::bf16, {m, n}, 3);
  HostTensor gamma = HostTensor::random(DType::bf16, {n}, 4);
  HostTensor out(DType::bf16, {m, n}), scaled(DType::bf16, {m, n});
  HostTensor partials(DType::f32, {m, 1}); // right for 128-wide tiles, not for 8-wide ones
  const ResidualRmsArgs args{a.view(),   w.view(),      residual.view(), gamma.view(),
                             out.view(), scaled.view(), partials.view()};
  for (cpu::Tile tile : {cpu::Tile{64, 8}, cpu::Tile{0, 32}, cpu::Tile{64, 7}}) {
    try {
      cpu::gemm_residual_rms(args, tile);
      ADD_FAILURE() << "tile " << tile.m << "x" << tile.n << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    }
  }
  const std::vector<double> untouched = out.values();
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](double x) {
    return std::isnan(x);
  })) << "a rejected call writes nothing";
  cpu::gemm_residual_rms(args, {64, 32});
  EXPECT_FALSE(std::isnan(partials.values()[0]));
}

TEST(CpuKernels, GemmEveryLayoutAlphaBetaAndAliasedC) {
  test::Seeds seeds;
  const int64_t m = 37, n = 26, k = 19;
  for (DType in : kDtypes)
    for (DType out_type : {DType::bf16, DType::f16, DType::f32})
      for (GemmLayout layout : {GemmLayout::fwd, GemmLayout::dgrad, GemmLayout::wgrad}) {
        SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + dtype_name(out_type) + ", layout " +
                     std::to_string(int(layout)));
        const bool wgrad = layout == GemmLayout::wgrad, fwd = layout == GemmLayout::fwd;
        HostTensor a = HostTensor::random(
            in, wgrad ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, seeds.next());
        HostTensor b = HostTensor::random(
            in, fwd ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, seeds.next());
        const std::vector<double> acc = gemm_exact(ref::Layout(int(layout)), a, b, m, n, k);
        // C is D itself: D = 0.5 acc + 2 D_old.
        HostTensor d = HostTensor::random(out_type, {m, n}, seeds.next());
        const std::vector<double> d_old = d.values();
        GemmArgs args{layout, a.view(), b.view(), d.view(), d.view(), 0.5f, 2.f};
        cpu::gemm(args);
        std::vector<double> exact(acc.size());
        for (size_t i = 0; i < acc.size(); ++i) exact[i] = 0.5 * acc[i] + 2 * d_old[i];
        expect_close("D = alpha acc + beta C", d, exact, 1e-5);
        // No C, and beta = 0 with a NaN C: C is not read.
        HostTensor plain(out_type, {m, n}), nan_c(out_type, {m, n});
        cpu::gemm({layout, a.view(), b.view(), plain.view(), nan_c.view(), -1.f, 0.f});
        for (size_t i = 0; i < acc.size(); ++i) exact[i] = -acc[i];
        expect_close("D = -acc", plain, exact, 1e-5);
      }
}

TEST(CpuKernels, ResidualRmsWithOutputAliasingTheResidual) {
  test::Seeds seeds;
  const int64_t m = 9, n = 140, k = 12;
  for (DType t : kDtypes) {
    HostTensor a = HostTensor::random(t, {m, k}, seeds.next());
    HostTensor w = HostTensor::random(t, {n, k}, seeds.next());
    HostTensor stream = HostTensor::random(t, {m, n}, seeds.next()); // residual in, x_new out
    HostTensor gamma = HostTensor::random(t, {n}, seeds.next(), 0.5, 1.5);
    HostTensor scaled(t, {m, n}), partials(DType::f32, {m, num_reduce_blocks(n)});
    std::vector<double> v = gemm_exact(ref::Layout::fwd, a, w, m, n, k);
    const std::vector<double> r = stream.values(), g = gamma.values();
    for (size_t i = 0; i < v.size(); ++i) v[i] += r[i];
    cpu::gemm_residual_rms({a.view(), w.view(), stream.view(), gamma.view(), stream.view(),
                            scaled.view(), partials.view()});
    std::vector<double> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = v[i] * g[i % size_t(n)];
    expect_close("out (aliasing residual)", stream, v, 1e-5);
    expect_close("out_scaled", scaled, h, 1e-5);
    expect_close("sumsq_partials", partials, row_blocks(v, m, n, kReduceBlock, sumsq_of), 0,
                 sumsq_partial_bounds(v, abs_gemm(a, w, m, n, k), m, n, kReduceBlock, k));
  }
}

TEST(CpuKernels, RmsScaleAndRmsSwiglu) {
  test::Seeds seeds;
  const int64_t m = 11, f = 70, k = 20;
  for (DType t : kDtypes) {
    HostTensor a = HostTensor::random(t, {m, k}, seeds.next());
    HostTensor w = HostTensor::random(t, {2 * f, k}, seeds.next(), -2, 2);
    HostTensor sumsq = HostTensor::random(DType::f32, {m, 2}, seeds.next(), 1, 5);
    const std::vector<double> rs = rstd_exact(sumsq, k, 1e-6);
    std::vector<double> z = gemm_exact(ref::Layout::fwd, a, w, m, 2 * f, k);
    // z is rounded to t before SwiGLU (act from z as stored): up to half an ulp of it more.
    std::vector<double> dz(z.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < 2 * f; ++j) {
        const size_t at = size_t(i * 2 * f + j);
        z[at] *= rs[size_t(i)];
        dz[at] = rounding_bound(t, z[at], 1e-6);
      }

    HostTensor out(t, {m, 2 * f}), rstd(DType::f32, {m});
    cpu::gemm_rms_scale({a.view(), w.view(), sumsq.view(), 1e-6f, out.view(), rstd.view()});
    expect_close("K1 out", out, z, 1e-5);
    expect_close("K1 rstd", rstd, rs, 1e-6);

    HostTensor preact(t, {m, 2 * f}), act(t, {m, f}), rstd2(DType::f32, {m});
    cpu::gemm_rms_swiglu(
        {a.view(), w.view(), sumsq.view(), 1e-6f, preact.view(), act.view(), rstd2.view()});
    std::vector<double> y(static_cast<size_t>(m * f)), dy(y.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < f; ++j) {
        const size_t gi = size_t(i * 2 * f + 2 * j), ui = gi + 1;
        const double g = z[gi], u = z[ui], s = sigmoid(g);
        y[size_t(i * f + j)] = g * s * u;
        // |dy/dg| dg + |dy/du| du, dg and du the rounding errors of z (bounded with margin).
        dy[size_t(i * f + j)] =
            2 * (std::fabs(u * (s + g * s * (1 - s))) * dz[gi] + std::fabs(g * s) * dz[ui]);
      }
    expect_close("K2 preact", preact, z, 1e-5);
    expect_close("K2 act", act, y, 1e-5, dy);
    expect_close("K2 rstd", rstd2, rs, 1e-6);
  }
}

// out[m, head h, i] per the HF rotate-half rule on Q and K heads, V untouched.
std::vector<double> rope_exact(const std::vector<double>& z, int64_t m, int64_t n,
                               const std::vector<int32_t>& positions,
                               const std::vector<double>& inv_freq, int64_t head_dim,
                               int64_t rotated_cols, double sign) {
  std::vector<double> out = z;
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t head = 0; head < rotated_cols; head += head_dim)
      for (int64_t j = 0; j < half; ++j) {
        const double theta = sign * double(positions[size_t(i)]) * inv_freq[size_t(j)];
        const double a = z[size_t(i * n + head + j)], b = z[size_t(i * n + head + j + half)];
        out[size_t(i * n + head + j)] = a * std::cos(theta) - b * std::sin(theta);
        out[size_t(i * n + head + j + half)] = b * std::cos(theta) + a * std::sin(theta);
      }
  return out;
}

TEST(CpuKernels, RmsRopeGroupedQueryHeadsAtLargePositions) {
  test::Seeds seeds;
  const int64_t m = 13, k = 16;
  // (head_dim, q heads, kv heads): heads narrower, equal to and wider than the 128 tile.
  const int64_t configs[][3] = {{16, 4, 2}, {128, 2, 1}, {48, 3, 1}, {256, 1, 1}};
  for (DType t : kDtypes)
    for (const auto& c : configs) {
      const int64_t head_dim = c[0], hq = c[1], hkv = c[2], n = (hq + 2 * hkv) * head_dim;
      SCOPED_TRACE("head_dim " + std::to_string(head_dim));
      HostTensor a = HostTensor::random(t, {m, k}, seeds.next());
      HostTensor w = HostTensor::random(t, {n, k}, seeds.next());
      HostTensor sumsq = HostTensor::random(DType::f32, {m, 1}, seeds.next(), 4, 8);
      std::vector<int32_t> pos(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t(i == 0 ? 0 : 1000003 * i % 300000);
      HostTensor positions = HostTensor::of_ints({m}, pos);
      std::vector<double> freq(size_t(head_dim / 2));
      for (size_t j = 0; j < freq.size(); ++j)
        freq[j] = double(float(std::pow(10000.0, -2.0 * double(j) / double(head_dim))));
      HostTensor inv_freq = HostTensor::of(DType::f32, {head_dim / 2}, freq);
      HostTensor out(t, {m, n}), rstd(DType::f32, {m});
      RopeSpec spec{positions.view(), inv_freq.view(), int32_t(hq), int32_t(hkv),
                    int32_t(head_dim)};
      cpu::gemm_rms_rope({a.view(), w.view(), sumsq.view(), 1e-6f, spec, out.view(), rstd.view()});
      std::vector<double> z = gemm_exact(ref::Layout::fwd, a, w, m, n, k);
      const std::vector<double> rs = rstd_exact(sumsq, k, 1e-6);
      // RoPE turns z as stored (rounded to t): its rounding error, and the partner's that the
      // rotation mixes in (|cos|, |sin| <= 1).
      std::vector<double> dz(z.size()), dout(z.size());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = size_t(i * n + j);
          z[at] *= rs[size_t(i)];
          dz[at] = rounding_bound(t, z[at], 1e-6);
        }
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const int64_t in_head = j % head_dim, half = head_dim / 2;
          const int64_t partner = in_head < half ? j + half : j - half;
          dout[size_t(i * n + j)] = dz[size_t(i * n + j)] + dz[size_t(i * n + partner)];
        }
      expect_close("K4 out", out,
                   rope_exact(z, m, n, pos, freq, head_dim, (hq + hkv) * head_dim, 1), 2e-5, dout);
      expect_close("K4 rstd", rstd, rs, 1e-6);
    }
}

TEST(CpuKernels, RmsBackwardAccumulatesWithAScalarFromMemory) {
  test::Seeds seeds;
  const int64_t m = 20, n = 36, k = 10;
  for (DType t : kDtypes)
    for (bool accumulate : {false, true}) {
      HostTensor dz = HostTensor::random(t, {m, k}, seeds.next());
      HostTensor w = HostTensor::random(t, {k, n}, seeds.next());
      HostTensor x = HostTensor::random(t, {m, n}, seeds.next(), -2, 2);
      HostTensor rstd = HostTensor::random(DType::f32, {m}, seeds.next(), 0.5, 2);
      HostTensor zeta = HostTensor::random(DType::f32, {m}, seeds.next());
      HostTensor gamma = HostTensor::random(t, {n}, seeds.next(), 0.5, 1.5);
      HostTensor dloss = HostTensor::of(DType::f32, {1}, {0.25});
      HostTensor dx = HostTensor::random(t, {m, n}, seeds.next());
      HostTensor h_hat(t, {m, n}), partials(DType::f32, {n, 1});
      const std::vector<double> dx_old = dx.values();
      RmsBackwardArgs args{dz.view(),
                           w.view(),
                           x.view(),
                           rstd.view(),
                           zeta.view(),
                           gamma.view(),
                           {-2.f, dloss.view()},
                           accumulate,
                           dx.view(),
                           h_hat.view(),
                           partials.view()};
      cpu::gemm_rms_backward(args);
      std::vector<double> g = gemm_exact(ref::Layout::dgrad, dz, w, m, n, k);
      const std::vector<double> xv = x.values(), rv = rstd.values(), zv = zeta.values(),
                                gv = gamma.values();
      std::vector<double> dx_exact(g.size()), h_exact(g.size()), terms(size_t(n), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const size_t e = size_t(i * n + j);
          const double gg = -0.5 * g[e], xh = xv[e] * rv[size_t(i)];
          const double result = rv[size_t(i)] * (gg * gv[size_t(j)] - xh * zv[size_t(i)]);
          dx_exact[e] = accumulate ? dx_old[e] + result : result;
          h_exact[e] = xh * gv[size_t(j)];
          terms[size_t(j)] += gg * xh;
        }
      expect_close("dx", dx, dx_exact, 1e-5);
      expect_close("h_hat", h_hat, h_exact, 1e-5);
      expect_close("dgamma_partials", partials, terms, 1e-4);
    }
}

TEST(CpuKernels, RmsStatsAcceptsAnyPartialWidth) {
  test::Seeds seeds;
  const int64_t m = 5, n = 300;
  for (DType t : kDtypes)
    for (int64_t p : {int64_t(1), num_reduce_blocks(n), int64_t(2), int64_t(5)}) {
      SCOPED_TRACE("P = " + std::to_string(p));
      HostTensor x = HostTensor::random(t, {m, n}, seeds.next(), -3, 3);
      HostTensor gamma = HostTensor::random(t, {n}, seeds.next(), 0.5, 1.5);
      HostTensor h(t, {m, n}), partials(DType::f32, {m, p});
      cpu::rms_stats({x.view(), gamma.view(), h.view(), partials.view()});
      const std::vector<double> xv = x.values(), gv = gamma.values();
      std::vector<double> h_exact(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) h_exact[i] = xv[i] * gv[i % size_t(n)];
      expect_close("out_scaled", h, h_exact, 1e-6);
      const std::vector<double> got = partials.values();
      for (int64_t i = 0; i < m; ++i) {
        double row = 0;
        for (int64_t b = 0; b < p; ++b) row += got[size_t(i * p + b)];
        const std::vector<double> x_row(xv.begin() + i * n, xv.begin() + (i + 1) * n);
        EXPECT_NEAR(row, sumsq_of(x_row), 1e-5 * sumsq_of(x_row)) << "row " << i;
      }
      if (p == num_reduce_blocks(n)) // the documented layout: kReduceBlock-wide blocks
        expect_close("partials", partials, row_blocks(xv, m, n, kReduceBlock, sumsq_of), 1e-4);
    }
}

TEST(CpuKernels, PartialReductions) {
  test::Seeds seeds;
  const int64_t rows = 17, p = 3;
  HostTensor partials = HostTensor::random(DType::f32, {rows, p}, seeds.next(), 0, 10);
  const std::vector<double> pv = partials.values();
  std::vector<double> sums(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i)
    sums[size_t(i)] = pv[size_t(i * p)] + pv[size_t(i * p + 1)] + pv[size_t(i * p + 2)];

  HostTensor rstd(DType::f32, {rows});
  cpu::rstd_from_partials({partials.view(), 100, 1e-5f, rstd.view()});
  expect_close("rstd", rstd, rstd_exact(partials, 100, 1e-5), 1e-6);

  HostTensor zeta(DType::f32, {rows});
  cpu::reduce_row_partials({partials.view(), 0.125f, zeta.view()});
  std::vector<double> scaled(sums);
  for (double& s : scaled) s *= 0.125;
  expect_close("row sums", zeta, scaled, 1e-5);

  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    HostTensor dgamma = HostTensor::random(t, {rows}, seeds.next());
    const std::vector<double> old = dgamma.values();
    cpu::reduce_col_partials({partials.view(), true, dgamma.view()});
    std::vector<double> exact(sums);
    for (size_t i = 0; i < exact.size(); ++i) exact[i] += old[i];
    expect_close("column sums, accumulated", dgamma, exact, 1e-5);
    HostTensor fresh(t, {rows});
    cpu::reduce_col_partials({partials.view(), false, fresh.view()});
    expect_close("column sums", fresh, sums, 1e-5);
  }
}

TEST(CpuKernels, RopeBackwardIsTheInverseRotationWithZeta) {
  test::Seeds seeds;
  const int64_t m = 7, head_dim = 32, hq = 2, hkv = 1, n = (hq + 2 * hkv) * head_dim;
  std::vector<int32_t> pos(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t(40000 * i + 3);
  std::vector<double> freq(size_t(head_dim / 2));
  for (size_t j = 0; j < freq.size(); ++j)
    freq[j] = double(float(std::pow(10000.0, -2.0 * double(j) / head_dim)));
  HostTensor positions = HostTensor::of_ints({m}, pos);
  HostTensor inv_freq = HostTensor::of(DType::f32, {head_dim / 2}, freq);
  const RopeSpec spec{positions.view(), inv_freq.view(), int32_t(hq), int32_t(hkv),
                      int32_t(head_dim)};
  for (DType t : kDtypes) {
    HostTensor qkv = HostTensor::random(t, {m, n}, seeds.next());
    HostTensor grad = HostTensor::random(t, {m, n}, seeds.next()); // dqkv in, dz out (aliased)
    HostTensor zeta(DType::f32, {m});
    const std::vector<double> dq = grad.values(), q = qkv.values();
    cpu::rope_backward({grad.view(), qkv.view(), spec, 0.5f, grad.view(), zeta.view()});
    expect_close("dz", grad, rope_exact(dq, m, n, pos, freq, head_dim, (hq + hkv) * head_dim, -1),
                 2e-5);
    std::vector<double> zeta_exact(size_t(m), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        zeta_exact[size_t(i)] += 0.5 * q[size_t(i * n + j)] * dq[size_t(i * n + j)];
    expect_close("zeta", zeta, zeta_exact, 1e-5);
  }
}

TEST(CpuKernels, CrossEntropyLossGradientAndZeta) {
  test::Seeds seeds;
  const int64_t m = 6, v = 150;
  for (LossReduction reduction : {LossReduction::mean, LossReduction::sum}) {
    HostTensor logits = HostTensor::random(DType::bf16, {m, v}, seeds.next(), -4, 4);
    const std::vector<double> l = logits.values();
    const std::vector<int32_t> targets = {3, -100, 149, 0, -100, 77};
    // K5's outputs, from the stored logits here: fp32 LSE partials and target logits.
    HostTensor partials =
        HostTensor::of(DType::f32, {m, 2}, row_blocks(l, m, v, kReduceBlock, logsumexp_of));
    std::vector<double> picked(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i)
      picked[size_t(i)] = targets[size_t(i)] < 0 ? 0 : l[size_t(i * v + targets[size_t(i)])];
    HostTensor target_logit = HostTensor::of(DType::f32, {m}, picked);
    HostTensor target = HostTensor::of_ints({m}, targets);
    HostTensor loss(DType::f32, {1}), scale(DType::f32, {1}), zeta(DType::f32, {m});
    CrossEntropyArgs args;
    args.logits = logits.view(), args.lse_partials = partials.view();
    args.target_logit = target_logit.view(), args.targets = target.view();
    args.reduction = reduction;
    args.loss = loss.view(), args.dlogits = logits.view(), args.grad_scale = scale.view();
    args.zeta = zeta.view();
    cpu::cross_entropy(args);

    const std::vector<double> row_lse = row_blocks(l, m, v, v, logsumexp_of);
    std::vector<double> dl(l.size(), 0.0), zeta_exact(size_t(m), 0.0);
    double total = 0;
    int valid = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (targets[size_t(i)] == -100) continue;
      ++valid;
      total += row_lse[size_t(i)] - picked[size_t(i)];
      for (int64_t j = 0; j < v; ++j) {
        const size_t e = size_t(i * v + j);
        dl[e] = std::exp(l[e] - row_lse[size_t(i)]) - (j == targets[size_t(i)] ? 1 : 0);
        zeta_exact[size_t(i)] += l[e] * dl[e];
      }
    }
    const bool mean = reduction == LossReduction::mean;
    expect_close("loss", loss, {mean ? total / valid : total}, 1e-5);
    expect_close("grad_scale", scale, {mean ? 1.0 / valid : 1.0}, 0);
    expect_close("dlogits (aliasing logits)", logits, dl, 1e-6);
    expect_close("zeta", zeta, zeta_exact, 1e-4);
  }
}

TEST(CpuKernels, CrossEntropyRejectsATargetOutsideTheVocabularyBeforeWriting) {
  const int64_t m = 3, v = 10;
  HostTensor logits = HostTensor::random(DType::bf16, {m, v}, 5);
  HostTensor partials = HostTensor::random(DType::f32, {m, 1}, 6);
  HostTensor target_logit = HostTensor::random(DType::f32, {m}, 7);
  HostTensor target = HostTensor::of_ints({m}, {1, 10, 2});
  HostTensor loss(DType::f32, {1}), scale(DType::f32, {1}), zeta(DType::f32, {m}),
      dlogits(DType::bf16, {m, v});
  CrossEntropyArgs args;
  args.logits = logits.view(), args.lse_partials = partials.view();
  args.target_logit = target_logit.view(), args.targets = target.view();
  args.loss = loss.view(), args.dlogits = dlogits.view(), args.grad_scale = scale.view();
  args.zeta = zeta.view();
  try {
    cpu::cross_entropy(args);
    ADD_FAILURE() << "target 10 of a vocabulary of 10 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
  }
  const std::vector<double> d = dlogits.values();
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](double x) { return std::isnan(x); }));
  EXPECT_TRUE(std::isnan(loss.values()[0]));
}

} // namespace
