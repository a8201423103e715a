// The GEMM problem as the host sees it: layouts, operands and the plain epilogue.
// Host-only (plain C++), shared by the public API, the CPU backend and the GPU dispatch.
#pragma once

#include <cstddef>

#include "coda/core/bool32.hpp"
#include "coda/core/scalar.hpp"
#include "coda/core/tensor.hpp"

namespace coda {

// Storage shapes, all row-major; D is [M, N]:
//   fwd   : D = A · Bᵀ   A [M, K], B [N, K]  (nn.Linear forward; B is the weight as stored)
//   dgrad : D = A · B    A [M, K], B [K, N]  (input gradient: dY · W)
//   wgrad : D = Aᵀ · B   A [K, M], B [K, N]  (weight gradient: dYᵀ · X, tokens = K)
enum class GemmLayout : int32_t { fwd = 0, dgrad = 1, wgrad = 2 };

// D = alpha · op(A)·op(B) + beta · C. C (optional) has D's shape; C may alias D (beta = 1 then
// accumulates, e.g. gradient accumulation). A and B are bf16 or f16 (the same); D and C are
// bf16, f16 or f32.
//
// alpha is a Scalar (coda/core/scalar.hpp): a number (`args.alpha = 2.f`), or value * tensor[0]
// with a [1] f32 tensor on the call's device, read by the GEMM itself (e.g. a loss gradient's
// 1 / #valid tokens), so no host synchronization is needed. beta is a host number.
//
// workspace (optional): scratch for the GPU GEMM's stream-K partial sums, a 1-D contiguous
// tensor of any dtype (its bytes: numel * dtype size) on the call's device.
//  * absent (data == nullptr): the GEMM runs without stream-K; correct, but sometimes slower on
//    shapes whose tiles fill few waves of the GPU (e.g. 3072 x 2048 x 8192 weight gradients);
//  * present: it must hold at least gemm_workspace_size(args) bytes (coda/coda.hpp), else the
//    call fails with invalid_argument naming the size it needs. Its contents are undefined
//    between calls: each launch that uses stream-K first clears its few KB of flags with one
//    cudaMemsetAsync on the call's stream, so launches that may overlap (other streams, a graph
//    replayed beside eager work) need workspaces of their own.
// The CPU backend ignores it.
struct GemmArgs {
  GemmLayout layout = GemmLayout::fwd;
  TensorView a, b, d;
  TensorView c;      // c.data == nullptr: no C
  Scalar alpha = {}; // "= {}": see workspace below
  float beta = 0.f;
  // NOTE: "= {}" keeps aggregate initializations that stop before it free of
  // -Wmissing-field-initializers. Absent (data == nullptr): no stream-K.
  TensorView workspace = {};

  int64_t m() const { return d.shape[0]; }
  int64_t n() const { return d.shape[1]; }
  int64_t k() const { return layout == GemmLayout::wgrad ? a.shape[0] : a.shape[1]; }
  bool has_c() const { return c.data != nullptr; }
  bool has_workspace() const { return workspace.data != nullptr; }
  size_t workspace_bytes() const {
    return has_workspace() ? size_t(workspace.numel()) * size_t(dtype_size(workspace.dtype)) : 0;
  }
};

} // namespace coda

namespace coda {

// How b_scales scale B in the FP8 GEMM (docs/fp8.md, "Scales"):
//   blocks: [ceil(N/128), ceil(K/128)], one per 128 x 128 block: a weight (quantize_weight_fp8),
//           the b of the forward and input-gradient GEMMs;
//   rows:   [N, ceil(K/128)], one per row and 128-wide block of K, as a_scales: the b of the
//           weight gradient dW = dYᵀ X, whose operands are both activations (the transposed
//           copies of dY and X, quantized along the tokens, which that GEMM reduces over).
enum class Fp8BScaling : int32_t { blocks = 0, rows = 1 };

// The block-scaled FP8 GEMM (docs/fp8.md), in the forward layout: D (+)= A · Bᵀ with
//   a        [M, K] e4m3                              activations, row-major
//   a_scales [M, ceil(K/128)] e8m0                    one per row and 128-wide block of K
//   b        [N, K] e4m3                              the weight as nn.Linear stores it (or, for
//                                                     the weight gradient, an activation)
//   b_scales [ceil(N/128), ceil(K/128)] e8m0          b_scaling = blocks: one per 128 x 128 block
//            [N, ceil(K/128)] e8m0                    b_scaling = rows: one per row and K block
//   d        [M, N] bf16 or f32
// so A(m, k) = a(m, k) · 2^(a_scales(m, k/128) - 127) and B(n, k) = b(n, k) · 2^(b_scales(n/128,
// k/128) - 127), or 2^(b_scales(n, k/128) - 127) by rows (coda/core/fp8.hpp quantizes so). The
// product is accumulated in fp32 one 128-deep block of K at a time: the block's products of codes
// are summed, times the block's scales, and added to the running sum (fp8_block_scale,
// fp8_promote). With `accumulate`, d's old value is then added in fp32 (d = d + sum, the weight
// gradient's accumulation over micro-batches); d is rounded once, at the end. M >= 1 is
// arbitrary; N is a multiple of 8 and K of 16 (16-byte rows for TMA); K need not be a multiple
// of 128 (the last block is short: the GPU's loads zero-fill it). A scale byte 0xFF (NaN) makes
// the rows or columns it scales NaN.
struct Fp8GemmArgs {
  TensorView a, a_scales;
  TensorView b, b_scales;
  TensorView d;
  // The C twin holds both as int32_t. (Their default initializers keep aggregate initializations
  // that stop at d free of -Wmissing-field-initializers.)
  Fp8BScaling b_scaling = Fp8BScaling::blocks;
  Bool32 accumulate = false; // d = d + A · Bᵀ (d read, the sum rounded once)

  int64_t m() const { return d.shape[0]; }
  int64_t n() const { return d.shape[1]; }
  int64_t k() const { return a.shape[1]; }
};

// A weight quantized for the FP8 GEMMs (docs/fp8.md), once per step from its master copy:
//   w        [N, K] bf16, f16 or f32                  the weight as nn.Linear stores it
//   codes    [N, K] e4m3, optional                    gemm_fp8's b for the forward (Y = X Wᵀ)
//   scales   [ceil(N/128), ceil(K/128)] e8m0          with codes: one per 128 x 128 block
//   codes_t  [K, N] e4m3, optional                    Wᵀ: gemm_fp8's b for the input gradient
//                                                     (dX = dY W reduces over N)
//   scales_t [ceil(K/128), ceil(N/128)] e8m0          with codes_t: the same scales, transposed
// At least one of the two copies; a backward, which reads only Wᵀ, leaves codes out.
// Per block (the last ones of each dimension may be short): amax of |w|, k =
// e4m3_scale_exponent(amax), each code quantize_e4m3(w, k), the scale 2^k as an E8M0 byte; a
// block holding a NaN or an infinity gets the NaN scale and NaN codes. A 128 x 128 block has one
// scale whichever way it is read, so the transposed copy is the same codes, transposed. N and K
// are multiples of 16 (each copy is a gemm_fp8 operand reduced over its rows' 1-byte elements).
struct QuantizeWeightFp8Args {
  TensorView w;
  TensorView codes, scales;
  TensorView codes_t, scales_t;

  int64_t n() const { return w.shape[0]; }
  int64_t k() const { return w.shape[1]; }
};

// An activation or a gradient quantized for the FP8 GEMMs (docs/fp8.md), blocks along its rows:
//   x        [M, K] bf16, f16 or f32                  the tensor as a layer produces it
//   codes    [M, K] e4m3                              gemm_fp8's a (or, scaled by rows, its b)
//   scales   [M, ceil(K/128)] e8m0                    one per row and 128-column block
//   codes_t  [K, M] e4m3, optional                    xᵀ: an operand of the weight gradient
//                                                     (dW = dYᵀ X reduces over M, the tokens)
//   scales_t [K, ceil(M/128)] e8m0                    with codes_t: one per column of x and
//                                                     128-row block
// Per block of 1 x 128 (the last of a row may be short): amax of |x|, k =
// e4m3_scale_exponent(amax), each code quantize_e4m3(x, k), the scale 2^k as an E8M0 byte; a
// block holding a NaN or an infinity gets the NaN scale and NaN codes. The transposed copy's
// blocks are 128 consecutive rows of one column of x (128 consecutive codes of a row of codes_t),
// each with its own scale: other blocks than the rows', so codes_t is not the transposed codes.
// K is a multiple of 16 (codes is a gemm_fp8 operand reduced over its rows of 1-byte codes); with
// codes_t, so is M (codes_t's rows, M codes each, are read the same way).
struct QuantizeActivationFp8Args {
  TensorView x;
  TensorView codes, scales;
  TensorView codes_t, scales_t;

  int64_t m() const { return x.shape[0]; }
  int64_t k() const { return x.shape[1]; }
};

} // namespace coda
