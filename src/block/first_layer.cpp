// The first layer (coda-paper 4.2 "First layer", 4.5 "First layer"): the embedding output has
// no producing GEMM, so its RMSNorm statistics come from rms_stats; then K4.
#include "block/scratch.hpp"
#include "block/steps.hpp"
#include "block/validate.hpp"
#include "coda/coda.hpp"

namespace coda::llama {

using api::Elem;
using api::exactly;
using namespace detail;

namespace {

// Registers the forward's tensors; returns M.
int64_t check_forward_tensors(api::Validator& v, Role produced, const Config& c,
                              const FirstWeights& w, const FirstInputs& in, const FirstOutputs& out,
                              const FirstSaved& saved) {
  check_config(v, c, Layer::first);
  v.input("inputs.x", in.x, Elem::half, {api::at_least_one("M"), hidden_dim(c)});
  const int64_t m = in.x.shape[0];
  v.input("inputs.rope.positions", in.rope.positions, Elem::i32, {tokens_dim(m)});
  v.input("inputs.rope.inv_freq", in.rope.inv_freq, Elem::f32,
          {exactly("head_dim/2", c.head_dim / 2)});
  v.input("weights.attn_norm", w.attn_norm, Elem::half, {hidden_dim(c)});
  v.input("weights.w_qkv", w.w_qkv, Elem::half,
          {exactly("qkv_width", c.qkv_width()), hidden_dim(c)});
  add(v, produced, "outputs.qkv", out.qkv, Elem::half,
      {tokens_dim(m), exactly("qkv_width", c.qkv_width())});
  add(v, produced, "saved.rstd", saved.rstd, Elem::f32, {tokens_dim(m)});
  return m;
}

} // namespace

void first_forward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                   const FirstOutputs& outputs, const FirstSaved& saved,
                   const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::first_forward");
  const int64_t m = check_forward_tensors(v, Role::output, config, weights, inputs, outputs, saved);
  check_workspace(v, workspace, Layer::first, Pass::forward, config, m);
  v.finish();

  Arena arena(workspace);
  const FirstForwardScratch s = carve_first_forward(arena, config, m, inputs.x.dtype);

  RmsStatsArgs stats; // h = x * gamma, row partials of x^2
  stats.x = inputs.x;
  stats.gamma = weights.attn_norm;
  stats.out_scaled = s.h;
  stats.sumsq_partials = s.sumsq;
  rms_stats(stats, stream);

  RmsRopeArgs qkv; // K4, with r from the partials inside its epilogue
  qkv.a = s.h;
  qkv.w = weights.w_qkv;
  qkv.sumsq_partials = s.sumsq;
  qkv.eps = config.eps;
  qkv.rope = rope_spec(config, inputs.rope);
  qkv.out = outputs.qkv;
  qkv.rstd_out = saved.rstd;
  gemm_rms_rope(qkv, stream);
}

void first_backward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                    const FirstOutputs& outputs, const FirstSaved& saved, const FirstGrads& grads,
                    bool accumulate, const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::first_backward");
  const int64_t m = check_forward_tensors(v, Role::input, config, weights, inputs, outputs, saved);
  v.output("grads.dx", grads.dx, Elem::half, {tokens_dim(m), hidden_dim(config)});
  v.input("grads.dqkv", grads.dqkv, Elem::half,
          {tokens_dim(m), exactly("qkv_width", config.qkv_width())});
  v.output("grads.dweights.attn_norm", grads.dweights.attn_norm, Elem::half_or_f32,
           {hidden_dim(config)});
  v.output("grads.dweights.w_qkv", grads.dweights.w_qkv, Elem::half_or_f32,
           {exactly("qkv_width", config.qkv_width()), hidden_dim(config)});
  check_workspace(v, workspace, Layer::first, Pass::backward, config, m);
  v.finish();

  Arena arena(workspace);
  const FirstBackwardScratch s = carve_first_backward(arena, config, m, inputs.x.dtype);

  RopeBackwardArgs rope; // B0: dz = RoPEᵀ(dqkv), zeta = (1/D) sum qkv * dqkv
  rope.dqkv = grads.dqkv;
  rope.qkv = outputs.qkv;
  rope.rope = rope_spec(config, inputs.rope);
  rope.scale = float(1.0 / double(config.hidden));
  rope.dz = s.dz;
  rope.zeta = s.norm.zeta;
  rope_backward(rope, stream);

  NormBackward norm; // B1 (dx += ...), A3 dgamma, B2 dW_qkv
  norm.dz = s.dz;
  norm.w = weights.w_qkv;
  norm.x = inputs.x;
  norm.rstd = saved.rstd;
  norm.gamma = weights.attn_norm;
  norm.dx = grads.dx;
  norm.dgamma = grads.dweights.attn_norm;
  norm.dw = grads.dweights.w_qkv;
  norm_backward(norm, accumulate, s.norm, stream);
}

} // namespace coda::llama
