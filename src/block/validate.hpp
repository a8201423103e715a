// Checks shared by the block's entry points, in the vocabulary of the public API's Validator
// (src/api/validate.hpp), so a bad block call reads like any other bad coda call. Each entry
// point registers its own tensors with the shapes the Config implies.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>

#include "api/validate.hpp"
#include "block/steps.hpp"
#include "coda/block/llama.hpp"

namespace coda::llama::detail {

// The Config alone: positive sizes, an even head_dim, a finite eps >= 0, a vocab for the last
// layer. Throws invalid_argument naming the field.
void check_config(const api::Validator& v, const Config& c, Layer layer);

// config.precision for this call: Precision::fp8 where every GEMM width of the layer is a
// multiple of 16; invalid_argument naming the width otherwise.
void check_precision(const api::Validator& v, const Config& c, Layer layer);

// What an FP8 backward needs beyond its shapes: M a multiple of 16 (the weight gradients reduce
// over the tokens in rows of 1-byte codes) and each weight gradient `dweights` bf16 or f32
// (gemm_fp8's d). invalid_argument / type_error naming the tensor otherwise.
struct NamedTensor {
  const char* name;
  const TensorView& tensor;
};
void check_fp8_backward(const api::Validator& v, int64_t m,
                        std::initializer_list<NamedTensor> dweights);

// The MLP's FP8 backward needs bf16 activations (gemm_fp8 writes grads.dy0 in bf16 or f32):
// type_error naming the dtype otherwise.
void check_fp8_mlp_activations(const api::Validator& v, DType act);

// The MLP's FP8 backward (B3..B8) in a middle or last layer: check_fp8_backward for its three
// weight gradients, and bf16 activations.
template <class Weights>
void check_fp8_mlp_backward(const api::Validator& v, int64_t m, DType act, const Weights& dw) {
  check_fp8_backward(v, m,
                     {{"grads.dweights.w_out", dw.w_out},
                      {"grads.dweights.w_gate_up", dw.w_gate_up},
                      {"grads.dweights.w_down", dw.w_down}});
  check_fp8_mlp_activations(v, act);
}

// A layer call's inputs.fp8_weights (coda/block/llama.hpp, Fp8Weight): in_workspace where absent
// (every tensor's data null). Where any is given: given, once all are, each e4m3 or e8m0 in the
// shape of its weight's copy (registered as inputs), and config.precision is fp8;
// invalid_argument or type_error naming the tensor otherwise (src/block/fp8_weights.cpp).
Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const FirstWeights& weights,
                                        const FirstFp8Weights& fp8_weights);
Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const MiddleWeights& weights,
                                        const MiddleFp8Weights& fp8_weights);
Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const LastWeights& weights,
                                        const LastFp8Weights& fp8_weights);

// The workspace: 1-D, any dtype, on the call's device (and the call's precision,
// check_precision), of at least workspace_size(layer, pass, c, tokens, copies) bytes, `copies`
// being check_given_fp8_weights' answer for the call.
void check_workspace(api::Validator& v, const TensorView& workspace, Layer layer, Pass pass,
                     const Config& c, int64_t tokens, Fp8WeightCopies copies);

// A Scalar argument: a finite value and an optional [1] f32 tensor. The Validator keeps the
// names, so they must be string literals.
void check_scalar(api::Validator& v, const char* value_name, const char* tensor_name,
                  const Scalar& s);

// Forward outputs and saved activations are outputs of the forward and inputs of the backward;
// `unread`: a tensor of the forward that this call does not read, absent or checked as an input
// (the middle backward's part 2 and outputs.qkv).
enum class Role { input, output, unread };
inline void add(api::Validator& v, Role role, const char* name, const TensorView& t, api::Elem elem,
                std::initializer_list<api::Dim> shape) {
  if (role == Role::input)
    v.input(name, t, elem, shape);
  else if (role == Role::output)
    v.output(name, t, elem, shape);
  else
    v.optional_input(name, t, elem, shape);
}

// The tensors of F1..F3 that the middle and last layers share, under the same names in both
// ("inputs.x0", "weights.w_down", "saved.z1", ...); next_norm and x2 are left to the caller.
// Checks the config first; returns M.
int64_t check_mlp_tensors(api::Validator& v, Role produced, const Config& c, Layer layer,
                          const MlpForward& f);

// The gradients of B3..B8 that the middle and last layers share: grads.dx, grads.dy0 and the
// four dweights of the attention output projection and the MLP.
void check_mlp_gradients(api::Validator& v, const Config& c, int64_t m, const MlpBackward& b);
// Those of B5..B8 (the middle backward's part 2): grads.dy0 and the dweights of w_out,
// ffn_norm and w_gate_up.
void check_gate_up_and_out_gradients(api::Validator& v, const Config& c, int64_t m,
                                     const MlpBackward& b);
// That of B4 (the middle backward's part 1): grads.dweights.w_down.
void check_down_gradient(api::Validator& v, const Config& c, const MlpBackward& b);

// The attention input that the first and middle layers share: its rope tables and weights
// ("inputs.rope.positions", "inputs.rope.inv_freq", "weights.attn_norm", "weights.w_qkv"), and
// what its forward produces ("outputs.qkv", in the role `produced`, and the norm's rstd,
// `rstd_name`; outputs of a forward, inputs of a backward; the rstd's role is its own: the
// middle backward's part 1 writes over it).
void check_attention_input(api::Validator& v, Role produced, const Config& c, int64_t m,
                           const Rope& rope, const TensorView& attn_norm, const TensorView& w_qkv,
                           const TensorView& qkv, const char* rstd_name, const TensorView& rstd,
                           Role rstd_role);

// Their weight gradients: grads.dweights.attn_norm and grads.dweights.w_qkv.
void check_attention_input_gradients(api::Validator& v, const Config& c,
                                     const TensorView& dattn_norm, const TensorView& dw_qkv);

// The dims of the block's shapes, named as the Config names them.
inline api::Dim hidden_dim(const Config& c) { return api::exactly("hidden", c.hidden); }
inline api::Dim tokens_dim(int64_t m) { return api::exactly("M", m); }

} // namespace coda::llama::detail
