// The textbook block's hand-written backward against central finite differences of its forward,
// for every gradient of the three layer kinds, in fp64, at tiny sizes with GQA, a hidden size
// different from n_heads * head_dim (so a transposed weight cannot pass), and ragged M.
//
// Tolerance: central differences with step h = 1e-5 on O(1) inputs err by O(h^2 f''') ~ 1e-10
// (truncation) plus O(eps |L| / h) ~ 1e-11 (cancellation), relative to the largest gradient
// entry. kFdTolerance = 1e-6 leaves two orders of margin for curvature (silu, rsqrt, softmax)
// while a wrong or missing backward term shows up as an O(1e-2..1) relative error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "reference/llama.hpp"
#include "tests/common/check.hpp"

namespace {

using coda::ref::LlamaConfig;
using coda::ref::Matrix;
using coda::ref::Rounding;

constexpr double kFdTolerance = 1e-6;

struct Rng {
  std::mt19937_64 engine;
  explicit Rng(uint64_t seed) : engine(seed) {}
  Matrix uniform(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Matrix v(static_cast<size_t>(n));
    for (auto& x : v) x = dist(engine);
    return v;
  }
  // A weight [out, in] with entries of size 1/sqrt(in), so activations stay O(1).
  Matrix weight(int64_t out, int64_t in) {
    Matrix w = uniform(out * in);
    for (auto& x : w) x /= std::sqrt(double(in));
    return w;
  }
  Matrix norm(int64_t n) { return uniform(n, 0.5, 1.5); }
  std::vector<int32_t> integers(int64_t n, int32_t lo, int32_t hi) {
    std::uniform_int_distribution<int32_t> dist(lo, hi);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = dist(engine);
    return v;
  }
};

double dot(const Matrix& a, const Matrix& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d loss / d param by central differences; loss() reads param, which is perturbed in place.
Matrix fd_gradient(Matrix& param, const std::function<double()>& loss, double h = 1e-5) {
  Matrix grad(param.size());
  for (size_t i = 0; i < param.size(); ++i) {
    const double saved = param[i];
    param[i] = saved + h;
    const double up = loss();
    param[i] = saved - h;
    const double down = loss();
    param[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

void expect_gradient(const std::string& what, const Matrix& analytic, Matrix& param,
                     const std::function<double()>& loss) {
  ASSERT_EQ(analytic.size(), param.size()) << what;
  const double err = coda::test::max_rel_error(analytic, fd_gradient(param, loss));
  EXPECT_LE(err, kFdTolerance) << what << " (seed " << coda::test::test_seed() << ")";
}

struct Case {
  const char* name;
  LlamaConfig cfg;
  int64_t M;
  bool llama3_rope;
};
// hidden != n_heads * head_dim everywhere; GQA in the first two; M ragged.
const Case kCases[] = {
    {"gqa", {12, 10, 4, 2, 4, 11, 1e-5}, 3, false},
    {"gqa-llama3", {10, 7, 3, 1, 6, 9, 1e-6}, 5, true},
    {"mha-one-token", {6, 5, 2, 2, 2, 4, 1e-6}, 1, false},
};

struct Inputs {
  std::vector<int32_t> positions;
  Matrix inv_freq;
  coda::ref::RopeInputs rope() const { return {positions, inv_freq}; }
};

Inputs make_rope(const Case& c, Rng& rng) {
  Inputs in;
  in.positions = rng.integers(c.M, 0, 4000);
  in.inv_freq = c.llama3_rope ? coda::ref::rope_inv_freq_llama3(c.cfg.head_dim, 500000.0, {})
                              : coda::ref::rope_inv_freq(c.cfg.head_dim, 10000.0);
  return in;
}

TEST(ReferenceLlama, FirstLayerGradientsMatchFiniteDifferences) {
  uint64_t seed = coda::test::test_seed();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Rng rng(seed++);
    const LlamaConfig& cfg = c.cfg;
    const int64_t M = c.M, D = cfg.hidden, Nq = cfg.qkv_width();
    const Inputs rope = make_rope(c, rng);
    coda::ref::FirstWeights w{rng.norm(D), rng.weight(Nq, D)};
    Matrix x0 = rng.uniform(M * D);
    // The first layer's residual output is x0 itself: L = <Gx, x0> + <Gq, qkv>.
    const Matrix gx = rng.uniform(M * D), gq = rng.uniform(M * Nq);
    auto loss = [&] {
      const auto f = coda::ref::first_forward(cfg, w, rope.rope(), x0);
      return dot(gx, x0) + dot(gq, f.qkv);
    };
    const auto b = coda::ref::first_backward(cfg, w, rope.rope(), x0, gq, gx);
    expect_gradient("dx0", b.dx0, x0, loss);
    expect_gradient("d attn_norm", b.grads.attn_norm, w.attn_norm, loss);
    expect_gradient("d w_qkv", b.grads.w_qkv, w.w_qkv, loss);
  }
}

coda::ref::MiddleWeights random_middle(const LlamaConfig& cfg, Rng& rng) {
  const int64_t D = cfg.hidden, F = cfg.intermediate;
  return {rng.weight(D, cfg.attn_width()),
          rng.norm(D),
          rng.weight(F, D),
          rng.weight(F, D),
          rng.weight(D, F),
          rng.norm(D),
          rng.weight(cfg.qkv_width(), D)};
}

TEST(ReferenceLlama, MiddleLayerGradientsMatchFiniteDifferences) {
  uint64_t seed = coda::test::test_seed() + 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Rng rng(seed++);
    const LlamaConfig& cfg = c.cfg;
    const int64_t M = c.M, D = cfg.hidden;
    const Inputs rope = make_rope(c, rng);
    coda::ref::MiddleWeights w = random_middle(cfg, rng);
    Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
    const Matrix gx = rng.uniform(M * D), gq = rng.uniform(M * cfg.qkv_width());
    auto loss = [&] {
      const auto f = coda::ref::middle_forward(cfg, w, rope.rope(), x0, y0);
      return dot(gx, f.mlp.x2) + dot(gq, f.qkv);
    };
    const auto b = coda::ref::middle_backward(cfg, w, rope.rope(), x0, y0, gx, gq);
    expect_gradient("dx0", b.dx0, x0, loss);
    expect_gradient("dy0", b.dy0, y0, loss);
    expect_gradient("d w_o", b.grads.w_o, w.w_o, loss);
    expect_gradient("d ffn_norm", b.grads.ffn_norm, w.ffn_norm, loss);
    expect_gradient("d w_gate", b.grads.w_gate, w.w_gate, loss);
    expect_gradient("d w_up", b.grads.w_up, w.w_up, loss);
    expect_gradient("d w_down", b.grads.w_down, w.w_down, loss);
    expect_gradient("d next_attn_norm", b.grads.next_attn_norm, w.next_attn_norm, loss);
    expect_gradient("d w_qkv_next", b.grads.w_qkv_next, w.w_qkv_next, loss);
  }
}

coda::ref::LastWeights random_last(const LlamaConfig& cfg, Rng& rng) {
  const int64_t D = cfg.hidden, F = cfg.intermediate;
  return {rng.weight(D, cfg.attn_width()),
          rng.norm(D),
          rng.weight(F, D),
          rng.weight(F, D),
          rng.weight(D, F),
          rng.norm(D),
          rng.weight(cfg.vocab, D)};
}

TEST(ReferenceLlama, LastLayerGradientsMatchFiniteDifferences) {
  uint64_t seed = coda::test::test_seed() + 200;
  for (const Case& c : kCases) {
    for (auto reduction : {coda::ref::Reduction::mean, coda::ref::Reduction::sum}) {
      SCOPED_TRACE(std::string(c.name) +
                   (reduction == coda::ref::Reduction::mean ? " mean" : " sum"));
      Rng rng(seed++);
      const LlamaConfig& cfg = c.cfg;
      const int64_t M = c.M, D = cfg.hidden;
      coda::ref::LastWeights w = random_last(cfg, rng);
      Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
      std::vector<int32_t> targets = rng.integers(M, 0, int32_t(cfg.vocab - 1));
      if (M > 1) targets[1] = -100; // one ignored row
      const coda::ref::LossSpec spec{targets, -100, reduction};
      const double dloss = rng.uniform(1, 0.5, 2.0)[0];
      auto loss = [&] { return dloss * coda::ref::last_forward(cfg, w, x0, y0, spec).ce.loss; };
      const auto b = coda::ref::last_backward(cfg, w, x0, y0, spec, dloss);
      expect_gradient("dx0", b.dx0, x0, loss);
      expect_gradient("dy0", b.dy0, y0, loss);
      expect_gradient("d w_o", b.grads.w_o, w.w_o, loss);
      expect_gradient("d ffn_norm", b.grads.ffn_norm, w.ffn_norm, loss);
      expect_gradient("d w_gate", b.grads.w_gate, w.w_gate, loss);
      expect_gradient("d w_up", b.grads.w_up, w.w_up, loss);
      expect_gradient("d w_down", b.grads.w_down, w.w_down, loss);
      expect_gradient("d final_norm", b.grads.final_norm, w.final_norm, loss);
      expect_gradient("d w_lm", b.grads.w_lm, w.w_lm, loss);
    }
  }
}

// The intermediates the header documents are what they claim, and the middle layer's QKV path
// is exactly the first layer's applied to x2 (one implementation of norm -> project -> RoPE).
TEST(ReferenceLlama, ForwardIntermediatesAreConsistent) {
  Rng rng(coda::test::test_seed() + 300);
  const Case& c = kCases[0];
  const LlamaConfig& cfg = c.cfg;
  const int64_t M = c.M, D = cfg.hidden;
  const Inputs rope = make_rope(c, rng);
  const coda::ref::MiddleWeights w = random_middle(cfg, rng);
  const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
  const auto f = coda::ref::middle_forward(cfg, w, rope.rope(), x0, y0);
  const auto first =
      coda::ref::first_forward(cfg, {w.next_attn_norm, w.w_qkv_next}, rope.rope(), f.mlp.x2);
  EXPECT_EQ(first.qkv, f.qkv);
  EXPECT_EQ(first.z, f.z2);
  EXPECT_EQ(first.rstd, f.rstd2);
  for (size_t i = 0; i < f.mlp.y1.size(); ++i) {
    const double g = f.mlp.gate[i];
    ASSERT_NEAR(f.mlp.y1[i], g / (1 + std::exp(-g)) * f.mlp.up[i], 1e-14);
  }
  // With every output rounded to bf16, the block stays within bf16 noise of the fp64 one: the
  // low-precision baseline is a baseline, not a different function.
  const auto low = coda::ref::middle_forward(
      cfg, w, rope.rope(), coda::ref::rounded({Rounding::Kind::bf16}, x0),
      coda::ref::rounded({Rounding::Kind::bf16}, y0), Rounding{Rounding::Kind::bf16});
  const double err = coda::test::max_rel_error(low.qkv, f.qkv);
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 0.05);
  for (double v : low.qkv) ASSERT_EQ(v, Rounding{Rounding::Kind::bf16}(v));
}

TEST(ReferenceLlama, LossReductionsAndIgnoredRows) {
  Rng rng(coda::test::test_seed() + 400);
  const LlamaConfig& cfg = kCases[0].cfg;
  const int64_t M = 4, D = cfg.hidden;
  const coda::ref::LastWeights w = random_last(cfg, rng);
  const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
  const std::vector<int32_t> targets = {3, -100, 0, int32_t(cfg.vocab - 1)};
  const auto mean =
      coda::ref::last_backward(cfg, w, x0, y0, {targets, -100, coda::ref::Reduction::mean});
  const auto sum =
      coda::ref::last_backward(cfg, w, x0, y0, {targets, -100, coda::ref::Reduction::sum});
  Matrix sum_over_valid = sum.grads.w_lm;
  for (auto& v : sum_over_valid) v /= 3.0; // three valid rows
  EXPECT_LE(coda::test::max_rel_error(mean.grads.w_lm, sum_over_valid), 1e-14);
  for (int64_t n = 0; n < cfg.vocab; ++n) EXPECT_EQ(mean.dlogits[size_t(1 * cfg.vocab + n)], 0.0);
}

// The gradients the middle and last layers' backwards share (the MLP's and the residual stream's),
// bit for bit.
template <class Backward> void expect_same_mlp_backward(const Backward& got, const Backward& want) {
  EXPECT_EQ(got.dx0, want.dx0);
  EXPECT_EQ(got.dy0, want.dy0);
  EXPECT_EQ(got.grads.w_o, want.grads.w_o);
  EXPECT_EQ(got.grads.ffn_norm, want.grads.ffn_norm);
  EXPECT_EQ(got.grads.w_gate, want.grads.w_gate);
  EXPECT_EQ(got.grads.w_up, want.grads.w_up);
  EXPECT_EQ(got.grads.w_down, want.grads.w_down);
}

// The backward from saved activations is the backward: fed the activations the fp64 forward
// saved, each *_from_saved gives its recomputing twin's gradients bit for bit (the same ops in the
// same order); with a low-precision Rounding it rounds h and y1 once, as an unfused forward does.
TEST(ReferenceLlama, BackwardFromSavedActivationsIsTheBackward) {
  uint64_t seed = coda::test::test_seed() + 600;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Rng rng(seed++);
    const LlamaConfig& cfg = c.cfg;
    const int64_t M = c.M, D = cfg.hidden, Nq = cfg.qkv_width();
    const Inputs rope = make_rope(c, rng);
    const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
    const Matrix dx = rng.uniform(M * D), dqkv = rng.uniform(M * Nq);

    const coda::ref::FirstWeights fw{rng.norm(D), rng.weight(Nq, D)};
    const auto first = coda::ref::first_backward(cfg, fw, rope.rope(), x0, dqkv, dx);
    const auto first_saved = coda::ref::first_backward_from_saved(
        cfg, fw, rope.rope(), x0, coda::ref::first_forward(cfg, fw, rope.rope(), x0).rstd, dqkv,
        dx);
    EXPECT_EQ(first_saved.dx0, first.dx0);
    EXPECT_EQ(first_saved.grads.attn_norm, first.grads.attn_norm);
    EXPECT_EQ(first_saved.grads.w_qkv, first.grads.w_qkv);

    const coda::ref::MiddleWeights mw = random_middle(cfg, rng);
    const auto mf = coda::ref::middle_forward(cfg, mw, rope.rope(), x0, y0);
    const coda::ref::MlpSaved saved{mf.mlp.x1, mf.mlp.rstd1, mf.mlp.gate, mf.mlp.up, mf.mlp.x2};
    const auto middle = coda::ref::middle_backward(cfg, mw, rope.rope(), x0, y0, dx, dqkv);
    const auto middle_saved =
        coda::ref::middle_backward_from_saved(cfg, mw, rope.rope(), y0, saved, mf.rstd2, dx, dqkv);
    expect_same_mlp_backward(middle_saved, middle);
    EXPECT_EQ(middle_saved.grads.next_attn_norm, middle.grads.next_attn_norm);
    EXPECT_EQ(middle_saved.grads.w_qkv_next, middle.grads.w_qkv_next);

    const coda::ref::LastWeights lw = random_last(cfg, rng);
    std::vector<int32_t> targets = rng.integers(M, 0, int32_t(cfg.vocab - 1));
    if (M > 1) targets[0] = -100;
    const coda::ref::LossSpec spec{targets};
    const auto lf = coda::ref::last_forward(cfg, lw, x0, y0, spec);
    const auto last = coda::ref::last_backward(cfg, lw, x0, y0, spec, 0.75);
    const auto last_saved = coda::ref::last_backward_from_saved(
        cfg, lw, y0, {lf.mlp.x1, lf.mlp.rstd1, lf.mlp.gate, lf.mlp.up, lf.mlp.x2}, lf.rstd2,
        last.dlogits);
    expect_same_mlp_backward(last_saved, last);
    EXPECT_EQ(last_saved.grads.final_norm, last.grads.final_norm);
    EXPECT_EQ(last_saved.grads.w_lm, last.grads.w_lm);

    // Low precision: the same function, within bf16 noise of the fp64 one.
    const Rounding bf16{Rounding::Kind::bf16};
    const auto low = coda::ref::middle_backward_from_saved(cfg, mw, rope.rope(), y0, saved,
                                                           mf.rstd2, dx, dqkv, bf16);
    EXPECT_GT(coda::test::max_rel_error(low.dx0, middle.dx0), 0.0);
    EXPECT_LT(coda::test::max_rel_error(low.dx0, middle.dx0), 0.05);
    EXPECT_LT(coda::test::max_rel_error(low.grads.w_qkv_next, middle.grads.w_qkv_next), 0.05);
    for (double v : low.dx0) ASSERT_EQ(v, bf16(v));

    // Sizes are checked before anything is computed.
    const Matrix short_rstd(mf.rstd2.begin(), mf.rstd2.end() - 1);
    EXPECT_THROW(coda::ref::middle_backward_from_saved(cfg, mw, rope.rope(), y0, saved, short_rstd,
                                                       dx, dqkv),
                 std::invalid_argument);
    coda::ref::MlpSaved short_gate = saved;
    short_gate.gate.pop_back();
    EXPECT_THROW(coda::ref::middle_backward_from_saved(cfg, mw, rope.rope(), y0, short_gate,
                                                       mf.rstd2, dx, dqkv),
                 std::invalid_argument);
    EXPECT_THROW(coda::ref::last_backward_from_saved(cfg, lw, y0, saved, lf.rstd2,
                                                     Matrix(last.dlogits.size() - 1)),
                 std::invalid_argument);
  }
}

TEST(ReferenceLlama, BadSizesThrowBeforeComputing) {
  Rng rng(coda::test::test_seed() + 500);
  const Case& c = kCases[0];
  const LlamaConfig& cfg = c.cfg;
  const int64_t M = c.M, D = cfg.hidden;
  const Inputs rope = make_rope(c, rng);
  coda::ref::MiddleWeights w = random_middle(cfg, rng);
  const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * cfg.attn_width());
  const Matrix short_x0(size_t(M * D - 1), 0.0);
  EXPECT_THROW(coda::ref::middle_forward(cfg, w, rope.rope(), short_x0, y0), std::invalid_argument);
  EXPECT_THROW(coda::ref::middle_forward(cfg, w, rope.rope(), Matrix{}, y0), std::invalid_argument);
  const Matrix short_y0(y0.begin(), y0.end() - 1);
  EXPECT_THROW(coda::ref::middle_forward(cfg, w, rope.rope(), x0, short_y0), std::invalid_argument);
  const std::vector<int32_t> few_positions(rope.positions.begin(), rope.positions.end() - 1);
  EXPECT_THROW(coda::ref::middle_forward(cfg, w, {few_positions, rope.inv_freq}, x0, y0),
               std::invalid_argument);
  w.w_qkv_next.pop_back();
  EXPECT_THROW(coda::ref::middle_forward(cfg, w, rope.rope(), x0, y0), std::invalid_argument);
  LlamaConfig odd = cfg;
  odd.head_dim = 3;
  EXPECT_THROW(coda::ref::first_forward(odd, {Matrix(size_t(D)), Matrix()}, rope.rope(), x0),
               std::invalid_argument);
  const coda::ref::LastWeights lw = random_last(cfg, rng);
  const std::vector<int32_t> bad_targets(size_t(M), int32_t(cfg.vocab));
  EXPECT_THROW(coda::ref::last_forward(cfg, lw, x0, y0, {bad_targets}), std::invalid_argument);
}

} // namespace
