// The last layer (coda-paper 4.2 "Last layer", 4.5 "Last layer"): F1..F3, the final RMSNorm
// with the LM head (K5), and the cross-entropy forward-backward, whose gradient the forward
// saves. Its backward has no incoming residual gradient: K6 writes dx.

#include "block/scratch.hpp"
#include "block/steps.hpp"
#include "block/validate.hpp"
#include "coda/coda.hpp"

namespace coda::llama {

using api::Elem;
using api::exactly;
using namespace detail;

namespace {

MlpForward mlp_forward_of(const LastWeights& w, const LastInputs& in, const LastSaved& saved) {
  return MlpForward{in.x0,        in.y0,    w.w_out,  w.ffn_norm, w.w_gate_up, w.w_down,
                    w.final_norm, saved.x1, saved.z1, saved.r1,   saved.x2};
}

// Registers the forward's tensors but for its outputs; returns M.
int64_t check_forward_tensors(api::Validator& v, Role produced, const Config& c,
                              const LastWeights& w, const LastInputs& in, const LastSaved& saved) {
  const int64_t m = check_mlp_tensors(v, produced, c, Layer::last, mlp_forward_of(w, in, saved));
  const api::Dim vocab = exactly("vocab", c.vocab);
  v.input("weights.final_norm", w.final_norm, Elem::half, {hidden_dim(c)});
  v.input("weights.lm_head", w.lm_head, Elem::half, {vocab, hidden_dim(c)});
  add(v, produced, "saved.x2", saved.x2, Elem::half, {tokens_dim(m), hidden_dim(c)});
  add(v, produced, "saved.r2", saved.r2, Elem::f32, {tokens_dim(m)});
  add(v, produced, "saved.dlogits", saved.dlogits, Elem::half, {tokens_dim(m), vocab});
  add(v, produced, "saved.grad_scale", saved.grad_scale, Elem::f32, {exactly("1", 1)});
  add(v, produced, "saved.zeta", saved.zeta, Elem::f32, {tokens_dim(m)});
  return m;
}

// alpha = dloss * grad_scale, the scale of dlogits in K6, in the LM head's weight gradient and
// in zeta. grad_scale (1 / #valid of a mean, 1 for a sum) is where cross_entropy wrote it (on
// the device, on the GPU) and dloss may be a device tensor too: nothing is read back to the host.
//
// NOTE: a Scalar carries one tensor, and alpha may be the product of two (dloss.tensor and
// grad_scale). So alpha is formed once, on the call's device, into the workspace slot `alpha`
// by a public call, reduce_row_partials over one [1, 1] "partial":
//   dloss without a tensor: partial grad_scale,    scale dloss.value
//   dloss with a tensor:    partial dloss.tensor,  scale dloss.value * grad_scale
// and the three consumers take Scalar{1 or 1/D, alpha}. That keeps Scalar (and coda_scalar, the
// GEMM's and K6's epilogues) at one tensor, costs one tiny launch beside the V x D GEMMs, needs
// no CUDA code in the block, and runs the same on the CPU backend with host tensors. A dloss
// given as the value v or as 1 times a tensor holding v gives the same alpha, bit for bit.
TensorView form_alpha(const Scalar& dloss, const TensorView& grad_scale, const TensorView& alpha,
                      Stream stream) {
  const TensorView& one = dloss.has_tensor() ? dloss.tensor : grad_scale;
  RowReduceArgs multiply;
  multiply.partials = make_view(one.data, DType::f32, 1, 1, one.device);
  multiply.partials.device_index = one.device_index;
  multiply.scale = Scalar{dloss.value, dloss.has_tensor() ? grad_scale : TensorView{}};
  multiply.out = alpha;
  reduce_row_partials(multiply, stream);
  return alpha;
}

} // namespace

void last_forward(const Config& config, const LastWeights& weights, const LastInputs& inputs,
                  const LastOutputs& outputs, const LastSaved& saved, const TensorView& workspace,
                  Stream stream) {
  api::Validator v("coda::llama::last_forward");
  const int64_t m = check_forward_tensors(v, Role::output, config, weights, inputs, saved);
  v.input("inputs.targets", inputs.targets, Elem::i32, {tokens_dim(m)});
  v.output("outputs.loss", outputs.loss, Elem::f32, {exactly("1", 1)});
  v.optional_output("outputs.logits", outputs.logits, Elem::half,
                    {tokens_dim(m), exactly("vocab", config.vocab)});
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::last, Pass::forward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  LastForwardScratch s = carve_last_forward(arena, config, m, inputs.x0.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8, inputs.fp8_weights);
  mlp_forward(mlp_forward_of(weights, inputs, saved), config.eps, s.mlp, stream,
              config.precision == Precision::fp8 ? &s.fp8 : nullptr); // F1..F3

  // The LM head and the loss stay 16-bit under Precision::fp8 (the recipe's, docs/fp8.md).

  // Without a logits output, the logits go straight into saved.dlogits, which the
  // cross-entropy then overwrites in place with their gradient.
  const TensorView logits = outputs.logits.data ? outputs.logits : saved.dlogits;

  RmsLseArgs head; // K5 (and r2 from S2 inside its epilogue)
  head.a = s.mlp.h;
  head.w = weights.lm_head;
  head.sumsq_partials = s.mlp.sumsq;
  head.eps = config.eps;
  head.targets = inputs.targets;
  head.logits = logits;
  head.lse_partials = s.lse_partials;
  head.target_logit = s.target_logit;
  head.rstd_out = saved.r2;
  gemm_rms_lse(head, stream);

  CrossEntropyArgs ce;
  ce.logits = logits;
  ce.lse_partials = s.lse_partials;
  ce.target_logit = s.target_logit;
  ce.targets = inputs.targets;
  ce.ignore_index = config.ignore_index;
  ce.reduction = config.loss_reduction;
  ce.loss = outputs.loss;
  ce.dlogits = saved.dlogits;
  ce.grad_scale = saved.grad_scale;
  ce.zeta = saved.zeta;
  ce.workspace = s.ce_workspace;
  cross_entropy(ce, stream);
}

void last_backward(const Config& config, const LastWeights& weights, const LastInputs& inputs,
                   const LastSaved& saved, const LastGrads& grads, bool accumulate,
                   const TensorView& workspace, Stream stream) {
  const LastWeights& dw = grads.dweights;
  const MlpBackward mlp = mlp_backward_of(weights, inputs, saved, grads);

  api::Validator v("coda::llama::last_backward");
  const int64_t m = check_forward_tensors(v, Role::input, config, weights, inputs, saved);
  // Not read (the loss gradient is saved.dlogits), but like every argument given it must be
  // valid: the fuzzer found an unaddressable targets view accepted here.
  v.optional_input("inputs.targets", inputs.targets, Elem::i32, {tokens_dim(m)});
  check_scalar(v, "grads.dloss.value", "grads.dloss.tensor", grads.dloss);
  check_mlp_gradients(v, config, m, mlp);
  v.output("grads.dweights.final_norm", dw.final_norm, Elem::half_or_f32, {hidden_dim(config)});
  v.output("grads.dweights.lm_head", dw.lm_head, Elem::half_or_f32,
           {exactly("vocab", config.vocab), hidden_dim(config)});
  const bool fp8 = config.precision == Precision::fp8;
  if (fp8) check_fp8_mlp_backward(v, m, inputs.x0.dtype, dw);
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::last, Pass::backward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  LastBackwardScratch s = carve_last_backward(arena, config, m, inputs.x0.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8_mlp, inputs.fp8_weights);
  const TensorView alpha = form_alpha(grads.dloss, saved.grad_scale, s.alpha, stream);

  RowReduceArgs zeta; // zeta = alpha * zetaL / D: the loss's zeta, scaled like its gradient
  zeta.partials = make_view(saved.zeta.data, DType::f32, m, 1, saved.zeta.device);
  zeta.partials.device_index = saved.zeta.device_index;
  zeta.scale = Scalar{float(1.0 / double(config.hidden)), alpha};
  zeta.out = s.norm.zeta;
  reduce_row_partials(zeta, stream);

  NormBackward final_norm; // B1 K6 with A = dlogits (dx written), A3 dgamma, dW_lm
  final_norm.dz = saved.dlogits;
  final_norm.w = weights.lm_head;
  final_norm.x = saved.x2;
  final_norm.rstd = saved.r2;
  final_norm.gamma = weights.final_norm;
  final_norm.alpha = Scalar{1.f, alpha};
  final_norm.accumulate_dx = false;
  final_norm.dx = grads.dx;
  final_norm.dgamma = dw.final_norm;
  final_norm.dw = dw.lm_head;
  norm_backward(final_norm, accumulate, s.norm, stream);

  mlp_backward(mlp, config.hidden, accumulate, s.mlp, s.ffn, stream,
               fp8 ? &s.fp8_mlp : nullptr); // B3..B8 (the LM head's K6 above stays 16-bit)
}

} // namespace coda::llama
