// The Llama block on the CPU backend: the shared block suite (tests/common/block_suite.hpp) on
// small ragged configurations, plus argument validation (a bad call throws the right status,
// names the field and writes nothing) and the C ABI.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "coda/block/llama.h"
#include "tests/common/block_suite.hpp"

namespace {

using namespace coda_block_suite;

// GQA with M = 150 (a ragged second 128-row block) and V = 200; hidden 200 (not a multiple of
// 128) with n_heads * head_dim = 160 != hidden, in f16 with f32 weight gradients; M = 64 within
// M = 61 within one partial block. (The tolerance rule compares maxima of errors: with much fewer
// rows the two maxima are too noisy to compare. The fp64 equivalence test covers tiny M.)
const BlockCase kCases[] = {
    {"bf16_gqa", make_config(96, 160, 4, 2, 24, 200), 150, DType::bf16, DType::bf16},
    {"f16_wide", make_config(200, 136, 4, 1, 40, 136), 133, DType::f16, DType::f32},
    {"bf16_one_block", make_config(64, 64, 2, 1, 32, 72), 61, DType::bf16, DType::f32},
};

// ---------------------------------------------------------------------------------------------
// A whole model: the first layer, L - 1 middle layers and the last, with the gradients flowing
// between them (dx, and dqkv through attention), against the textbook model. Attention runs on
// the host between the coda calls, as a user's attention would: fp64 math on the 16-bit qkv, its
// output and gradient rounded to the dtype (the textbook model rounds the same way).

// Causal softmax attention within each packed sequence (a sequence starts where the position is
// 0, and at token 0), GQA: y[m, h] = sum_{j <= m, same sequence} softmax_j(q_m . k_j / sqrt(hd))
// v_j.
std::vector<int64_t> sequence_starts(const std::vector<int32_t>& positions) {
  std::vector<int64_t> start(positions.size());
  for (size_t m = 0; m < positions.size(); ++m)
    start[m] = (m == 0 || positions[m] == 0) ? int64_t(m) : start[m - 1];
  return start;
}

Values attention(const Values& qkv, const llama::Config& c, const std::vector<int64_t>& start,
                 ref::Rounding r) {
  const int64_t M = int64_t(start.size()), hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads,
                Nq = c.qkv_width();
  const double scale = 1.0 / std::sqrt(double(hd));
  Values y(size_t(M * Hq * hd), 0.0);
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kh = Hq + h / (Hq / Hkv), vh = Hq + Hkv + h / (Hq / Hkv);
    for (int64_t m = 0; m < M; ++m) {
      std::vector<double> p;
      double top = -INFINITY;
      for (int64_t j = start[size_t(m)]; j <= m; ++j) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d)
          s += qkv[size_t(m * Nq + h * hd + d)] * qkv[size_t(j * Nq + kh * hd + d)];
        p.push_back(s * scale);
        top = std::max(top, p.back());
      }
      double z = 0;
      for (double& v : p) z += (v = std::exp(v - top));
      for (int64_t j = start[size_t(m)]; j <= m; ++j)
        for (int64_t d = 0; d < hd; ++d)
          y[size_t(m * Hq * hd + h * hd + d)] +=
              p[size_t(j - start[size_t(m)])] / z * qkv[size_t(j * Nq + vh * hd + d)];
    }
  }
  return ref::rounded(r, y);
}

Values attention_backward(const Values& dy, const Values& qkv, const llama::Config& c,
                          const std::vector<int64_t>& start, ref::Rounding r) {
  const int64_t M = int64_t(start.size()), hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads,
                Nq = c.qkv_width();
  const double scale = 1.0 / std::sqrt(double(hd));
  Values dqkv(size_t(M * Nq), 0.0);
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kh = Hq + h / (Hq / Hkv), vh = Hq + Hkv + h / (Hq / Hkv);
    for (int64_t m = 0; m < M; ++m) {
      const int64_t j0 = start[size_t(m)], n = m - j0 + 1;
      std::vector<double> p(static_cast<size_t>(n)), dp(static_cast<size_t>(n));
      double top = -INFINITY;
      for (int64_t j = j0; j <= m; ++j) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d)
          s += qkv[size_t(m * Nq + h * hd + d)] * qkv[size_t(j * Nq + kh * hd + d)];
        p[size_t(j - j0)] = s * scale;
        top = std::max(top, s * scale);
      }
      double z = 0;
      for (double& v : p) z += (v = std::exp(v - top));
      double dot = 0;
      for (int64_t j = j0; j <= m; ++j) {
        p[size_t(j - j0)] /= z;
        double g = 0;
        for (int64_t d = 0; d < hd; ++d)
          g += dy[size_t(m * Hq * hd + h * hd + d)] * qkv[size_t(j * Nq + vh * hd + d)];
        dp[size_t(j - j0)] = g;
        dot += g * p[size_t(j - j0)];
      }
      for (int64_t j = j0; j <= m; ++j) {
        const double pj = p[size_t(j - j0)], ds = pj * (dp[size_t(j - j0)] - dot) * scale;
        for (int64_t d = 0; d < hd; ++d) {
          dqkv[size_t(m * Nq + h * hd + d)] += ds * qkv[size_t(j * Nq + kh * hd + d)];
          dqkv[size_t(j * Nq + kh * hd + d)] += ds * qkv[size_t(m * Nq + h * hd + d)];
          dqkv[size_t(j * Nq + vh * hd + d)] += pj * dy[size_t(m * Hq * hd + h * hd + d)];
        }
      }
    }
  }
  return ref::rounded(r, dqkv);
}

// The weights of an L-layer model, by layer; layer l < L - 1 is a middle layer (its next
// attention norm and QKV weight belong to layer l + 1), layer L - 1 the last (final norm, LM head).
struct ModelWeights {
  ModelWeights(Maker& make, int layers)
      : attn_norm0(make.norm()), w_qkv0(make.weight(make.c.qkv_width(), make.c.hidden)) {
    const llama::Config& c = make.c;
    for (int l = 0; l < layers; ++l) {
      const bool last = l == layers - 1;
      Layer w{make.weight(c.hidden, c.attention_width()),
              make.norm(),
              make.weight(c.intermediate, c.hidden),
              make.weight(c.intermediate, c.hidden),
              {},
              make.weight(c.hidden, c.intermediate),
              make.norm(),
              make.weight(last ? c.vocab : c.qkv_width(), c.hidden)};
      w.gate_up = make.fused_gate_up(w.gate, w.up);
      layer.push_back(std::move(w));
    }
  }
  struct Layer {
    HostTensor w_out, ffn_norm, gate, up, gate_up, w_down, norm_next, w_next;
  };
  llama::MiddleWeights middle(int l) {
    Layer& w = layer[size_t(l)];
    return {w.w_out.view(),  w.ffn_norm.view(),  w.gate_up.view(),
            w.w_down.view(), w.norm_next.view(), w.w_next.view()};
  }
  llama::LastWeights last() {
    Layer& w = layer.back();
    return {w.w_out.view(),  w.ffn_norm.view(),  w.gate_up.view(),
            w.w_down.view(), w.norm_next.view(), w.w_next.view()};
  }
  ref::MiddleWeights middle_textbook(int l) const {
    const Layer& w = layer[size_t(l)];
    return {w.w_out.values(),  w.ffn_norm.values(),  w.gate.values(),  w.up.values(),
            w.w_down.values(), w.norm_next.values(), w.w_next.values()};
  }
  ref::LastWeights last_textbook() const {
    const Layer& w = layer.back();
    return {w.w_out.values(),  w.ffn_norm.values(),  w.gate.values(),  w.up.values(),
            w.w_down.values(), w.norm_next.values(), w.w_next.values()};
  }

  HostTensor attn_norm0, w_qkv0;
  std::vector<Layer> layer;
};

// The textbook model's gradients (weights of each layer, and the embedding's).
struct ModelGradients {
  ref::FirstWeights first;
  std::vector<ref::MiddleWeights> middle;
  ref::LastWeights last;
  Values dx;
};

ModelGradients textbook_model(const ModelWeights& w, const ref::LlamaConfig& rc,
                              const llama::Config& c, RopeTensors& rope, const Values& x,
                              const ref::LossSpec& loss, int64_t M, ref::Rounding r) {
  const int layers = int(w.layer.size());
  const ref::FirstWeights fw{w.attn_norm0.values(), w.w_qkv0.values()};
  Values qkv = ref::first_forward(rc, fw, rope.textbook(), x, r).qkv, xc = x;
  const std::vector<int64_t> start = sequence_starts(rope.positions_v);
  std::vector<Values> x0s, y0s, qkvs{qkv};
  for (int l = 0; l < layers - 1; ++l) {
    x0s.push_back(xc);
    y0s.push_back(attention(qkv, c, start, r));
    ref::MiddleForward f =
        ref::middle_forward(rc, w.middle_textbook(l), rope.textbook(), xc, y0s.back(), r);
    xc = f.mlp.x2, qkv = f.qkv;
    qkvs.push_back(qkv);
  }
  ModelGradients g;
  const ref::LastBackward lb =
      ref::last_backward(rc, w.last_textbook(), xc, attention(qkv, c, start, r), loss, 1.0, r);
  g.last = lb.grads;
  Values dx = lb.dx0, dqkv = attention_backward(lb.dy0, qkvs.back(), c, start, r);
  g.middle.resize(size_t(layers - 1));
  for (int l = layers - 2; l >= 0; --l) {
    const ref::MiddleBackward b = ref::middle_backward(rc, w.middle_textbook(l), rope.textbook(),
                                                       x0s[size_t(l)], y0s[size_t(l)], dx, dqkv, r);
    g.middle[size_t(l)] = b.grads;
    dx = b.dx0, dqkv = attention_backward(b.dy0, qkvs[size_t(l)], c, start, r);
  }
  const ref::FirstBackward fb = ref::first_backward(rc, fw, rope.textbook(), x, dqkv, dx, r);
  g.first = fb.grads;
  g.dx = fb.dx0;
  return g;
}

// Four layers in bf16 with f32 weight gradients, GQA 2:1: every weight gradient and the
// embedding's gradient within the rule against the textbook model (whose errors compound
// through the same chain).
TEST(BlockModel, FourLayersMatchTheTextbookModel) {
  coda::test::Seeds seeds;
  const int L = 4;
  const BlockCase bc{"model", make_config(96, 160, 4, 2, 24, 200), 150, DType::bf16, DType::f32};
  Maker make(bc, seeds);
  const llama::Config& c = make.c;
  const int64_t M = make.M, D = c.hidden, F = c.intermediate, Nq = c.qkv_width(),
                A = c.attention_width(), V = c.vocab;
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  RopeTensors rope(M, c.head_dim);
  ModelWeights w(make, L);
  HostTensor x = make.activation(D);
  const std::vector<int32_t> targets_v = make.targets();
  HostTensor targets = HostTensor::of_ints({M}, targets_v);
  const ref::LossSpec loss{targets_v, -100, ref::Reduction::mean};

  const std::vector<int64_t> start = sequence_starts(rope.positions_v);
  // Forward, keeping what each backward reads.
  HostTensor qkv0 = make.output(Nq), rstd0 = make.stat();
  HostTensor ws_first = make.workspace(llama::Layer::first, llama::Pass::forward);
  llama::first_forward(c, {w.attn_norm0.view(), w.w_qkv0.view()}, {x.view(), rope.view()},
                       {qkv0.view()}, {rstd0.view()}, ws_first.view());
  struct Saved {
    HostTensor y0, x2, qkv, x1, z1, r1, r2;
  };
  std::vector<Saved> saved;
  saved.reserve(size_t(L - 1));
  HostTensor ws_mid = make.workspace(llama::Layer::middle, llama::Pass::forward);
  for (int l = 0; l < L - 1; ++l) {
    HostTensor& x0 = l == 0 ? x : saved.back().x2;
    HostTensor& qkv = l == 0 ? qkv0 : saved.back().qkv;
    saved.push_back({HostTensor::of(make.dt, {M, A}, attention(qkv.values(), c, start, lowp)),
                     make.output(D), make.output(Nq), make.output(D), make.output(2 * F),
                     make.stat(), make.stat()});
    Saved& s = saved.back();
    llama::middle_forward(c, w.middle(l), {x0.view(), s.y0.view(), rope.view()},
                          {s.x2.view(), s.qkv.view()},
                          {s.x1.view(), s.z1.view(), s.r1.view(), s.r2.view()}, ws_mid.view());
  }
  HostTensor y_last =
      HostTensor::of(make.dt, {M, A}, attention(saved.back().qkv.values(), c, start, lowp));
  HostTensor loss_out(DType::f32, {1}),
      x1 = make.output(D), z1 = make.output(2 * F), r1 = make.stat(), x2 = make.output(D),
      r2 = make.stat(), dlogits = make.output(V), grad_scale(DType::f32, {1}), zeta = make.stat();
  const llama::LastInputs last_in{saved.back().x2.view(), y_last.view(), targets.view()};
  const llama::LastSaved last_saved{x1.view(), z1.view(),      r1.view(),         x2.view(),
                                    r2.view(), dlogits.view(), grad_scale.view(), zeta.view()};
  HostTensor ws_last = make.workspace(llama::Layer::last, llama::Pass::forward);
  llama::last_forward(c, w.last(), last_in, {loss_out.view(), {}}, last_saved, ws_last.view());

  // Backward, layer by layer, against the textbook model in fp64 and in the 16-bit dtype.
  const ref::LlamaConfig rc = ref_config(c);
  const ModelGradients exact = textbook_model(w, rc, c, rope, x.values(), loss, M, {});
  const ModelGradients unfused = textbook_model(w, rc, c, rope, x.values(), loss, M, lowp);
  const DType g = bc.grad_dtype;
  HostTensor dx = make.output(D), dy = make.output(A);
  {
    Grad d_out = make.grad(g, {D, A}, false), d_ffn = make.grad(g, {D}, false),
         d_gate_up = make.grad(g, {2 * F, D}, false), d_down = make.grad(g, {D, F}, false),
         d_final = make.grad(g, {D}, false), d_head = make.grad(g, {V, D}, false);
    HostTensor ws = make.workspace(llama::Layer::last, llama::Pass::backward);
    llama::last_backward(c, w.last(), last_in, last_saved,
                         {coda::Scalar{1.f},
                          dx.view(),
                          dy.view(),
                          {d_out.tensor.view(), d_ffn.tensor.view(), d_gate_up.tensor.view(),
                           d_down.tensor.view(), d_final.tensor.view(), d_head.tensor.view()}},
                         false, ws.view());
    check_grad("last: d w_out", d_out, exact.last.w_o, unfused.last.w_o);
    check_grad("last: d ffn_norm", d_ffn, exact.last.ffn_norm, unfused.last.ffn_norm);
    check_grad("last: d w_gate_up", d_gate_up,
               ref::fused::interleave_gate_up(F, D, exact.last.w_gate, exact.last.w_up),
               ref::fused::interleave_gate_up(F, D, unfused.last.w_gate, unfused.last.w_up));
    check_grad("last: d w_down", d_down, exact.last.w_down, unfused.last.w_down);
    check_grad("last: d final_norm", d_final, exact.last.final_norm, unfused.last.final_norm);
    check_grad("last: d lm_head", d_head, exact.last.w_lm, unfused.last.w_lm);
  }
  HostTensor dqkv = HostTensor::of(
      make.dt, {M, Nq}, attention_backward(dy.values(), saved.back().qkv.values(), c, start, lowp));
  HostTensor ws_mid_b = make.workspace(llama::Layer::middle, llama::Pass::backward);
  for (int l = L - 2; l >= 0; --l) {
    SCOPED_TRACE("middle layer " + std::to_string(l));
    Saved& s = saved[size_t(l)];
    HostTensor& x0 = l == 0 ? x : saved[size_t(l - 1)].x2;
    Grad d_out = make.grad(g, {D, A}, false), d_ffn = make.grad(g, {D}, false),
         d_gate_up = make.grad(g, {2 * F, D}, false), d_down = make.grad(g, {D, F}, false),
         d_norm = make.grad(g, {D}, false), d_qkv = make.grad(g, {Nq, D}, false);
    HostTensor dy0 = make.output(A);
    llama::middle_backward(c, w.middle(l), {x0.view(), s.y0.view(), rope.view()},
                           {s.x2.view(), s.qkv.view()},
                           {s.x1.view(), s.z1.view(), s.r1.view(), s.r2.view()},
                           {dx.view(),
                            dqkv.view(),
                            dy0.view(),
                            {d_out.tensor.view(), d_ffn.tensor.view(), d_gate_up.tensor.view(),
                             d_down.tensor.view(), d_norm.tensor.view(), d_qkv.tensor.view()}},
                           false, ws_mid_b.view());
    const ref::MiddleWeights& e = exact.middle[size_t(l)];
    const ref::MiddleWeights& u = unfused.middle[size_t(l)];
    check_grad("d w_out", d_out, e.w_o, u.w_o);
    check_grad("d ffn_norm", d_ffn, e.ffn_norm, u.ffn_norm);
    check_grad("d w_gate_up", d_gate_up, ref::fused::interleave_gate_up(F, D, e.w_gate, e.w_up),
               ref::fused::interleave_gate_up(F, D, u.w_gate, u.w_up));
    check_grad("d w_down", d_down, e.w_down, u.w_down);
    check_grad("d next attn_norm", d_norm, e.next_attn_norm, u.next_attn_norm);
    check_grad("d next w_qkv", d_qkv, e.w_qkv_next, u.w_qkv_next);
    HostTensor& qkv_l = l == 0 ? qkv0 : saved[size_t(l - 1)].qkv;
    dqkv = HostTensor::of(make.dt, {M, Nq},
                          attention_backward(dy0.values(), qkv_l.values(), c, start, lowp));
  }
  Grad d_norm = make.grad(g, {D}, false), d_qkv = make.grad(g, {Nq, D}, false);
  HostTensor ws_first_b = make.workspace(llama::Layer::first, llama::Pass::backward);
  llama::first_backward(c, {w.attn_norm0.view(), w.w_qkv0.view()}, {x.view(), rope.view()},
                        {qkv0.view()}, {rstd0.view()},
                        {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}},
                        false, ws_first_b.view());
  check_grad("first: d attn_norm", d_norm, exact.first.attn_norm, unfused.first.attn_norm);
  check_grad("first: d w_qkv", d_qkv, exact.first.w_qkv, unfused.first.w_qkv);
  check("d embedding (dx)", dx, exact.dx, unfused.dx);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: the right status, a message naming the field, and nothing written.

class BlockArguments : public ::testing::Test {
protected:
  coda::test::Seeds seeds;
  Maker make{BlockCase{"args", make_config(64, 96, 2, 1, 32, 72), 13, DType::bf16, DType::f32},
             seeds};
  MiddleProblem p{make};
  HostTensor x2 = make.output(64), qkv = make.output(make.c.qkv_width());
  HostTensor x1 = make.output(64), z1 = make.output(192), r1 = make.stat(), r2 = make.stat();
  HostTensor workspace = make.workspace(llama::Layer::middle, llama::Pass::forward);

  llama::MiddleInputs inputs() { return {p.x0.view(), p.y0.view(), p.rope.view()}; }
  llama::MiddleOutputs outputs() { return {x2.view(), qkv.view()}; }
  llama::MiddleSaved saved() { return {x1.view(), z1.view(), r1.view(), r2.view()}; }

  // Runs the forward with one argument spoiled; expects `status` and `field` in the message,
  // and every output still poisoned.
  void expect_rejected(coda::Status status, const std::string& field, const llama::Config& config,
                       const llama::MiddleWeights& weights, const llama::MiddleInputs& in,
                       const llama::MiddleOutputs& out, const coda::TensorView& ws) {
    try {
      llama::middle_forward(config, weights, in, out, saved(), ws);
      ADD_FAILURE() << "accepted a call that should fail on " << field;
    } catch (const coda::Error& e) {
      EXPECT_EQ(int(e.status()), int(status)) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("middle_forward"), std::string::npos) << e.what();
    }
    for (HostTensor* t : {&x2, &qkv, &x1, &z1, &r1, &r2}) {
      for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
      EXPECT_TRUE(t->guard_intact());
    }
  }
};

TEST_F(BlockArguments, TransposedWeightIsNamed) {
  llama::MiddleWeights w = p.weights();
  std::swap(w.w_down.shape[0], w.w_down.shape[1]);
  w.w_down.stride[0] = w.w_down.shape[1];
  expect_rejected(coda::Status::invalid_argument, "weights.w_down", make.c, w, inputs(), outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, SmallWorkspaceSaysHowMuch) {
  coda::TensorView ws = workspace.view();
  ws.shape[0] -= 1;
  expect_rejected(coda::Status::invalid_argument, "workspace_size", make.c, p.weights(), inputs(),
                  outputs(), ws);
}

TEST_F(BlockArguments, MixedDtypesAreATypeError) {
  llama::MiddleInputs in = inputs();
  in.y0.dtype = DType::f16;
  expect_rejected(coda::Status::type_error, "y0", make.c, p.weights(), in, outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, OddHeadDimIsRejected) {
  llama::Config config = make.c;
  config.head_dim = 31;
  expect_rejected(coda::Status::invalid_argument, "head_dim", config, p.weights(), inputs(),
                  outputs(), workspace.view());
}

TEST_F(BlockArguments, OutputOverlappingAnInputIsRejected) {
  llama::MiddleOutputs out = outputs();
  out.x2 = p.x0.view(); // x0 is still an input when x2 is written
  expect_rejected(coda::Status::invalid_argument, "x2", make.c, p.weights(), inputs(), out,
                  workspace.view());
}

TEST_F(BlockArguments, NoTokensIsRejected) {
  llama::MiddleInputs in = inputs();
  in.x0.shape[0] = 0;
  expect_rejected(coda::Status::invalid_argument, "x0", make.c, p.weights(), in, outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, WorkspaceSizeChecksItsArguments) {
  EXPECT_THROW(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 0),
               coda::Error);
  EXPECT_THROW(llama::workspace_size(llama::Layer(7), llama::Pass::forward, make.c, 16),
               coda::Error);
  llama::Config no_vocab = make.c;
  no_vocab.vocab = 0;
  EXPECT_THROW(llama::workspace_size(llama::Layer::last, llama::Pass::forward, no_vocab, 16),
               coda::Error);
  EXPECT_NO_THROW(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, no_vocab, 16));
  llama::Config huge = make.c;
  huge.vocab = int64_t(1) << 40;
  EXPECT_THROW(llama::workspace_size(llama::Layer::last, llama::Pass::forward, huge, 1 << 30),
               coda::Error); // 2^70 bytes of logits partials: an error, not a wrapped size
}

// ---------------------------------------------------------------------------------------------
// The C ABI: the same bits as the C++ API, statuses instead of exceptions.

coda_tensor c_tensor(const coda::TensorView& v) {
  coda_tensor t{};
  t.data = v.data;
  t.dtype = int32_t(v.dtype);
  t.rank = v.rank;
  for (int i = 0; i < CODA_MAX_RANK; ++i) t.shape[i] = v.shape[i], t.stride[i] = v.stride[i];
  t.device = int32_t(v.device);
  t.device_index = v.device_index;
  return t;
}

coda_llama_config c_config(const llama::Config& c) {
  return {c.hidden,     c.intermediate, c.n_heads,
          c.n_kv_heads, c.head_dim,     c.vocab,
          c.eps,        c.ignore_index, int32_t(c.loss_reduction)};
}

TEST_F(BlockArguments, CAbiMatchesCpp) {
  const coda_llama_config config = c_config(make.c);
  size_t bytes = 0;
  ASSERT_EQ(coda_llama_workspace_size(CODA_LLAMA_MIDDLE, CODA_LLAMA_FORWARD, &config, 13, &bytes),
            CODA_OK);
  EXPECT_EQ(bytes, llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 13));

  const llama::MiddleWeights w = p.weights();
  const coda_llama_middle_weights cw{c_tensor(w.w_out),     c_tensor(w.ffn_norm),
                                     c_tensor(w.w_gate_up), c_tensor(w.w_down),
                                     c_tensor(w.attn_norm), c_tensor(w.w_qkv)};
  const llama::MiddleInputs in = inputs();
  const coda_llama_middle_inputs ci{
      c_tensor(in.x0), c_tensor(in.y0), {c_tensor(in.rope.positions), c_tensor(in.rope.inv_freq)}};
  const coda_llama_middle_outputs co{c_tensor(x2.view()), c_tensor(qkv.view())};
  const coda_llama_middle_saved cs{c_tensor(x1.view()), c_tensor(z1.view()), c_tensor(r1.view()),
                                   c_tensor(r2.view())};
  const coda_tensor cws = c_tensor(workspace.view());
  ASSERT_EQ(coda_llama_middle_forward(&config, &cw, &ci, &co, &cs, &cws, nullptr), CODA_OK)
      << coda_last_error();

  HostTensor x2_cpp = make.output(64), qkv_cpp = make.output(make.c.qkv_width());
  HostTensor x1_cpp = make.output(64), z1_cpp = make.output(192);
  HostTensor r1_cpp = make.stat(), r2_cpp = make.stat();
  llama::middle_forward(make.c, w, in, {x2_cpp.view(), qkv_cpp.view()},
                        {x1_cpp.view(), z1_cpp.view(), r1_cpp.view(), r2_cpp.view()},
                        workspace.view());
  EXPECT_TRUE(same_bits(x2, x2_cpp));
  EXPECT_TRUE(same_bits(qkv, qkv_cpp));
  EXPECT_TRUE(same_bits(z1, z1_cpp));
  EXPECT_TRUE(same_bits(r2, r2_cpp));
}

TEST_F(BlockArguments, CAbiReportsInsteadOfThrowing) {
  const coda_llama_config config = c_config(make.c);
  EXPECT_EQ(
      coda_llama_middle_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("is NULL"), std::string::npos);

  size_t bytes = 0;
  EXPECT_EQ(coda_llama_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, -1, &bytes),
            CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("tokens"), std::string::npos);
  EXPECT_EQ(coda_llama_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, 16, nullptr),
            CODA_INVALID_ARGUMENT);

  coda_llama_config odd = config;
  odd.head_dim = 31;
  const coda_tensor none{};
  const coda_llama_first_weights w{none, none};
  const coda_llama_first_inputs in{none, {none, none}};
  const coda_llama_first_outputs out{none};
  const coda_llama_first_saved saved{none};
  EXPECT_EQ(coda_llama_first_forward(&odd, &w, &in, &out, &saved, &none, nullptr),
            CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("head_dim"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Block, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<BlockCase>& info) {
                           return std::string(info.param.name);
                         });

} // namespace
