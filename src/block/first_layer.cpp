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

AttentionInput attention_input_of(const FirstWeights& w, const FirstInputs& in,
                                  const FirstOutputs& out, const FirstSaved& saved) {
  return AttentionInput{in.x, w.attn_norm, w.w_qkv, out.qkv, saved.rstd};
}

// Registers the forward's tensors; returns M.
int64_t check_forward_tensors(api::Validator& v, Role produced, const Config& c,
                              const FirstWeights& w, const FirstInputs& in, const FirstOutputs& out,
                              const FirstSaved& saved) {
  check_config(v, c, Layer::first);
  v.input("inputs.x", in.x, Elem::half, {api::at_least_one("M"), hidden_dim(c)});
  const int64_t m = in.x.shape[0];
  check_attention_input(v, produced, c, m, in.rope, w.attn_norm, w.w_qkv, out.qkv, "saved.rstd",
                        saved.rstd, produced);
  return m;
}

} // namespace

void first_forward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                   const FirstOutputs& outputs, const FirstSaved& saved,
                   const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::first_forward");
  const int64_t m = check_forward_tensors(v, Role::output, config, weights, inputs, outputs, saved);
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::first, Pass::forward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  FirstForwardScratch s = carve_first_forward(arena, config, m, inputs.x.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8, inputs.fp8_weights);

  RmsStatsArgs stats; // h = x * gamma, row partials of x^2
  stats.x = inputs.x;
  stats.gamma = weights.attn_norm;
  stats.out_scaled = s.h;
  stats.sumsq_partials = s.sumsq;
  rms_stats(stats, stream);

  attention_input_forward(attention_input_of(weights, inputs, outputs, saved), config, inputs.rope,
                          s.h, s.sumsq, stream,
                          config.precision == Precision::fp8 ? &s.fp8 : nullptr); // K4
}

void first_backward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                    const FirstOutputs& outputs, const FirstSaved& saved, const FirstGrads& grads,
                    bool accumulate, const TensorView& workspace, Stream stream) {
  api::Validator v("coda::llama::first_backward");
  const int64_t m = check_forward_tensors(v, Role::input, config, weights, inputs, outputs, saved);
  v.output("grads.dx", grads.dx, Elem::half, {tokens_dim(m), hidden_dim(config)});
  v.input("grads.dqkv", grads.dqkv, Elem::half,
          {tokens_dim(m), exactly("qkv_width", config.qkv_width())});
  check_attention_input_gradients(v, config, grads.dweights.attn_norm, grads.dweights.w_qkv);
  if (config.precision == Precision::fp8)
    check_fp8_backward(v, m, {{"grads.dweights.w_qkv", grads.dweights.w_qkv}});
  const Fp8WeightCopies copies = check_given_fp8_weights(v, config, weights, inputs.fp8_weights);
  check_workspace(v, workspace, Layer::first, Pass::backward, config, m, copies);
  v.finish();

  Arena arena(workspace);
  FirstBackwardScratch s = carve_first_backward(arena, config, m, inputs.x.dtype, copies);
  if (copies == Fp8WeightCopies::given) use_fp8_weights(s.fp8, inputs.fp8_weights);

  const AttentionInputGrads g{grads.dqkv, grads.dx, grads.dweights.attn_norm, grads.dweights.w_qkv};
  attention_input_backward(attention_input_of(weights, inputs, outputs, saved), g, config,
                           inputs.rope, accumulate, s.dz, s.norm, stream,
                           config.precision == Precision::fp8 ? &s.fp8 : nullptr); // B0..B2
}

} // namespace coda::llama
