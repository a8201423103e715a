/* coda C ABI: plain C99, usable from C, C++ and ctypes.
 *
 * Every function mirrors an entry point of coda/coda.hpp (whose argument structs, in
 * coda/kernels/args.hpp and coda/gemm/problem.hpp, document the shapes and the math). Each
 * returns a coda_status; on failure nothing was written to any output, and coda_last_error()
 * holds a message that names the offending argument and says what to fix. No C++ exception
 * ever crosses this interface.
 *
 * Tensors live on the host (CODA_DEVICE_CPU: the CPU backend computes synchronously and ignores
 * the stream) or on the current CUDA device (CODA_DEVICE_CUDA: the call is enqueued on `stream`
 * and returns without synchronizing). All tensors of one call are on one device. */
#ifndef CODA_CODA_H
#define CODA_CODA_H

#include <stddef.h>
#include <stdint.h>

#include "coda/core/types.h"

#define CODA_VERSION_MAJOR 0
#define CODA_VERSION_MINOR 1
#define CODA_VERSION_PATCH 0
#define CODA_VERSION_STRING "0.1.0"

/* Partial reductions have one column per CODA_REDUCE_BLOCK elements (kReduceBlock), except the
   log-sum-exp partials of gemm_rms_lse and the zeta partials of gemm_swiglu_backward: one per
   CODA_STAGED_REDUCE_BLOCK (kStagedReduceBlock). */
#define CODA_REDUCE_BLOCK 128
#define CODA_STAGED_REDUCE_BLOCK 64

#ifdef __cplusplus
extern "C" {
#endif

typedef enum coda_gemm_layout {
  CODA_GEMM_FWD = 0,   /* D = A * B^T   A [M, K], B [N, K] */
  CODA_GEMM_DGRAD = 1, /* D = A * B     A [M, K], B [K, N] */
  CODA_GEMM_WGRAD = 2  /* D = A^T * B   A [K, M], B [K, N] */
} coda_gemm_layout;

typedef enum coda_loss_reduction { CODA_LOSS_MEAN = 0, CODA_LOSS_SUM = 1 } coda_loss_reduction;

typedef struct coda_rope_spec {
  coda_tensor positions; /* [M] i32 */
  coda_tensor inv_freq;  /* [head_dim / 2] f32 */
  int32_t n_q_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
} coda_rope_spec;

typedef struct coda_gemm_args {
  int32_t layout; /* coda_gemm_layout */
  coda_tensor a, b, d;
  coda_tensor c;     /* optional; may alias d */
  coda_scalar alpha; /* a number (coda_scalar_value) or value * a [1] f32 tensor */
  float beta;
  /* Optional 1-D scratch of coda_gemm_workspace_size bytes for the GPU GEMM's stream-K (absent:
   * no stream-K, sometimes slower on few-wave shapes). Contents undefined between calls; calls
   * that may overlap need their own. Ignored on the CPU. */
  coda_tensor workspace;
} coda_gemm_args;

/* How b_scales scale b in coda_gemm_fp8: per 128 x 128 block (a weight) or per row and 128-wide
 * block of K, as a_scales (the weight gradient's b, an activation). */
typedef enum coda_fp8_b_scaling { CODA_FP8_B_BLOCKS = 0, CODA_FP8_B_ROWS = 1 } coda_fp8_b_scaling;

typedef struct coda_fp8_gemm_args { /* coda_gemm_fp8; the shapes and dtypes at its prototype */
  coda_tensor a, a_scales;
  coda_tensor b, b_scales;
  coda_tensor d;
  int32_t b_scaling;  /* coda_fp8_b_scaling */
  int32_t accumulate; /* nonzero: d += product */
} coda_fp8_gemm_args;

typedef struct coda_quantize_weight_fp8_args { /* coda_quantize_weight_fp8; see its prototype */
  coda_tensor w;
  coda_tensor codes, scales;
  coda_tensor codes_t, scales_t; /* optional, together */
} coda_quantize_weight_fp8_args;

typedef struct coda_quantize_activation_fp8_args { /* coda_quantize_activation_fp8; its prototype */
  coda_tensor x;
  coda_tensor codes, scales;
  coda_tensor codes_t, scales_t; /* optional, together */
} coda_quantize_activation_fp8_args;

typedef struct coda_residual_rms_args { /* K0; out may alias residual */
  coda_tensor a, w, residual, gamma;
  coda_tensor out, out_scaled, sumsq_partials;
  coda_tensor a_scales, w_scales; /* with a and w CODA_E4M3: coda_gemm_fp8's scales; else absent */
} coda_residual_rms_args;

typedef struct coda_rms_scale_args { /* K1 */
  coda_tensor a, w, sumsq_partials;
  float eps;
  coda_tensor out, rstd_out;
  coda_tensor a_scales, w_scales; /* with a and w CODA_E4M3: coda_gemm_fp8's scales; else absent */
} coda_rms_scale_args;

typedef struct coda_rms_swiglu_args { /* K2 */
  coda_tensor a, w, sumsq_partials;
  float eps;
  coda_tensor preact, act, rstd_out;
  coda_tensor a_scales, w_scales; /* with a and w CODA_E4M3: coda_gemm_fp8's scales; else absent */
} coda_rms_swiglu_args;

typedef struct coda_rms_geglu_args { /* K2g: K2 with GeGLU */
  coda_tensor a, w, sumsq_partials;
  float eps;
  coda_tensor preact, act, rstd_out;
  coda_tensor a_scales, w_scales; /* with a and w CODA_E4M3: coda_gemm_fp8's scales; else absent */
} coda_rms_geglu_args;

typedef struct coda_rms_rope_args { /* K4 */
  coda_tensor a, w, sumsq_partials;
  float eps;
  coda_rope_spec rope;
  coda_tensor out, rstd_out;
  coda_tensor a_scales, w_scales; /* with a and w CODA_E4M3: coda_gemm_fp8's scales; else absent */
} coda_rms_rope_args;

typedef struct coda_rms_lse_args { /* K5 */
  coda_tensor a, w, sumsq_partials;
  float eps;
  coda_tensor targets;
  coda_tensor logits, lse_partials /* [M, ceil(V / CODA_STAGED_REDUCE_BLOCK)] */, target_logit,
      rstd_out;
} coda_rms_lse_args;

typedef struct coda_rms_backward_args { /* K6 */
  coda_tensor dz, w, x, rstd, zeta, gamma;
  coda_scalar alpha;
  int32_t accumulate; /* nonzero: dx += result */
  coda_tensor dx, h_hat, dgamma_partials;
  coda_tensor dz_scales, w_scales; /* with dz and w CODA_E4M3 (w the weight's transposed codes
                                      [N, K], coda_quantize_weight_fp8's codes_t): their scales */
} coda_rms_backward_args;

typedef struct coda_swiglu_backward_args { /* K7; dpreact may alias preact */
  coda_tensor dx, w, preact;
  coda_tensor act, dpreact, zeta_partials /* [M, ceil(F / CODA_STAGED_REDUCE_BLOCK)] */;
  coda_tensor dx_scales, w_scales; /* with dx and w CODA_E4M3 (w the weight's transposed codes
                                      [F, K], coda_quantize_weight_fp8's codes_t): their scales */
  coda_tensor act_codes_t, act_scales_t; /* E4M3 operands: act's transposed FP8 copy [F, M] and
                                            its 128 x 128 block scales, in place of act (which is
                                            then absent): coda_quantize_weight_fp8's codes_t and
                                            scales_t of the 16-bit act, bit for bit */
} coda_swiglu_backward_args;

typedef struct coda_rms_stats_args {
  coda_tensor x, gamma;
  coda_tensor out_scaled, sumsq_partials;
} coda_rms_stats_args;

typedef struct coda_rstd_args {
  coda_tensor partials;
  int64_t n;
  float eps;
  coda_tensor rstd;
} coda_rstd_args;

typedef struct coda_row_reduce_args {
  coda_tensor partials;
  coda_scalar scale;
  coda_tensor out;
} coda_row_reduce_args;

typedef struct coda_col_reduce_args {
  coda_tensor partials;
  int32_t accumulate; /* nonzero: out += sum */
  coda_tensor out;
} coda_col_reduce_args;

typedef struct coda_rope_backward_args { /* dz may alias dqkv */
  coda_tensor dqkv, qkv;
  coda_rope_spec rope;
  float scale;
  coda_tensor dz, zeta;
} coda_rope_backward_args;

typedef struct coda_cross_entropy_args { /* dlogits may alias logits */
  coda_tensor logits, lse_partials, target_logit, targets;
  int32_t ignore_index;
  int32_t reduction; /* coda_loss_reduction */
  coda_tensor loss, dlogits, grad_scale, zeta;
  coda_tensor workspace; /* coda_cross_entropy_workspace_size(M) bytes; may be absent on the CPU */
} coda_cross_entropy_args;

CODA_API coda_status coda_gemm(const coda_gemm_args* args, coda_stream_t stream);
/* Bytes of args->workspace coda_gemm(args) can use on the current device (0 on the CPU). */
CODA_API coda_status coda_gemm_workspace_size(const coda_gemm_args* args, size_t* bytes);
/* The block-scaled FP8 GEMM (coda::gemm_fp8, docs/fp8.md): D (+)= dequant(A) dequant(B)^T with
 *   a        [M, K]                       CODA_E4M3  activation codes, row-major
 *   a_scales [M, ceil(K/128)]             CODA_E8M0  one per row and 128-wide block of K
 *   b        [N, K]                       CODA_E4M3  the weight as nn.Linear stores it
 *   b_scales [ceil(N/128), ceil(K/128)]   CODA_E8M0  CODA_FP8_B_BLOCKS: one per 128 x 128 block
 *            [N, ceil(K/128)]             CODA_E8M0  CODA_FP8_B_ROWS: one per row and K block
 *   d        [M, N]                       CODA_BF16 or CODA_F32
 * where A(m, k) = a(m, k) 2^(a_scales(m, k/128) - 127) and B(n, k) = b(n, k) 2^(b_scales(n/128,
 * k/128) - 127), or 2^(b_scales(n, k/128) - 127) by rows. Per element, each 128-deep block of K is
 * summed in fp32 and added to the fp32 accumulator times its two scales, block after block; with
 * accumulate, d's old value is added last; D is rounded once. M >= 1 is arbitrary, N a multiple
 * of 8 and K of 16 (16-byte rows); the last K block may be short. A scale byte 0xFF (NaN) makes
 * the outputs it scales NaN. No workspace, no alpha. */
CODA_API coda_status coda_gemm_fp8(const coda_fp8_gemm_args* args, coda_stream_t stream);
/* A weight's FP8 copies for coda_gemm_fp8 (coda::quantize_weight_fp8, docs/fp8.md), made from
 * its master copy:
 *   w        [N, K]                       CODA_BF16, CODA_F16 or CODA_F32  as nn.Linear stores it
 *   codes    [N, K]                       CODA_E4M3  optional: coda_gemm_fp8's b for the forward
 *   scales   [ceil(N/128), ceil(K/128)]   CODA_E8M0  with codes: one per 128 x 128 block
 *   codes_t  [K, N]                       CODA_E4M3  optional: w^T, b for the input gradient
 *   scales_t [ceil(K/128), ceil(N/128)]   CODA_E8M0  with codes_t: the scales, transposed
 * Each copy's codes and scales are given together or both absent (data NULL), and at least one
 * copy is given (a backward reads only w^T). Per 128 x 128 block (the
 * last of each dimension may be short): amax of |w|, k the smallest integer with amax <= 448 2^k
 * (at least -126), the scale byte k + 127, each code w 2^-k rounded to nearest even E4M3; the
 * transposed copy holds the same codes and scales, transposed. A block holding a NaN or an
 * infinity gets the NaN scale 0xFF and NaN codes 0x7F. N and K are multiples of 16. */
CODA_API coda_status coda_quantize_weight_fp8(const coda_quantize_weight_fp8_args* args,
                                              coda_stream_t stream);
/* An activation's (or a gradient's) FP8 copies for coda_gemm_fp8
 * (coda::quantize_activation_fp8, docs/fp8.md):
 *   x        [M, K]                       CODA_BF16, CODA_F16 or CODA_F32  as a layer produces it
 *   codes    [M, K]                       CODA_E4M3  coda_gemm_fp8's a (or, CODA_FP8_B_ROWS, b)
 *   scales   [M, ceil(K/128)]             CODA_E8M0  one per row and 128-column block
 *   codes_t  [K, M]                       CODA_E4M3  optional: x^T, an operand of the weight
 *                                                    gradient dW = dY^T X (reduces over M)
 *   scales_t [K, ceil(M/128)]             CODA_E8M0  with codes_t: one per column of x and
 *                                                    128-row block
 * codes_t and scales_t are given together or both absent (data NULL). Per 1 x 128 block (a row's
 * 128 columns for codes; for codes_t, 128 rows of one column of x, i.e. 128 codes of a row of
 * codes_t; the last block may be short): amax of |x|, k the smallest integer with amax <= 448 2^k
 * (at least -126), the scale byte k + 127, each code x 2^-k rounded to nearest even E4M3. The
 * copies have different blocks, so codes_t is not codes transposed. A block holding a NaN or an
 * infinity gets the NaN scale 0xFF and NaN codes 0x7F. K is a multiple of 16, and so is M when
 * codes_t is given. */
CODA_API coda_status coda_quantize_activation_fp8(const coda_quantize_activation_fp8_args* args,
                                                  coda_stream_t stream);
CODA_API coda_status coda_gemm_residual_rms(const coda_residual_rms_args* args,
                                            coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_scale(const coda_rms_scale_args* args, coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_swiglu(const coda_rms_swiglu_args* args, coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_geglu(const coda_rms_geglu_args* args, coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_rope(const coda_rms_rope_args* args, coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_lse(const coda_rms_lse_args* args, coda_stream_t stream);
CODA_API coda_status coda_gemm_rms_backward(const coda_rms_backward_args* args,
                                            coda_stream_t stream);
CODA_API coda_status coda_gemm_swiglu_backward(const coda_swiglu_backward_args* args,
                                               coda_stream_t stream);

CODA_API coda_status coda_rms_stats(const coda_rms_stats_args* args, coda_stream_t stream);
CODA_API coda_status coda_rstd_from_partials(const coda_rstd_args* args, coda_stream_t stream);
CODA_API coda_status coda_reduce_row_partials(const coda_row_reduce_args* args,
                                              coda_stream_t stream);
CODA_API coda_status coda_reduce_col_partials(const coda_col_reduce_args* args,
                                              coda_stream_t stream);
CODA_API coda_status coda_rope_backward(const coda_rope_backward_args* args, coda_stream_t stream);
CODA_API coda_status coda_cross_entropy(const coda_cross_entropy_args* args, coda_stream_t stream);
CODA_API coda_status coda_cross_entropy_workspace_size(int64_t m, size_t* bytes);

/* Fused gate/up rows (gate0, up0, gate1, up1, ...) to and from the [gate; up] stacking. Both
 * [2F, K], one dtype, one device, not overlapping. */
CODA_API coda_status coda_interleave_gate_up(const coda_tensor* stacked, const coda_tensor* fused,
                                             coda_stream_t stream);
CODA_API coda_status coda_deinterleave_gate_up(const coda_tensor* fused, const coda_tensor* stacked,
                                               coda_stream_t stream);

/* "MAJOR.MINOR.PATCH" of the library actually loaded (compare with CODA_VERSION_*). */
CODA_API const char* coda_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The fused Llama block's C ABI (it needs only coda/core/types.h), so that this header is the
 * whole C ABI, as coda/coda.hpp is the whole C++ API. */
#include "coda/block/llama.h"

#endif /* CODA_CODA_H */
