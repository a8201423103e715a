// References of the named CODA kernels: plain loops, one rounding policy for both the fp64 ground
// truth and the unfused low-precision path (kernels.hpp says where each path rounds).
#include "reference/kernels.hpp"

#include "reference/gemm.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace coda::ref {
namespace {

size_t at(int64_t i) { return size_t(i); }

void expect_size(const char* kernel, const char* what, const std::vector<double>& v,
                 int64_t expected) {
  if (int64_t(v.size()) != expected)
    throw std::invalid_argument(std::string(kernel) + ": " + what + " has " +
                                std::to_string(v.size()) + " elements, expected " +
                                std::to_string(expected));
}

// Width P of an [M, P] partials matrix (at least 1 column).
int64_t partials_width(const char* kernel, const std::vector<double>& partials, int64_t M) {
  if (M <= 0) return 0;
  const int64_t width = int64_t(partials.size()) / M;
  if (width < 1 || width * M != int64_t(partials.size()))
    throw std::invalid_argument(std::string(kernel) + ": partials must be [M, P] with P >= 1");
  return width;
}

// A running sum as the path accumulates it: fp64 for the ground truth; otherwise fp32, each term
// and each partial sum rounded to fp32 as a kernel's fp32 accumulator holds them.
class Sum {
public:
  explicit Sum(Rounding r) : fp32_(!r.exact()) {}
  void add(double term) {
    value_ = fp32_ ? double(float(value_ + double(float(term)))) : value_ + term;
  }
  double value() const { return value_; }

private:
  bool fp32_;
  double value_ = 0;
};

// out[m, b] = sum_{n in block b} term(m, n), statistics of the path.
template <class Term>
std::vector<double> row_partials(Rounding r, int64_t M, int64_t N, int64_t block, Term term) {
  const int64_t blocks = partial_blocks(N, block);
  std::vector<double> out(at(M * blocks));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      Sum sum(r);
      for (int64_t n = b * block; n < std::min(N, (b + 1) * block); ++n) sum.add(term(m, n));
      out[at(m * blocks + b)] = sum.value();
    }
  return out;
}

// out[n, b] = sum_{m in block b} term(m, n).
template <class Term>
std::vector<double> col_partials(Rounding r, int64_t M, int64_t N, int64_t block, Term term) {
  return row_partials(r, N, M, block, [&](int64_t n, int64_t m) { return term(m, n); });
}

// The GEMM as the path computes it: fp64, or fp32 accumulation with a rounded output.
std::vector<double> matmul(Rounding r, Layout layout, int64_t M, int64_t N, int64_t K,
                           const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(at(M * N));
  linear(r, layout, M, N, K, a.data(), b.data(), d.data());
  return d;
}

// rstd and z = rstd[m] * (a · wᵀ) of the normalized GEMMs (K1, K2, K4, K5). In low precision
// at the kernels' rounding points (ARCHITECTURE section 7): fp32 accumulation, z rounded once
// (rstd scales the fp32 accumulator, as every schedule's epilogue does), and the ops after it
// read z as stored. (Rounding the GEMM output before the scale, as this reference once did,
// models a path the kernels never take; with SiLU's sensitivity to its input, up to 4x near
// g = -5, the two paths' errors differ at random by more than the 2x rule allows on small
// outputs: 48 of 400 seeds on the CPU suites, 2026-12-01.)
struct NormedGemm {
  std::vector<double> z, rstd;
};
std::vector<double> fp32_accumulated(Rounding r, int64_t M, int64_t N, int64_t K,
                                     const std::vector<double>& a, const std::vector<double>& w,
                                     Layout layout = Layout::fwd) {
  if (r.exact()) return matmul(r, layout, M, N, K, a, w);
  std::vector<float> a32(a.size()), w32(w.size()), d32(at(M * N));
  for (size_t i = 0; i < a.size(); ++i) a32[i] = float(r(a[i]));
  for (size_t i = 0; i < w.size(); ++i) w32[i] = float(r(w[i]));
  gemm_fp32(layout, M, N, K, a32.data(), w32.data(), d32.data());
  return std::vector<double>(d32.begin(), d32.end());
}
// a · w: the hardware product where one is given (NormedGemmInputs::product; the exact path
// takes it as exact), else fp32_accumulated (in fp64 on the exact path).
std::vector<double> product_or_sum(Rounding r, const char* kernel,
                                   const std::vector<double>& product, int64_t M, int64_t N,
                                   int64_t K, const std::vector<double>& a,
                                   const std::vector<double>& w, Layout layout = Layout::fwd) {
  if (product.empty()) return fp32_accumulated(r, M, N, K, a, w, layout);
  expect_size(kernel, "product", product, M * N);
  return product;
}
NormedGemm normed_gemm(Rounding r, const char* kernel, const NormedGemmInputs& in) {
  expect_size(kernel, "a", in.a, in.M * in.K);
  expect_size(kernel, "w", in.w, in.N * in.K);
  NormedGemm out;
  out.rstd = rstd_from_partials(r, in.M, in.sumsq_partials, in.K, in.eps);
  out.z = product_or_sum(r, kernel, in.product, in.M, in.N, in.K, in.a, in.w);
  for (int64_t m = 0; m < in.M; ++m)
    for (int64_t n = 0; n < in.N; ++n) {
      double& z = out.z[at(m * in.N + n)];
      z = r(out.rstd[at(m)] * z);
    }
  return out;
}

// Interleaved pairs (x0, y0, x1, y1, ...) [M, 2F] <-> separate x, y [M, F].
void split_pairs(const std::vector<double>& pairs, std::vector<double>& x, std::vector<double>& y) {
  x.resize(pairs.size() / 2);
  y.resize(pairs.size() / 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] = pairs[2 * i], y[i] = pairs[2 * i + 1];
}
std::vector<double> join_pairs(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> pairs(2 * x.size());
  for (size_t i = 0; i < x.size(); ++i) pairs[2 * i] = x[i], pairs[2 * i + 1] = y[i];
  return pairs;
}

// log sum exp over [begin, end), as the path computes it (fp32 sum of exponentials unfused).
double logsumexp(Rounding r, const double* begin, const double* end) {
  const double max = *std::max_element(begin, end);
  Sum sum(r);
  for (const double* x = begin; x != end; ++x) sum.add(std::exp(x[0] - max));
  return r.stat(max + std::log(sum.value()));
}

} // namespace

std::vector<double> gemm(Rounding r, const GemmInputs& in) {
  expect_size("gemm", "a", in.a, in.M * in.K);
  expect_size("gemm", "b", in.b, in.K * in.N);
  if (!in.c.empty()) expect_size("gemm", "c", in.c, in.M * in.N);
  // The accumulator: fp64, or fp32 that is not rounded before the epilogue.
  const Rounding accumulate = r.exact() ? r : Rounding{Rounding::Kind::f32};
  std::vector<double> d = matmul(accumulate, in.layout, in.M, in.N, in.K, in.a, in.b);
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = r(in.alpha * d[i] + (in.c.empty() ? 0.0 : in.beta * in.c[i]));
  return d;
}

ResidualRmsOutputs residual_rms(Rounding r, const ResidualRmsInputs& in) {
  const int64_t M = in.M, N = in.N;
  expect_size("residual_rms", "a", in.a, M * in.K);
  expect_size("residual_rms", "w", in.w, N * in.K);
  expect_size("residual_rms", "residual", in.residual, M * N);
  expect_size("residual_rms", "gamma", in.gamma, N);
  ResidualRmsOutputs out;
  // The GEMM's output rounded once (matmul's rounding of the same fp32 sum).
  out.out = product_or_sum(r, "residual_rms", in.product, M, N, in.K, in.a, in.w);
  for (double& v : out.out) v = r(v);
  add(r, M * N, out.out.data(), in.residual.data(), out.out.data());
  const std::vector<double>& x = out.out;
  out.out_scaled.resize(at(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      out.out_scaled[at(m * N + n)] = r(x[at(m * N + n)] * in.gamma[at(n)]);
  out.sumsq_partials = row_partials(r, M, N, in.block, [&](int64_t m, int64_t n) {
    const double v = x[at(m * N + n)];
    return v * v;
  });
  return out;
}

RmsScaleOutputs rms_scale(Rounding r, const NormedGemmInputs& in) {
  NormedGemm z = normed_gemm(r, "rms_scale", in);
  return {std::move(z.z), std::move(z.rstd)};
}

RmsGatedOutputs rms_gated(Rounding r, const NormedGemmInputs& in, double (*activation)(double)) {
  if (in.N % 2 != 0) throw std::invalid_argument("rms_gated: N must be even (2F)");
  NormedGemm z = normed_gemm(r, "rms_gated", in);
  std::vector<double> gate, up;
  split_pairs(z.z, gate, up);
  RmsGatedOutputs out;
  out.act.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out.act[i] = r(activation(gate[i]) * up[i]);
  out.preact = std::move(z.z);
  out.rstd = std::move(z.rstd);
  return out;
}

RmsRopeOutputs rms_rope(Rounding r, const NormedGemmInputs& in, const RopeTable& rope) {
  if (in.N != rope.shape.width()) throw std::invalid_argument("rms_rope: N != rope width");
  if (int64_t(rope.positions.size()) != in.M) throw std::invalid_argument("rms_rope: positions");
  expect_size("rms_rope", "inv_freq", rope.inv_freq, rope.shape.head_dim / 2);
  NormedGemm z = normed_gemm(r, "rms_rope", in);
  RmsRopeOutputs out;
  out.out.resize(z.z.size());
  rope_forward(r, in.M, rope.shape, rope.positions.data(), rope.inv_freq.data(), z.z.data(),
               out.out.data());
  out.rstd = std::move(z.rstd);
  return out;
}

std::vector<double> lse_row_partials(Rounding r, int64_t M, int64_t N, const std::vector<double>& x,
                                     int64_t block) {
  expect_size("lse_row_partials", "x", x, M * N);
  const int64_t blocks = partial_blocks(N, block);
  std::vector<double> out(at(M * blocks));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const double* row = x.data() + m * N;
      out[at(m * blocks + b)] = logsumexp(r, row + b * block, row + std::min(N, (b + 1) * block));
    }
  return out;
}

RmsLseOutputs rms_lse(Rounding r, const NormedGemmInputs& in, const std::vector<int32_t>& targets,
                      int64_t block) {
  if (int64_t(targets.size()) != in.M) throw std::invalid_argument("rms_lse: targets must be [M]");
  NormedGemm z = normed_gemm(r, "rms_lse", in);
  RmsLseOutputs out;
  out.lse_partials = lse_row_partials(r, in.M, in.N, z.z, block);
  out.target_logit.assign(at(in.M), 0.0);
  for (int64_t m = 0; m < in.M; ++m)
    if (targets[at(m)] >= 0 && targets[at(m)] < in.N)
      out.target_logit[at(m)] = z.z[at(m * in.N + targets[at(m)])];
  out.logits = std::move(z.z);
  out.rstd = std::move(z.rstd);
  return out;
}

RmsBackwardOutputs rms_backward(Rounding r, const RmsBackwardInputs& in) {
  const int64_t M = in.M, N = in.N;
  expect_size("rms_backward", "dz", in.dz, M * in.K);
  expect_size("rms_backward", "w", in.w, in.K * N);
  expect_size("rms_backward", "x", in.x, M * N);
  expect_size("rms_backward", "rstd", in.rstd, M);
  expect_size("rms_backward", "zeta", in.zeta, M);
  expect_size("rms_backward", "gamma", in.gamma, N);
  if (in.accumulate) expect_size("rms_backward", "dx_in", in.dx_in, M * N);

  // g = alpha dz · w rounded once, after the scale (fp32 accumulation; K6's Stage, and a dgrad
  // GEMM with alpha in its epilogue): rounding the GEMM output and then the scaled value, as
  // this reference once did, models a path the kernel never takes, and the two paths' errors
  // differ at random by more than the 2x rule allows on small outputs (141 of 24000 runs of
  // Kernels/RmsBackward, all M = 1, N = 8; 2026-12-04).
  std::vector<double> g =
      product_or_sum(r, "rms_backward", in.product, M, N, in.K, in.dz, in.w, Layout::dgrad);
  scale(r, M * N, in.alpha, g.data(), g.data());
  RmsBackwardOutputs out;
  out.dx.resize(at(M * N));
  out.h_hat.resize(at(M * N));
  for (int64_t m = 0; m < M; ++m) {
    const double rstd = in.rstd[at(m)], zeta = in.zeta[at(m)];
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = at(m * N + n);
      const double xh = in.x[i] * rstd;
      const double result = r(rstd * (g[i] * in.gamma[at(n)] - xh * zeta));
      out.dx[i] = in.accumulate ? r(in.dx_in[i] + result) : result;
      out.h_hat[i] = r(xh * in.gamma[at(n)]);
    }
  }
  out.dgamma_partials = col_partials(r, M, N, in.block, [&](int64_t m, int64_t n) {
    return g[at(m * N + n)] * in.x[at(m * N + n)] * in.rstd[at(m)];
  });
  return out;
}

SwigluBackwardOutputs swiglu_backward(Rounding r, const SwigluBackwardInputs& in) {
  const int64_t M = in.M, F = in.F;
  expect_size("swiglu_backward", "dx", in.dx, M * in.K);
  expect_size("swiglu_backward", "w", in.w, in.K * F);
  expect_size("swiglu_backward", "preact", in.preact, M * 2 * F);
  // dy: the GEMM's output rounded once (matmul's rounding of the same fp32 sum).
  std::vector<double> dy =
      product_or_sum(r, "swiglu_backward", in.product, M, F, in.K, in.dx, in.w, Layout::dgrad);
  for (double& v : dy) v = r(v);
  std::vector<double> gate, up;
  split_pairs(in.preact, gate, up);
  std::vector<double> dgate(gate.size()), dup(gate.size());
  swiglu_backward(r, M, F, gate.data(), up.data(), dy.data(), dgate.data(), dup.data());
  SwigluBackwardOutputs out;
  out.act.resize(gate.size());
  swiglu_forward(r, M, F, gate.data(), up.data(), out.act.data());
  out.zeta_partials = row_partials(r, M, F, in.block, [&](int64_t m, int64_t j) {
    const size_t i = at(m * F + j);
    return gate[i] * dgate[i] + up[i] * dup[i];
  });
  out.dpreact = join_pairs(dgate, dup);
  return out;
}

RmsStatsOutputs rms_stats(Rounding r, int64_t M, int64_t N, const std::vector<double>& x,
                          const std::vector<double>& gamma, int64_t block) {
  expect_size("rms_stats", "x", x, M * N);
  expect_size("rms_stats", "gamma", gamma, N);
  RmsStatsOutputs out;
  out.out_scaled.resize(at(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      out.out_scaled[at(m * N + n)] = r(x[at(m * N + n)] * gamma[at(n)]);
  out.sumsq_partials = row_partials(
      r, M, N, block, [&](int64_t m, int64_t n) { return x[at(m * N + n)] * x[at(m * N + n)]; });
  return out;
}

std::vector<double> rstd_from_partials(Rounding r, int64_t M, const std::vector<double>& partials,
                                       int64_t n, double eps) {
  const int64_t P = partials_width("rstd_from_partials", partials, M);
  std::vector<double> rstd(at(std::max<int64_t>(M, 0)));
  for (int64_t m = 0; m < M; ++m) {
    Sum sum(r);
    for (int64_t p = 0; p < P; ++p) sum.add(partials[at(m * P + p)]);
    rstd[at(m)] = r.stat(1.0 / std::sqrt(sum.value() / double(n) + eps));
  }
  return rstd;
}

std::vector<double> reduce_row_partials(Rounding r, int64_t M, const std::vector<double>& partials,
                                        double scale) {
  const int64_t P = partials_width("reduce_row_partials", partials, M);
  std::vector<double> out(at(std::max<int64_t>(M, 0)));
  for (int64_t m = 0; m < M; ++m) {
    Sum sum(r);
    for (int64_t p = 0; p < P; ++p) sum.add(partials[at(m * P + p)]);
    out[at(m)] = r.stat(scale * sum.value());
  }
  return out;
}

std::vector<double> reduce_col_partials(Rounding r, int64_t N, const std::vector<double>& partials,
                                        bool accumulate, const std::vector<double>& out_in) {
  const int64_t P = partials_width("reduce_col_partials", partials, N);
  if (accumulate) expect_size("reduce_col_partials", "out_in", out_in, N);
  std::vector<double> out(at(std::max<int64_t>(N, 0)));
  for (int64_t n = 0; n < N; ++n) {
    Sum sum(r);
    for (int64_t p = 0; p < P; ++p) sum.add(partials[at(n * P + p)]);
    out[at(n)] = accumulate ? r(out_in[at(n)] + r(sum.value())) : r(sum.value());
  }
  return out;
}

RopeBackwardOutputs rope_backward(Rounding r, int64_t M, const RopeTable& rope,
                                  const std::vector<double>& dqkv, const std::vector<double>& qkv,
                                  double scale) {
  const int64_t width = rope.shape.width();
  expect_size("rope_backward", "dqkv", dqkv, M * width);
  expect_size("rope_backward", "qkv", qkv, M * width);
  expect_size("rope_backward", "inv_freq", rope.inv_freq, rope.shape.head_dim / 2);
  if (int64_t(rope.positions.size()) != M) throw std::invalid_argument("rope_backward: positions");
  RopeBackwardOutputs out;
  out.dz.resize(dqkv.size());
  rope_backward(r, M, rope.shape, rope.positions.data(), rope.inv_freq.data(), dqkv.data(),
                out.dz.data());
  out.zeta.resize(at(M));
  for (int64_t m = 0; m < M; ++m) {
    Sum sum(r);
    for (int64_t n = 0; n < width; ++n) sum.add(qkv[at(m * width + n)] * dqkv[at(m * width + n)]);
    out.zeta[at(m)] = r.stat(scale * sum.value());
  }
  return out;
}

namespace {

// lse[m] from K5's partials (the fused kernel's input) or, in the unfused path, from the logits.
std::vector<double> cross_entropy_lse(Rounding r, const CrossEntropyInputs& in) {
  std::vector<double> lse(at(in.M));
  if (!r.exact()) {
    for (int64_t m = 0; m < in.M; ++m)
      lse[at(m)] = logsumexp(r, in.logits.data() + m * in.V, in.logits.data() + (m + 1) * in.V);
    return lse;
  }
  const int64_t P = partials_width("cross_entropy", in.lse_partials, in.M);
  for (int64_t m = 0; m < in.M; ++m)
    lse[at(m)] = logsumexp(r, in.lse_partials.data() + m * P, in.lse_partials.data() + (m + 1) * P);
  return lse;
}

} // namespace

CrossEntropyOutputs cross_entropy(Rounding r, const CrossEntropyInputs& in) {
  const int64_t M = in.M, V = in.V;
  expect_size("cross_entropy", "logits", in.logits, M * V);
  expect_size("cross_entropy", "target_logit", in.target_logit, M);
  if (int64_t(in.targets.size()) != M) throw std::invalid_argument("cross_entropy: targets");
  int64_t valid = 0;
  for (int32_t t : in.targets) {
    if (t == in.ignore_index) continue;
    if (t < 0 || t >= V)
      throw std::invalid_argument("cross_entropy: target " + std::to_string(t) + " outside [0, V)");
    ++valid;
  }
  const std::vector<double> lse = cross_entropy_lse(r, in);
  CrossEntropyOutputs out;
  out.dlogits.assign(at(M * V), 0.0);
  out.zeta.assign(at(M), 0.0);
  Sum total(r);
  for (int64_t m = 0; m < M; ++m) {
    const int32_t t = in.targets[at(m)];
    if (t == in.ignore_index) continue;
    // The fused path reads the target logit K5 kept in fp32; the unfused one the rounded logit.
    const double target = r.exact() ? in.target_logit[at(m)] : in.logits[at(m * V + t)];
    total.add(r.stat(lse[at(m)] - target));
    Sum zeta(r);
    for (int64_t n = 0; n < V; ++n) {
      const size_t i = at(m * V + n);
      out.dlogits[i] = r(std::exp(in.logits[i] - lse[at(m)]) - (n == t ? 1.0 : 0.0));
      zeta.add(in.logits[i] * out.dlogits[i]);
    }
    out.zeta[at(m)] = zeta.value();
  }
  const bool mean = in.reduction == Reduction::mean;
  out.grad_scale = mean ? (valid > 0 ? r.stat(1.0 / double(valid)) : 0.0) : 1.0;
  out.loss = r.stat(total.value() * (mean ? out.grad_scale : 1.0));
  return out;
}

} // namespace coda::ref
