// Each step is one kernel reference with Rounding::none, in the order src/block runs the
// kernels; the comments carry the paper's step names (coda-paper 4.2 / 4.5).
#include "reference/llama_fused.hpp"

#include <stdexcept>
#include <string>

#include "reference/kernels.hpp"

namespace coda::ref::fused {
namespace {

constexpr Rounding kExact{};

Matrix copy(std::span<const double> s) { return Matrix(s.begin(), s.end()); }

// M from x0 [M, D], with every other size left to the kernel references' own checks.
int64_t rows_of(const LlamaConfig& c, std::span<const double> x0) {
  if (c.hidden <= 0 || x0.empty() || int64_t(x0.size()) % c.hidden != 0)
    throw std::invalid_argument("llama_fused: x0 must be [M, hidden] with M >= 1; got " +
                                std::to_string(x0.size()) + " elements");
  return int64_t(x0.size()) / c.hidden;
}

RopeTable rope_table(const LlamaConfig& c, RopeInputs rope) {
  RopeTable t;
  t.shape = c.rope_shape();
  t.positions.assign(rope.positions.begin(), rope.positions.end());
  t.inv_freq.assign(rope.inv_freq.begin(), rope.inv_freq.end());
  return t;
}

// dW = alpha · dyᵀ · x for an nn.Linear weight [out, in]; tokens are the GEMM's K.
Matrix weight_gradient(int64_t tokens, int64_t out, int64_t in, const Matrix& dy, const Matrix& x,
                       double alpha = 1) {
  return gemm(kExact, {Layout::wgrad, out, in, tokens, dy, x, {}, alpha});
}

// One RMSNorm backward through its consumer GEMM: K6, the dgamma reduce, the weight gradient.
struct NormGrads {
  Matrix dx, dgamma, dw;
};
NormGrads norm_backward(RmsBackwardInputs k6) {
  const int64_t tokens = k6.M, width = k6.N, consumer = k6.K;
  const Matrix dz = k6.dz;
  const double alpha = k6.alpha;
  RmsBackwardOutputs out = rms_backward(kExact, k6);
  NormGrads g;
  g.dgamma = reduce_col_partials(kExact, width, out.dgamma_partials, false, {});
  g.dw = weight_gradient(tokens, consumer, width, dz, out.h_hat, alpha);
  g.dx = std::move(out.dx);
  return g;
}

// K4 of a layer's attention input, from h = x * attn_norm and the row partials of x² over its
// columns: the post-RoPE qkv [M, Nq] and the norm's rstd [M], into the caller's fields.
void qkv_forward(const LlamaConfig& c, RopeInputs rope, int64_t M, Matrix h, const Matrix& w_qkv,
                 Matrix sumsq_partials, Matrix& rstd, Matrix& qkv) {
  RmsRopeOutputs k4 = rms_rope(
      kExact, {M, c.qkv_width(), c.hidden, std::move(h), w_qkv, std::move(sumsq_partials), c.eps},
      rope_table(c, rope));
  rstd = std::move(k4.rstd);
  qkv = std::move(k4.out);
}

// B0..B2 of a layer's attention input x (rstd from its forward, gamma attn_norm): the RoPE backward
// of dqkv into dz [M, Nq] and zeta [M], then the norm backward through the QKV projection into dx
// (accumulated onto dx_in), dgamma (the attention norm's) and dw (w_qkv's).
void qkv_backward(const LlamaConfig& c, RopeInputs rope, int64_t M, std::span<const double> dqkv,
                  const Matrix& qkv, const Matrix& w_qkv, Matrix x, const Matrix& rstd,
                  const Matrix& attn_norm, Matrix dx_in, Matrix& dz, Matrix& zeta, Matrix& dx,
                  Matrix& dgamma, Matrix& dw) {
  RopeBackwardOutputs b0 = ref::rope_backward(kExact, M, rope_table(c, rope), copy(dqkv), qkv,
                                              1.0 / double(c.hidden)); // B0
  dz = std::move(b0.dz);
  zeta = std::move(b0.zeta);
  NormGrads norm = norm_backward({M, c.hidden, c.qkv_width(), dz, w_qkv, std::move(x), rstd, zeta,
                                  attn_norm, 1.0, true, std::move(dx_in)}); // B1, A3, B2
  dx = std::move(norm.dx);
  dgamma = std::move(norm.dgamma);
  dw = std::move(norm.dw);
}

// F1..F3: K0, K2 (r1 inside), K0.
MlpForward mlp_forward(const LlamaConfig& c, int64_t M, const Matrix& w_out, const Matrix& ffn_norm,
                       const Matrix& w_gate_up, const Matrix& w_down, const Matrix& next_norm,
                       std::span<const double> x0, std::span<const double> y0) {
  const int64_t D = c.hidden, F = c.intermediate;
  MlpForward f;
  ResidualRmsOutputs k0 =
      residual_rms(kExact, {M, D, c.attn_width(), copy(y0), w_out, copy(x0), ffn_norm});
  f.x1 = std::move(k0.out);
  f.h1 = std::move(k0.out_scaled);

  RmsGatedOutputs k2 =
      rms_swiglu(kExact, {M, 2 * F, D, f.h1, w_gate_up, std::move(k0.sumsq_partials), c.eps});
  f.z1 = std::move(k2.preact);
  f.y1 = std::move(k2.act);
  f.r1 = std::move(k2.rstd);

  ResidualRmsOutputs k0b = residual_rms(kExact, {M, D, F, f.y1, w_down, f.x1, next_norm});
  f.x2 = std::move(k0b.out);
  f.h2 = std::move(k0b.out_scaled);
  f.sumsq2 = std::move(k0b.sumsq_partials);
  return f;
}

// B3..B8 from dx = the total gradient of x2.
MlpBackward mlp_backward(const LlamaConfig& c, int64_t M, const Matrix& w_out,
                         const Matrix& ffn_norm, const Matrix& w_gate_up, const Matrix& w_down,
                         std::span<const double> y0, const MlpForward& f, const Matrix& dx,
                         Matrix& dw_out, Matrix& dffn_norm, Matrix& dw_gate_up, Matrix& dw_down) {
  const int64_t D = c.hidden, F = c.intermediate, A = c.attn_width();
  MlpBackward b;
  SwigluBackwardOutputs k7 = swiglu_backward(kExact, {M, F, D, dx, w_down, f.z1}); // B3
  b.zeta1 = reduce_row_partials(kExact, M, k7.zeta_partials, 1.0 / double(D));     // A4
  dw_down = weight_gradient(M, D, F, dx, k7.act);                                  // B4
  b.dz1 = std::move(k7.dpreact);

  NormGrads ffn = norm_backward(
      {M, D, 2 * F, b.dz1, w_gate_up, f.x1, f.r1, b.zeta1, ffn_norm, 1.0, true, dx}); // B5, A5, B6
  dffn_norm = std::move(ffn.dgamma);
  dw_gate_up = std::move(ffn.dw);
  b.dx0 = std::move(ffn.dx);

  b.dy0 = gemm(kExact, {Layout::dgrad, M, A, D, b.dx0, w_out, {}}); // B7
  dw_out = weight_gradient(M, D, A, b.dx0, copy(y0));               // B8
  return b;
}

} // namespace

Matrix interleave_gate_up(int64_t F, int64_t K, std::span<const double> gate,
                          std::span<const double> up) {
  if (int64_t(gate.size()) != F * K || int64_t(up.size()) != F * K)
    throw std::invalid_argument("llama_fused: gate and up must both be [F, K]");
  Matrix fused(size_t(2 * F * K));
  for (int64_t j = 0; j < F; ++j)
    for (int64_t k = 0; k < K; ++k) {
      fused[size_t((2 * j) * K + k)] = gate[size_t(j * K + k)];
      fused[size_t((2 * j + 1) * K + k)] = up[size_t(j * K + k)];
    }
  return fused;
}

void deinterleave_gate_up(int64_t F, int64_t K, std::span<const double> fused, Matrix& gate,
                          Matrix& up) {
  if (int64_t(fused.size()) != 2 * F * K)
    throw std::invalid_argument("llama_fused: the fused gate/up must be [2F, K]");
  gate.assign(size_t(F * K), 0.0);
  up.assign(size_t(F * K), 0.0);
  for (int64_t j = 0; j < F; ++j)
    for (int64_t k = 0; k < K; ++k) {
      gate[size_t(j * K + k)] = fused[size_t((2 * j) * K + k)];
      up[size_t(j * K + k)] = fused[size_t((2 * j + 1) * K + k)];
    }
}

FirstWeights to_fused(const ref::FirstWeights& w) { return {w.attn_norm, w.w_qkv}; }

MiddleWeights to_fused(const ref::MiddleWeights& w, const LlamaConfig& c) {
  return {
      w.w_o,    w.ffn_norm,       interleave_gate_up(c.intermediate, c.hidden, w.w_gate, w.w_up),
      w.w_down, w.next_attn_norm, w.w_qkv_next};
}

LastWeights to_fused(const ref::LastWeights& w, const LlamaConfig& c) {
  return {w.w_o,    w.ffn_norm,   interleave_gate_up(c.intermediate, c.hidden, w.w_gate, w.w_up),
          w.w_down, w.final_norm, w.w_lm};
}

FirstForward first_forward(const LlamaConfig& c, const FirstWeights& w, RopeInputs rope,
                           std::span<const double> x0) {
  const int64_t M = rows_of(c, x0);
  RmsStatsOutputs stats = rms_stats(kExact, M, c.hidden, copy(x0), w.attn_norm);
  FirstForward f;
  f.h = stats.out_scaled;
  qkv_forward(c, rope, M, f.h, w.w_qkv, std::move(stats.sumsq_partials), f.rstd, f.qkv);
  return f;
}

FirstBackward first_backward(const LlamaConfig& c, const FirstWeights& w, RopeInputs rope,
                             std::span<const double> x0, const FirstForward& fwd,
                             std::span<const double> dqkv, std::span<const double> dx_res) {
  const int64_t M = rows_of(c, x0);
  FirstBackward b;
  qkv_backward(c, rope, M, dqkv, fwd.qkv, w.w_qkv, copy(x0), fwd.rstd, w.attn_norm, copy(dx_res),
               b.dz, b.zeta, b.dx, b.grads.attn_norm, b.grads.w_qkv);
  return b;
}

MiddleForward middle_forward(const LlamaConfig& c, const MiddleWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> y0) {
  const int64_t M = rows_of(c, x0);
  MiddleForward f;
  f.mlp = mlp_forward(c, M, w.w_out, w.ffn_norm, w.w_gate_up, w.w_down, w.attn_norm, x0, y0);
  qkv_forward(c, rope, M, f.mlp.h2, w.w_qkv, f.mlp.sumsq2, f.r2, f.qkv); // F4
  return f;
}

MiddleBackward middle_backward(const LlamaConfig& c, const MiddleWeights& w, RopeInputs rope,
                               std::span<const double> y0, const MiddleForward& fwd,
                               std::span<const double> dx2, std::span<const double> dqkv) {
  const int64_t M = rows_of(c, dx2);
  MiddleBackward b;
  qkv_backward(c, rope, M, dqkv, fwd.qkv, w.w_qkv, fwd.mlp.x2, fwd.r2, w.attn_norm, copy(dx2),
               b.dz2, b.zeta2, b.dx2, b.grads.attn_norm, b.grads.w_qkv);
  b.mlp = mlp_backward(c, M, w.w_out, w.ffn_norm, w.w_gate_up, w.w_down, y0, fwd.mlp, b.dx2,
                       b.grads.w_out, b.grads.ffn_norm, b.grads.w_gate_up, b.grads.w_down);
  return b;
}

LastForward last_forward(const LlamaConfig& c, const LastWeights& w, std::span<const double> x0,
                         std::span<const double> y0, const LossSpec& loss) {
  const int64_t M = rows_of(c, x0);
  LastForward f;
  f.mlp = mlp_forward(c, M, w.w_out, w.ffn_norm, w.w_gate_up, w.w_down, w.final_norm, x0, y0);
  const std::vector<int32_t> targets(loss.targets.begin(), loss.targets.end());
  RmsLseOutputs k5 =
      rms_lse(kExact, {M, c.vocab, c.hidden, f.mlp.h2, w.lm_head, f.mlp.sumsq2, c.eps}, targets);
  f.r2 = std::move(k5.rstd);
  f.logits = std::move(k5.logits);
  CrossEntropyOutputs ce = cross_entropy(kExact, {M, c.vocab, f.logits, std::move(k5.lse_partials),
                                                  std::move(k5.target_logit), targets,
                                                  loss.ignore_index, loss.reduction});
  f.loss = ce.loss;
  f.grad_scale = ce.grad_scale;
  f.dlogits = std::move(ce.dlogits);
  f.zeta = std::move(ce.zeta);
  return f;
}

LastBackward last_backward(const LlamaConfig& c, const LastWeights& w, std::span<const double> y0,
                           const LastForward& fwd, double dloss) {
  const int64_t M = int64_t(fwd.zeta.size());
  const double alpha = dloss * fwd.grad_scale; // the scale of dlogits
  LastBackward b;
  b.zeta = reduce_row_partials(kExact, M, fwd.zeta, alpha / double(c.hidden));
  NormGrads head = norm_backward({M,
                                  c.hidden,
                                  c.vocab,
                                  fwd.dlogits,
                                  w.lm_head,
                                  fwd.mlp.x2,
                                  fwd.r2,
                                  b.zeta,
                                  w.final_norm,
                                  alpha,
                                  false,
                                  {}}); // B1, A3, dW_lm
  b.dx2 = std::move(head.dx);
  b.grads.final_norm = std::move(head.dgamma);
  b.grads.lm_head = std::move(head.dw);
  b.mlp = mlp_backward(c, M, w.w_out, w.ffn_norm, w.w_gate_up, w.w_down, y0, fwd.mlp, b.dx2,
                       b.grads.w_out, b.grads.ffn_norm, b.grads.w_gate_up, b.grads.w_down);
  return b;
}

} // namespace coda::ref::fused
