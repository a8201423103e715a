// The pieces of the block schedule that more than one layer runs. Each is a fixed sequence of
// public kernel calls (coda/coda.hpp); tensors are already validated by the entry point.
#pragma once

#include "block/scratch.hpp"
#include "coda/block/llama.hpp"

namespace coda::llama::detail {

RopeSpec rope_spec(const Config& c, const Rope& rope);

// dw (+)= alpha · dyᵀ · x: an nn.Linear weight gradient [out, in] from dy [M, out] and
// x [M, in], tokens being the GEMM's reduction dimension (GemmLayout::wgrad). `workspace` is the
// GEMM's (NormBackwardScratch::gemm_workspace; absent on the CPU).
void weight_gradient(const TensorView& dy, const TensorView& x, const TensorView& dw,
                     const Scalar& alpha, bool accumulate, const TensorView& workspace,
                     Stream stream);

// The attention input of the first and middle layers: the attn_norm RMSNorm, the QKV projection
// and RoPE.
//   forward (4.2, K4):      qkv = RoPE(rstd * (h·W_qkvᵀ)), h = x * attn_norm, rstd from the row
//                           partials S of x² inside the epilogue
//   backward (4.5, B0..B2): dz = RoPEᵀ(dqkv), zeta = (1/D) sum qkv * dqkv; then norm_backward
//                           through W_qkv (dx += ...)
struct AttentionInput {
  TensorView x, attn_norm, w_qkv; // the norm's input [M, D] and the weights
  TensorView qkv, rstd;           // outputs of the forward (saved for the backward)
};
// `fp8` (Precision::fp8): the QKV projection on E4M3 operands, h and W_qkv quantized first.
void attention_input_forward(const AttentionInput& f, const Config& c, const Rope& rope,
                             const TensorView& h, const TensorView& sumsq, Stream stream,
                             const Fp8ForwardScratch* fp8 = nullptr);
struct AttentionInputGrads {
  TensorView dqkv;               // input
  TensorView dx;                 // accumulated into
  TensorView dattn_norm, dw_qkv; // weight gradients
};
// `dz` is the [M, qkv_width] scratch for the pre-RoPE gradient. `fp8` (Precision::fp8): the
// norm backward on E4M3 operands (norm_backward).
void attention_input_backward(const AttentionInput& f, const AttentionInputGrads& g,
                              const Config& c, const Rope& rope, bool accumulate_grads,
                              const TensorView& dz, const NormBackwardScratch& scratch,
                              Stream stream, const Fp8NormBackwardScratch* fp8 = nullptr);

// coda-paper 4.2, F1..F3:
//   F1 K0: x1 = y0·W0ᵀ + x0;  h1 = x1 * ffn_norm;  S1 = row partials of x1²
//   F2 K2: z1 = r1 * (h1·W1ᵀ); y1 = silu(z1[:, 2j]) * z1[:, 2j+1];  r1 from S1 (rstd_out)
//   F3 K0: x2 = y1·W2ᵀ + x1;  h2 = x2 * next_norm;  S2
// Leaves h2 in scratch.h and S2 in scratch.sumsq for the GEMM that consumes x2's norm.
struct MlpForward {
  TensorView x0, y0;                                        // inputs
  TensorView w_out, ffn_norm, w_gate_up, w_down, next_norm; // weights
  TensorView x1, z1, r1, x2;                                // outputs (saved for the backward)
};
// `fp8` (Precision::fp8): the three GEMMs on E4M3 operands, each GEMM's input and weight
// quantized just before it (quantize_activation_fp8, quantize_weight_fp8), each weight only where
// the scratch does not hold the caller's copy of it (Fp8Operand::given), here and below.
void mlp_forward(const MlpForward& f, float eps, const MlpForwardScratch& scratch, Stream stream,
                 const Fp8ForwardScratch* fp8 = nullptr);

// One RMSNorm backward through the GEMM that consumed the norm's output (coda-paper 4.3, K6),
// with zeta already in scratch.zeta:
//   K6:    g = alpha · dz·w (rounded from K = 3072, kRmsBackwardRoundedGradientMinK);
//          dx (+)= rstd * (g * gamma - x * rstd * zeta);  h_hat;  partials
//   dgamma (+)= sum of the partials
//   dw     (+)= alpha · dzᵀ · h_hat
struct NormBackward {
  TensorView dz, w;          // the consumer's output gradient [M, K] and weight [K, D]
  TensorView x, rstd, gamma; // the norm's input [M, D], its rstd [M], gamma [D]
  Scalar alpha;              // scale of dz, inside K6 and in the weight gradient
  bool accumulate_dx = true; // false: dx is written (no incoming residual gradient)
  TensorView dx, dgamma, dw; // outputs
};
// `fp8` (Precision::fp8): K6 on dz quantized by rows and the weight's transposed codes, and the
// weight gradient as gemm_fp8's rows form on dz and h_hat quantized by columns (alpha 1 only:
// gemm_fp8 has no alpha).
void norm_backward(const NormBackward& b, bool accumulate_grads, const NormBackwardScratch& scratch,
                   Stream stream, const Fp8NormBackwardScratch* fp8 = nullptr);

// coda-paper 4.5, B3..B8, once dx holds d loss / d x2 in full:
//   B3 K7: dy1 = dx·W2; y1 (recomputed), dz1, zeta partials      A4: zeta1
//   B4: dW2 (+)= dxᵀ·y1
//   B5 K6: dx += r1 * (dz1·W1 * ffn_norm - x1 * r1 * zeta1)      A5: dffn_norm   B6: dW1
//   B7: dy0 = dx·W0      B8: dW0 (+)= dxᵀ·y0
// dx then holds d loss / d x0 (the residual identity). The two halves run apart in the middle
// layer's two-part backward; zeta1 passes from one to the other in `zeta1`.
struct MlpBackward {
  TensorView y0;                                     // forward input
  TensorView w_out, ffn_norm, w_gate_up, w_down;     // weights
  TensorView x1, z1, r1;                             // saved (z1 overwritten with dz1: B3)
  TensorView dx, dy0;                                // dx in/out, dy0 out
  TensorView dw_out, dffn_norm, dw_gate_up, dw_down; // weight gradients
};
// B3, A4, B4: writes dz1 over b.z1 and zeta1 into `zeta1` ([M] f32).
// `fp8` (Precision::fp8), here and below: K7 on dx by rows and W_down's transposed codes, the
// weight gradients as gemm_fp8's rows form, dy0 as its forward form on dx and W_out's
// transposed codes, the ffn norm backward as norm_backward's FP8 form.
void swiglu_and_down_backward(const MlpBackward& b, int64_t hidden, bool accumulate_grads,
                              const MlpBackwardScratch& mlp, const TensorView& zeta1,
                              const TensorView& gemm_workspace, Stream stream,
                              const Fp8MlpBackwardScratch* fp8 = nullptr);
// B5..B8, reading zeta1 from norm.zeta.
void gate_up_and_out_backward(const MlpBackward& b, bool accumulate_grads,
                              const NormBackwardScratch& norm, Stream stream,
                              const Fp8MlpBackwardScratch* fp8 = nullptr);
// Both, with zeta1 in norm.zeta.
void mlp_backward(const MlpBackward& b, int64_t hidden, bool accumulate_grads,
                  const MlpBackwardScratch& mlp, const NormBackwardScratch& norm, Stream stream,
                  const Fp8MlpBackwardScratch* fp8 = nullptr);

// The MLP backward's tensors in a middle or last layer's call, whose Weights, Inputs, Saved and
// Grads name them alike.
template <class Weights, class Inputs, class Saved, class Grads>
MlpBackward mlp_backward_of(const Weights& w, const Inputs& in, const Saved& saved,
                            const Grads& grads) {
  const Weights& dw = grads.dweights;
  return MlpBackward{in.y0,    w.w_out,     w.ffn_norm,   w.w_gate_up, w.w_down,
                     saved.x1, saved.z1,    saved.r1,     grads.dx,    grads.dy0,
                     dw.w_out, dw.ffn_norm, dw.w_gate_up, dw.w_down};
}

} // namespace coda::llama::detail
