// The textbook Llama block, forward and hand-written backward, in CODA's "shifted"
// decomposition (coda-paper.md section 3 "Shifted block", 4.2, 4.5). Plain C++: no CUDA.
//
// Textbook means no reparameterization: RMSNorm is applied to its input and the normalized
// result is multiplied by the next weight; the backward is ordinary backpropagation through each
// op of reference/ops.hpp. The fused CODA schedule is tested against these functions (to fp64
// rounding with Rounding::none), and the GPU against them (ARCHITECTURE section 7: fp64 as ground
// truth, a bf16/f16 Rounding as the ordinary unfused baseline).
//
// One "layer" runs from the attention output of layer l to the post-RoPE QKV of layer l+1;
// attention stays outside. Three kinds:
//
//   first  (embedding -> QKV of layer 0):
//     h   = RMSNorm(x0; attn_norm)                              [M, D]
//     z   = h · w_qkvᵀ                                          [M, Nq]   pre-RoPE
//     qkv = RoPE(z)                                             [M, Nq]   output
//
//   middle (attention output of layer l -> QKV of layer l+1):
//     x1   = x0 + y0 · w_oᵀ                                     [M, D]
//     h1   = RMSNorm(x1; ffn_norm)                              [M, D]
//     gate = h1 · w_gateᵀ,  up = h1 · w_upᵀ                     [M, F]
//     y1   = silu(gate) * up                                    [M, F]
//     x2   = x1 + y1 · w_downᵀ                                  [M, D]    output
//     h2   = RMSNorm(x2; next_attn_norm)                        [M, D]
//     z2   = h2 · w_qkv_nextᵀ                                   [M, Nq]   pre-RoPE
//     qkv  = RoPE(z2)                                           [M, Nq]   output
//
//   last   (attention output of the last layer -> loss):
//     x1, h1, gate, up, y1, x2 as in middle
//     h2     = RMSNorm(x2; final_norm)                          [M, D]
//     logits = h2 · w_lmᵀ                                       [M, V]
//     loss   = cross_entropy(logits, targets, ignore_index, mean | sum)
//
// Shapes: M tokens (any M >= 1), D = hidden, F = intermediate, Hq / Hkv = query / key-value heads
// (GQA when Hkv < Hq), hd = head_dim (even), Nq = (Hq + 2 Hkv) hd, V = vocab. All matrices are
// row-major std::vector<double>; weights are in Hugging Face layouts [out, in]:
//   w_qkv [Nq, D] = [W_q; W_k; W_v] stacked by rows, w_o [D, Hq hd], w_gate / w_up [F, D],
//   w_down [D, F], w_lm [V, D], norms [D].
// RoPE is the Hugging Face convention of reference/ops.hpp (rotate-half, +theta, V untouched).
//
// Relation to CODA's names (coda-paper.md 4.2): CODA's h1 = x1 ⊙ ffn_norm (not normalized),
// r1 = rstd1, z1[:, 2j] = gate[:, j], z1[:, 2j+1] = up[:, j] (interleaved fused gate/up),
// W1 = [w_gate; w_up] interleaved, W0 = w_o, W2 = w_down, W3 = w_qkv_next, γ0 = ffn_norm,
// γ1 = next_attn_norm (or final_norm), y2 = qkv.
//
// Backward inputs: first and middle take dqkv = dL/dqkv (from attention backward of the next
// layer) and the residual-stream gradient from the layer above (dx_res for first, dx2 for
// middle); last starts from the loss (times dloss). Every backward returns dL/d(each input
// activation) and dL/d(each weight), in the weights' own struct type and shapes.
//
// Rounding: with Rounding::none everything is fp64. With a bf16/f16 Rounding, every op's output
// (each matrix above, each gradient) is rounded as reference/ops.hpp describes, i.e. PyTorch
// eager in that dtype: the ordinary unfused low-precision path. Inputs are used as given.
//
// Bad sizes (a vector whose length does not match the config and M, an odd head_dim, ...)
// throw std::invalid_argument before anything is computed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/ops.hpp"

namespace coda::ref {

using Matrix = std::vector<double>; // row-major, shape documented at each use

struct LlamaConfig {
  int64_t hidden = 0;       // D
  int64_t intermediate = 0; // F
  int64_t n_heads = 0;      // Hq
  int64_t n_kv_heads = 0;   // Hkv
  int64_t head_dim = 0;     // hd
  int64_t vocab = 0;        // V (last layer only)
  double eps = 1e-6;        // RMSNorm epsilon

  int64_t qkv_width() const { return (n_heads + 2 * n_kv_heads) * head_dim; } // Nq
  int64_t attn_width() const { return n_heads * head_dim; }                   // width of y0
  RopeShape rope_shape() const { return {n_heads, n_kv_heads, head_dim}; }
};

// Per-token positions [M] and the frequency table [head_dim / 2] (rope_inv_freq or
// rope_inv_freq_llama3).
struct RopeInputs {
  std::span<const int32_t> positions;
  std::span<const double> inv_freq;
};

// ---- Weights. Gradients use the same structs (same names, same shapes).
struct FirstWeights {
  Matrix attn_norm; // [D]
  Matrix w_qkv;     // [Nq, D]
};
struct MiddleWeights {
  Matrix w_o;            // [D, Hq hd]
  Matrix ffn_norm;       // [D]
  Matrix w_gate, w_up;   // [F, D]
  Matrix w_down;         // [D, F]
  Matrix next_attn_norm; // [D]
  Matrix w_qkv_next;     // [Nq, D]
};
struct LastWeights {
  Matrix w_o, ffn_norm, w_gate, w_up, w_down; // as in MiddleWeights
  Matrix final_norm;                          // [D]
  Matrix w_lm;                                // [V, D]
};

// ---- Forward results: the outputs and every intermediate named in the formulas above.
struct FirstForward {
  Matrix rstd; // [M]  1 / sqrt(mean(x0^2) + eps)
  Matrix h;    // [M, D]
  Matrix z;    // [M, Nq]
  Matrix qkv;  // [M, Nq]  output
};

// The attention-output projection and the MLP, shared by middle and last.
struct MlpForward {
  Matrix x1;       // [M, D]
  Matrix rstd1;    // [M]
  Matrix h1;       // [M, D]
  Matrix gate, up; // [M, F]
  Matrix y1;       // [M, F]
  Matrix x2;       // [M, D]  output (the residual stream)
};

struct MiddleForward {
  MlpForward mlp;
  Matrix rstd2; // [M]
  Matrix h2;    // [M, D]
  Matrix z2;    // [M, Nq]
  Matrix qkv;   // [M, Nq]  output
};

struct LastForward {
  MlpForward mlp;
  Matrix rstd2;          // [M]
  Matrix h2;             // [M, D]
  Matrix logits;         // [M, V]
  Matrix lse;            // [M]
  CrossEntropyResult ce; // ce.loss is the output
};

// ---- Backward results.
struct FirstBackward {
  Matrix dz;  // [M, Nq] gradient of the pre-RoPE projection
  Matrix dx0; // [M, D]  dx_res + the gradient through the norm path
  FirstWeights grads;
};
struct MiddleBackward {
  Matrix dz2;        // [M, Nq]
  Matrix dx2;        // [M, D] total gradient of x2 (incoming dx2 + through the next norm)
  Matrix dgate, dup; // [M, F]
  Matrix dx0;        // [M, D] (= dx1: the residual passes the gradient through)
  Matrix dy0;        // [M, Hq hd]
  MiddleWeights grads;
};
struct LastBackward {
  Matrix dlogits;    // [M, V] dloss * d loss / d logits
  Matrix dx2;        // [M, D]
  Matrix dgate, dup; // [M, F]
  Matrix dx0;        // [M, D]
  Matrix dy0;        // [M, Hq hd]
  LastWeights grads;
};

// x0 [M, D] is the embedding output.
FirstForward first_forward(const LlamaConfig& cfg, const FirstWeights& w, RopeInputs rope,
                           std::span<const double> x0, Rounding r = {});
// dqkv [M, Nq]; dx_res [M, D] is the residual-stream gradient from the layer above (the
// middle layer's dx0).
FirstBackward first_backward(const LlamaConfig& cfg, const FirstWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> dqkv,
                             std::span<const double> dx_res, Rounding r = {});

// x0 [M, D] the residual stream, y0 [M, Hq hd] the attention output of this layer.
MiddleForward middle_forward(const LlamaConfig& cfg, const MiddleWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> y0,
                             Rounding r = {});
// dx2 [M, D] from the layer above, dqkv [M, Nq] from the next attention's backward.
MiddleBackward middle_backward(const LlamaConfig& cfg, const MiddleWeights& w, RopeInputs rope,
                               std::span<const double> x0, std::span<const double> y0,
                               std::span<const double> dx2, std::span<const double> dqkv,
                               Rounding r = {});

struct LossSpec {
  std::span<const int32_t> targets; // [M], each in [0, V) or ignore_index
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
};
LastForward last_forward(const LlamaConfig& cfg, const LastWeights& w, std::span<const double> x0,
                         std::span<const double> y0, const LossSpec& loss, Rounding r = {});
// Gradients of dloss * loss. (Under a low-precision Rounding, dlogits are rounded by the
// cross-entropy, then scaled by dloss and rounded again; with dloss = 1 that is one rounding.)
LastBackward last_backward(const LlamaConfig& cfg, const LastWeights& w, std::span<const double> x0,
                           std::span<const double> y0, const LossSpec& loss, double dloss = 1.0,
                           Rounding r = {});

// ---- The same backward from the activations a forward saved, instead of the forward recomputed
// from x0 (and y0) under r. A test that holds a backward to the rule feeds these the very tensors
// that backward reads (reference/README.md): then its error and the baseline's are those of the
// backward's own arithmetic, not two independent draws of the forward's roundings (the rounding
// of a saved x2, say, weighted by the gradient; tests/cpu/test_block_cpu.cpp, BlockModel). What
// the backward needs besides, h = x * rstd * gamma for each norm and y1 = silu(gate) * up, is
// formed from them and rounded once under r, as an unfused forward stores it. With
// Rounding::none and the forward's own tensors, each equals its recomputing twin bit for bit.
struct MlpSaved {
  Matrix x1;       // [M, D]
  Matrix rstd1;    // [M]
  Matrix gate, up; // [M, F]
  Matrix x2;       // [M, D]
};
// x0 [M, D] (the first layer's input is also what its norm saved), rstd [M].
FirstBackward first_backward_from_saved(const LlamaConfig& cfg, const FirstWeights& w,
                                        RopeInputs rope, std::span<const double> x0,
                                        std::span<const double> rstd, std::span<const double> dqkv,
                                        std::span<const double> dx_res, Rounding r = {});
// rstd2 [M], the next attention norm's.
MiddleBackward middle_backward_from_saved(const LlamaConfig& cfg, const MiddleWeights& w,
                                          RopeInputs rope, std::span<const double> y0,
                                          const MlpSaved& saved, std::span<const double> rstd2,
                                          std::span<const double> dx2, std::span<const double> dqkv,
                                          Rounding r = {});
// rstd2 [M], the final norm's; dlogits [M, V] the loss gradient as the backward reads it, already
// scaled (dloss * d loss / d logits): it is used as given.
LastBackward last_backward_from_saved(const LlamaConfig& cfg, const LastWeights& w,
                                      std::span<const double> y0, const MlpSaved& saved,
                                      std::span<const double> rstd2,
                                      std::span<const double> dlogits, Rounding r = {});

} // namespace coda::ref
