// CODA's fused schedule of the Llama block (coda-paper.md 4.2 and 4.5; src/block does the same
// with the public kernel API), in fp64, composed from the kernel references of
// reference/kernels.hpp with Rounding::none. It is the algebraic twin of the textbook block of
// reference/llama.hpp: tests hold the two equal to fp64 rounding, which proves the
// reparameterization (h = x * gamma un-normalized with rstd applied after the GEMM, the
// interleaved gate/up weight, RMSNorm backward through zeta = (1/D) sum z dz, the loss gradient
// scaled by alpha = dloss * grad_scale) before any low-precision kernel is involved.
//
// Shapes as in reference/llama.hpp: M tokens, D hidden, F intermediate, Nq = qkv width,
// A = n_heads * head_dim (the attention output), V vocab. Matrices are row-major.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/llama.hpp"

namespace coda::ref::fused {

// ---- Weights in CODA's layout: W1 is the fused gate/up weight with rows interleaved
// (row 2j = gate row j, row 2j+1 = up row j). Gradients use the same structs.
struct FirstWeights {
  Matrix attn_norm; // gamma [D]
  Matrix w_qkv;     // [Nq, D]
};
struct MiddleWeights {
  Matrix w_out;     // W0 [D, A]
  Matrix ffn_norm;  // gamma0 [D]
  Matrix w_gate_up; // W1 [2F, D] interleaved
  Matrix w_down;    // W2 [D, F]
  Matrix attn_norm; // gamma1 [D] of layer l+1
  Matrix w_qkv;     // W3 [Nq, D] of layer l+1
};
struct LastWeights {
  Matrix w_out, ffn_norm, w_gate_up, w_down; // as in MiddleWeights
  Matrix final_norm;                         // [D]
  Matrix lm_head;                            // [V, D]
};

// [gate; up] (each [F, K]) -> the interleaved [2F, K], and back.
Matrix interleave_gate_up(int64_t F, int64_t K, std::span<const double> gate,
                          std::span<const double> up);
void deinterleave_gate_up(int64_t F, int64_t K, std::span<const double> fused, Matrix& gate,
                          Matrix& up);

// The textbook (Hugging Face layout) weights in CODA's layout.
FirstWeights to_fused(const ref::FirstWeights& w);
MiddleWeights to_fused(const ref::MiddleWeights& w, const LlamaConfig& c);
LastWeights to_fused(const ref::LastWeights& w, const LlamaConfig& c);

// ---- Forward: the outputs, and what the backward reads (saved), as the kernels produce them.
struct FirstForward {
  Matrix h;    // [M, D] x * gamma (un-normalized)
  Matrix rstd; // [M]
  Matrix qkv;  // [M, Nq] output
};
struct MlpForward { // F1..F3
  Matrix x1;        // [M, D]
  Matrix h1;        // [M, D] x1 * gamma0
  Matrix r1;        // [M]
  Matrix z1;        // [M, 2F] interleaved pre-activation
  Matrix y1;        // [M, F]
  Matrix x2;        // [M, D] output (the residual stream)
  Matrix h2;        // [M, D] x2 * gamma1 (or final_norm)
  Matrix sumsq2;    // [M, ceil(D/128)] row partials of x2²
};
struct MiddleForward {
  MlpForward mlp;
  Matrix r2;  // [M]
  Matrix qkv; // [M, Nq] output
};
struct LastForward {
  MlpForward mlp;
  Matrix r2;             // [M]
  Matrix logits;         // [M, V]
  double loss = 0;       // output
  double grad_scale = 0; // 1 / #valid (mean) or 1 (sum)
  Matrix dlogits;        // [M, V] softmax - onehot (unscaled)
  Matrix zeta;           // [M] sum_n logits * dlogits (unscaled)
};

// ---- Backward: the gradients, and the intermediates the schedule names.
struct FirstBackward {
  Matrix dz;   // [M, Nq] pre-RoPE gradient
  Matrix zeta; // [M]
  Matrix dx;   // [M, D] dx_res + the gradient through the norm
  FirstWeights grads;
};
struct MlpBackward { // B3..B8
  Matrix dz1;        // [M, 2F] interleaved (dgate, dup)
  Matrix zeta1;      // [M]
  Matrix dx0;        // [M, D]
  Matrix dy0;        // [M, A]
};
struct MiddleBackward {
  Matrix dz2;   // [M, Nq]
  Matrix zeta2; // [M]
  Matrix dx2;   // [M, D] the total gradient of x2, after B1
  MlpBackward mlp;
  MiddleWeights grads;
};
struct LastBackward {
  Matrix zeta; // [M] alpha * zetaL / D
  Matrix dx2;  // [M, D] after B1
  MlpBackward mlp;
  LastWeights grads;
};

// Signatures follow reference/llama.hpp, plus the forward's result where the backward needs
// what the forward saved.
FirstForward first_forward(const LlamaConfig& c, const FirstWeights& w, RopeInputs rope,
                           std::span<const double> x0);
FirstBackward first_backward(const LlamaConfig& c, const FirstWeights& w, RopeInputs rope,
                             std::span<const double> x0, const FirstForward& fwd,
                             std::span<const double> dqkv, std::span<const double> dx_res);

MiddleForward middle_forward(const LlamaConfig& c, const MiddleWeights& w, RopeInputs rope,
                             std::span<const double> x0, std::span<const double> y0);
MiddleBackward middle_backward(const LlamaConfig& c, const MiddleWeights& w, RopeInputs rope,
                               std::span<const double> y0, const MiddleForward& fwd,
                               std::span<const double> dx2, std::span<const double> dqkv);

LastForward last_forward(const LlamaConfig& c, const LastWeights& w, std::span<const double> x0,
                         std::span<const double> y0, const LossSpec& loss);
// Gradients of dloss * loss.
LastBackward last_backward(const LlamaConfig& c, const LastWeights& w, std::span<const double> y0,
                           const LastForward& fwd, double dloss = 1.0);

} // namespace coda::ref::fused
