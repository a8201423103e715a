// A middle layer (coda-paper 4.2 and 4.5): from the attention output of layer l to the
// post-RoPE QKV of layer l+1.
#include <string>

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

AttentionInput attention_input_of(const MiddleWeights& w, const MiddleOutputs& out,
                                  const MiddleSaved& saved) {
  return AttentionInput{out.x2, w.attn_norm, w.w_qkv, out.qkv, saved.r2};
}

// Registers the forward's tensors; returns M. r2 is an output of the forward and of the
// backward's part 1 (zeta1 over it); qkv is read by B0 alone, so the backward's part 2 leaves it
// unread (a caller may free it between the parts).
int64_t check_forward_tensors(api::Validator& v, Role produced, const Config& c,
                              const MiddleWeights& w, const MiddleInputs& in,
                              const MiddleOutputs& out, const MiddleSaved& saved, Role r2_role,
                              Role qkv_role) {
  const int64_t m =
      check_mlp_tensors(v, produced, c, Layer::middle, mlp_forward_of(w, in, out, saved));
  add(v, produced, "outputs.x2", out.x2, Elem::half, {tokens_dim(m), hidden_dim(c)});
  check_attention_input(v, qkv_role, c, m, in.rope, w.attn_norm, w.w_qkv, out.qkv, "saved.r2",
                        saved.r2, r2_role);
  return m;
}

// The gradients of B0..B2 (the attention norm of layer l+1 and its QKV projection).
void check_attention_input_part(api::Validator& v, const Config& c, int64_t m,
                                const MiddleGrads& grads) {
  v.input("grads.dqkv", grads.dqkv, Elem::half,
          {tokens_dim(m), exactly("qkv_width", c.qkv_width())});
  check_attention_input_gradients(v, c, grads.dweights.attn_norm, grads.dweights.w_qkv);
}

// B0..B2: the attention norm of layer l+1 and its QKV projection, backward (dx accumulated).
void attention_input_backward_of(const Config& config, const MiddleWeights& weights,
                                 const MiddleInputs& inputs, const MiddleOutputs& outputs,
                                 const MiddleSaved& saved, const MiddleGrads& grads,
                                 bool accumulate, const MiddleBackwardScratch& s, Stream stream) {
  const MiddleWeights& dw = grads.dweights;
  const AttentionInputGrads attention{grads.dqkv, grads.dx, dw.attn_norm, dw.w_qkv};
  attention_input_backward(attention_input_of(weights, outputs, saved), attention, config,
                           inputs.rope, accumulate, s.dz2, s.norm, stream,
                           config.precision == Precision::fp8 ? &s.fp8_attn : nullptr);
}

} // namespace

void middle_forward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                    const MiddleOutputs& outputs, const MiddleSaved& saved,
                    const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::middle_forward");
  const int64_t m = check_forward_tensors(v, Role::output, config, weights, inputs, outputs, saved,
                                          Role::output, Role::output);
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::middle, Pass::forward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  MiddleForwardScratch s = carve_middle_forward(arena, config, m, inputs.x0.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8, inputs.fp8_weights);
  const Fp8ForwardScratch* fp8 = config.precision == Precision::fp8 ? &s.fp8 : nullptr;
  mlp_forward(mlp_forward_of(weights, inputs, outputs, saved), config.eps, s.mlp, stream,
              fp8); // F1..F3

  attention_input_forward(attention_input_of(weights, outputs, saved), config, inputs.rope, s.mlp.h,
                          s.mlp.sumsq, stream,
                          fp8); // F4 K4 (and A2: r2 from S2 inside its epilogue)
}

void middle_backward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                     const MiddleOutputs& outputs, const MiddleSaved& saved,
                     const MiddleGrads& grads, bool accumulate, const TensorView& workspace,
                     Stream stream) {
  const MlpBackward mlp = mlp_backward_of(weights, inputs, saved, grads);

  api::Validator v("coda::llama::middle_backward");
  const int64_t m = check_forward_tensors(v, Role::input, config, weights, inputs, outputs, saved,
                                          Role::input, Role::input);
  check_attention_input_part(v, config, m, grads);
  check_mlp_gradients(v, config, m, mlp);
  const bool fp8 = config.precision == Precision::fp8;
  if (fp8) {
    check_fp8_mlp_backward(v, m, inputs.x0.dtype, grads.dweights);
    check_fp8_backward(v, m, {{"grads.dweights.w_qkv", grads.dweights.w_qkv}});
  }
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::middle, Pass::backward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  MiddleBackwardScratch s = carve_middle_backward(arena, config, m, inputs.x0.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s, inputs.fp8_weights);

  attention_input_backward_of(config, weights, inputs, outputs, saved, grads, accumulate, s,
                              stream); // B0..B2
  mlp_backward(mlp, config.hidden, accumulate, s.mlp, s.ffn, stream,
               fp8 ? &s.fp8_mlp : nullptr); // B3..B8
}

void middle_backward_part(Pass part, const Config& config, const MiddleWeights& weights,
                          const MiddleInputs& inputs, const MiddleOutputs& outputs,
                          const MiddleSaved& saved, const MiddleGrads& grads, bool accumulate,
                          const TensorView& workspace, Stream stream) {
  const MlpBackward mlp = mlp_backward_of(weights, inputs, saved, grads);
  const bool first = part == Pass::backward_part1;

  api::Validator v("coda::llama::middle_backward_part");
  if (!first && part != Pass::backward_part2)
    v.fail(Status::invalid_argument,
           "part must be Pass::backward_part1 or backward_part2; got " + std::to_string(int(part)));
  const int64_t m =
      check_forward_tensors(v, Role::input, config, weights, inputs, outputs, saved,
                            first ? Role::output : Role::input, first ? Role::input : Role::unread);
  v.output("grads.dx", grads.dx, Elem::half, {tokens_dim(m), hidden_dim(config)});
  if (first) {
    check_attention_input_part(v, config, m, grads);
    check_down_gradient(v, config, mlp);
  } else {
    check_gate_up_and_out_gradients(v, config, m, mlp);
  }
  const bool fp8 = config.precision == Precision::fp8;
  if (fp8) { // each part's weight gradients, and the MLP backward's activations (either part)
    const MiddleWeights& dw = grads.dweights;
    if (first)
      check_fp8_backward(
          v, m, {{"grads.dweights.w_qkv", dw.w_qkv}, {"grads.dweights.w_down", dw.w_down}});
    else
      check_fp8_backward(
          v, m, {{"grads.dweights.w_out", dw.w_out}, {"grads.dweights.w_gate_up", dw.w_gate_up}});
    check_fp8_mlp_activations(v, inputs.x0.dtype);
  }
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::middle, part, config, m, copies);
  v.finish();

  Arena arena(workspace);
  if (first) {
    MiddleBackwardScratch s = carve_middle_backward(arena, config, m, inputs.x0.dtype, copies);
    if (copies == Fp8WeightCopies::given) use_fp8_weights(s, inputs.fp8_weights);
    attention_input_backward_of(config, weights, inputs, outputs, saved, grads, accumulate, s,
                                stream); // B0..B2
    // B3, A4, B4: zeta1 over r2, whose one reader (B1's K6) has run.
    swiglu_and_down_backward(mlp, config.hidden, accumulate, s.mlp, saved.r2, s.norm.gemm_workspace,
                             stream, fp8 ? &s.fp8_mlp : nullptr);
  } else {
    MiddleBackwardPart2Scratch s =
        carve_middle_backward_part2(arena, config, m, inputs.x0.dtype, copies);
    s.ffn.zeta = saved.r2; // zeta1, from part 1
    if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8_mlp, inputs.fp8_weights);
    gate_up_and_out_backward(mlp, accumulate, s.ffn, stream,
                             fp8 ? &s.fp8_mlp : nullptr); // B5..B8
  }
}

} // namespace coda::llama
