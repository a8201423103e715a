// References of the named CODA kernels. include/coda/kernels/args.hpp is the contract (shapes,
// math, partial layouts); coda-paper.md section 4 the derivations. Plain C++: no CUDA.
//
// Every kernel function takes a Rounding policy (reference/ops.hpp) and its inputs as values,
// and computes every output of the kernel:
//  * Rounding::none: the fp64 ground truth of the fused kernel. The inputs are used as given (in
//    a test, the bf16 / f16 / f32 values the kernel reads) and nothing is rounded.
//  * bf16 / f16: the ordinary unfused low-precision path to the same outputs, as PyTorch eager
//    computes it with one kernel per op: the GEMM accumulates in fp32 and rounds its output, and
//    each following op (add, row scale, silu*mul, RoPE, ...) computes from the rounded tensors
//    and rounds its own output. Sums that such kernels accumulate in fp32 (partials,
//    statistics, zeta) are accumulated here in fp32 too, term by term.
//  * f32: the same path with fp32 tensors (e.g. a GEMM whose output is f32).
// The tolerance rule (tests/common/check.hpp) holds a kernel's output to the none result,
// allowing twice the error of the bf16 / f16 result.
//
// Conventions: row-major; M rows (tokens). Row partials are [M, ceil(N / block)], entry (m, b)
// reducing columns [b * block, (b + 1) * block) of row m; column partials are
// [N, ceil(M / block)], entry (n, b) reducing rows [b * block, ...) of column n. Partials are f32
// statistics: in the unfused path they are fp32 block sums of the rounded tensors.
// Inputs of the wrong size are a std::invalid_argument.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "reference/gemm.hpp"
#include "reference/ops.hpp"

namespace coda::ref {

// The partial-reduction block of the public API (= coda::kReduceBlock), and that of K5's lse and
// K7's zeta partials (= coda::kStagedReduceBlock).
constexpr int64_t kPartialBlock = 128;
constexpr int64_t kStagedPartialBlock = 64;
constexpr int64_t partial_blocks(int64_t n, int64_t block = kPartialBlock) {
  return n / block + (n % block > 0 ? 1 : 0); // ceil(n / block), no overflow near 2^63
}

// ---- plain GEMM: D = alpha * op(A) op(B) + beta * C, D [M, N] in the layouts of gemm.hpp.
// Unfused: fp32 accumulation, then alpha * acc + beta * C in one rounding (a cuBLAS epilogue).
struct GemmInputs {
  Layout layout = Layout::fwd;
  int64_t M = 0, N = 0, K = 0;
  std::vector<double> a, b; // storage shapes of gemm.hpp
  std::vector<double> c;    // [M, N], or empty for none
  double alpha = 1, beta = 0;
};
std::vector<double> gemm(Rounding r, const GemmInputs& in);

// ---- K0 gemm_residual_rms: x = a · wᵀ + residual; out = x, out_scaled = x * gamma[n],
// sumsq_partials = row partials of x² (from the unrounded x in the fused kernel; from the rounded
// x in the unfused path, as eager RMSNorm reads it).
struct ResidualRmsInputs {
  int64_t M = 0, N = 0, K = 0;
  std::vector<double> a;        // [M, K]
  std::vector<double> w;        // [N, K]
  std::vector<double> residual; // [M, N]
  std::vector<double> gamma;    // [N]
  int64_t block = kPartialBlock;
  // Empty, or a · wᵀ [M, N] as a hardware GEMM computed it (NormedGemmInputs::product): the
  // rounded paths round it once in place of their fp32 sum, Rounding::none takes it as exact.
  std::vector<double> product = {};
};
struct ResidualRmsOutputs {
  std::vector<double> out, out_scaled; // [M, N]
  std::vector<double> sumsq_partials;  // [M, partial_blocks(N)]
};
ResidualRmsOutputs residual_rms(Rounding r, const ResidualRmsInputs& in);

// ---- The normalized GEMM shared by K1, K2, K4 and K5:
//   rstd[m] = 1 / sqrt(sum_p sumsq_partials[m, p] / K + eps),  z = rstd[m] * (a · wᵀ)
// (unfused: the GEMM output is rounded, then the row scale rounds again).
struct NormedGemmInputs {
  int64_t M = 0, N = 0, K = 0;
  std::vector<double> a;              // [M, K] the gamma-scaled, un-normalized input h
  std::vector<double> w;              // [N, K]
  std::vector<double> sumsq_partials; // [M, P], any P >= 1: row partials of x² over K columns
  double eps = 1e-6;
  // Empty, or the product a · wᵀ [M, N] as a hardware GEMM computed it, used in place of the
  // sum over K: Hopper's FP8 tensor cores sum a scale block's products with fewer bits than fp32
  // (docs/fp8.md), so the unfused path on FP8 operands is gemm_fp8's output, not an fp32 sum.
  // Rounding::none takes it as exact (the exact epilogue of that product; without it, the exact
  // sum over K).
  std::vector<double> product = {};
  int64_t partial_width() const { return M > 0 ? int64_t(sumsq_partials.size()) / M : 0; }
};

// K1 gemm_rms_scale: out = z.
struct RmsScaleOutputs {
  std::vector<double> out;  // [M, N]
  std::vector<double> rstd; // [M]
};
RmsScaleOutputs rms_scale(Rounding r, const NormedGemmInputs& in);

// K2 and its variants with another gated activation: w is the fused interleaved gate/up weight
// [2F, K] (N = 2F); preact = z, act[m, j] = activation(z[m, 2j]) * z[m, 2j + 1] (unfused: from
// the stored z, rounded once, as one activation-times-up kernel stores it).
struct RmsGatedOutputs {
  std::vector<double> preact; // [M, 2F]
  std::vector<double> act;    // [M, F]
  std::vector<double> rstd;   // [M]
};
RmsGatedOutputs rms_gated(Rounding r, const NormedGemmInputs& in, double (*activation)(double));

// The gates' activations in fp64.
inline double silu(double g) { return g * (1 / (1 + std::exp(-g))); }
inline double gelu(double g) { return g / 2 * (1 + std::erf(g / std::numbers::sqrt2)); }

// K2 gemm_rms_swiglu: activation silu(g) = g * sigmoid(g).
inline RmsGatedOutputs rms_swiglu(Rounding r, const NormedGemmInputs& in) {
  return rms_gated(r, in, silu);
}

// K2g gemm_rms_geglu: activation gelu(g) = g / 2 * (1 + erf(g / sqrt 2)).
inline RmsGatedOutputs rms_geglu(Rounding r, const NormedGemmInputs& in) {
  return rms_gated(r, in, gelu);
}

// Per-token rotary embedding of a fused [Q | K | V] projection (ops.hpp: rope_forward).
struct RopeTable {
  RopeShape shape;
  std::vector<int32_t> positions; // [M]
  std::vector<double> inv_freq;   // [head_dim / 2]
};

// K4 gemm_rms_rope: out = RoPE(z), N = shape.width().
struct RmsRopeOutputs {
  std::vector<double> out;  // [M, N]
  std::vector<double> rstd; // [M]
};
RmsRopeOutputs rms_rope(Rounding r, const NormedGemmInputs& in, const RopeTable& rope);

// K5 gemm_rms_lse: logits = z [M, V]; lse_partials = row partials of logsumexp (fp32 over the
// rounded logits in the unfused path); target_logit[m] = logits[m, targets[m]] (the rounded
// logit in the unfused path) where 0 <= targets[m] < V, else 0.
struct RmsLseOutputs {
  std::vector<double> logits;       // [M, V]
  std::vector<double> lse_partials; // [M, partial_blocks(V, kStagedPartialBlock)]
  std::vector<double> target_logit; // [M]
  std::vector<double> rstd;         // [M]
};
RmsLseOutputs rms_lse(Rounding r, const NormedGemmInputs& in, const std::vector<int32_t>& targets,
                      int64_t block = kStagedPartialBlock);

// Row partials of logsumexp: entry (m, b) = log sum_{n in block b} exp(x[m, n]) over x [M, N]
// (fp64, or fp32 max and sum of exponentials).
std::vector<double> lse_row_partials(Rounding r, int64_t M, int64_t N, const std::vector<double>& x,
                                     int64_t block = kStagedPartialBlock);

// ---- K6 gemm_rms_backward (N = the RMSNorm width, K = the consumer's output width):
//   g = alpha * (dz · w),  xh = x * rstd[m]
//   dx = (accumulate ? dx_in : 0) + rstd[m] * (g * gamma[n] - xh * zeta[m])
//   h_hat = xh * gamma[n],  dgamma_partials = column partials of g * xh.
// Unfused: g = round(alpha * (dz · w)) from the fp32 accumulator (one rounding: a dgrad GEMM
// with alpha in its epilogue, and K6's Stage), the backward op rounds its result, and the
// accumulation into dx rounds once more.
struct RmsBackwardInputs {
  int64_t M = 0, N = 0, K = 0;
  std::vector<double> dz;    // [M, K]
  std::vector<double> w;     // [K, N] the consumer's weight as nn.Linear stores it
  std::vector<double> x;     // [M, N] the RMSNorm input
  std::vector<double> rstd;  // [M]
  std::vector<double> zeta;  // [M]
  std::vector<double> gamma; // [N]
  double alpha = 1;
  bool accumulate = false;
  std::vector<double> dx_in; // [M, N] when accumulate
  int64_t block = kPartialBlock;
  // Empty, or dz · w [M, N] as a hardware GEMM computed it (NormedGemmInputs::product), used in
  // place of the sum over K (by Rounding::none as exact).
  std::vector<double> product = {};
};
struct RmsBackwardOutputs {
  std::vector<double> dx, h_hat;       // [M, N]
  std::vector<double> dgamma_partials; // [N, partial_blocks(M)]
};
RmsBackwardOutputs rms_backward(Rounding r, const RmsBackwardInputs& in);

// ---- K7 gemm_swiglu_backward: dy = dx · w [M, F]; with g = preact[m, 2j], u = preact[m, 2j+1]:
//   act = silu(g) * u, dpreact[2j] = dy * u * sig * (1 + g (1 - sig)), dpreact[2j+1] = dy * silu(g)
//   zeta_partials = row partials over j of g * dpreact[2j] + u * dpreact[2j+1].
struct SwigluBackwardInputs {
  int64_t M = 0, F = 0, K = 0;
  std::vector<double> dx;     // [M, K] the residual-stream gradient
  std::vector<double> w;      // [K, F] the down-projection weight
  std::vector<double> preact; // [M, 2F] interleaved (g0, u0, g1, u1, ...)
  int64_t block = kStagedPartialBlock;
  // Empty, or dx · w [M, F] as a hardware GEMM computed it (NormedGemmInputs::product): the
  // rounded paths round it once to dy in place of their fp32 sum, Rounding::none takes it as
  // exact.
  std::vector<double> product = {};
};
struct SwigluBackwardOutputs {
  std::vector<double> act;           // [M, F]
  std::vector<double> dpreact;       // [M, 2F]
  std::vector<double> zeta_partials; // [M, partial_blocks(F, kStagedPartialBlock)]
};
SwigluBackwardOutputs swiglu_backward(Rounding r, const SwigluBackwardInputs& in);

// ---- rms_stats: out_scaled = x * gamma[n]; sumsq_partials = row partials of x².
struct RmsStatsOutputs {
  std::vector<double> out_scaled;     // [M, N]
  std::vector<double> sumsq_partials; // [M, partial_blocks(N)]
};
RmsStatsOutputs rms_stats(Rounding r, int64_t M, int64_t N, const std::vector<double>& x,
                          const std::vector<double>& gamma, int64_t block = kPartialBlock);

// ---- rstd_from_partials: rstd[m] = 1 / sqrt(sum_p partials[m, p] / n + eps), partials [M, P].
std::vector<double> rstd_from_partials(Rounding r, int64_t M, const std::vector<double>& partials,
                                       int64_t n, double eps);

// ---- reduce_row_partials: out[m] = scale * sum_p partials[m, p], partials [M, P].
std::vector<double> reduce_row_partials(Rounding r, int64_t M, const std::vector<double>& partials,
                                        double scale);

// ---- reduce_col_partials: out[n] = (accumulate ? out_in[n] : 0) + sum_p partials[n, p].
// r is the output's policy: f32 output -> Rounding f32. Unfused: the sum is rounded, then the
// accumulation rounds again.
std::vector<double> reduce_col_partials(Rounding r, int64_t N, const std::vector<double>& partials,
                                        bool accumulate, const std::vector<double>& out_in);

// ---- rope_backward: dz = RoPEᵀ(dqkv) (V passes through); zeta[m] = scale * sum_n qkv * dqkv.
struct RopeBackwardOutputs {
  std::vector<double> dz;   // [M, width]
  std::vector<double> zeta; // [M]
};
RopeBackwardOutputs rope_backward(Rounding r, int64_t M, const RopeTable& rope,
                                  const std::vector<double>& dqkv, const std::vector<double>& qkv,
                                  double scale);

// ---- cross_entropy from K5's outputs.
//   lse[m] = logsumexp_p lse_partials[m, p]; loss_m = lse[m] - target_logit[m]
//   loss = sum or mean of loss_m over rows whose target is not ignore_index
//   dlogits = exp(logits - lse[m]) - onehot(target), zero rows where ignored
//   grad_scale = 1 / #valid (mean) or 1 (sum);  zeta[m] = sum_n logits * dlogits
// The unfused path has no partials: it computes lse and the loss from the rounded logits, as
// eager cross-entropy over materialized logits does. A mean over zero valid rows is 0 with
// grad_scale 0. Targets outside [0, V) that are not ignore_index: std::invalid_argument.
struct CrossEntropyInputs {
  int64_t M = 0, V = 0;
  std::vector<double> logits;       // [M, V]
  std::vector<double> lse_partials; // [M, P], any P >= 1
  std::vector<double> target_logit; // [M]
  std::vector<int32_t> targets;     // [M]
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
};
struct CrossEntropyOutputs {
  double loss = 0;
  double grad_scale = 0;
  std::vector<double> dlogits; // [M, V]
  std::vector<double> zeta;    // [M]
};
CrossEntropyOutputs cross_entropy(Rounding r, const CrossEntropyInputs& in);

} // namespace coda::ref
