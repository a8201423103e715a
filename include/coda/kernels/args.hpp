// Arguments of the named CODA kernels (coda-paper.md section 4; conventions of ARCHITECTURE
// section 5). Host-only plain C++: the public API validates these, then dispatches them to the
// CPU backend (host pointers) or the GPU backend (device pointers).
//
// Conventions every kernel shares:
//  * Activations are row-major [M, width]; M = tokens (any M >= 1). Every row of every
//    16-bit tensor is 16-byte aligned: widths (N, K, F, V, ...) are multiples of 8.
//  * Weights are stored as nn.Linear stores them: [out_features, in_features].
//  * 16-bit tensors are bf16 or f16, all of one call alike; statistics, partials, rstd, zeta
//    and scales are f32; positions and targets are i32.
//  * Partial reductions: "row partials" are [M, ceil(N / kReduceBlock)] f32, entry (m, b) reduces
//    columns [b*kReduceBlock, (b+1)*kReduceBlock) of row m. "Column partials" are
//    [N, ceil(M / kReduceBlock)] f32, entry (n, b) reduces rows [b*kReduceBlock, ...) of column n.
//    Producers write exactly num_reduce_blocks(width) columns; consumers of row partials accept
//    any width P >= 1 (they sum the row). K5's lse and K7's zeta partials are the exception: one
//    column per kStagedReduceBlock (64) columns, num_staged_reduce_blocks(width) of them
//    (coda/epilogue/reduce_block.hpp says why).
//  * The fused gate/up layout is interleaved by row pairs: fused row 2j is gate row j and fused
//    row 2j+1 is up row j (so a pre-activation row reads g0,u0,g1,u1,...). Converters to and
//    from Hugging Face's [gate; up] stacking are in coda/coda.hpp.
//  * RoPE follows Hugging Face Llama: rotate-half within each head, +theta,
//    theta_i = position * inv_freq[i] for i < head_dim/2, pairs (i, i + head_dim/2):
//      out[i]            = x[i] cos - x[i + hd/2] sin
//      out[i + hd/2]     = x[i + hd/2] cos + x[i] sin
//    on the query and key heads of the fused [Q | K | V] projection; V is untouched.
#pragma once

#include <cstdint>

#include "coda/core/bool32.hpp"
#include "coda/core/scalar.hpp"
#include "coda/core/stream.hpp" // Stream, for the entry points that take these
#include "coda/core/tensor.hpp"
#include "coda/epilogue/reduce_block.hpp" // kReduceBlock, num_reduce_blocks

namespace coda {

// Every struct below is layout-identical to its C twin in coda/coda.h (coda_rms_scale_args for
// RmsScaleArgs, ...): src/api/abi_cast.hpp static_asserts it field by field and the C ABI casts.
// A field added here goes into coda.h too, at the same place.

// Per-token rotary embedding of the fused QKV projection [M, (n_q_heads + 2 n_kv_heads) *
// head_dim].
struct RopeSpec {
  TensorView positions; // [M] i32, the position of each token (packed sequences restart at 0)
  TensorView inv_freq;  // [head_dim / 2] f32, base^(-2i/head_dim) or a scaled (Llama-3) table
  int32_t n_q_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
};

// K0: x_new = acc + residual; the next RMSNorm's statistics and gamma-scaled input.
//   acc = a · wᵀ                               a [M, K], w [N, K]
//   out[m, n]        = round(acc + residual)     [M, N]   the new residual stream
//   out_scaled[m, n] = round((acc + residual) * gamma[n])   [M, N]   next GEMM's input h
//   sumsq_partials   row partials of (acc + residual)^2 in fp32, from the unrounded sum
// out may alias residual.
struct ResidualRmsArgs {
  TensorView a, w, residual, gamma;
  TensorView out, out_scaled, sumsq_partials;
  TensorView a_scales = {}, w_scales = {}; // E4M3 operands: as K4's (RmsRopeArgs)
};

// K1: out = round(rstd[m] * acc), acc = a · wᵀ, rstd[m] = rsqrt(sum_b partials[m, b] / K + eps).
// a is the gamma-scaled, un-normalized input h from K0 or rms_stats; K is the RMSNorm width.
// rstd_out (optional, [M] f32) receives rstd for the backward.
struct RmsScaleArgs {
  TensorView a, w, sumsq_partials;
  float eps = 1e-6f;
  TensorView out, rstd_out;
  TensorView a_scales = {}, w_scales = {}; // E4M3 operands: as K4's (RmsRopeArgs)
};

// K2: z = round(rstd[m] * (a · wᵀ)) with w the fused interleaved gate/up weight [2F, K] (z in the
// call's 16-bit type, as the pre-activation is stored: the staged schedule hands its tile over so);
//   preact = z [M, 2F]   (kept for the backward)
//   act[m, j] = round(silu(z[m, 2j]) * z[m, 2j+1]) [M, F], from z as stored.
struct RmsSwigluArgs {
  TensorView a, w, sumsq_partials;
  float eps = 1e-6f;
  TensorView preact, act, rstd_out;
  TensorView a_scales = {}, w_scales = {}; // E4M3 operands: as K4's (RmsRopeArgs)
};

// K2g: K2 with GeGLU, gelu(x) = x / 2 * (1 + erf(x / sqrt 2)) (the erf form, PyTorch's default)
// in place of silu: preact = z [M, 2F] as K2's, act[m, j] = round(gelu(z[m, 2j]) * z[m, 2j+1]).
struct RmsGegluArgs {
  TensorView a, w, sumsq_partials;
  float eps = 1e-6f;
  TensorView preact, act, rstd_out;
  TensorView a_scales = {}, w_scales = {}; // E4M3 operands: as K4's (RmsRopeArgs)
};

// K4: out = round(RoPE(round(rstd[m] * (a · wᵀ)))), w the fused [Q; K; V] weight
// [(Hq + 2 Hkv) hd, K] (RoPE on z rounded to the 16-bit type, as an unfused projection stores it).
// FP8 operands (docs/fp8.md): a and w as E4M3 codes with gemm_fp8's block scales, a_scales
// [M, ceil(K/128)] and w_scales [ceil(N/128), ceil(K/128)] e8m0, and a · wᵀ is gemm_fp8's product
// of them (K a multiple of 16); absent (data == nullptr) for 16-bit operands. out is bf16 or f16.
struct RmsRopeArgs {
  TensorView a, w, sumsq_partials;
  float eps = 1e-6f;
  RopeSpec rope;
  TensorView out, rstd_out;
  TensorView a_scales = {}, w_scales = {}; // "= {}": initializations stopping before stay quiet
};

// K5: logits l = rstd[m] * (a · wᵀ), w the LM head [V, K].
//   logits = round(l) [M, V]
//   lse_partials[m, b] = logsumexp (in fp32) of the stored logits round(l) over the b-th block of
//                        kStagedReduceBlock columns: [M, ceil(V / 64)] (-inf never appears since
//                        every block holds at least one column)
//   target_logit[m] = round(l)[m, targets[m]] as f32 where 0 <= targets[m] < V, else 0.
// Both come from the rounded logits that cross_entropy reads, so its softmax sums to 1 (as
// PyTorch's cross-entropy of 16-bit logits does); coda/epilogue/ops/round.hpp says why.
struct RmsLseArgs {
  TensorView a, w, sumsq_partials;
  float eps = 1e-6f;
  TensorView targets;
  TensorView logits, lse_partials, target_logit, rstd_out;
};

// K6: the RMSNorm backward in the input-gradient GEMM's epilogue.
//   g = alpha * (dz · w)     dz [M, K] gradient of the consumer's output, w [K, N] its weight;
//                            from K = kRmsBackwardRoundedGradientMinK rounded to the call's
//                            16-bit type, as an unfused input-gradient GEMM stores it (the GPU
//                            runs those calls on a staged schedule, which hands g over so:
//                            staged_wide, or on E4M3 operands the staged FP8 tile); below,
//                            fp32. Everything after it in fp32.
//   xh = x[m, n] * rstd[m]
//   result = rstd[m] * (g * gamma[n] - xh * zeta[m])
//   dx = accumulate ? dx + result : result          [M, N] (dx read and rounded once)
//   h_hat = round(xh * gamma[n])                    [M, N] normalized input, for the weight
//   gradient dgamma_partials: column partials of g * xh      [N, ceil(M / kReduceBlock)]
// zeta[m] = (1/N) sum_k z[m, k] dz[m, k] over the consumer's output (see rope_backward, K7, CE).
inline constexpr int64_t kRmsBackwardRoundedGradientMinK = 3072;
// E4M3 operands (docs/fp8.md), gemm_fp8's in its forward form: dz as codes with dz_scales
// [M, ceil(K/128)], and w then the weight's transposed codes [N, K] (quantize_weight_fp8's
// codes_t) with w_scales its scales_t [ceil(N/128), ceil(K/128)]; g rounded by the same rule of K
// (the threshold is the 16-bit kernel's; at K = 3072 the staged FP8 tile measured 20% faster
// than the cooperative one: docs/fp8.md, "K6 on the staged FP8 tile").
struct RmsBackwardArgs {
  TensorView dz, w, x, rstd, zeta, gamma;
  Scalar alpha;
  Bool32 accumulate = true; // a bool held as the C ABI's int32_t (coda/core/bool32.hpp)
  TensorView dx, h_hat, dgamma_partials;
  TensorView dz_scales = {}, w_scales = {};
};

// K7: the SwiGLU backward in the down projection's input-gradient GEMM.
//   dy = round(dx · w)   dx [M, K] residual-stream gradient, w [K, F] the down weight (rounded to
//                        the call's 16-bit type, as an unfused input-gradient GEMM stores it:
//                        the staged schedule hands its tile over so)
//   g = preact[m, 2j], u = preact[m, 2j+1], sig = sigmoid(g), s = g * sig
//   act[m, j]          = round(s * u)                           (recomputed y for dW_down)
//   dpreact[m, 2j]     = round(dy * u * sig * (1 + g * (1 - sig)))
//   dpreact[m, 2j + 1] = round(dy * s)
//   zeta_partials: row partials over j of g * dg + u * du (fp32), per kStagedReduceBlock
//                  columns                                            [M, ceil(F / 64)]
// E4M3 operands (docs/fp8.md), gemm_fp8's in its forward form as K6's: dx as codes with
// dx_scales [M, ceil(K/128)], and w then the weight's transposed codes [F, K]
// (quantize_weight_fp8's codes_t) with w_scales its scales_t [ceil(F/128), ceil(K/128)]; dy is
// still rounded to the 16-bit type before the SwiGLU backward, and every output stays 16-bit;
// or, in place of act, act_codes_t [F, M] e4m3 with act_scales_t [ceil(F/128), ceil(M/128)]:
// act's transposed copy in 128 x 128 blocks, bit for bit quantize_weight_fp8's codes_t and
// scales_t of the 16-bit act (the down weight gradient's B; M a multiple of 16).
struct SwigluBackwardArgs {
  TensorView dx, w, preact;
  TensorView act, dpreact, zeta_partials;
  TensorView dx_scales = {}, w_scales = {};
  TensorView act_codes_t = {}, act_scales_t = {};
};

// First-layer RMSNorm statistics (no producing GEMM): h = round(x * gamma), row partials of x^2.
struct RmsStatsArgs {
  TensorView x, gamma;
  TensorView out_scaled, sumsq_partials;
};

// rstd[m] = rsqrt(sum_b partials[m, b] / n + eps).
struct RstdArgs {
  TensorView partials;
  int64_t n = 0;
  float eps = 1e-6f;
  TensorView rstd;
};

// out[m] = scale * sum_b partials[m, b]  (e.g. zeta from K7's partials, scale = 1/hidden).
// scale is a Scalar (coda/core/scalar.hpp): a number, or value * tensor[0] read on the device.
struct RowReduceArgs {
  TensorView partials;
  Scalar scale = {}; // "= {}": designated initializations may leave it out warning-free
  TensorView out;
};

// out[n] (+)= sum_b partials[n, b]  (e.g. dgamma from K6's partials); out is f32, bf16 or f16.
struct ColReduceArgs {
  TensorView partials;
  Bool32 accumulate = false; // a bool held as the C ABI's int32_t
  TensorView out;
};

// RoPE backward and zeta: dz = RoPEᵀ(dqkv) (rotation by -theta; V passes through), and
// zeta[m] = scale * sum_n qkv[m, n] * dqkv[m, n] (= scale * sum z dz since RoPE is orthogonal),
// from the saved post-RoPE qkv. dz may alias dqkv.
struct RopeBackwardArgs {
  TensorView dqkv, qkv;
  RopeSpec rope;
  float scale = 1.f;
  TensorView dz, zeta;
};

enum class LossReduction : int32_t { mean = 0, sum = 1 };

// Cross-entropy forward and backward from K5's outputs.
//   lse[m] = logsumexp_b lse_partials[m, b]; loss_m = lse[m] - target_logit[m]
//   loss = sum or mean over rows whose target != ignore_index       [1] f32
//   dlogits = softmax(logits) - onehot(target), rows with ignore_index zero   (may alias logits)
//   grad_scale = 1 / #valid (mean) or 1 (sum)   [1] f32: the caller multiplies dloss by it
//   (with no valid row the mean loss is 0 and grad_scale 0, rather than torch's NaN)
//   zeta[m] = sum_n logits[m, n] * dlogits[m, n]   [M] f32 (unscaled)
// Targets outside [0, V) that are not ignore_index are an error on the CPU backend (checked
// before any output is written). The GPU kernel cannot report them without a host read-back of
// the targets: it treats such a row exactly as an ignored row (zero dlogits and zeta, left out of
// the sum and of the mean's count), as K5 already writes target_logit 0 for it. Callers that need
// the error check the targets themselves.
// The GPU keeps each row's loss and valid flag in the workspace (any contents on entry) and sums
// them in one CTA in a fixed order: no atomics, the same bits every run.
struct CrossEntropyArgs {
  TensorView logits, lse_partials, target_logit, targets;
  int32_t ignore_index = -100;
  LossReduction reduction = LossReduction::mean;
  TensorView loss, dlogits, grad_scale, zeta;
  TensorView workspace; // [cross_entropy_workspace_size(M)] bytes (u8 viewed as i32/f32), may be
                        // empty on the CPU
};

} // namespace coda

// The entry points that take the structs above, one per struct: X(name, Args), K0..K7 and K2g
// (GEMMs with a fused epilogue) and the auxiliary kernels. These two lists are the one place a
// kernel is named; each row becomes
//   void coda::name(const Args&, Stream = nullptr)   the C++ API (coda/coda.hpp), defined in
//                                                    src/api/coda.cpp: validate, then run
//   Device api::validate(const Args&)                its argument rules (src/api/checks.hpp)
//   cpu::name, gpu::name                             the backends' functions of the same name
//                                                    (src/cpu/backend.hpp,
//                                                    src/gpu/fused/kernels.hpp,
//                                                    src/gpu/auxiliary/kernels.hpp)
// and src/api/c_abi.cpp checks that coda/coda.h declares its C entry point coda_name on the C twin
// of Args (tools/gen_abi.py generates the C ABI's own list, and the Python one, from coda.h).
#define CODA_FUSED_KERNELS(X)                                                                      \
  X(gemm_residual_rms, ResidualRmsArgs)       /* K0 */                                             \
  X(gemm_rms_scale, RmsScaleArgs)             /* K1 */                                             \
  X(gemm_rms_swiglu, RmsSwigluArgs)           /* K2 */                                             \
  X(gemm_rms_geglu, RmsGegluArgs)             /* K2g */                                            \
  X(gemm_rms_rope, RmsRopeArgs)               /* K4 */                                             \
  X(gemm_rms_lse, RmsLseArgs)                 /* K5 */                                             \
  X(gemm_rms_backward, RmsBackwardArgs)       /* K6 */                                             \
  X(gemm_swiglu_backward, SwigluBackwardArgs) /* K7 */
#define CODA_AUX_KERNELS(X)                                                                        \
  X(rms_stats, RmsStatsArgs)                                                                       \
  X(rstd_from_partials, RstdArgs)                                                                  \
  X(reduce_row_partials, RowReduceArgs)                                                            \
  X(reduce_col_partials, ColReduceArgs)                                                            \
  X(rope_backward, RopeBackwardArgs)                                                               \
  X(cross_entropy, CrossEntropyArgs)
