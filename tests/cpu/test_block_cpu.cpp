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
// A whole model: the first layer, L - 1 middle layers and the last, with the activations and
// gradients flowing between them (x2, dx, and qkv and dqkv through attention), each call against
// the textbook layer on the same inputs. Attention runs on the host between the coda calls, as a
// user's attention would: fp64 math on the 16-bit qkv, its output and gradient rounded to the
// dtype.

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

// coda's saved activations of a middle or last layer as the textbook backward takes them
// (z1's interleaved columns split into gate and up).
ref::MlpSaved mlp_saved(const HostTensor& x1, const HostTensor& z1, const HostTensor& r1,
                        const HostTensor& x2, int64_t M, int64_t F) {
  ref::MlpSaved s{x1.values(), r1.values(), Values(size_t(M * F)), Values(size_t(M * F)),
                  x2.values()};
  const Values z = z1.values();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < F; ++j) {
      s.gate[size_t(m * F + j)] = z[size_t(m * 2 * F + 2 * j)];
      s.up[size_t(m * F + j)] = z[size_t(m * 2 * F + 2 * j + 1)];
    }
  return s;
}

// Four layers in bf16 with f32 weight gradients, GQA 2:1, chained as in training. Every tensor a
// coda call hands on (to the next call, to the host attention, to the user) passes the rule
// against the textbook fed the very tensors that call read, in fp64 (the truth) and in bf16 (the
// unfused baseline): a forward call against the textbook forward of its inputs (outputs and saved
// activations); a backward call against the textbook backward of its incoming gradients and of
// the activations it reads (coda's saved tensors: ref::*_backward_from_saved). From the exact
// input x on, a wrong value anywhere in the chain fails the check of the call that made it.
//
// Why the textbook is fed each call's own inputs, and not run end to end from x as this test did
// before (reason for the change; measurements in docs/reliability.md, "BlockModel"): the rule
// compares two paths' arithmetic on the same inputs. End to end, an output's error is its call's
// own error plus every upstream rounding error carried through the model's Jacobian, J e_coda,
// and the baseline's is J e_unfused: two independent draws. Here the carried errors gather on
// the first tokens of each packed sequence, whose K and V gradients sum those of every later
// query of the sequence (dV_j = sum_{m >= j} p_mj dy_m), so a weight or gamma gradient's max
// error is set by a few random sums and the ratio of two draws' maxima passed 2 about once in
// 1000 runs: CODA_TEST_SEED=851 at 619f712 (d next attn_norm of layer 0, share 1.014: 4.13e-5,
// of which 4.07e-5 carried in through dqkv, 35% of it from the token at position 0 of the second
// sequence; the call's own error 7.9e-6 against the unfused call's 1.62e-5 on the same inputs)
// and 957 at 3cb2336 (d next w_qkv of layer 1, 1.142: 1.84e-4, 1.72e-4 of it carried, though
// the call's inputs were more accurate than the unfused chain's: dqkv 1.08e-5 against 1.32e-5).
// For the same reason a backward is fed the saved activations rather than a forward recomputed
// from the layer's inputs: that folds the rounding of the saved x2 (coda's, or the unfused
// forward's), weighted by the same few large gradient rows, into the backward's error, two draws
// again. CODA_TEST_SEED=566 at 3cb2336, d next attn_norm of layer 0: against the layer
// recomputed from its inputs, share 0.93 (1.44e-5); the saved tensors' rounding alone moves that
// truth by 1.54e-5, while coda's arithmetic on what it read errs by 2.4e-6 against the unfused
// backward's 8.1e-6 on the same tensors. The saved tensors are held to the rule by the forward's
// checks.
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
  const ref::LlamaConfig rc = ref_config(c);
  const ref::FirstWeights first_w{w.attn_norm0.values(), w.w_qkv0.values()};

  const std::vector<int64_t> start = sequence_starts(rope.positions_v);
  // Forward, keeping what each backward reads; each call against the textbook forward of its
  // inputs.
  HostTensor qkv0 = make.output(Nq), rstd0 = make.stat();
  HostTensor ws_first = make.workspace(llama::Layer::first, llama::Pass::forward);
  llama::first_forward(c, {w.attn_norm0.view(), w.w_qkv0.view()}, {x.view(), rope.view()},
                       {qkv0.view()}, {rstd0.view()}, ws_first.view());
  {
    const auto textbook = [&](ref::Rounding r) {
      return ref::first_forward(rc, first_w, rope.textbook(), x.values(), r);
    };
    const ref::FirstForward tf = textbook({}), lf = textbook(lowp);
    check("first: outputs.qkv", qkv0, tf.qkv, lf.qkv);
    check("first: saved.rstd", rstd0, tf.rstd, lf.rstd);
  }
  struct Saved {
    HostTensor y0, x2, qkv, x1, z1, r1, r2;
  };
  std::vector<Saved> saved;
  saved.reserve(size_t(L - 1));
  HostTensor ws_mid = make.workspace(llama::Layer::middle, llama::Pass::forward);
  for (int l = 0; l < L - 1; ++l) {
    SCOPED_TRACE("middle layer " + std::to_string(l) + ", forward");
    HostTensor& x0 = l == 0 ? x : saved.back().x2;
    HostTensor& qkv = l == 0 ? qkv0 : saved.back().qkv;
    saved.push_back({HostTensor::of(make.dt, {M, A}, attention(qkv.values(), c, start, lowp)),
                     make.output(D), make.output(Nq), make.output(D), make.output(2 * F),
                     make.stat(), make.stat()});
    Saved& s = saved.back();
    llama::middle_forward(c, w.middle(l), {x0.view(), s.y0.view(), rope.view()},
                          {s.x2.view(), s.qkv.view()},
                          {s.x1.view(), s.z1.view(), s.r1.view(), s.r2.view()}, ws_mid.view());
    const auto textbook = [&](ref::Rounding r) {
      return ref::middle_forward(rc, w.middle_textbook(l), rope.textbook(), x0.values(),
                                 s.y0.values(), r);
    };
    const ref::MiddleForward tf = textbook({}), lf = textbook(lowp);
    check("outputs.x2", s.x2, tf.mlp.x2, lf.mlp.x2);
    check("outputs.qkv", s.qkv, tf.qkv, lf.qkv);
    check_mlp_saved(s, s.z1, tf.mlp, lf.mlp, M, F);
    check("saved.r2", s.r2, tf.rstd2, lf.rstd2);
  }
  HostTensor y_last =
      HostTensor::of(make.dt, {M, A}, attention(saved.back().qkv.values(), c, start, lowp));
  HostTensor loss_out(DType::f32, {1}),
      logits = make.output(V), x1 = make.output(D), z1 = make.output(2 * F), r1 = make.stat(),
      x2 = make.output(D), r2 = make.stat(), dlogits = make.output(V), grad_scale(DType::f32, {1}),
      zeta = make.stat();
  const llama::LastInputs last_in{saved.back().x2.view(), y_last.view(), targets.view()};
  const llama::LastSaved last_saved{x1.view(), z1.view(),      r1.view(),         x2.view(),
                                    r2.view(), dlogits.view(), grad_scale.view(), zeta.view()};
  HostTensor ws_last = make.workspace(llama::Layer::last, llama::Pass::forward);
  llama::last_forward(c, w.last(), last_in, {loss_out.view(), logits.view()}, last_saved,
                      ws_last.view());
  const Values last_y0 = y_last.values();
  {
    SCOPED_TRACE("last layer, forward");
    const auto textbook = [&](ref::Rounding r) {
      return ref::last_forward(rc, w.last_textbook(), saved.back().x2.values(), last_y0, loss, r);
    };
    const ref::LastForward tf = textbook({}), lf = textbook(lowp);
    check_loss(loss_out, tf, lf, targets_v, V);
    check("outputs.logits", logits, tf.logits, lf.logits);
    check("saved.x1", x1, tf.mlp.x1, lf.mlp.x1);
    check("saved.z1", z1, interleave_columns(tf.mlp.gate, tf.mlp.up, M, F),
          interleave_columns(lf.mlp.gate, lf.mlp.up, M, F));
    check("saved.r1", r1, tf.mlp.rstd1, lf.mlp.rstd1);
    check("saved.x2", x2, tf.mlp.x2, lf.mlp.x2);
    check("saved.r2", r2, tf.rstd2, lf.rstd2);
    const auto softmax_minus_onehot = [&](ref::Rounding r, const Values& l) {
      Values d(l.size());
      ref::cross_entropy(r, M, V, l.data(), targets_v.data(), -100, ref::Reduction::sum, nullptr,
                         d.data());
      return d;
    };
    check("saved.dlogits", dlogits, softmax_minus_onehot({}, tf.logits),
          softmax_minus_onehot(lowp, lf.logits));
    check_zeta_of_stored_logits(zeta, logits.values(), targets_v, M, V);
    check("saved.grad_scale", grad_scale, {tf.ce.grad_scale}, {lf.ce.grad_scale});
  }

  // Backward, layer by layer, each call against the textbook backward of the gradients and
  // saved activations it reads, in fp64 and in the 16-bit dtype.
  const DType g = bc.grad_dtype;
  HostTensor dx = make.output(D), dy = make.output(A);
  {
    SCOPED_TRACE("last layer, backward");
    Grad d_out = make.grad(g, {D, A}, false), d_ffn = make.grad(g, {D}, false),
         d_gate_up = make.grad(g, {2 * F, D}, false), d_down = make.grad(g, {D, F}, false),
         d_final = make.grad(g, {D}, false), d_head = make.grad(g, {V, D}, false);
    HostTensor ws = make.workspace(llama::Layer::last, llama::Pass::backward);
    // What the backward reads, taken before it overwrites saved.z1 with its gradient.
    const ref::MlpSaved mlp = mlp_saved(x1, z1, r1, x2, M, F);
    llama::last_backward(c, w.last(), last_in, last_saved,
                         {coda::Scalar{1.f},
                          dx.view(),
                          dy.view(),
                          {d_out.tensor.view(), d_ffn.tensor.view(), d_gate_up.tensor.view(),
                           d_down.tensor.view(), d_final.tensor.view(), d_head.tensor.view()}},
                         false, ws.view());
    // The loss gradient as the backward reads it: saved.dlogits scaled by dloss * grad_scale
    // (1 * saved.grad_scale), exact for the truth, rounded once for the unfused baseline.
    const double alpha = grad_scale.values()[0];
    Values dl = dlogits.values(), dl_lowp(dl.size());
    for (size_t i = 0; i < dl.size(); ++i) dl[i] *= alpha, dl_lowp[i] = lowp(dl[i]);
    const auto textbook = [&](const Values& d, ref::Rounding r) {
      return ref::last_backward_from_saved(rc, w.last_textbook(), last_y0, mlp, r2.values(), d, r);
    };
    const ref::LastBackward tb = textbook(dl, {}), lb = textbook(dl_lowp, lowp);
    const ref::LastWeights &e = tb.grads, &u = lb.grads;
    check("last: grads.dx", dx, tb.dx0, lb.dx0);
    check("last: grads.dy0", dy, tb.dy0, lb.dy0);
    check_grad("last: d w_out", d_out, e.w_o, u.w_o);
    check_grad("last: d ffn_norm", d_ffn, e.ffn_norm, u.ffn_norm);
    check_grad("last: d w_gate_up", d_gate_up,
               ref::fused::interleave_gate_up(F, D, e.w_gate, e.w_up),
               ref::fused::interleave_gate_up(F, D, u.w_gate, u.w_up));
    check_grad("last: d w_down", d_down, e.w_down, u.w_down);
    check_grad("last: d final_norm", d_final, e.final_norm, u.final_norm);
    check_grad("last: d lm_head", d_head, e.w_lm, u.w_lm);
  }
  HostTensor dqkv = HostTensor::of(
      make.dt, {M, Nq}, attention_backward(dy.values(), saved.back().qkv.values(), c, start, lowp));
  HostTensor ws_mid_b = make.workspace(llama::Layer::middle, llama::Pass::backward);
  for (int l = L - 2; l >= 0; --l) {
    SCOPED_TRACE("middle layer " + std::to_string(l) + ", backward");
    Saved& s = saved[size_t(l)];
    HostTensor& x0 = l == 0 ? x : saved[size_t(l - 1)].x2;
    const Values dx_in = dx.values(); // grads.dx is read (dx2) and overwritten (dx0)
    Grad d_out = make.grad(g, {D, A}, false), d_ffn = make.grad(g, {D}, false),
         d_gate_up = make.grad(g, {2 * F, D}, false), d_down = make.grad(g, {D, F}, false),
         d_norm = make.grad(g, {D}, false), d_qkv = make.grad(g, {Nq, D}, false);
    HostTensor dy0 = make.output(A);
    // What the backward reads, taken before it overwrites saved.z1 with its gradient.
    const ref::MlpSaved mlp = mlp_saved(s.x1, s.z1, s.r1, s.x2, M, F);
    llama::middle_backward(c, w.middle(l), {x0.view(), s.y0.view(), rope.view()},
                           {s.x2.view(), s.qkv.view()},
                           {s.x1.view(), s.z1.view(), s.r1.view(), s.r2.view()},
                           {dx.view(),
                            dqkv.view(),
                            dy0.view(),
                            {d_out.tensor.view(), d_ffn.tensor.view(), d_gate_up.tensor.view(),
                             d_down.tensor.view(), d_norm.tensor.view(), d_qkv.tensor.view()}},
                           false, ws_mid_b.view());
    const auto textbook = [&](ref::Rounding r) {
      return ref::middle_backward_from_saved(rc, w.middle_textbook(l), rope.textbook(),
                                             s.y0.values(), mlp, s.r2.values(), dx_in,
                                             dqkv.values(), r);
    };
    const ref::MiddleBackward tb = textbook({}), lb = textbook(lowp);
    const ref::MiddleWeights &e = tb.grads, &u = lb.grads;
    check("grads.dx (d x0)", dx, tb.dx0, lb.dx0);
    check("grads.dy0", dy0, tb.dy0, lb.dy0);
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
  const Values dx_in = dx.values();
  llama::first_backward(c, {w.attn_norm0.view(), w.w_qkv0.view()}, {x.view(), rope.view()},
                        {qkv0.view()}, {rstd0.view()},
                        {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}},
                        false, ws_first_b.view());
  const auto textbook = [&](ref::Rounding r) {
    return ref::first_backward_from_saved(rc, first_w, rope.textbook(), x.values(), rstd0.values(),
                                          dqkv.values(), dx_in, r);
  };
  const ref::FirstBackward tb = textbook({}), lb = textbook(lowp);
  check_grad("first: d attn_norm", d_norm, tb.grads.attn_norm, lb.grads.attn_norm);
  check_grad("first: d w_qkv", d_qkv, tb.grads.w_qkv, lb.grads.w_qkv);
  check("d embedding (dx)", dx, tb.dx0, lb.dx0);
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

// Precision::fp8 is every call's but the middle layer's two-part backward, so far: its two
// parts refuse it, naming the
// alternative (the size query and the call share the check); the forward's workspace holds the
// quantized operands beside the native one's; a precision that is neither is a bad argument.
TEST_F(BlockArguments, Fp8WorkspacesAreLargerAndABadPrecisionIsRefused) {
  llama::Config fp8 = make.c;
  fp8.precision = llama::Precision::fp8;
  for (llama::Pass pass : {llama::Pass::backward_part1, llama::Pass::backward_part2})
    EXPECT_GT(llama::workspace_size(llama::Layer::middle, pass, fp8, 16),
              llama::workspace_size(llama::Layer::middle, pass, make.c, 16));
  for (llama::Layer layer : {llama::Layer::first, llama::Layer::last})
    EXPECT_GT(llama::workspace_size(layer, llama::Pass::forward, fp8, 16),
              llama::workspace_size(layer, llama::Pass::forward, make.c, 16));
  EXPECT_GT(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, fp8, 16),
            llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 16));
  llama::Config bad = make.c;
  bad.precision = llama::Precision(7);
  expect_rejected(coda::Status::invalid_argument, "config.precision", bad, p.weights(), inputs(),
                  outputs(), workspace.view());
}

// The first layer's FP8 backward writes its weight gradients with gemm_fp8 (bf16 or f32): with
// f16 activations, an f16 one (which the 16-bit rule allows) is a type error naming it, with
// nothing written.
TEST(BlockFp8Arguments, F16WeightGradientIsNamed) {
  coda::test::Seeds seeds;
  Maker make{BlockCase{"fp8", make_config(64, 96, 2, 1, 32, 72), 32, DType::f16, DType::f16},
             seeds};
  make.c.precision = llama::Precision::fp8;
  const int64_t D = 64, Nq = make.c.qkv_width();
  RopeTensors rope(make.M, make.c.head_dim);
  HostTensor attn_norm = make.norm(), w_qkv = make.weight(Nq, D), x = make.activation(D);
  HostTensor qkv = make.activation(Nq),
             rstd = HostTensor::of(DType::f32, {make.M}, std::vector<double>(32, 1.0));
  HostTensor dqkv = make.activation(Nq), dx = make.activation(D);
  Grad d_norm = make.grad(DType::f16, {D}, false), d_qkv = make.grad(DType::f16, {Nq, D}, false);
  HostTensor ws = make.workspace(llama::Layer::first, llama::Pass::backward);
  try {
    llama::first_backward(make.c, {attn_norm.view(), w_qkv.view()}, {x.view(), rope.view()},
                          {qkv.view()}, {rstd.view()},
                          {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}},
                          false, ws.view());
    ADD_FAILURE() << "an f16 weight gradient was accepted";
  } catch (const coda::Error& e) {
    EXPECT_EQ(int(e.status()), int(coda::Status::type_error)) << e.what();
    EXPECT_NE(std::string(e.what()).find("grads.dweights.w_qkv"), std::string::npos) << e.what();
  }
  for (double v : d_qkv.tensor.values()) ASSERT_TRUE(std::isnan(v)) << "d w_qkv was written";
  for (double v : d_norm.tensor.values()) ASSERT_TRUE(std::isnan(v)) << "d attn_norm was written";
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

// The two-part backward: a pass that is not a part, a part missing one of its own gradients, and
// the parts of a layer that has none are each rejected, naming what to fix, with nothing written.
TEST_F(BlockArguments, BackwardPartsCheckTheirArguments) {
  llama::middle_forward(make.c, p.weights(), inputs(), outputs(), saved(), workspace.view());
  HostTensor z1_before = z1, r2_before = r2; // same_bits takes non-const tensors
  HostTensor dx = HostTensor::of(make.dt, {make.M, 64}, p.dx2.values()), dy0 = make.output(64);
  HostTensor d_down = HostTensor(DType::f32, {64, 96}), d_attn = HostTensor(DType::f32, {64});
  HostTensor d_qkv = HostTensor(DType::f32, {make.c.qkv_width(), 64});
  const Values dx_before = dx.values();
  HostTensor ws = make.workspace(llama::Layer::middle, llama::Pass::backward_part1);

  llama::MiddleGrads part1{dx.view(), p.dqkv.view(), {}, {}};
  part1.dweights.attn_norm = d_attn.view();
  part1.dweights.w_qkv = d_qkv.view();
  const auto expect_rejected = [&](llama::Pass part, const llama::MiddleGrads& g,
                                   const std::string& field, const llama::MiddleOutputs& out) {
    try {
      llama::middle_backward_part(part, make.c, p.weights(), inputs(), out, saved(), g, false,
                                  ws.view());
      ADD_FAILURE() << "accepted a call that should fail on " << field;
    } catch (const coda::Error& e) {
      EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument)) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_EQ(dx.values(), dx_before);
    EXPECT_TRUE(same_bits(z1, z1_before));
    EXPECT_TRUE(same_bits(r2, r2_before));
  };
  expect_rejected(llama::Pass::backward_part1, part1, "grads.dweights.w_down", outputs()); // absent
  part1.dweights.w_down = d_down.view();
  expect_rejected(llama::Pass::backward, part1, "part must be", outputs());
  llama::MiddleOutputs without_qkv = outputs(); // part 1 reads qkv (B0); part 2 may go without
  without_qkv.qkv = {};
  expect_rejected(llama::Pass::backward_part1, part1, "outputs.qkv", without_qkv);
  llama::MiddleGrads part2{dx.view(), {}, dy0.view(), {}};
  expect_rejected(llama::Pass::backward_part2, part2, "grads.dweights.w_out", without_qkv);
  part1.dy0 = dy0.view(); // the other part's gradients are not looked at
  part1.dy0.shape[1] = 7;
  EXPECT_NO_THROW(llama::middle_backward_part(llama::Pass::backward_part1, make.c, p.weights(),
                                              inputs(), outputs(), saved(), part1, false,
                                              ws.view()));
  EXPECT_FALSE(same_bits(r2, r2_before)) << "part 1 leaves zeta1 over saved.r2";

  EXPECT_THROW(llama::workspace_size(llama::Layer::last, llama::Pass::backward_part1, make.c, 16),
               coda::Error);
  EXPECT_THROW(llama::workspace_size(llama::Layer::first, llama::Pass::backward_part2, make.c, 16),
               coda::Error);
  const size_t one = llama::workspace_size(llama::Layer::middle, llama::Pass::backward, make.c, 16);
  EXPECT_EQ(llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part1, make.c, 16),
            one);
  EXPECT_LT(llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part2, make.c, 16),
            one);
}

// ---------------------------------------------------------------------------------------------
// The weights' FP8 copies (coda/block/llama.hpp, Fp8Weight): quantize_weights against the
// quantizer, their size, and bad copies refused by name with nothing written. (The Block suite's
// *Fp8GivenWeights tests check what a call does with good ones.)

// Every tensor of `copies` still poisoned: nothing wrote it.
void expect_unwritten(const WeightCopies& copies, const std::string& what) {
  for (const HostTensor& t : copies.tensors) {
    for (double v : t.values()) ASSERT_TRUE(std::isnan(v)) << what << ": a copy was written";
    EXPECT_TRUE(t.guard_intact());
  }
}

// quantize_weights writes each weight's two copies as quantize_weight_fp8 does alone, one copy a
// call (the block's own calls, in which a forward or backward quantizes one copy of each weight it
// reads), bit for bit; it reads no norm (absent here). fp8_weights_size counts every copy's byte.
TEST_F(BlockArguments, QuantizeWeightsIsTheQuantizerOnEachWeight) {
  llama::Config fp8 = make.c;
  fp8.precision = llama::Precision::fp8;
  WeightCopies q = WeightCopies::middle(fp8);
  llama::MiddleWeights w = p.weights();
  w.ffn_norm = w.attn_norm = coda::TensorView{};
  llama::quantize_weights(fp8, w, q.middle());
  const coda::TensorView weights[] = {w.w_out, w.w_gate_up, w.w_down, w.w_qkv};
  WeightCopies alone = WeightCopies::middle(fp8);
  for (size_t i = 0; i < 4; ++i) {
    coda::QuantizeWeightFp8Args rows, columns;
    rows.w = columns.w = weights[i];
    rows.codes = alone.tensors[4 * i].view();
    rows.scales = alone.tensors[4 * i + 1].view();
    columns.codes_t = alone.tensors[4 * i + 2].view();
    columns.scales_t = alone.tensors[4 * i + 3].view();
    coda::quantize_weight_fp8(rows);
    coda::quantize_weight_fp8(columns);
  }
  for (size_t t = 0; t < q.tensors.size(); ++t)
    EXPECT_TRUE(same_bits(q.tensors[t], alone.tensors[t])) << "copy tensor " << t;

  size_t bytes = 0; // 1 byte an element: E4M3 codes, E8M0 scales
  for (const HostTensor& t : q.tensors) bytes += size_t(t.numel());
  EXPECT_EQ(llama::fp8_weights_size(llama::Layer::middle, fp8), bytes);
  for (const auto& [layer, copies] : {std::pair{llama::Layer::first, WeightCopies::first(fp8)},
                                      std::pair{llama::Layer::last, WeightCopies::last(fp8)}}) {
    size_t layer_bytes = 0;
    for (const HostTensor& t : copies.tensors) layer_bytes += size_t(t.numel());
    EXPECT_EQ(llama::fp8_weights_size(layer, fp8), layer_bytes) << int(layer);
  }
  EXPECT_THROW(llama::fp8_weights_size(llama::Layer::middle, make.c), coda::Error); // native
  EXPECT_THROW(llama::fp8_weights_size(llama::Layer(7), fp8), coda::Error);
}

// quantize_weights' refusals: a native config, a copy of the wrong shape, a copy or a weight
// absent, two copies over one another; each names what to fix and writes nothing.
TEST_F(BlockArguments, QuantizeWeightsChecksItsArguments) {
  llama::Config fp8 = make.c;
  fp8.precision = llama::Precision::fp8;
  WeightCopies q = WeightCopies::middle(fp8);
  const auto expect_rejected = [&](const llama::Config& config, const llama::MiddleWeights& w,
                                   const llama::MiddleFp8Weights& copies, coda::Status status,
                                   const std::string& message) {
    try {
      llama::quantize_weights(config, w, copies);
      ADD_FAILURE() << "accepted a call that should fail on " << message;
    } catch (const coda::Error& e) {
      EXPECT_EQ(int(e.status()), int(status)) << e.what();
      EXPECT_NE(std::string(e.what()).find("coda::llama::quantize_weights"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    expect_unwritten(q, message);
  };
  expect_rejected(make.c, p.weights(), q.middle(), coda::Status::invalid_argument,
                  "config.precision must be Precision::fp8");
  llama::MiddleFp8Weights copies = q.middle();
  copies.w_down.scales = q.middle().w_gate_up.scales; // [2, 1] for [1, 1]
  expect_rejected(fp8, p.weights(), copies, coda::Status::invalid_argument,
                  "fp8_weights.w_down.scales must have shape [ceil(hidden/128), "
                  "ceil(intermediate/128)] = [1, 1]; got [2, 1]");
  copies = q.middle();
  copies.w_out.codes = {};
  expect_rejected(fp8, p.weights(), copies, coda::Status::invalid_argument,
                  "fp8_weights.w_out.codes is required");
  copies = q.middle();
  copies.w_out.codes_t = copies.w_out.codes; // [64, 64] both: the shapes allow it
  expect_rejected(fp8, p.weights(), copies, coda::Status::invalid_argument, "overlaps");
  llama::MiddleWeights w = p.weights();
  w.w_qkv = {};
  expect_rejected(fp8, w, q.middle(), coda::Status::invalid_argument, "weights.w_qkv is required");
}

// Copies given to a call: refused with a native config, when some are absent, in a wrong shape or
// dtype, or under an output; by name, with every output still poisoned. The backward checks them
// as the forward does.
TEST_F(BlockArguments, GivenFp8WeightsAreChecked) {
  llama::Config fp8 = make.c;
  fp8.precision = llama::Precision::fp8;
  HostTensor ws = HostTensor(
      DType::f32,
      {int64_t(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, fp8, make.M) / 4 +
               1)});
  WeightCopies q = WeightCopies::middle(fp8);
  llama::quantize_weights(fp8, p.weights(), q.middle());
  const auto given = [&](const llama::MiddleFp8Weights& copies) {
    llama::MiddleInputs in = inputs();
    in.fp8_weights = copies;
    return in;
  };
  expect_rejected(coda::Status::invalid_argument,
                  "inputs.fp8_weights.w_out.codes is given, but config.precision is not fp8",
                  make.c, p.weights(), given(q.middle()), outputs(), workspace.view());
  llama::MiddleFp8Weights copies = q.middle();
  copies.w_down.codes_t = {};
  expect_rejected(coda::Status::invalid_argument,
                  "inputs.fp8_weights.w_out.codes is given but inputs.fp8_weights.w_down.codes_t "
                  "is absent",
                  fp8, p.weights(), given(copies), outputs(), ws.view());
  copies = q.middle();
  copies.w_gate_up.codes_t = copies.w_gate_up.codes; // the forward copy for the transposed one
  expect_rejected(coda::Status::invalid_argument,
                  "inputs.fp8_weights.w_gate_up.codes_t must have shape [hidden, 2*intermediate] "
                  "= [64, 192]; got [192, 64]",
                  fp8, p.weights(), given(copies), outputs(), ws.view());
  copies = q.middle();
  copies.w_qkv.scales.dtype = DType::e4m3;
  expect_rejected(coda::Status::type_error, "inputs.fp8_weights.w_qkv.scales must be e8m0", fp8,
                  p.weights(), given(copies), outputs(), ws.view());
  llama::MiddleOutputs out = outputs();
  out.x2 = make_view(q.tensors[0].view().data, make.dt, make.M, 64); // over w_out's codes
  expect_rejected(coda::Status::invalid_argument, "x2 overlaps inputs.fp8_weights.w_out.codes", fp8,
                  p.weights(), given(q.middle()), out, ws.view());

  // The last layer's backward, given copies with a native config: refused before it writes.
  LastProblem last(make, ref::Reduction::mean);
  WeightCopies lq = WeightCopies::last(fp8);
  llama::quantize_weights(fp8, last.weights(), lq.last());
  HostTensor x1 = make.activation(64), z1 = make.activation(192), r1 = make.stat();
  HostTensor x2 = make.activation(64), r2 = make.stat(), dlogits = make.activation(72);
  HostTensor grad_scale(DType::f32, {1}), zeta = make.stat(), dx = make.output(64);
  HostTensor dy0 = make.output(64), d_out(DType::f32, {64, 64}), d_ffn(DType::f32, {64});
  HostTensor d_gate_up(DType::f32, {192, 64}), d_down(DType::f32, {64, 96});
  HostTensor d_final(DType::f32, {64}), d_head(DType::f32, {72, 64});
  const Values z1_before = z1.values();
  const llama::LastGrads grads{
      coda::Scalar{1.f, {}},
      dx.view(),
      dy0.view(),
      {d_out.view(), d_ffn.view(), d_gate_up.view(), d_down.view(), d_final.view(), d_head.view()}};
  try {
    llama::last_backward(make.c, last.weights(), {last.x0.view(), last.y0.view(), {}, lq.last()},
                         {x1.view(), z1.view(), r1.view(), x2.view(), r2.view(), dlogits.view(),
                          grad_scale.view(), zeta.view()},
                         grads, false, workspace.view());
    ADD_FAILURE() << "a native backward given FP8 copies was accepted";
  } catch (const coda::Error& e) {
    EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument)) << e.what();
    EXPECT_NE(std::string(e.what()).find("coda::llama::last_backward: inputs.fp8_weights.w_out."
                                         "codes is given, but config.precision is not fp8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(z1.values(), z1_before) << "saved.z1 was written";
  for (HostTensor* t : {&dx, &dy0, &d_out, &d_ffn, &d_gate_up, &d_down, &d_final, &d_head})
    for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "a gradient was written";
}

// The workspace of a call given the weights' FP8 copies (workspace_size with
// Fp8WeightCopies::given) leaves out the regions the call would quantize the weights into, and
// only those. A weight's copy [N, K] is its codes and its scales, each carved at a 256-byte
// boundary (Arena), so it takes
//   bytes(N, K)  = N K + ceil(N/128) ceil(K/128)         unpadded, and
//   padded(N, K) = align256(N K) + align256(ceil(N/128) ceil(K/128))   with the padding after.
// Where this is exact: a forward's weight copies lie over one another after everything else,
// the largest setting the size, so the saving is the largest forward copy (codes padded, scales
// not: nothing follows them) plus the padding before the region; the first layer's backward
// carves W_qkv's transposed copy between the activations' operands, so its saving is that copy,
// padded. The middle and last layers' backwards carve one weight copy in each of the phases that
// lie over one another, and the saving depends on which phase is longest without its copy: at
// least the smallest of the pass's copies, at most the largest, padded. With a config whose four
// weights differ in size, so that a copy of the wrong weight or an activation left out would
// show.
TEST(BlockFp8Workspace, GivenCopiesSaveTheirRegions) {
  llama::Config c = make_config(256, 704, 4, 2, 64, 300); // W_qkv 512 rows, A = 256
  c.precision = llama::Precision::fp8;
  const int64_t M = 208, D = c.hidden, F = c.intermediate, A = c.attention_width();
  const int64_t Q = c.qkv_width();
  const auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const auto blocks = [](int64_t n, int64_t k) {
    return size_t(coda::num_fp8_scale_blocks(n) * coda::num_fp8_scale_blocks(k));
  };
  const auto bytes = [&](std::pair<int64_t, int64_t> w) {
    return size_t(w.first * w.second) + blocks(w.first, w.second);
  };
  const auto padded = [&](std::pair<int64_t, int64_t> w) {
    return align(size_t(w.first * w.second)) + align(blocks(w.first, w.second));
  };
  const auto forward_region = [&](std::pair<int64_t, int64_t> w) {
    return align(size_t(w.first * w.second)) + blocks(w.first, w.second);
  };
  // Each weight [N, K] as nn.Linear stores it (the transposed copy has the same bytes).
  const std::pair<int64_t, int64_t> w_qkv{Q, D}, w_out{D, A}, w_gate_up{2 * F, D}, w_down{D, F};
  using Weights = std::vector<std::pair<int64_t, int64_t>>;
  const Weights first{w_qkv}, mlp{w_out, w_gate_up, w_down};
  const Weights middle{w_out, w_gate_up, w_down, w_qkv};

  struct Case {
    llama::Layer layer;
    llama::Pass pass;
    const Weights& weights; // the copies the call's workspace would hold
    const char* name;
  };
  const Case cases[] = {
      {llama::Layer::first, llama::Pass::forward, first, "first forward"},
      {llama::Layer::first, llama::Pass::backward, first, "first backward"},
      {llama::Layer::middle, llama::Pass::forward, middle, "middle forward"},
      {llama::Layer::middle, llama::Pass::backward, middle, "middle backward"},
      {llama::Layer::middle, llama::Pass::backward_part1, middle, "middle backward part 1"},
      {llama::Layer::middle, llama::Pass::backward_part2, mlp, "middle backward part 2"},
      {llama::Layer::last, llama::Pass::forward, mlp, "last forward"},
      {llama::Layer::last, llama::Pass::backward, mlp, "last backward"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const size_t full = llama::workspace_size(k.layer, k.pass, c, M);
    const size_t given =
        llama::workspace_size(k.layer, k.pass, c, M, llama::Fp8WeightCopies::given);
    EXPECT_EQ(llama::workspace_size(k.layer, k.pass, c, M, llama::Fp8WeightCopies::in_workspace),
              full);
    ASSERT_LT(given, full);
    const size_t saved = full - given;
    size_t least = SIZE_MAX, most = 0, largest_forward = 0;
    for (const auto& w : k.weights) {
      least = std::min(least, bytes(w));
      most = std::max(most, padded(w));
      largest_forward = std::max(largest_forward, forward_region(w));
    }
    if (k.pass == llama::Pass::forward) {
      EXPECT_EQ(saved, align(given) - given + largest_forward);
    } else if (k.layer == llama::Layer::first) {
      EXPECT_EQ(saved, padded(w_qkv));
    }
    EXPECT_GE(saved, least);
    EXPECT_LE(saved, most + 255);
  }

  // Native calls read no copies: the given size is refused, as is a source that is neither.
  llama::Config native = c;
  native.precision = llama::Precision::native;
  try {
    llama::workspace_size(llama::Layer::middle, llama::Pass::forward, native, M,
                          llama::Fp8WeightCopies::given);
    ADD_FAILURE() << "the given-copies size of a native call was answered";
  } catch (const coda::Error& e) {
    EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument));
    EXPECT_NE(std::string(e.what()).find("coda::llama::workspace_size: Fp8WeightCopies::given "
                                         "needs config.precision = Precision::fp8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, native, M,
                                  llama::Fp8WeightCopies::in_workspace),
            llama::workspace_size(llama::Layer::middle, llama::Pass::forward, native, M));
  EXPECT_THROW(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, c, M,
                                     llama::Fp8WeightCopies(2)),
               coda::Error);
}

// A workspace of the given-copies size serves only a call given the copies: one that quantizes
// its own weights is refused, saying why, with nothing written; given them, it runs in that
// workspace, and one byte less is refused naming the given-copies size.
TEST_F(BlockArguments, GivenCopiesWorkspaceNeedsTheCopies) {
  llama::Config fp8 = make.c;
  fp8.precision = llama::Precision::fp8;
  const size_t full = llama::workspace_size(llama::Layer::middle, llama::Pass::forward, fp8, 13);
  const size_t small = llama::workspace_size(llama::Layer::middle, llama::Pass::forward, fp8, 13,
                                             llama::Fp8WeightCopies::given);
  ASSERT_LT(small, full);
  HostTensor ws(DType::e4m3, {int64_t(small)}); // one byte an element
  expect_rejected(coda::Status::invalid_argument,
                  "workspace holds " + std::to_string(small) + " bytes but this call needs " +
                      std::to_string(full) +
                      " (coda::llama::workspace_size(Layer::middle, Pass::forward, config, "
                      "M=13)): inputs.fp8_weights are absent, so the call quantizes the weights "
                      "into its workspace",
                  fp8, p.weights(), inputs(), outputs(), ws.view());

  WeightCopies q = WeightCopies::middle(fp8);
  llama::quantize_weights(fp8, p.weights(), q.middle());
  llama::MiddleInputs given = inputs();
  given.fp8_weights = q.middle();
  coda::TensorView short_ws = ws.view();
  short_ws.shape[0] -= 1;
  expect_rejected(coda::Status::invalid_argument,
                  "workspace holds " + std::to_string(small - 1) + " bytes but this call needs " +
                      std::to_string(small) +
                      " (coda::llama::workspace_size(Layer::middle, Pass::forward, config, M=13, "
                      "Fp8WeightCopies::given))",
                  fp8, p.weights(), given, outputs(), short_ws);
  llama::middle_forward(fp8, p.weights(), given, outputs(), saved(), ws.view());
  EXPECT_TRUE(ws.guard_intact()) << "the call wrote past its workspace";
  for (double v : x2.values()) ASSERT_FALSE(std::isnan(v)) << "outputs.x2 was not written";
}

// The same refusal in a backward (the first layer's), with nothing written: the gradients stay
// poisoned and dx (accumulated into) as it was.
TEST(BlockFp8Workspace, BackwardNotGivenCopiesNeedsTheFullWorkspace) {
  coda::test::Seeds seeds;
  Maker make{BlockCase{"fp8", make_config(64, 96, 2, 1, 32, 72), 32, DType::bf16, DType::f32},
             seeds};
  make.c.precision = llama::Precision::fp8;
  FirstProblem p(make);
  HostTensor qkv = make.activation(make.c.qkv_width());
  HostTensor rstd = HostTensor::of(DType::f32, {make.M}, std::vector<double>(32, 1.0));
  HostTensor d_norm(DType::f32, {64}), d_qkv(DType::f32, {make.c.qkv_width(), 64});
  const Values dx_before = p.dx.values();
  HostTensor ws =
      make.workspace(llama::Layer::first, llama::Pass::backward, llama::Fp8WeightCopies::given);
  try {
    llama::first_backward(
        make.c, p.weights(), {p.x.view(), p.rope.view()}, {qkv.view()}, {rstd.view()},
        {p.dx.view(), p.dqkv.view(), {d_norm.view(), d_qkv.view()}}, false, ws.view());
    ADD_FAILURE() << "a backward quantizing its weights ran in the given-copies workspace";
  } catch (const coda::Error& e) {
    EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument)) << e.what();
    EXPECT_NE(std::string(e.what()).find("coda::llama::first_backward: workspace holds"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("inputs.fp8_weights are absent"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(p.dx.values(), dx_before) << "grads.dx was written";
  for (HostTensor* t : {&d_norm, &d_qkv})
    for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "a gradient was written";
  for (double v : ws.values()) ASSERT_TRUE(std::isnan(v)) << "the workspace was written";
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
  return {c.hidden,
          c.intermediate,
          c.n_heads,
          c.n_kv_heads,
          c.head_dim,
          c.vocab,
          c.eps,
          c.ignore_index,
          int32_t(c.loss_reduction),
          int32_t(c.precision)};
}

TEST_F(BlockArguments, CAbiMatchesCpp) {
  const coda_llama_config config = c_config(make.c);
  size_t bytes = 0;
  ASSERT_EQ(coda_llama_workspace_size(CODA_LLAMA_MIDDLE, CODA_LLAMA_FORWARD, &config, 13, &bytes),
            CODA_OK);
  EXPECT_EQ(bytes, llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 13));
  ASSERT_EQ(
      coda_llama_workspace_size(CODA_LLAMA_MIDDLE, CODA_LLAMA_BACKWARD_PART1, &config, 13, &bytes),
      CODA_OK);
  EXPECT_EQ(bytes,
            llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part1, make.c, 13));

  const llama::MiddleWeights w = p.weights();
  const coda_llama_middle_weights cw{c_tensor(w.w_out),     c_tensor(w.ffn_norm),
                                     c_tensor(w.w_gate_up), c_tensor(w.w_down),
                                     c_tensor(w.attn_norm), c_tensor(w.w_qkv)};
  const llama::MiddleInputs in = inputs();
  const coda_llama_middle_inputs ci{c_tensor(in.x0),
                                    c_tensor(in.y0),
                                    {c_tensor(in.rope.positions), c_tensor(in.rope.inv_freq)},
                                    {}};
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
  EXPECT_EQ(coda_llama_middle_backward_part(CODA_LLAMA_BACKWARD_PART2, nullptr, nullptr, nullptr,
                                            nullptr, nullptr, nullptr, 0, nullptr, nullptr),
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
  const coda_llama_first_inputs in{none, {none, none}, {}};
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
