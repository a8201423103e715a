// CODA's fused schedule (reference/llama_fused, fp64) against the textbook block
// (reference/llama, fp64): every output and every gradient of the first, middle and last layer
// agree to fp64 rounding. This is the algebraic proof of the reparameterization (coda-paper
// 4.2-4.5): un-normalized h = x * gamma with rstd applied after the GEMM, the interleaved gate/up
// weight, the RMSNorm backward through zeta = (1/D) sum z dz (from RoPE's orthogonality, K7's
// pairs and the loss), and the loss gradient scaled by alpha = dloss * grad_scale.
//
// Tolerance: both sides are fp64 with O(1) values and reductions of at most a few hundred terms,
// so rounding differences are ~1e-14 relative; kTolerance = 1e-10 is four orders above that,
// while a wrong term (a missing rstd, a transposed pair, zeta off by a factor) is O(1e-2..1).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "reference/llama.hpp"
#include "reference/llama_fused.hpp"
#include "tests/common/check.hpp"

namespace {

namespace ref = coda::ref;
namespace fused = coda::ref::fused;
using ref::LlamaConfig;
using ref::Matrix;

constexpr double kTolerance = 1e-10;

struct Case {
  const char* name;
  LlamaConfig config;
  int64_t tokens;
};
// GoogleTest's printer for the parameter (--gtest_list_tests, failures): its name.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << ", " << c.tokens << " tokens"; }

// GQA; M below one partial block; D = n_heads * head_dim.
// MHA; M = 133 (two ragged 128-row blocks); D = 200 (not a multiple of 128) != n_heads * head_dim.
// GQA 4:1; M = 257; D = 136, F = 264, V = 300: every partial buffer has a ragged last block.
const Case kCases[] = {
    {"gqa_small", {64, 96, 4, 2, 16, 50, 1e-6}, 37},
    {"mha_ragged", {200, 136, 4, 4, 40, 130, 1e-5}, 133},
    {"gqa4_wide", {136, 264, 4, 1, 34, 300, 1e-6}, 257},
};

class Rng {
public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  Matrix uniform(int64_t n, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Matrix v(static_cast<size_t>(n));
    for (double& x : v) x = dist(engine_);
    return v;
  }
  // [out, in] with entries of size 1/sqrt(in), so activations stay O(1).
  Matrix weight(int64_t out, int64_t in) {
    Matrix w = uniform(out * in);
    for (double& x : w) x /= std::sqrt(double(in));
    return w;
  }
  Matrix norm(int64_t n) { return uniform(n, 0.5, 1.5); }
  std::vector<int32_t> integers(int64_t n, int32_t lo, int32_t hi) {
    std::uniform_int_distribution<int32_t> dist(lo, hi);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& x : v) x = dist(engine_);
    return v;
  }

private:
  std::mt19937_64 engine_;
};

void expect_equal(const std::string& what, const Matrix& fused_value, const Matrix& textbook) {
  ASSERT_EQ(fused_value.size(), textbook.size()) << what;
  const double err = coda::test::max_rel_error(fused_value, textbook);
  EXPECT_LT(err, kTolerance) << what << ": max relative error " << err << " (seed "
                             << coda::test::test_seed() << ")";
}

Matrix interleaved(const LlamaConfig& c, const Matrix& gate, const Matrix& up, int64_t rows) {
  // Activations [M, F] gate / up -> [M, 2F] interleaved columns (the layout of z1, dz1).
  Matrix out(size_t(rows * 2 * c.intermediate));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < c.intermediate; ++j) {
      out[size_t(m * 2 * c.intermediate + 2 * j)] = gate[size_t(m * c.intermediate + j)];
      out[size_t(m * 2 * c.intermediate + 2 * j + 1)] = up[size_t(m * c.intermediate + j)];
    }
  return out;
}

// Positions of packed sequences: restarts at 0 at random places, large offsets elsewhere.
std::vector<int32_t> packed_positions(Rng& rng, int64_t tokens) {
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  const std::vector<int32_t> starts = rng.integers(tokens, 0, 9);
  int32_t p = rng.integers(1, 0, 4000)[0];
  for (int64_t m = 0; m < tokens; ++m) pos[size_t(m)] = starts[size_t(m)] == 0 ? (p = 0) : ++p;
  return pos;
}

class BlockEquivalence : public ::testing::TestWithParam<Case> {
protected:
  Rng rng{coda::test::test_seed() ^ std::hash<std::string>{}(GetParam().name)};
  const LlamaConfig& c = GetParam().config;
  const int64_t M = GetParam().tokens;
  const std::vector<int32_t> positions = packed_positions(rng, M);
  const Matrix inv_freq = ref::rope_inv_freq(c.head_dim, 10000.0);
  ref::RopeInputs rope() const { return {positions, inv_freq}; }
};

TEST_P(BlockEquivalence, FirstLayer) {
  const ref::FirstWeights w{rng.norm(c.hidden), rng.weight(c.qkv_width(), c.hidden)};
  const Matrix x0 = rng.uniform(M * c.hidden), dqkv = rng.uniform(M * c.qkv_width());
  const Matrix dx_res = rng.uniform(M * c.hidden);

  const ref::FirstForward tf = ref::first_forward(c, w, rope(), x0);
  const ref::FirstBackward tb = ref::first_backward(c, w, rope(), x0, dqkv, dx_res);
  const fused::FirstWeights fw = fused::to_fused(w);
  const fused::FirstForward ff = fused::first_forward(c, fw, rope(), x0);
  const fused::FirstBackward fb = fused::first_backward(c, fw, rope(), x0, ff, dqkv, dx_res);

  expect_equal("qkv", ff.qkv, tf.qkv);
  expect_equal("rstd", ff.rstd, tf.rstd);
  expect_equal("dz (pre-RoPE)", fb.dz, tb.dz);
  expect_equal("dx", fb.dx, tb.dx0);
  expect_equal("d attn_norm", fb.grads.attn_norm, tb.grads.attn_norm);
  expect_equal("d w_qkv", fb.grads.w_qkv, tb.grads.w_qkv);
}

// The gradients the middle and last layers share, through the MLP and the attention output
// projection: fb is the layer's fused backward, tb its textbook one.
template <class FusedBackward, class TextbookBackward>
void expect_mlp_backward_equal(const LlamaConfig& c, int64_t M, const FusedBackward& fb,
                               const TextbookBackward& tb) {
  const int64_t D = c.hidden, F = c.intermediate;
  expect_equal("dx2 (total)", fb.dx2, tb.dx2);
  expect_equal("dz1", fb.mlp.dz1, interleaved(c, tb.dgate, tb.dup, M));
  expect_equal("dx0", fb.mlp.dx0, tb.dx0);
  expect_equal("dy0", fb.mlp.dy0, tb.dy0);
  Matrix dgate, dup;
  fused::deinterleave_gate_up(F, D, fb.grads.w_gate_up, dgate, dup);
  expect_equal("d w_out", fb.grads.w_out, tb.grads.w_o);
  expect_equal("d ffn_norm", fb.grads.ffn_norm, tb.grads.ffn_norm);
  expect_equal("d w_gate", dgate, tb.grads.w_gate);
  expect_equal("d w_up", dup, tb.grads.w_up);
  expect_equal("d w_down", fb.grads.w_down, tb.grads.w_down);
}

TEST_P(BlockEquivalence, MiddleLayer) {
  const int64_t D = c.hidden, F = c.intermediate;
  const ref::MiddleWeights w{rng.weight(D, c.attn_width()),
                             rng.norm(D),
                             rng.weight(F, D),
                             rng.weight(F, D),
                             rng.weight(D, F),
                             rng.norm(D),
                             rng.weight(c.qkv_width(), D)};
  const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * c.attn_width());
  const Matrix dx2 = rng.uniform(M * D), dqkv = rng.uniform(M * c.qkv_width());

  const ref::MiddleForward tf = ref::middle_forward(c, w, rope(), x0, y0);
  const ref::MiddleBackward tb = ref::middle_backward(c, w, rope(), x0, y0, dx2, dqkv);
  const fused::MiddleWeights fw = fused::to_fused(w, c);
  const fused::MiddleForward ff = fused::middle_forward(c, fw, rope(), x0, y0);
  const fused::MiddleBackward fb = fused::middle_backward(c, fw, rope(), y0, ff, dx2, dqkv);

  expect_equal("x1", ff.mlp.x1, tf.mlp.x1);
  expect_equal("r1", ff.mlp.r1, tf.mlp.rstd1);
  expect_equal("z1 (interleaved gate/up)", ff.mlp.z1, interleaved(c, tf.mlp.gate, tf.mlp.up, M));
  expect_equal("y1", ff.mlp.y1, tf.mlp.y1);
  expect_equal("x2", ff.mlp.x2, tf.mlp.x2);
  expect_equal("r2", ff.r2, tf.rstd2);
  expect_equal("qkv", ff.qkv, tf.qkv);

  expect_equal("dz2 (pre-RoPE)", fb.dz2, tb.dz2);
  expect_mlp_backward_equal(c, M, fb, tb);
  expect_equal("d attn_norm", fb.grads.attn_norm, tb.grads.next_attn_norm);
  expect_equal("d w_qkv", fb.grads.w_qkv, tb.grads.w_qkv_next);
}

void check_last_layer(const LlamaConfig& c, int64_t M, Rng& rng, ref::Reduction reduction) {
  const int64_t D = c.hidden, F = c.intermediate;
  const ref::LastWeights w{rng.weight(D, c.attn_width()),
                           rng.norm(D),
                           rng.weight(F, D),
                           rng.weight(F, D),
                           rng.weight(D, F),
                           rng.norm(D),
                           rng.weight(c.vocab, D)};
  const Matrix x0 = rng.uniform(M * D), y0 = rng.uniform(M * c.attn_width());
  // About one target in eight ignored.
  std::vector<int32_t> targets = rng.integers(M, 0, int32_t(c.vocab) - 1);
  const std::vector<int32_t> coin = rng.integers(M, 0, 7);
  for (int64_t m = 0; m < M; ++m)
    if (coin[size_t(m)] == 0) targets[size_t(m)] = -100;
  const ref::LossSpec loss{targets, -100, reduction};
  const double dloss = rng.uniform(1, 0.5, 2.0)[0];

  const ref::LastForward tf = ref::last_forward(c, w, x0, y0, loss);
  const ref::LastBackward tb = ref::last_backward(c, w, x0, y0, loss, dloss);
  const fused::LastWeights fw = fused::to_fused(w, c);
  const fused::LastForward ff = fused::last_forward(c, fw, x0, y0, loss);
  const fused::LastBackward fb = fused::last_backward(c, fw, y0, ff, dloss);

  expect_equal("x2", ff.mlp.x2, tf.mlp.x2);
  expect_equal("r2", ff.r2, tf.rstd2);
  expect_equal("logits", ff.logits, tf.logits);
  expect_equal("loss", {ff.loss}, {tf.ce.loss});
  expect_equal("grad_scale", {ff.grad_scale}, {tf.ce.grad_scale});

  expect_mlp_backward_equal(c, M, fb, tb);
  expect_equal("d final_norm", fb.grads.final_norm, tb.grads.final_norm);
  expect_equal("d lm_head", fb.grads.lm_head, tb.grads.w_lm);
}

TEST_P(BlockEquivalence, LastLayerMeanLoss) { check_last_layer(c, M, rng, ref::Reduction::mean); }

TEST_P(BlockEquivalence, LastLayerSumLoss) { check_last_layer(c, M, rng, ref::Reduction::sum); }

// The conversion is a permutation: deinterleave inverts interleave, and rows land where the
// contract says (fused row 2j = gate row j, 2j+1 = up row j).
TEST(BlockEquivalenceLayout, GateUpInterleaving) {
  Rng rng(coda::test::test_seed());
  const int64_t F = 5, K = 3;
  const Matrix gate = rng.uniform(F * K), up = rng.uniform(F * K);
  const Matrix fused_w = fused::interleave_gate_up(F, K, gate, up);
  for (int64_t j = 0; j < F; ++j)
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(fused_w[size_t(2 * j * K + k)], gate[size_t(j * K + k)]);
      EXPECT_EQ(fused_w[size_t((2 * j + 1) * K + k)], up[size_t(j * K + k)]);
    }
  Matrix gate_back, up_back;
  fused::deinterleave_gate_up(F, K, fused_w, gate_back, up_back);
  EXPECT_EQ(gate_back, gate);
  EXPECT_EQ(up_back, up);
}

INSTANTIATE_TEST_SUITE_P(Configs, BlockEquivalence, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

} // namespace
