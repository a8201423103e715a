#include "block/validate.hpp"

#include <cmath>
#include <string>

namespace coda::llama::detail {

namespace {

const char* layer_name(Layer layer) {
  return name_of(layer,
                 {{Layer::first, "first"}, {Layer::middle, "middle"}, {Layer::last, "last"}});
}

void positive(const api::Validator& v, const char* field, int64_t value, const char* why) {
  if (value >= 1) return;
  v.fail(Status::invalid_argument, std::string("config.") + field + " must be >= 1 (" + why +
                                       "); got " + std::to_string(value));
}

const char* pass_name(Pass pass) {
  return name_of(pass, {{Pass::forward, "forward"},
                        {Pass::backward, "backward"},
                        {Pass::backward_part1, "backward_part1"},
                        {Pass::backward_part2, "backward_part2"}});
}

} // namespace

void check_config(const api::Validator& v, const Config& c, Layer layer) {
  positive(v, "hidden", c.hidden, "the residual stream width");
  positive(v, "n_heads", c.n_heads, "query heads");
  positive(v, "n_kv_heads", c.n_kv_heads, "key/value heads");
  positive(v, "head_dim", c.head_dim, "the width of one head");
  if (c.head_dim % 2 != 0)
    v.fail(Status::invalid_argument,
           "config.head_dim must be even (RoPE rotates the pairs (i, i + head_dim/2)); got " +
               std::to_string(c.head_dim));
  // The widths derived from the config (n_heads*head_dim, qkv_width, 2*intermediate) must fit
  // in 64 bits before any shape is compared with them.
  int64_t width = 0;
  if (__builtin_mul_overflow(int64_t(c.n_heads) + 2 * int64_t(c.n_kv_heads), c.head_dim, &width))
    v.fail(Status::invalid_argument,
           "config: (n_heads + 2*n_kv_heads)*head_dim overflows 64 bits; got n_heads " +
               std::to_string(c.n_heads) + ", n_kv_heads " + std::to_string(c.n_kv_heads) +
               ", head_dim " + std::to_string(c.head_dim));
  if (layer != Layer::first) positive(v, "intermediate", c.intermediate, "the SwiGLU width");
  if (layer != Layer::first && __builtin_mul_overflow(c.intermediate, 2, &width))
    v.fail(Status::invalid_argument, "config.intermediate must be < 2^62 (2*intermediate rows of "
                                     "the gate/up weight); got " +
                                         std::to_string(c.intermediate));
  if (layer == Layer::last) positive(v, "vocab", c.vocab, "the LM head's output width");
  if (!std::isfinite(c.eps) || c.eps < 0.f)
    v.fail(Status::invalid_argument,
           "config.eps must be finite and >= 0; got " + std::to_string(c.eps));
  if (c.precision != Precision::native && c.precision != Precision::fp8)
    v.fail(Status::invalid_argument, "config.precision must be Precision::native or fp8; got " +
                                         std::to_string(int(c.precision)));
  if (layer == Layer::last && c.loss_reduction != LossReduction::mean &&
      c.loss_reduction != LossReduction::sum)
    v.fail(Status::invalid_argument, "config.loss_reduction must be mean or sum; got " +
                                         std::to_string(int(c.loss_reduction)));
}

void check_precision(const api::Validator& v, const Config& c, Layer layer) {
  if (c.precision != Precision::fp8) return;
  // Every GEMM's K and N the layer has, as gemm_fp8 needs them: rows of 16-byte E4M3 codes.
  const struct {
    const char* what;
    int64_t value;
    bool used;
  } widths[] = {{"hidden", c.hidden, true},
                {"intermediate", c.intermediate, layer != Layer::first},
                {"n_heads * head_dim", c.attention_width(), layer != Layer::first},
                {"(n_heads + 2 n_kv_heads) * head_dim", c.qkv_width(), layer != Layer::last}};
  for (const auto& w : widths)
    if (w.used && w.value % 16 != 0)
      v.fail(Status::invalid_argument,
             std::string("config.precision = fp8 needs every GEMM width a multiple of 16 (rows of "
                         "16-byte E4M3 codes); config ") +
                 w.what + " = " + std::to_string(w.value));
}

void check_fp8_backward(const api::Validator& v, int64_t m,
                        std::initializer_list<NamedTensor> dweights) {
  if (m % 16 != 0)
    v.fail(Status::invalid_argument,
           "config.precision = fp8: a backward needs M (tokens) a multiple of 16 (the weight "
           "gradients reduce over the tokens in rows of 16-byte E4M3 codes); got M = " +
               std::to_string(m));
  for (const NamedTensor& dw : dweights)
    if (dw.tensor.dtype != DType::bf16 && dw.tensor.dtype != DType::f32)
      v.fail(Status::type_error, std::string("config.precision = fp8: ") + dw.name +
                                     " must be bf16 or f32 (gemm_fp8 writes the weight "
                                     "gradients); got " +
                                     dtype_name(dw.tensor.dtype));
}

void check_fp8_mlp_activations(const api::Validator& v, DType act) {
  if (act != DType::bf16)
    v.fail(Status::type_error, std::string("config.precision = fp8: the MLP's backward needs bf16 "
                                           "activations (gemm_fp8 writes grads.dy0 in bf16 or "
                                           "f32); got ") +
                                   dtype_name(act));
}

void check_workspace(api::Validator& v, const TensorView& workspace, Layer layer, Pass pass,
                     const Config& c, int64_t tokens, Fp8WeightCopies copies) {
  check_precision(v, c, layer);
  v.output("workspace", workspace, api::Elem::any, {api::any("bytes / element size")});
  const bool given = copies == Fp8WeightCopies::given;
  const size_t needed = workspace_size(layer, pass, c, tokens, copies);
  const size_t held = size_t(workspace.numel() * dtype_size(workspace.dtype));
  if (held >= needed) return;
  // A workspace sized for a call given the copies, handed to one that quantizes its own.
  const bool sized_for_given =
      !given && c.precision == Precision::fp8 &&
      held >= workspace_size(layer, pass, c, tokens, Fp8WeightCopies::given);
  v.fail(Status::invalid_argument,
         "workspace holds " + std::to_string(held) + " bytes but this call needs " +
             std::to_string(needed) + " (coda::llama::workspace_size(Layer::" + layer_name(layer) +
             ", Pass::" + pass_name(pass) + ", config, M=" + std::to_string(tokens) +
             (given ? ", Fp8WeightCopies::given))" : "))") +
             (sized_for_given
                  ? ": inputs.fp8_weights are absent, so the call quantizes the weights into its "
                    "workspace; the Fp8WeightCopies::given size is for a call given them"
                  : ""));
}

void check_scalar(api::Validator& v, const char* value_name, const char* tensor_name,
                  const Scalar& s) {
  v.finite(value_name, s.value);
  v.optional_input(tensor_name, s.tensor, api::Elem::f32, {api::exactly("1", 1)});
}

int64_t check_mlp_tensors(api::Validator& v, Role produced, const Config& c, Layer layer,
                          const MlpForward& f) {
  using api::Elem;
  check_config(v, c, layer);
  const api::Dim attention = api::exactly("n_heads*head_dim", c.attention_width());
  const api::Dim intermediate = api::exactly("intermediate", c.intermediate);
  const api::Dim gate_up = api::exactly("2*intermediate", 2 * c.intermediate);
  v.input("inputs.x0", f.x0, Elem::half, {api::at_least_one("M"), hidden_dim(c)});
  const int64_t m = f.x0.shape[0];
  v.input("inputs.y0", f.y0, Elem::half, {tokens_dim(m), attention});
  v.input("weights.w_out", f.w_out, Elem::half, {hidden_dim(c), attention});
  v.input("weights.ffn_norm", f.ffn_norm, Elem::half, {hidden_dim(c)});
  v.input("weights.w_gate_up", f.w_gate_up, Elem::half, {gate_up, hidden_dim(c)});
  v.input("weights.w_down", f.w_down, Elem::half, {hidden_dim(c), intermediate});
  add(v, produced, "saved.x1", f.x1, Elem::half, {tokens_dim(m), hidden_dim(c)});
  // Written by the backward too (d loss / d z1 over it): an output of both passes, so it may
  // share memory with no other argument.
  v.output("saved.z1", f.z1, Elem::half, {tokens_dim(m), gate_up});
  add(v, produced, "saved.r1", f.r1, Elem::f32, {tokens_dim(m)});
  return m;
}

void check_gate_up_and_out_gradients(api::Validator& v, const Config& c, int64_t m,
                                     const MlpBackward& b) {
  using api::Elem;
  const api::Dim attention = api::exactly("n_heads*head_dim", c.attention_width());
  v.output("grads.dy0", b.dy0, Elem::half, {tokens_dim(m), attention});
  v.output("grads.dweights.w_out", b.dw_out, Elem::half_or_f32, {hidden_dim(c), attention});
  v.output("grads.dweights.ffn_norm", b.dffn_norm, Elem::half_or_f32, {hidden_dim(c)});
  v.output("grads.dweights.w_gate_up", b.dw_gate_up, Elem::half_or_f32,
           {api::exactly("2*intermediate", 2 * c.intermediate), hidden_dim(c)});
}

void check_down_gradient(api::Validator& v, const Config& c, const MlpBackward& b) {
  v.output("grads.dweights.w_down", b.dw_down, api::Elem::half_or_f32,
           {hidden_dim(c), api::exactly("intermediate", c.intermediate)});
}

void check_mlp_gradients(api::Validator& v, const Config& c, int64_t m, const MlpBackward& b) {
  v.output("grads.dx", b.dx, api::Elem::half, {tokens_dim(m), hidden_dim(c)});
  check_gate_up_and_out_gradients(v, c, m, b);
  check_down_gradient(v, c, b);
}

void check_attention_input(api::Validator& v, Role produced, const Config& c, int64_t m,
                           const Rope& rope, const TensorView& attn_norm, const TensorView& w_qkv,
                           const TensorView& qkv, const char* rstd_name, const TensorView& rstd,
                           Role rstd_role) {
  using api::Elem;
  v.input("inputs.rope.positions", rope.positions, Elem::i32, {tokens_dim(m)});
  v.input("inputs.rope.inv_freq", rope.inv_freq, Elem::f32,
          {api::exactly("head_dim/2", c.head_dim / 2)});
  v.input("weights.attn_norm", attn_norm, Elem::half, {hidden_dim(c)});
  v.input("weights.w_qkv", w_qkv, Elem::half,
          {api::exactly("qkv_width", c.qkv_width()), hidden_dim(c)});
  add(v, produced, "outputs.qkv", qkv, Elem::half,
      {tokens_dim(m), api::exactly("qkv_width", c.qkv_width())});
  add(v, rstd_role, rstd_name, rstd, Elem::f32, {tokens_dim(m)});
}

void check_attention_input_gradients(api::Validator& v, const Config& c,
                                     const TensorView& dattn_norm, const TensorView& dw_qkv) {
  using api::Elem;
  v.output("grads.dweights.attn_norm", dattn_norm, Elem::half_or_f32, {hidden_dim(c)});
  v.output("grads.dweights.w_qkv", dw_qkv, Elem::half_or_f32,
           {api::exactly("qkv_width", c.qkv_width()), hidden_dim(c)});
}

} // namespace coda::llama::detail
