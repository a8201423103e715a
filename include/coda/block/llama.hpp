// The Llama block as CODA's fused schedule (coda-paper.md sections 4.2 and 4.5), forward and
// backward, in CODA's "shifted" decomposition: one call runs from the attention output of layer
// l to the post-RoPE QKV of layer l+1, so attention itself stays outside.
//
//   first  : x (embedding output)  -> RMSNorm -> QKV -> RoPE -> qkv_0
//   middle : (x0, y0 = attention_l output) -> out-proj + residual -> RMSNorm -> gate/up -> SwiGLU
//            -> down + residual = x2 -> RMSNorm -> QKV_{l+1} -> RoPE -> qkv_{l+1}
//   last   : (x0, y0) -> ... -> down + residual = x2 -> final RMSNorm -> LM head -> cross-entropy
//
// Every entry point validates its own arguments (throwing coda::Error that names the offending
// field and the expected shape), then calls only the public kernel API of coda/coda.hpp, so the
// same schedule runs on the CPU backend (host tensors) and the GPU backend (device tensors).
//
// Layouts and dtypes:
//  * Activations are row-major [M, width], M = tokens. 16-bit tensors (activations, weights,
//    saved activations, gradients of activations) are all bf16 or all f16; rstd, zeta, loss and
//    the gradient scale are f32; positions and targets are i32. Weight and gamma gradients may be
//    bf16, f16 or f32 (each independently).
//  * Weights are stored as nn.Linear stores them, [out_features, in_features]. The fused gate/up
//    weight is interleaved by row pairs (coda::interleave_gate_up converts Hugging Face's
//    [gate; up]); the fused QKV weight is [Q; K; V] with Hugging Face's rotate-half RoPE.
//  * All tensors are contiguous and live on one device.
//
// Scratch space: each call takes a caller-owned workspace of at least
// workspace_size(layer, pass, config, tokens) bytes (any dtype, contiguous, on the tensors'
// device), or workspace_size(layer, pass, config, tokens, Fp8WeightCopies::given) bytes where its
// inputs carry the weights' FP8 copies (fp8_weights). Its contents are undefined between calls.
// A backward's workspace includes the stream-K scratch of its coda::gemm calls
// (GemmArgs::workspace), which the block hands to each in turn.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coda/core/error.hpp"
#include "coda/core/stream.hpp"
#include "coda/core/tensor.hpp"
#include "coda/kernels/args.hpp"

namespace coda::llama {

// How the block's GEMMs run (docs/fp8.md, "The FP8 block"):
//   native: in the activations' 16-bit dtype (bf16 or f16), fp32 accumulation;
//   fp8:    on E4M3 operands with power-of-two block scales (the activations in 1 x 128 blocks
//           along K, the weights in 128 x 128 blocks), fp32 accumulation, the outputs and
//           everything else as native; the LM head and the loss stay 16-bit. Every call,
//           the middle layer's two-part backward included; a backward needs M a
//           multiple of 16, the GEMMs' weight gradients bf16 or f32 and, in the middle and
//           last layers, bf16 activations. The weights stay 16-bit; a call quantizes the ones
//           it reads into its workspace unless its inputs carry their FP8 copies (fp8_weights,
//           made once per step by quantize_weights, at the end of this file), and each GEMM's
//           activation operand is quantized by a pass of its own before it (the fused kernels
//           do not emit FP8 yet).
enum class Precision : int32_t { native = 0, fp8 = 1 };

struct Config {
  int64_t hidden = 0;       // D, the residual stream and RMSNorm width
  int64_t intermediate = 0; // F, the SwiGLU width (the fused gate/up weight has 2F rows)
  int32_t n_heads = 0;      // query heads
  int32_t n_kv_heads = 0;   // key/value heads (GQA when fewer than n_heads)
  int32_t head_dim = 0;     // even
  int64_t vocab = 0;        // V, last layer only
  float eps = 1e-6f;        // RMSNorm epsilon
  int32_t ignore_index = -100;
  LossReduction loss_reduction = LossReduction::mean;
  Precision precision = Precision::native;

  int64_t attention_width() const { return int64_t(n_heads) * head_dim; }
  int64_t qkv_width() const { return (int64_t(n_heads) + 2 * int64_t(n_kv_heads)) * head_dim; }
};

enum class Layer : int32_t { first = 0, middle = 1, last = 2 };
// backward_part1 and backward_part2: the middle layer's backward in two calls
// (middle_backward_part, below).
enum class Pass : int32_t { forward = 0, backward = 1, backward_part1 = 2, backward_part2 = 3 };

// Where the weights' FP8 copies that a Precision::fp8 call's GEMMs read come from, which sets
// the size of its workspace:
//   in_workspace: the call quantizes the weights into its workspace (its inputs' fp8_weights
//                 absent); every native call's size too;
//   given:        its inputs carry the copies (fp8_weights, made by quantize_weights): the
//                 workspace holds no weight's copy, only the activations' FP8 operands, and is
//                 smaller by at least the smallest of the pass's weight copies (docs/fp8.md, "The
//                 given calls' smaller workspace"). Precision::fp8 only: a native call reads no
//                 FP8 copy, and asking for this size with a native config is invalid_argument.
enum class Fp8WeightCopies : int32_t { in_workspace = 0, given = 1 };

// Bytes of scratch one call needs: a function of the layer, pass, config, token count and, with
// Precision::fp8, of where its weights' FP8 copies come from (the first overload: in_workspace);
// for a backward, also of the current CUDA device (the GEMMs' stream-K scratch depends on its
// SM count; none where no sm_90 device is current). Query it with the device current that the
// call will run on; the call checks the workspace against the same number, the given size where
// its inputs carry the copies and the in_workspace size where they do not.
size_t workspace_size(Layer layer, Pass pass, const Config& config, int64_t tokens);
size_t workspace_size(Layer layer, Pass pass, const Config& config, int64_t tokens,
                      Fp8WeightCopies copies);

// Per-token rotary embedding inputs (coda::RopeSpec without the head counts, which come from
// the Config).
struct Rope {
  TensorView positions; // [M] i32
  TensorView inv_freq;  // [head_dim / 2] f32
};

// ---------------------------------------------------------------------------------------------
// The weights' FP8 copies, made once per step (Precision::fp8; docs/fp8.md, "The weights
// quantized once per step").
//
// Without them, each FP8 call quantizes the weights its GEMMs read: the forward each weight's
// copy in 128 x 128 blocks, the backward its transposed copy, so a training step of N
// micro-batches reads every weight 2N times. quantize_weights (at the end of this file) writes
// both copies of each weight in one pass over it. Given in a layer's inputs
// (FirstInputs::fp8_weights, ...) to its forward and backward calls, they are read instead: the
// call quantizes no weight, and its results are bit for bit the self-quantizing call's (one
// quantizer, quantize_weight_fp8, makes both). The copies must be made again whenever a weight
// changes (after the optimizer step): the block cannot tell stale copies from fresh ones. A call
// given them needs only workspace_size(..., Fp8WeightCopies::given) bytes of workspace.
//
// Each copy holds a weight [N, K] (the weights struct's field of its name, as nn.Linear stores
// it; N and K multiples of 16):
//   codes    [N, K] e4m3                       the forward GEMM's B
//   scales   [ceil(N/128), ceil(K/128)] e8m0   one per 128 x 128 block
//   codes_t  [K, N] e4m3                       the transposed codes: the input gradient's B
//   scales_t [ceil(K/128), ceil(N/128)] e8m0   the same scales, transposed
// 2 bytes a parameter and 2 a block, alive from the forward to the backward (fp8_weights_size).
// A layer's copies are all given or all absent (every tensor's data null: the call quantizes its
// own), and given only with Precision::fp8. The LM head has none: it stays 16-bit.
struct Fp8Weight {
  TensorView codes, scales, codes_t, scales_t;
};
struct FirstFp8Weights {
  Fp8Weight w_qkv;
};
struct MiddleFp8Weights {
  Fp8Weight w_out, w_gate_up, w_down, w_qkv; // of MiddleWeights' fields of these names
};
struct LastFp8Weights {
  Fp8Weight w_out, w_gate_up, w_down;
};

// ---------------------------------------------------------------------------------------------
// First layer: h = x * gamma (no producing GEMM to fuse into), full-row rstd, then K4.

struct FirstWeights {
  TensorView attn_norm; // gamma [D]
  TensorView w_qkv;     // [(n_heads + 2 n_kv_heads) head_dim, D]
};
struct FirstInputs {
  TensorView x; // [M, D] the residual stream (embedding output)
  Rope rope;
  // Optional, Precision::fp8: W_qkv's FP8 copies (quantize_weights), as MiddleInputs'.
  FirstFp8Weights fp8_weights = {};
};
struct FirstOutputs {
  TensorView qkv; // [M, qkv_width] post-RoPE, for attention of layer 0
};
struct FirstSaved {
  TensorView rstd; // [M] f32
};
struct FirstGrads {
  TensorView dx;         // [M, D] in: residual gradient from layer 0's block; out: d loss / d x
  TensorView dqkv;       // [M, qkv_width] in: from attention backward (read only)
  FirstWeights dweights; // out (or accumulated into, see `accumulate`)
};

void first_forward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                   const FirstOutputs& outputs, const FirstSaved& saved,
                   const TensorView& workspace, Stream stream = nullptr);

// accumulate: add the weight and gamma gradients into dweights (gradient accumulation) instead
// of overwriting them. dx is always accumulated into (the residual identity).
void first_backward(const Config& config, const FirstWeights& weights, const FirstInputs& inputs,
                    const FirstOutputs& outputs, const FirstSaved& saved, const FirstGrads& grads,
                    bool accumulate, const TensorView& workspace, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Middle layer (coda-paper 4.2): 4 GEMMs (K0, K2, K0, K4); the two rstd reductions run inside
// K2's and K4's epilogues, which read the partials of their own rows and write r1 and r2.

struct MiddleWeights {
  TensorView w_out;     // W0 [D, n_heads head_dim]   attention output projection of layer l
  TensorView ffn_norm;  // gamma0 [D]                 pre-MLP RMSNorm of layer l
  TensorView w_gate_up; // W1 [2F, D]                 fused gate/up, rows interleaved
  TensorView w_down;    // W2 [D, F]
  TensorView attn_norm; // gamma1 [D]                 pre-attention RMSNorm of layer l+1
  TensorView w_qkv;     // W3 [qkv_width, D]          QKV projection of layer l+1
};
struct MiddleInputs {
  TensorView x0; // [M, D] residual stream entering layer l's attention residual
  TensorView y0; // [M, n_heads head_dim] attention output of layer l
  Rope rope;     // of layer l+1's tokens
  // Optional, Precision::fp8: the weights' FP8 copies (quantize_weights), read by the forward and
  // both backwards in place of their own quantizations.
  MiddleFp8Weights fp8_weights = {};
};
struct MiddleOutputs {
  TensorView x2;  // [M, D] residual stream leaving layer l
  TensorView qkv; // [M, qkv_width] post-RoPE, for attention of layer l+1
};
// The backward consumes what the forward saved: it overwrites z1 with d loss / d z1 (the
// backward's K7 reads each pre-activation before writing its gradient over it, and nothing after
// it reads z1), so that the largest tensor of the backward needs no workspace. A second
// backward needs the forward run again.
struct MiddleSaved {
  TensorView x1; // [M, D]  residual stream after attention
  TensorView z1; // [M, 2F] gate/up pre-activation (interleaved); the backward overwrites it
  TensorView r1; // [M] f32 rstd of x1
  TensorView r2; // [M] f32 rstd of x2; middle_backward_part's part 1 overwrites it
};
struct MiddleGrads {
  TensorView dx;          // [M, D] in: d loss / d x2; out: d loss / d x0 (accumulated in place)
  TensorView dqkv;        // [M, qkv_width] in: from attention backward of layer l+1 (read only)
  TensorView dy0;         // [M, n_heads head_dim] out: for attention backward of layer l
  MiddleWeights dweights; // out (or accumulated into, see `accumulate`)
};

void middle_forward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                    const MiddleOutputs& outputs, const MiddleSaved& saved,
                    const TensorView& workspace, Stream stream = nullptr);

// coda-paper 4.5: B0 rope_backward, B1 K6, B2 dW3, B3 K7, B4 dW2, B5 K6, B6 dW1, B7 dy0, B8 dW0.
void middle_backward(const Config& config, const MiddleWeights& weights, const MiddleInputs& inputs,
                     const MiddleOutputs& outputs, const MiddleSaved& saved,
                     const MiddleGrads& grads, bool accumulate, const TensorView& workspace,
                     Stream stream = nullptr);

// The same backward in two calls, for a caller that allocates each call's gradients just before
// it. One call needs every gradient at once, and they are all alive where its largest scratch
// (the recomputed SwiGLU output y1, [M, F]) is; split, the gradients of part 2 do not exist yet
// while y1 does, and y1 is gone (with part 1's workspace) before they are allocated.
//   part 1 (Pass::backward_part1): B0..B4. Reads grads.dqkv and grads.dx (d loss / d x2); writes
//     grads.dx (d loss / d x1's residual part: d/d x2 plus the attention norm's backward),
//     grads.dweights.attn_norm, .w_qkv and .w_down, d loss / d z1 over saved.z1 (as the one-call
//     backward), and zeta1, the ffn norm's [M] f32 backward statistic, over saved.r2 (the
//     attention norm's rstd, whose one reader, B1, has run).
//   part 2 (Pass::backward_part2): B5..B8 from what part 1 left in grads.dx, saved.z1 and
//     saved.r2; writes grads.dx (d loss / d x0), grads.dy0 and grads.dweights.ffn_norm, .w_gate_up
//     and .w_out. It does not read outputs.qkv, which may be absent: a caller that holds qkv only
//     for the backward (attention's backward has run) can free it after part 1.
// Each part reads and writes only the gradients it names; the others may be absent. Both parts
// take the whole forward's tensors (weights, inputs, outputs, saved) as middle_backward does, and
// each its own workspace, workspace_size(Layer::middle, part, config, M) bytes. Part 1 then part
// 2 give bit for bit middle_backward's results.
void middle_backward_part(Pass part, const Config& config, const MiddleWeights& weights,
                          const MiddleInputs& inputs, const MiddleOutputs& outputs,
                          const MiddleSaved& saved, const MiddleGrads& grads, bool accumulate,
                          const TensorView& workspace, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Last layer: the middle layer's F1..F3, then the final RMSNorm + LM head (K5) and the
// cross-entropy forward-backward (its gradient is computed in the forward and saved).

struct LastWeights {
  TensorView w_out;      // W0 [D, n_heads head_dim]
  TensorView ffn_norm;   // gamma0 [D]
  TensorView w_gate_up;  // W1 [2F, D] interleaved
  TensorView w_down;     // W2 [D, F]
  TensorView final_norm; // gamma [D]
  TensorView lm_head;    // [V, D]
};
struct LastInputs {
  TensorView x0;      // [M, D]
  TensorView y0;      // [M, n_heads head_dim]
  TensorView targets; // [M] i32, in [0, V) or config.ignore_index
  // Optional, Precision::fp8: the weights' FP8 copies (quantize_weights), as MiddleInputs'.
  LastFp8Weights fp8_weights = {};
};
struct LastOutputs {
  TensorView loss;   // [1] f32, mean or sum over non-ignored tokens (config.loss_reduction)
  TensorView logits; // optional [M, V]: a copy of the logits (otherwise they live only briefly
                     // in saved.dlogits)
};
struct LastSaved {       // consumed by the backward, as MiddleSaved
  TensorView x1;         // [M, D]
  TensorView z1;         // [M, 2F]; the backward overwrites it (MiddleSaved)
  TensorView r1;         // [M] f32
  TensorView x2;         // [M, D] residual stream before the final norm
  TensorView r2;         // [M] f32
  TensorView dlogits;    // [M, V] softmax - onehot (unscaled)
  TensorView grad_scale; // [1] f32 1 / #valid (mean) or 1 (sum)
  TensorView zeta;       // [M] f32 sum_n logits * dlogits
};
struct LastGrads {
  Scalar dloss;         // d (outer loss) / d loss, e.g. 1 or the loss scale; a value, or a
                        // value times a [1] f32 tensor on the block's device (read there)
  TensorView dx;        // [M, D] out: d loss / d x0 (written, there is no incoming gradient)
  TensorView dy0;       // [M, n_heads head_dim] out
  LastWeights dweights; // out (or accumulated into, see `accumulate`)
};

void last_forward(const Config& config, const LastWeights& weights, const LastInputs& inputs,
                  const LastOutputs& outputs, const LastSaved& saved, const TensorView& workspace,
                  Stream stream = nullptr);

// B1 is K6 with A = dlogits, alpha = dloss * grad_scale, zeta = saved.zeta * alpha / D. alpha is
// formed on the block's device (in the workspace) from saved.grad_scale and dloss, so a mean
// loss or a device dloss needs no host synchronization. inputs.targets is not read (the forward
// saved dlogits) and may be absent; when given it is validated like the forward's.
void last_backward(const Config& config, const LastWeights& weights, const LastInputs& inputs,
                   const LastSaved& saved, const LastGrads& grads, bool accumulate,
                   const TensorView& workspace, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// The FP8 copies of a layer's weights (Fp8Weight, above the first layer, says what they hold).

// Bytes of a layer's copies (their tensors' sizes, unpadded), for a caller that sizes their
// memory; config.precision must be fp8.
size_t fp8_weights_size(Layer layer, const Config& config);

// Writes both copies of every weight `fp8_weights` holds, from the 16-bit weight of its name, in
// one pass over each (config.precision must be fp8). Reads only those weights: the norms and the
// LM head may be absent. Then pass them in the inputs of every call that reads these weights
// until they change (a middle layer's: its forward and its backward or backward parts).
void quantize_weights(const Config& config, const FirstWeights& weights,
                      const FirstFp8Weights& fp8_weights, Stream stream = nullptr);
void quantize_weights(const Config& config, const MiddleWeights& weights,
                      const MiddleFp8Weights& fp8_weights, Stream stream = nullptr);
void quantize_weights(const Config& config, const LastWeights& weights,
                      const LastFp8Weights& fp8_weights, Stream stream = nullptr);

} // namespace coda::llama
