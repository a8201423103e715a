// Argument rules shared by several entry points (checks_*.cpp).
#pragma once

#include "api/validate.hpp"
#include "coda/kernels/args.hpp"

namespace coda::api {

static_assert(kReduceBlock == 128 && kStagedReduceBlock == 64,
              "the partial shapes in messages say ceil(x/128) and ceil(x/64)");

// The documented name of the fused QKV width.
inline constexpr const char* kQkvWidth = "(n_q_heads + 2*n_kv_heads)*head_dim";

// Partials written by a producer: exactly one column per kReduceBlock block of `n`.
inline Dim reduce_blocks(const char* name, int64_t n) {
  return exactly(name, num_reduce_blocks(n));
}
// The same per kStagedReduceBlock (K5's lse and K7's zeta partials).
inline Dim staged_reduce_blocks(const char* name, int64_t n) {
  return exactly(name, num_staged_reduce_blocks(n));
}

struct Mnk {
  int64_t m, n, k;
};

// A 16-bit [M, W] input `name`: M >= 1 rows of W, named `width`, a GEMM dimension (16-byte rows,
// so that it, or a tensor of its width, is a GEMM operand). Names must be string literals.
struct GemmRows {
  int64_t m, width;
};
GemmRows gemm_rows_input(Validator& v, const char* name, const TensorView& t, const char* width);

// The operands of a forward GEMM, a [M, K] and w [N, K] (n_dim names N). Checks M >= 1 and K;
// N is left to the caller, whose rules for it differ.
Mnk forward_operands(Validator& v, const TensorView& a, const TensorView& w, Dim n_dim);
// The same for a kernel that also takes E4M3 operands (docs/fp8.md): when a is e4m3, a and w are
// gemm_fp8's operands with its block scales (a_scales [M, ceil(K/128)], w_scales [ceil(N/128),
// ceil(K/128)], K a multiple of 16); otherwise the 16-bit rules above, and no scales.
Mnk forward_operands(Validator& v, const TensorView& a, const TensorView& w, Dim n_dim,
                     const TensorView& a_scales, const TensorView& w_scales);

// The operands of a backward (dgrad) GEMM, `grad` [M, K] named `grad_name` and w [K, N] with N
// named `n_name`: M >= 1, and K and N GEMM dimensions. Both names must be string literals.
Mnk backward_operands(Validator& v, const char* grad_name, const TensorView& grad,
                      const TensorView& w, const char* n_name);
// The same for a kernel that also takes E4M3 operands (docs/fp8.md), which are gemm_fp8's in its
// forward form whatever the layout: grad [M, K] as e4m3 codes with `grad_scales_name`
// [M, ceil(K/128)], and w the weight's transposed codes [N, K] (quantize_weight_fp8's codes_t)
// with w_scales [ceil(N/128), ceil(K/128)]; otherwise the 16-bit rules above, and no scales.
Mnk backward_operands(Validator& v, const char* grad_name, const char* grad_scales_name,
                      const TensorView& grad, const TensorView& w, const char* n_name,
                      const TensorView& grad_scales, const TensorView& w_scales);

// The RMSNorm statistics a consumer kernel reads: sumsq_partials [M, P >= 1] f32, eps >= 0.
void normalization_inputs(Validator& v, const TensorView& sumsq_partials, float eps, int64_t m);

// The scalar fields of a RopeSpec; returns the fused QKV width they imply.
int64_t rope_width(const Validator& v, const RopeSpec& rope);
// Its tables: positions [M] i32, inv_freq [head_dim/2] f32.
void rope_tables(Validator& v, const RopeSpec& rope, int64_t m);

// A Scalar: a finite value and an optional [1] f32 tensor.
void scalar_input(Validator& v, const char* value_name, const char* tensor_name, const Scalar& s);

} // namespace coda::api
