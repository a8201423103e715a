/* The Llama block of coda/block/llama.hpp through the C ABI: plain C99, usable from C, C++ and
 * ctypes. Every struct mirrors its C++ namesake field for field (coda::llama::Config, the
 * weight / input / output / saved / gradient structs); llama.hpp documents the shapes, dtypes
 * and the schedule. Each function returns a coda_status; on failure nothing was written and
 * coda_last_error() says what to fix. No C++ exception crosses this interface. */
#ifndef CODA_BLOCK_LLAMA_H
#define CODA_BLOCK_LLAMA_H

#include "coda/core/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum coda_llama_layer {
  CODA_LLAMA_FIRST = 0,
  CODA_LLAMA_MIDDLE = 1,
  CODA_LLAMA_LAST = 2
} coda_llama_layer;

/* The two BACKWARD_PARTs: the middle layer's backward in two calls
 * (coda_llama_middle_backward_part). */
typedef enum coda_llama_pass {
  CODA_LLAMA_FORWARD = 0,
  CODA_LLAMA_BACKWARD = 1,
  CODA_LLAMA_BACKWARD_PART1 = 2,
  CODA_LLAMA_BACKWARD_PART2 = 3
} coda_llama_pass;

/* coda::llama::Precision: how the block's GEMMs run (llama.hpp). */
typedef enum coda_llama_precision {
  CODA_LLAMA_NATIVE = 0,
  CODA_LLAMA_FP8 = 1
} coda_llama_precision;

/* coda::llama::Fp8WeightCopies: where an FP8 call's weight copies come from, which sets its
 * workspace's size (coda_llama_fp8_workspace_size). */
typedef enum coda_llama_fp8_weight_copies {
  CODA_LLAMA_FP8_WEIGHTS_IN_WORKSPACE = 0,
  CODA_LLAMA_FP8_WEIGHTS_GIVEN = 1
} coda_llama_fp8_weight_copies;

typedef struct coda_llama_config {
  int64_t hidden;       /* D */
  int64_t intermediate; /* F (middle and last layers) */
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t head_dim; /* even */
  int64_t vocab;    /* last layer only */
  float eps;
  int32_t ignore_index;   /* e.g. -100 */
  int32_t loss_reduction; /* coda_loss_reduction (coda/coda.h) */
  int32_t precision;      /* coda_llama_precision */
} coda_llama_config;

typedef struct coda_llama_rope {
  coda_tensor positions; /* [M] i32 */
  coda_tensor inv_freq;  /* [head_dim / 2] f32 */
} coda_llama_rope;

/* The FP8 copies of a weight [N, K] (coda::llama::Fp8Weight, llama.hpp: shapes and use): codes
 * [N, K] e4m3, scales [ceil(N/128), ceil(K/128)] e8m0, codes_t [K, N] e4m3 and scales_t
 * [ceil(K/128), ceil(N/128)] e8m0, written by coda_llama_<layer>_quantize_weights and read by an
 * FP8 call given them in its inputs' fp8_weights (all of a layer's or none: all NULL). */
typedef struct coda_llama_fp8_weight {
  coda_tensor codes, scales, codes_t, scales_t;
} coda_llama_fp8_weight;

/* ---- first layer */
typedef struct coda_llama_first_weights {
  coda_tensor attn_norm, w_qkv;
} coda_llama_first_weights;
typedef struct coda_llama_first_fp8_weights {
  coda_llama_fp8_weight w_qkv;
} coda_llama_first_fp8_weights;
typedef struct coda_llama_first_inputs {
  coda_tensor x;
  coda_llama_rope rope;
  coda_llama_first_fp8_weights fp8_weights; /* optional (all NULL: the call quantizes its own) */
} coda_llama_first_inputs;
typedef struct coda_llama_first_outputs {
  coda_tensor qkv;
} coda_llama_first_outputs;
typedef struct coda_llama_first_saved {
  coda_tensor rstd;
} coda_llama_first_saved;
typedef struct coda_llama_first_grads {
  coda_tensor dx;   /* in/out: accumulated into */
  coda_tensor dqkv; /* in */
  coda_llama_first_weights dweights;
} coda_llama_first_grads;

/* ---- middle layer */
typedef struct coda_llama_middle_weights {
  coda_tensor w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv;
} coda_llama_middle_weights;
typedef struct coda_llama_middle_fp8_weights {
  coda_llama_fp8_weight w_out, w_gate_up, w_down, w_qkv;
} coda_llama_middle_fp8_weights;
typedef struct coda_llama_middle_inputs {
  coda_tensor x0, y0;
  coda_llama_rope rope;
  coda_llama_middle_fp8_weights fp8_weights; /* optional */
} coda_llama_middle_inputs;
typedef struct coda_llama_middle_outputs {
  coda_tensor x2, qkv;
} coda_llama_middle_outputs;
/* The backward overwrites z1 with d loss / d z1 (coda/block/llama.hpp, MiddleSaved), and the
   first of its two parts r2 with a statistic for the second: run the forward again before
   another backward. */
typedef struct coda_llama_middle_saved {
  coda_tensor x1, z1, r1, r2;
} coda_llama_middle_saved;
typedef struct coda_llama_middle_grads {
  coda_tensor dx;   /* in: d loss / d x2; out: d loss / d x0 */
  coda_tensor dqkv; /* in */
  coda_tensor dy0;  /* out */
  coda_llama_middle_weights dweights;
} coda_llama_middle_grads;

/* ---- last layer */
typedef struct coda_llama_last_weights {
  coda_tensor w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head;
} coda_llama_last_weights;
typedef struct coda_llama_last_fp8_weights {
  coda_llama_fp8_weight w_out, w_gate_up, w_down; /* the LM head stays 16-bit */
} coda_llama_last_fp8_weights;
typedef struct coda_llama_last_inputs {
  coda_tensor x0, y0, targets;
  coda_llama_last_fp8_weights fp8_weights; /* optional */
} coda_llama_last_inputs;
typedef struct coda_llama_last_outputs {
  coda_tensor loss;   /* [1] f32 */
  coda_tensor logits; /* optional [M, V] */
} coda_llama_last_outputs;
/* The backward overwrites z1, as the middle layer's. */
typedef struct coda_llama_last_saved {
  coda_tensor x1, z1, r1, x2, r2, dlogits, grad_scale, zeta;
} coda_llama_last_saved;
typedef struct coda_llama_last_grads {
  coda_scalar dloss;
  coda_tensor dx, dy0; /* out */
  coda_llama_last_weights dweights;
} coda_llama_last_grads;

/* Bytes of workspace one call needs (layer: coda_llama_layer, pass: coda_llama_pass); for a
 * backward it includes the GEMMs' stream-K scratch on the current CUDA device. */
CODA_API coda_status coda_llama_workspace_size(int32_t layer, int32_t pass,
                                               const coda_llama_config* config, int64_t tokens,
                                               size_t* bytes);
/* The same, for a call whose weights' FP8 copies come from `fp8_weight_copies`
 * (coda_llama_fp8_weight_copies): CODA_LLAMA_FP8_WEIGHTS_GIVEN, the smaller workspace of a call
 * whose inputs carry them (fp8_weights; config->precision CODA_LLAMA_FP8 only),
 * CODA_LLAMA_FP8_WEIGHTS_IN_WORKSPACE coda_llama_workspace_size's. */
CODA_API coda_status coda_llama_fp8_workspace_size(int32_t layer, int32_t pass,
                                                   const coda_llama_config* config, int64_t tokens,
                                                   int32_t fp8_weight_copies, size_t* bytes);

/* accumulate != 0: weight and gamma gradients are added into dweights instead of written. */
CODA_API coda_status coda_llama_first_forward(const coda_llama_config* config,
                                              const coda_llama_first_weights* weights,
                                              const coda_llama_first_inputs* inputs,
                                              const coda_llama_first_outputs* outputs,
                                              const coda_llama_first_saved* saved,
                                              const coda_tensor* workspace, coda_stream_t stream);
CODA_API coda_status coda_llama_first_backward(
    const coda_llama_config* config, const coda_llama_first_weights* weights,
    const coda_llama_first_inputs* inputs, const coda_llama_first_outputs* outputs,
    const coda_llama_first_saved* saved, const coda_llama_first_grads* grads, int32_t accumulate,
    const coda_tensor* workspace, coda_stream_t stream);

CODA_API coda_status coda_llama_middle_forward(const coda_llama_config* config,
                                               const coda_llama_middle_weights* weights,
                                               const coda_llama_middle_inputs* inputs,
                                               const coda_llama_middle_outputs* outputs,
                                               const coda_llama_middle_saved* saved,
                                               const coda_tensor* workspace, coda_stream_t stream);
CODA_API coda_status coda_llama_middle_backward(
    const coda_llama_config* config, const coda_llama_middle_weights* weights,
    const coda_llama_middle_inputs* inputs, const coda_llama_middle_outputs* outputs,
    const coda_llama_middle_saved* saved, const coda_llama_middle_grads* grads, int32_t accumulate,
    const coda_tensor* workspace, coda_stream_t stream);
/* The middle backward in two calls, each allocating its own gradients (coda::llama::
 * middle_backward_part in coda/block/llama.hpp): part CODA_LLAMA_BACKWARD_PART1, then
 * CODA_LLAMA_BACKWARD_PART2, each with a workspace of coda_llama_workspace_size(middle, part).
 * Part 2 does not read outputs->qkv, which may be absent (data NULL). */
CODA_API coda_status coda_llama_middle_backward_part(
    int32_t part, const coda_llama_config* config, const coda_llama_middle_weights* weights,
    const coda_llama_middle_inputs* inputs, const coda_llama_middle_outputs* outputs,
    const coda_llama_middle_saved* saved, const coda_llama_middle_grads* grads, int32_t accumulate,
    const coda_tensor* workspace, coda_stream_t stream);

CODA_API coda_status coda_llama_last_forward(const coda_llama_config* config,
                                             const coda_llama_last_weights* weights,
                                             const coda_llama_last_inputs* inputs,
                                             const coda_llama_last_outputs* outputs,
                                             const coda_llama_last_saved* saved,
                                             const coda_tensor* workspace, coda_stream_t stream);
CODA_API coda_status coda_llama_last_backward(const coda_llama_config* config,
                                              const coda_llama_last_weights* weights,
                                              const coda_llama_last_inputs* inputs,
                                              const coda_llama_last_saved* saved,
                                              const coda_llama_last_grads* grads,
                                              int32_t accumulate, const coda_tensor* workspace,
                                              coda_stream_t stream);

/* The weights' FP8 copies, made once per step (config->precision CODA_LLAMA_FP8; coda::llama::
 * fp8_weights_size and quantize_weights in llama.hpp): the bytes of a layer's copies, and both
 * copies of each of its weights written in one pass. Each quantize call reads only the weights
 * its fp8_weights hold (the norms and the LM head may be NULL). */
CODA_API coda_status coda_llama_fp8_weights_size(int32_t layer, const coda_llama_config* config,
                                                 size_t* bytes);
CODA_API coda_status coda_llama_first_quantize_weights(
    const coda_llama_config* config, const coda_llama_first_weights* weights,
    const coda_llama_first_fp8_weights* fp8_weights, coda_stream_t stream);
CODA_API coda_status coda_llama_middle_quantize_weights(
    const coda_llama_config* config, const coda_llama_middle_weights* weights,
    const coda_llama_middle_fp8_weights* fp8_weights, coda_stream_t stream);
CODA_API coda_status coda_llama_last_quantize_weights(
    const coda_llama_config* config, const coda_llama_last_weights* weights,
    const coda_llama_last_fp8_weights* fp8_weights, coda_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CODA_BLOCK_LLAMA_H */
