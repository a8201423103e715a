// The block's scratch tensors, carved out of the caller's workspace. One carving function per
// call describes its layout; workspace_size() runs the same function on a counting Arena, so the
// size query and the schedule can never disagree.
//
// Tensors whose lifetimes do not overlap share memory: a carving function rewinds the Arena to
// an earlier mark and carves the later phase's tensors over the earlier phase's. That is safe
// because the block's kernels run one after another on one stream: every reader of the earlier
// tensor has finished before the kernel that writes the later one starts. Each such overlap is
// written next to its carve, with the step (B0..B8, coda-paper 4.5) after which the earlier
// tensor is dead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coda/block/llama.hpp"

namespace coda::llama::detail {

// Hands out 256-byte-aligned, contiguous tensors from one block of memory. Without memory it
// only counts the bytes it would hand out.
class Arena {
public:
  Arena() = default;                        // counting only
  explicit Arena(const TensorView& memory); // carves from memory (its device and index)

  TensorView matrix(DType dtype, int64_t rows, int64_t cols);
  TensorView vector(DType dtype, int64_t n);
  TensorView bytes(size_t n); // raw scratch for a kernel's own workspace (f32 elements)
  // Where the next tensor would start. rewind(mark) carves what follows over everything carved
  // since `mark`: the caller guarantees those tensors are dead (in stream order) before the new
  // ones are written.
  size_t mark() const { return next_; }
  void rewind(size_t mark) { next_ = mark; }
  size_t used() const { return used_; } // bytes needed: the highest end of any tensor carved

private:
  size_t take(int64_t rows, int64_t cols, DType dtype); // the offset of a new tensor

  char* base_ = nullptr;
  Device device_ = Device::cpu;
  int32_t device_index_ = 0;
  size_t next_ = 0;
  size_t used_ = 0;
};

// F1..F3 of the forward, shared by the middle and the last layer.
struct MlpForwardScratch {
  TensorView h;     // [M, D] gamma-scaled GEMM input: h1 for K2, then h2 for the next norm's GEMM
  TensorView sumsq; // [M, ceil(D/128)] f32 row partials of x^2: S1, then S2
  TensorView y1;    // [M, F] SwiGLU output
};

// A GEMM operand in FP8 (Precision::fp8): E4M3 codes and their E8M0 block scales, as gemm_fp8
// reads them (an activation: [M, K] and [M, ceil(K/128)]; a weight: [N, K] and
// [ceil(N/128), ceil(K/128)]). `given`: a weight's copy that the caller made (inputs.fp8_weights,
// use_fp8_weights): the step reads it instead of quantizing the weight into the scratch's.
struct Fp8Operand {
  TensorView codes, scales;
  bool given = false;
};

// The FP8 forward's operands: each GEMM's activation and weight, quantized just before it. No
// two GEMMs read at once, so the activations share one region and the weights another
// (carve_fp8_forward, which carves those of the layer's GEMMs: the first layer's QKV projection,
// the middle layer's four, the last layer's three before its 16-bit LM head).
struct Fp8ForwardScratch {
  Fp8Operand y0, h, y1; // y0 [M, A]; h [M, D] (h1 for F2, h2 for F4); y1 [M, F]
  Fp8Operand w_out, w_gate_up, w_down, w_qkv; // each weight [N, K] as nn.Linear stores it
};

// The FP8 operands of one RMSNorm backward (Precision::fp8): K6 reads dz by rows and the
// consumer weight's transposed codes, the weight gradient dz by columns (blocked along the
// tokens) and h_hat in 128 x 128 blocks, transposed (B scaled by blocks). The weight and h_hat
// are quantized into their transposed copies alone (quantize_weight_fp8 without codes).
struct Fp8NormBackwardScratch {
  Fp8Operand dz, dz_t; // [M, K] and [K, M]: K the consumer's output width
  Fp8Operand w_t;      // the consumer weight [K, D], transposed: [D, K]
  Fp8Operand h_hat_t;  // h_hat [M, D] transposed: [D, M], 128 x 128 blocks
};

// The FP8 operands of the MLP's backward (B3..B8, Precision::fp8): dx by rows and columns (after
// B1 for K7 and dW_down, again after B5 for dy0 and dW_out), W_down's and W_out's transposed
// codes (K7's and dy0's B), y1 and y0 in 128 x 128 blocks, transposed (dW_down's and dW_out's
// B, scaled by blocks), and the ffn norm backward's own (B5, B6). The phases' operands lie over
// one another (carve_fp8_mlp_backward): no two phases read at once.
struct Fp8MlpBackwardScratch {
  Fp8Operand dx, dx_t;        // [M, D], [D, M]
  Fp8Operand w_down_t;        // W_down [D, F] transposed: [F, D]
  Fp8Operand y1_t;            // y1 [M, F] transposed: [F, M], 128 x 128 blocks
  Fp8Operand w_out_t;         // W_out [D, A] transposed: [A, D]
  Fp8Operand y0_t;            // y0 [M, A] transposed: [A, M], 128 x 128 blocks
  Fp8NormBackwardScratch ffn; // K = 2F: dz1 and W_gate_up
};

// One RMSNorm backward (K6 + dgamma reduce + the consumer's weight gradient). In the middle and
// last layers the two norm backwards (B1 and B5) share everything but h_hat, which each takes
// from the memory of a phase that is over by then.
struct NormBackwardScratch {
  TensorView h_hat;           // [M, D] normalized input of the consumer GEMM
  TensorView dgamma_partials; // [D, ceil(M/128)] f32 column partials
  TensorView zeta;            // [M] f32
  TensorView gemm_workspace;  // gemm_scratch_bytes: for every coda::gemm of the backward, in turn
};

// The largest gemm_workspace_size of the backward's coda::gemm calls (weight gradients, dy0) on
// the current CUDA device when it can run the GPU backend; 0 otherwise. Stream order lets the
// GEMMs of one call share it.
size_t gemm_scratch_bytes(Layer layer, const Config& c, int64_t m);

// B3..B6 of the backward, shared by the middle and the last layer.
struct MlpBackwardScratch {
  TensorView y1;            // [M, F] recomputed SwiGLU output (none with Precision::fp8)
  TensorView zeta_partials; // [M, ceil(F/64)] f32
  // (d loss / d z1 [M, 2F] has no scratch: K7 writes it over the saved z1, its last reader.)
};

// The middle layer's forward: F1..F4's, and with Precision::fp8 their FP8 operands (fp8's
// tensors absent otherwise).
struct MiddleForwardScratch {
  MlpForwardScratch mlp;
  Fp8ForwardScratch fp8;
};

struct FirstForwardScratch {
  TensorView h;          // [M, D]
  TensorView sumsq;      // [M, ceil(D/128)] f32
  Fp8ForwardScratch fp8; // Precision::fp8: the QKV projection's operands
};
struct FirstBackwardScratch {
  TensorView dz; // [M, qkv_width] pre-RoPE gradient
  NormBackwardScratch norm;
  Fp8NormBackwardScratch fp8; // Precision::fp8: B1's and B2's operands
};
struct LastForwardScratch {
  MlpForwardScratch mlp;
  TensorView lse_partials; // [M, ceil(V/64)] f32
  TensorView target_logit; // [M] f32
  TensorView ce_workspace; // cross_entropy_workspace_size(M) bytes
  Fp8ForwardScratch fp8;   // Precision::fp8: F1..F3's operands
};
struct MiddleBackwardScratch {
  TensorView dz2;           // [M, qkv_width] (B0..B2)
  NormBackwardScratch norm; // the attention norm's backward (B1, B2)
  MlpBackwardScratch mlp;
  NormBackwardScratch ffn; // the ffn norm's backward (B5, B6): norm's but for h_hat
  // Precision::fp8: B1's and B2's operands, and B3..B8's, over one another.
  Fp8NormBackwardScratch fp8_attn;
  Fp8MlpBackwardScratch fp8_mlp;
};
// The middle backward in two parts (middle_backward_part). Part 1 (B0..B4) carves the one-call
// backward's MiddleBackwardScratch and leaves its ffn norm's h_hat unused (it lies over y1's
// region, so the size is the same); part 2 has only the ffn norm's backward and the GEMMs'
// scratch (zeta1 comes in saved.r2, from part 1), and with Precision::fp8 the operands of B5..B8.
struct MiddleBackwardPart2Scratch {
  NormBackwardScratch ffn;       // B5, B6 (its zeta absent: saved.r2 holds zeta1)
  Fp8MlpBackwardScratch fp8_mlp; // Precision::fp8: B5..B8's operands (B3's and B4's unused)
};
struct LastBackwardScratch {
  NormBackwardScratch norm; // the final norm's backward (K6 through the LM head, dW_lm)
  MlpBackwardScratch mlp;
  NormBackwardScratch ffn; // the ffn norm's backward (B5, B6): norm's but for h_hat
  TensorView alpha;        // [1] f32: dloss * grad_scale, the scale of dlogits (last_layer.cpp)
  Fp8MlpBackwardScratch fp8_mlp; // Precision::fp8: B3..B8's operands (the LM head stays 16-bit)
};

// The caller's FP8 weights (a layer's inputs.fp8_weights, checked as given) as the scratch's
// weight operands, which a carve with Fp8WeightCopies::given left absent: every weight operand
// then reads its given copy (Fp8Operand::given) and no step quantizes a weight.
void use_fp8_weights(Fp8ForwardScratch& s, const FirstFp8Weights& w);
void use_fp8_weights(Fp8ForwardScratch& s, const MiddleFp8Weights& w);
void use_fp8_weights(Fp8ForwardScratch& s, const LastFp8Weights& w);
void use_fp8_weights(Fp8NormBackwardScratch& s, const FirstFp8Weights& w);
void use_fp8_weights(MiddleBackwardScratch& s, const MiddleFp8Weights& w);
void use_fp8_weights(Fp8MlpBackwardScratch& s, const MiddleFp8Weights& w);
void use_fp8_weights(Fp8MlpBackwardScratch& s, const LastFp8Weights& w);

// `act` is the 16-bit activation dtype of the call. With Precision::fp8 and
// Fp8WeightCopies::given, the weights' operands are not carved (absent until use_fp8_weights
// puts the given copies there); the activations' FP8 operands are, in the same phases.
Fp8ForwardScratch carve_fp8_forward(Arena& arena, Layer layer, const Config& c, int64_t m,
                                    Fp8WeightCopies copies);
MlpForwardScratch carve_mlp_forward(Arena& arena, const Config& c, int64_t m, DType act);
MiddleForwardScratch carve_middle_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                          Fp8WeightCopies copies);
FirstForwardScratch carve_first_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                        Fp8WeightCopies copies);
FirstBackwardScratch carve_first_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                          Fp8WeightCopies copies);
LastForwardScratch carve_last_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                      Fp8WeightCopies copies);
MiddleBackwardScratch carve_middle_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                            Fp8WeightCopies copies);
MiddleBackwardPart2Scratch carve_middle_backward_part2(Arena& arena, const Config& c, int64_t m,
                                                       DType act, Fp8WeightCopies copies);
LastBackwardScratch carve_last_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                        Fp8WeightCopies copies);

} // namespace coda::llama::detail
