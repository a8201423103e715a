#include "reference/llama.hpp"

#include <stdexcept>
#include <string>

namespace coda::ref {
namespace {

// ---- Validation: every size is checked before anything is computed.

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("llama: " + what); }

template <class T> void expect_size(std::span<const T> v, int64_t n, const char* what) {
  if (int64_t(v.size()) != n)
    bad(std::string(what) + " has " + std::to_string(v.size()) + " elements, expected " +
        std::to_string(n));
}

void check_config(const LlamaConfig& c, bool needs_mlp, bool needs_vocab) {
  if (c.hidden <= 0) bad("hidden must be positive");
  if (needs_mlp && c.intermediate <= 0) bad("intermediate must be positive");
  if (c.n_heads <= 0 || c.n_kv_heads <= 0) bad("n_heads and n_kv_heads must be positive");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) bad("head_dim must be positive and even");
  if (needs_vocab && c.vocab <= 0) bad("vocab must be positive");
  if (!(c.eps >= 0)) bad("eps must be >= 0");
}

// M from x0 [M, D]: at least one full row, no partial row.
int64_t rows_of(const LlamaConfig& c, std::span<const double> x0, const char* name = "x0") {
  if (x0.empty() || int64_t(x0.size()) % c.hidden != 0)
    bad(std::string(name) + " must be [M, hidden] with M >= 1; got " + std::to_string(x0.size()) +
        " elements");
  return int64_t(x0.size()) / c.hidden;
}

void check_rope(const LlamaConfig& c, RopeInputs rope, int64_t M) {
  expect_size(rope.positions, M, "rope.positions");
  expect_size(rope.inv_freq, c.head_dim / 2, "rope.inv_freq");
}

// ---- RMSNorm followed by a projection: h = RMSNorm(x; gamma), z = h · wᵀ.

struct NormProject {
  Matrix rstd, h, z;
};

NormProject norm_project(Rounding r, int64_t M, int64_t D, int64_t N, const double* x,
                         const Matrix& gamma, const Matrix& w, double eps) {
  NormProject out{Matrix(size_t(M)), Matrix(size_t(M * D)), Matrix(size_t(M * N))};
  rmsnorm_forward(r, M, D, x, gamma.data(), eps, out.h.data(), out.rstd.data());
  linear(r, Layout::fwd, M, N, D, out.h.data(), w.data(), out.z.data());
  return out;
}

struct NormProjectGrads {
  Matrix dx, dgamma, dw; // dx is the gradient through the norm path only
};

NormProjectGrads norm_project_backward(Rounding r, int64_t M, int64_t D, int64_t N, const double* x,
                                       const Matrix& gamma, const Matrix& w, const NormProject& fwd,
                                       const Matrix& dz) {
  NormProjectGrads g{Matrix(size_t(M * D)), Matrix(size_t(D)), Matrix(size_t(N * D))};
  Matrix dh(size_t(M * D));
  linear(r, Layout::dgrad, M, D, N, dz.data(), w.data(), dh.data());       // dz · w
  linear(r, Layout::wgrad, N, D, M, dz.data(), fwd.h.data(), g.dw.data()); // dzᵀ · h
  rmsnorm_backward(r, M, D, x, gamma.data(), fwd.rstd.data(), dh.data(), g.dx.data(),
                   g.dgamma.data());
  return g;
}

// ---- The attention-output projection and the MLP (shared by middle and last).

struct MlpWeightsView {
  const Matrix &w_o, &ffn_norm, &w_gate, &w_up, &w_down;
};
struct MlpGrads {
  Matrix dgate, dup, dx0, dy0;
  Matrix w_o, ffn_norm, w_gate, w_up, w_down;
};

void check_mlp(const LlamaConfig& c, const MlpWeightsView& w, int64_t M,
               std::span<const double> y0) {
  const int64_t D = c.hidden, F = c.intermediate;
  expect_size<double>(y0, M * c.attn_width(), "y0");
  expect_size<double>(w.w_o, D * c.attn_width(), "w_o");
  expect_size<double>(w.ffn_norm, D, "ffn_norm");
  expect_size<double>(w.w_gate, F * D, "w_gate");
  expect_size<double>(w.w_up, F * D, "w_up");
  expect_size<double>(w.w_down, D * F, "w_down");
}

MlpForward mlp_forward(Rounding r, const LlamaConfig& c, const MlpWeightsView& w, int64_t M,
                       std::span<const double> x0, std::span<const double> y0) {
  const int64_t D = c.hidden, F = c.intermediate, A = c.attn_width();
  MlpForward f;
  Matrix proj(size_t(M * D));
  linear(r, Layout::fwd, M, D, A, y0.data(), w.w_o.data(), proj.data());
  f.x1.resize(size_t(M * D));
  add(r, M * D, x0.data(), proj.data(), f.x1.data());
  f.h1.resize(size_t(M * D));
  f.rstd1.resize(size_t(M));
  rmsnorm_forward(r, M, D, f.x1.data(), w.ffn_norm.data(), c.eps, f.h1.data(), f.rstd1.data());
  f.gate.resize(size_t(M * F));
  f.up.resize(size_t(M * F));
  linear(r, Layout::fwd, M, F, D, f.h1.data(), w.w_gate.data(), f.gate.data());
  linear(r, Layout::fwd, M, F, D, f.h1.data(), w.w_up.data(), f.up.data());
  f.y1.resize(size_t(M * F));
  swiglu_forward(r, M, F, f.gate.data(), f.up.data(), f.y1.data());
  linear(r, Layout::fwd, M, D, F, f.y1.data(), w.w_down.data(), proj.data());
  f.x2.resize(size_t(M * D));
  add(r, M * D, f.x1.data(), proj.data(), f.x2.data());
  return f;
}

// dx2: the total gradient of x2. Returns the gradients of x0, y0 and the five weights.
MlpGrads mlp_backward(Rounding r, const LlamaConfig& c, const MlpWeightsView& w, int64_t M,
                      std::span<const double> y0, const MlpForward& f, const Matrix& dx2) {
  const int64_t D = c.hidden, F = c.intermediate, A = c.attn_width();
  MlpGrads g;
  // x2 = x1 + y1 · w_downᵀ
  Matrix dy1(size_t(M * F));
  linear(r, Layout::dgrad, M, F, D, dx2.data(), w.w_down.data(), dy1.data());
  g.w_down.resize(size_t(D * F));
  linear(r, Layout::wgrad, D, F, M, dx2.data(), f.y1.data(), g.w_down.data());
  // y1 = silu(gate) * up
  g.dgate.resize(size_t(M * F));
  g.dup.resize(size_t(M * F));
  swiglu_backward(r, M, F, f.gate.data(), f.up.data(), dy1.data(), g.dgate.data(), g.dup.data());
  // gate = h1 · w_gateᵀ, up = h1 · w_upᵀ
  Matrix dh1(size_t(M * D)), dh1_up(size_t(M * D));
  linear(r, Layout::dgrad, M, D, F, g.dgate.data(), w.w_gate.data(), dh1.data());
  linear(r, Layout::dgrad, M, D, F, g.dup.data(), w.w_up.data(), dh1_up.data());
  add(r, M * D, dh1.data(), dh1_up.data(), dh1.data());
  g.w_gate.resize(size_t(F * D));
  g.w_up.resize(size_t(F * D));
  linear(r, Layout::wgrad, F, D, M, g.dgate.data(), f.h1.data(), g.w_gate.data());
  linear(r, Layout::wgrad, F, D, M, g.dup.data(), f.h1.data(), g.w_up.data());
  // h1 = RMSNorm(x1; ffn_norm); x1 also feeds x2 directly.
  Matrix dx1(size_t(M * D));
  g.ffn_norm.resize(size_t(D));
  rmsnorm_backward(r, M, D, f.x1.data(), w.ffn_norm.data(), f.rstd1.data(), dh1.data(), dx1.data(),
                   g.ffn_norm.data());
  add(r, M * D, dx1.data(), dx2.data(), dx1.data());
  // x1 = x0 + y0 · w_oᵀ
  g.dy0.resize(size_t(M * A));
  linear(r, Layout::dgrad, M, A, D, dx1.data(), w.w_o.data(), g.dy0.data());
  g.w_o.resize(size_t(D * A));
  linear(r, Layout::wgrad, D, A, M, dx1.data(), y0.data(), g.w_o.data());
  g.dx0 = std::move(dx1);
  return g;
}

// The MLP weights of a MiddleWeights or LastWeights.
template <class Weights> MlpWeightsView mlp_view(const Weights& w) {
  return {w.w_o, w.ffn_norm, w.w_gate, w.w_up, w.w_down};
}

// Moves the MLP backward's results into a MiddleBackward or LastBackward.
template <class Backward> void take_mlp_grads(MlpGrads& g, Backward& b) {
  b.dgate = std::move(g.dgate);
  b.dup = std::move(g.dup);
  b.dx0 = std::move(g.dx0);
  b.dy0 = std::move(g.dy0);
  b.grads.w_o = std::move(g.w_o);
  b.grads.ffn_norm = std::move(g.ffn_norm);
  b.grads.w_gate = std::move(g.w_gate);
  b.grads.w_up = std::move(g.w_up);
  b.grads.w_down = std::move(g.w_down);
}

// ---- The projection to QKV of the next layer: norm, project, RoPE.

NormProject qkv_forward(Rounding r, const LlamaConfig& c, RopeInputs rope, int64_t M,
                        const double* x, const Matrix& norm, const Matrix& w_qkv, Matrix& qkv) {
  NormProject p = norm_project(r, M, c.hidden, c.qkv_width(), x, norm, w_qkv, c.eps);
  qkv.resize(p.z.size());
  rope_forward(r, M, c.rope_shape(), rope.positions.data(), rope.inv_freq.data(), p.z.data(),
               qkv.data());
  return p;
}

// The backward of qkv_forward, given the gradient dx_res [M, D] that reaches x by the residual
// stream: dz is the gradient of the projection before RoPE, dx the total gradient of x (dx_res +
// the gradient through the norm path), dgamma and dw those of norm and w_qkv.
void qkv_backward(Rounding r, const LlamaConfig& c, RopeInputs rope, int64_t M, const double* x,
                  const Matrix& norm, const Matrix& w_qkv, const NormProject& fwd,
                  std::span<const double> dqkv, std::span<const double> dx_res, Matrix& dz,
                  Matrix& dx, Matrix& dgamma, Matrix& dw) {
  dz.resize(dqkv.size());
  rope_backward(r, M, c.rope_shape(), rope.positions.data(), rope.inv_freq.data(), dqkv.data(),
                dz.data());
  NormProjectGrads g =
      norm_project_backward(r, M, c.hidden, c.qkv_width(), x, norm, w_qkv, fwd, dz);
  add(r, M * c.hidden, dx_res.data(), g.dx.data(), g.dx.data());
  dx = std::move(g.dx);
  dgamma = std::move(g.dgamma);
  dw = std::move(g.dw);
}

void check_qkv(const LlamaConfig& c, const Matrix& norm, const Matrix& w_qkv, const char* norm_name,
               const char* w_name) {
  expect_size<double>(norm, c.hidden, norm_name);
  expect_size<double>(w_qkv, c.qkv_width() * c.hidden, w_name);
}

// ---- What a backward reads, from the activations a forward saved (the *_from_saved entry
// points): h = x * rstd * gamma and y1 = silu(gate) * up, each rounded once under r, as an
// unfused forward stores them.

NormProject norm_from_saved(Rounding r, int64_t M, int64_t D, std::span<const double> x,
                            std::span<const double> rstd, const Matrix& gamma) {
  NormProject p{Matrix(rstd.begin(), rstd.end()), Matrix(size_t(M * D)), {}};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < D; ++n)
      p.h[size_t(m * D + n)] = r(x[size_t(m * D + n)] * rstd[size_t(m)] * gamma[size_t(n)]);
  return p;
}

void check_mlp_saved(const LlamaConfig& c, int64_t M, const MlpSaved& s) {
  expect_size<double>(s.x1, M * c.hidden, "saved.x1");
  expect_size<double>(s.rstd1, M, "saved.rstd1");
  expect_size<double>(s.gate, M * c.intermediate, "saved.gate");
  expect_size<double>(s.up, M * c.intermediate, "saved.up");
  expect_size<double>(s.x2, M * c.hidden, "saved.x2");
}

MlpForward mlp_from_saved(Rounding r, const LlamaConfig& c, const Matrix& ffn_norm, int64_t M,
                          const MlpSaved& s) {
  MlpForward f;
  f.x1 = s.x1;
  f.rstd1 = s.rstd1;
  f.h1 = norm_from_saved(r, M, c.hidden, s.x1, s.rstd1, ffn_norm).h;
  f.gate = s.gate;
  f.up = s.up;
  f.y1.resize(size_t(M * c.intermediate));
  swiglu_forward(r, M, c.intermediate, f.gate.data(), f.up.data(), f.y1.data());
  f.x2 = s.x2;
  return f;
}

} // namespace

// ---- first

FirstForward first_forward(const LlamaConfig& cfg, const FirstWeights& w, RopeInputs rope,
                           std::span<const double> x0, Rounding r) {
  check_config(cfg, false, false);
  const int64_t M = rows_of(cfg, x0);
  check_rope(cfg, rope, M);
  check_qkv(cfg, w.attn_norm, w.w_qkv, "attn_norm", "w_qkv");
  FirstForward f;
  NormProject p = qkv_forward(r, cfg, rope, M, x0.data(), w.attn_norm, w.w_qkv, f.qkv);
  f.rstd = std::move(p.rstd);
  f.h = std::move(p.h);
  f.z = std::move(p.z);
  return f;
}

namespace {
void check_first_backward(const LlamaConfig& cfg, const FirstWeights& w, RopeInputs rope, int64_t M,
                          std::span<const double> dqkv, std::span<const double> dx_res) {
  check_rope(cfg, rope, M);
  check_qkv(cfg, w.attn_norm, w.w_qkv, "attn_norm", "w_qkv");
  expect_size(dqkv, M * cfg.qkv_width(), "dqkv");
  expect_size(dx_res, M * cfg.hidden, "dx_res");
}

FirstBackward first_backward_core(Rounding r, const LlamaConfig& cfg, const FirstWeights& w,
                                  RopeInputs rope, int64_t M, std::span<const double> x0,
                                  const NormProject& p, std::span<const double> dqkv,
                                  std::span<const double> dx_res) {
  FirstBackward b;
  qkv_backward(r, cfg, rope, M, x0.data(), w.attn_norm, w.w_qkv, p, dqkv, dx_res, b.dz, b.dx0,
               b.grads.attn_norm, b.grads.w_qkv);
  return b;
}
} // namespace

FirstBackward first_backward(const LlamaConfig& cfg, const FirstWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> dqkv,
                             std::span<const double> dx_res, Rounding r) {
  check_config(cfg, false, false);
  const int64_t M = rows_of(cfg, x0);
  check_first_backward(cfg, w, rope, M, dqkv, dx_res);
  Matrix qkv;
  const NormProject p = qkv_forward(r, cfg, rope, M, x0.data(), w.attn_norm, w.w_qkv, qkv);
  return first_backward_core(r, cfg, w, rope, M, x0, p, dqkv, dx_res);
}

FirstBackward first_backward_from_saved(const LlamaConfig& cfg, const FirstWeights& w,
                                        RopeInputs rope, std::span<const double> x0,
                                        std::span<const double> rstd, std::span<const double> dqkv,
                                        std::span<const double> dx_res, Rounding r) {
  check_config(cfg, false, false);
  const int64_t M = rows_of(cfg, x0);
  check_first_backward(cfg, w, rope, M, dqkv, dx_res);
  expect_size(rstd, M, "rstd");
  const NormProject p = norm_from_saved(r, M, cfg.hidden, x0, rstd, w.attn_norm);
  return first_backward_core(r, cfg, w, rope, M, x0, p, dqkv, dx_res);
}

// ---- middle

namespace {
void check_middle(const LlamaConfig& cfg, const MiddleWeights& w, RopeInputs rope, int64_t M,
                  std::span<const double> y0) {
  check_rope(cfg, rope, M);
  check_mlp(cfg, mlp_view(w), M, y0);
  check_qkv(cfg, w.next_attn_norm, w.w_qkv_next, "next_attn_norm", "w_qkv_next");
}
} // namespace

MiddleForward middle_forward(const LlamaConfig& cfg, const MiddleWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> y0, Rounding r) {
  check_config(cfg, true, false);
  const int64_t M = rows_of(cfg, x0);
  check_middle(cfg, w, rope, M, y0);
  MiddleForward f;
  f.mlp = mlp_forward(r, cfg, mlp_view(w), M, x0, y0);
  NormProject p =
      qkv_forward(r, cfg, rope, M, f.mlp.x2.data(), w.next_attn_norm, w.w_qkv_next, f.qkv);
  f.rstd2 = std::move(p.rstd);
  f.h2 = std::move(p.h);
  f.z2 = std::move(p.z);
  return f;
}

namespace {
MiddleBackward middle_backward_core(Rounding r, const LlamaConfig& cfg, const MiddleWeights& w,
                                    RopeInputs rope, int64_t M, std::span<const double> y0,
                                    const MlpForward& f, const NormProject& p,
                                    std::span<const double> dx2, std::span<const double> dqkv) {
  MiddleBackward b;
  qkv_backward(r, cfg, rope, M, f.x2.data(), w.next_attn_norm, w.w_qkv_next, p, dqkv, dx2, b.dz2,
               b.dx2, b.grads.next_attn_norm, b.grads.w_qkv_next);
  MlpGrads g = mlp_backward(r, cfg, mlp_view(w), M, y0, f, b.dx2);
  take_mlp_grads(g, b);
  return b;
}
} // namespace

MiddleBackward middle_backward(const LlamaConfig& cfg, const MiddleWeights& w, RopeInputs rope,
                               std::span<const double> x0, std::span<const double> y0,
                               std::span<const double> dx2, std::span<const double> dqkv,
                               Rounding r) {
  check_config(cfg, true, false);
  const int64_t M = rows_of(cfg, x0), D = cfg.hidden;
  check_middle(cfg, w, rope, M, y0);
  expect_size(dx2, M * D, "dx2");
  expect_size(dqkv, M * cfg.qkv_width(), "dqkv");
  const MlpForward f = mlp_forward(r, cfg, mlp_view(w), M, x0, y0);
  Matrix qkv;
  const NormProject p =
      qkv_forward(r, cfg, rope, M, f.x2.data(), w.next_attn_norm, w.w_qkv_next, qkv);
  return middle_backward_core(r, cfg, w, rope, M, y0, f, p, dx2, dqkv);
}

MiddleBackward middle_backward_from_saved(const LlamaConfig& cfg, const MiddleWeights& w,
                                          RopeInputs rope, std::span<const double> y0,
                                          const MlpSaved& saved, std::span<const double> rstd2,
                                          std::span<const double> dx2, std::span<const double> dqkv,
                                          Rounding r) {
  check_config(cfg, true, false);
  const int64_t M = rows_of(cfg, saved.x1, "saved.x1"), D = cfg.hidden;
  check_middle(cfg, w, rope, M, y0);
  check_mlp_saved(cfg, M, saved);
  expect_size(rstd2, M, "rstd2");
  expect_size(dx2, M * D, "dx2");
  expect_size(dqkv, M * cfg.qkv_width(), "dqkv");
  const MlpForward f = mlp_from_saved(r, cfg, w.ffn_norm, M, saved);
  const NormProject p = norm_from_saved(r, M, D, f.x2, rstd2, w.next_attn_norm);
  return middle_backward_core(r, cfg, w, rope, M, y0, f, p, dx2, dqkv);
}

// ---- last

namespace {
void check_last(const LlamaConfig& cfg, const LastWeights& w, int64_t M, std::span<const double> y0,
                const LossSpec& loss) {
  check_mlp(cfg, mlp_view(w), M, y0);
  expect_size<double>(w.final_norm, cfg.hidden, "final_norm");
  expect_size<double>(w.w_lm, cfg.vocab * cfg.hidden, "w_lm");
  expect_size(loss.targets, M, "targets");
  for (int64_t m = 0; m < M; ++m) {
    const int32_t t = loss.targets[size_t(m)];
    if (t != loss.ignore_index && (t < 0 || t >= cfg.vocab))
      bad("target " + std::to_string(t) + " of row " + std::to_string(m) +
          " is outside [0, vocab) and is not ignore_index");
  }
}

// Everything after x2: final norm, LM head, cross-entropy (with its gradient).
// The LM head stays in 16 bits under the FP8 recipe (Rounding::fp8 applies to the layers' GEMMs).
void head_forward(Rounding r, const LlamaConfig& cfg, const LastWeights& w, int64_t M,
                  const LossSpec& loss, const Matrix& x2, LastForward& f, Matrix* dlogits) {
  r.fp8 = false;
  NormProject p =
      norm_project(r, M, cfg.hidden, cfg.vocab, x2.data(), w.final_norm, w.w_lm, cfg.eps);
  f.rstd2 = std::move(p.rstd);
  f.h2 = std::move(p.h);
  f.logits = std::move(p.z);
  f.lse.resize(size_t(M));
  if (dlogits) dlogits->resize(f.logits.size());
  f.ce = cross_entropy(r, M, cfg.vocab, f.logits.data(), loss.targets.data(), loss.ignore_index,
                       loss.reduction, f.lse.data(), dlogits ? dlogits->data() : nullptr);
}
} // namespace

LastForward last_forward(const LlamaConfig& cfg, const LastWeights& w, std::span<const double> x0,
                         std::span<const double> y0, const LossSpec& loss, Rounding r) {
  check_config(cfg, true, true);
  const int64_t M = rows_of(cfg, x0);
  check_last(cfg, w, M, y0, loss);
  LastForward f;
  f.mlp = mlp_forward(r, cfg, mlp_view(w), M, x0, y0);
  head_forward(r, cfg, w, M, loss, f.mlp.x2, f, nullptr);
  return f;
}

namespace {
// b.dlogits holds the scaled loss gradient.
LastBackward last_backward_core(Rounding r, const LlamaConfig& cfg, const LastWeights& w, int64_t M,
                                std::span<const double> y0, const MlpForward& f,
                                const NormProject& p, LastBackward b) {
  const int64_t D = cfg.hidden;
  Rounding head = r; // the LM head stays in 16 bits under the FP8 recipe (head_forward)
  head.fp8 = false;
  NormProjectGrads h =
      norm_project_backward(head, M, D, cfg.vocab, f.x2.data(), w.final_norm, w.w_lm, p, b.dlogits);
  b.dx2 = std::move(h.dx);
  MlpGrads g = mlp_backward(r, cfg, mlp_view(w), M, y0, f, b.dx2);
  take_mlp_grads(g, b);
  b.grads.final_norm = std::move(h.dgamma);
  b.grads.w_lm = std::move(h.dw);
  return b;
}
} // namespace

LastBackward last_backward(const LlamaConfig& cfg, const LastWeights& w, std::span<const double> x0,
                           std::span<const double> y0, const LossSpec& loss, double dloss,
                           Rounding r) {
  check_config(cfg, true, true);
  const int64_t M = rows_of(cfg, x0);
  check_last(cfg, w, M, y0, loss);
  LastForward f;
  f.mlp = mlp_forward(r, cfg, mlp_view(w), M, x0, y0);
  LastBackward b;
  head_forward(r, cfg, w, M, loss, f.mlp.x2, f, &b.dlogits);
  scale(r, M * cfg.vocab, dloss, b.dlogits.data(), b.dlogits.data());
  const NormProject p{f.rstd2, f.h2, f.logits};
  return last_backward_core(r, cfg, w, M, y0, f.mlp, p, std::move(b));
}

LastBackward last_backward_from_saved(const LlamaConfig& cfg, const LastWeights& w,
                                      std::span<const double> y0, const MlpSaved& saved,
                                      std::span<const double> rstd2,
                                      std::span<const double> dlogits, Rounding r) {
  check_config(cfg, true, true);
  const int64_t M = rows_of(cfg, saved.x1, "saved.x1"), D = cfg.hidden;
  check_mlp(cfg, mlp_view(w), M, y0);
  expect_size<double>(w.final_norm, D, "final_norm");
  expect_size<double>(w.w_lm, cfg.vocab * D, "w_lm");
  check_mlp_saved(cfg, M, saved);
  expect_size(rstd2, M, "rstd2");
  expect_size(dlogits, M * cfg.vocab, "dlogits");
  const MlpForward f = mlp_from_saved(r, cfg, w.ffn_norm, M, saved);
  const NormProject p = norm_from_saved(r, M, D, f.x2, rstd2, w.final_norm);
  LastBackward b;
  b.dlogits.assign(dlogits.begin(), dlogits.end());
  return last_backward_core(r, cfg, w, M, y0, f, p, std::move(b));
}

} // namespace coda::ref
