// A middle layer (coda-paper 4.2 and 4.5): from the attention output of layer l to the
// post-RoPE QKV of layer l+1.
#include "block/scratch.hpp"
#include "block/steps.hpp"
#include "block/validate.hpp"
#include "coda/coda.hpp"

namespace coda::llama {

using api::Elem;
using api::exactly;
using namespace detail;

namespace {

MlpForward mlp_forward_of(const MiddleWeights& w, const MiddleInputs& in, const MiddleOutputs& out,
                          const MiddleSaved& saved) {
  return MlpForward{in.x0,       in.y0,    w.w_out,  w.ffn_norm, w.w_gate_up, w.w_down,
                    w.attn_norm, saved.x1, saved.z1, saved.r1,   out.x2};
}

// Registers the forward's tensors; returns M.
int64_t check_forward_tensors(api::Validator& v, Role produced, const Config& c,
                              const MiddleWeights& w, const MiddleInputs& in,
                              const MiddleOutputs& out, const MiddleSaved& saved) {
  const int64_t m =
      check_mlp_tensors(v, produced, c, Layer::middle, mlp_forward_of(w, in, out, saved));
  const api::Dim qkv_width = exactly("qkv_width", c.qkv_width());
  v.input("inputs.rope.positions", in.rope.positions, Elem::i32, {tokens_dim(m)});
  v.input("inputs.rope.inv_freq", in.rope.inv_freq, Elem::f32,
          {exactly("head_dim/2", c.head_dim / 2)});
  v.input("weights.attn_norm", w.attn_norm, Elem::half, {hidden_dim(c)});
  v.input("weights.w_qkv", w.w_qkv, Elem::half, {qkv_width, hidden_dim(c)});
  add(v, produced, "outputs.x2", out.x2, Elem::half, {tokens_dim(m), hidden_dim(c)});
  add(v, produced, "outputs.qkv", out.qkv, Elem::half, {tokens_dim(m), qkv_width});
  add(v, produced, "saved.r2", saved.r2, Elem::f32, {tokens_dim(m)});
  return m;
}

} // namespace

void middle_forward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                    const MiddleOutputs& outputs, const MiddleSaved& saved,
                    const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::middle_forward");
  const int64_t m = check_forward_tensors(v, Role::output, config, weights, inputs, outputs, saved);
  check_workspace(v, workspace, Layer::middle, Pass::forward, config, m);
  v.finish();

  Arena arena(workspace);
  const MlpForwardScratch s = carve_mlp_forward(arena, config, m, inputs.x0.dtype);
  mlp_forward(mlp_forward_of(weights, inputs, outputs, saved), config.eps, s, stream); // F1..F3

  RmsRopeArgs qkv; // F4 K4 (and A2: r2 from S2 inside its epilogue)
  qkv.a = s.h;
  qkv.w = weights.w_qkv;
  qkv.sumsq_partials = s.sumsq;
  qkv.eps = config.eps;
  qkv.rope = rope_spec(config, inputs.rope);
  qkv.out = outputs.qkv;
  qkv.rstd_out = saved.r2;
  gemm_rms_rope(qkv, stream);
}

void middle_backward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                     const MiddleOutputs& outputs, const MiddleSaved& saved,
                     const MiddleGrads& grads, bool accumulate, const TensorView& workspace,
                     Stream stream) {
  const MiddleWeights& dw = grads.dweights;
  const MlpBackward mlp{inputs.y0,      weights.w_out, weights.ffn_norm, weights.w_gate_up,
                        weights.w_down, saved.x1,      saved.z1,         saved.r1,
                        grads.dx,       grads.dy0,     dw.w_out,         dw.ffn_norm,
                        dw.w_gate_up,   dw.w_down};

  api::Validator v("coda::llama::middle_backward");
  const int64_t m = check_forward_tensors(v, Role::input, config, weights, inputs, outputs, saved);
  v.input("grads.dqkv", grads.dqkv, Elem::half,
          {tokens_dim(m), exactly("qkv_width", config.qkv_width())});
  check_mlp_gradients(v, config, m, mlp);
  v.output("grads.dweights.attn_norm", dw.attn_norm, Elem::half_or_f32, {hidden_dim(config)});
  v.output("grads.dweights.w_qkv", dw.w_qkv, Elem::half_or_f32,
           {exactly("qkv_width", config.qkv_width()), hidden_dim(config)});
  check_workspace(v, workspace, Layer::middle, Pass::backward, config, m);
  v.finish();

  Arena arena(workspace);
  const MiddleBackwardScratch s = carve_middle_backward(arena, config, m, inputs.x0.dtype);

  RopeBackwardArgs rope; // B0: dz2 = RoPEᵀ(dqkv), zeta2 = (1/D) sum qkv * dqkv
  rope.dqkv = grads.dqkv;
  rope.qkv = outputs.qkv;
  rope.rope = rope_spec(config, inputs.rope);
  rope.scale = float(1.0 / double(config.hidden));
  rope.dz = s.dz2;
  rope.zeta = s.norm.zeta;
  rope_backward(rope, stream);

  NormBackward attn_norm; // B1 K6 (dx += ...), A3 dgamma1, B2 dW3
  attn_norm.dz = s.dz2;
  attn_norm.w = weights.w_qkv;
  attn_norm.x = outputs.x2;
  attn_norm.rstd = saved.r2;
  attn_norm.gamma = weights.attn_norm;
  attn_norm.dx = grads.dx;
  attn_norm.dgamma = dw.attn_norm;
  attn_norm.dw = dw.w_qkv;
  norm_backward(attn_norm, accumulate, s.norm, stream);

  mlp_backward(mlp, config.hidden, accumulate, s.mlp, s.norm, stream); // B3..B8
}

} // namespace coda::llama
