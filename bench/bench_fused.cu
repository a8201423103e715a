// The fused kernels at the Llama-3.2-1B and Llama-3.1-8B shapes (8192 tokens, bf16): the forward
// K0, K1, K2, K2g (K2 with GeGLU, at K2's shape), K4, K5 and the backward K6 (at the QKV and
// gate/up input-gradient shapes) and K7 (the down projection's input gradient), each against
//   coda_gemm: coda's plain GEMM of the same shape (the mainloop the fused kernel runs on),
//   cublas:    cuBLASLt's plain GEMM of the same shape,
//   unfused:   cuBLASLt's GEMM plus the simplest correct CUDA kernels doing the rest of the math
//              (an rstd kernel, then one elementwise / block-reduction kernel).
// All run in this process on the same random inputs, interleaved run by run; each timed run
// follows a 256 MB write that flushes L2; CUDA events; the median of the timed runs is reported.
// The fused kernel runs on its default GEMM schedule (coda_ms in the JSON) and, for the table,
// on each schedule forced (cooperative 128 x 256, ping-pong 128 x 128 and staged 128 x 192 tiles;
// K6: cooperative and staged_wide 128 x 256, no ping-pong).
//
// Each kernel that takes E4M3 operands (K0, K1, K2, K2g, K4, K6, K7; docs/fp8.md) runs a
// second case ("precision": "fp8"): a and w quantized from the same bf16 inputs
// (quantize_activation_fp8, quantize_weight_fp8; the input gradients' w is the weight's
// transposed copy), the fused kernel on the FP8 mainloop's tile against
//   coda_gemm: gemm_fp8 of the same shape (bf16 D), the floor of the FP8 fused kernel,
//   cublas:    cuBLASLt's bf16 GEMM of the same shape, as in the bf16 case,
//   unfused:   gemm_fp8 plus the bf16 case's kernels for the rest,
//   bf16_fused: the bf16 fused kernel on the bf16 inputs, interleaved with the rest.
//
//   bench_fused [--commit HASH] [--out bench/results/fused.json] [--runs 50] [--filter K2]
// (flags as "--name value" or "--name=value"; --commit defaults to $CODA_COMMIT)
//
// Prints a table and writes the JSON described in docs/PERFORMANCE.md (fused section).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "coda/core/error.hpp"
#include "gpu/backend.hpp"
#include "gpu/fused/kernels.hpp"
#include "gpu/gemm/workspace.hpp"
#include "harness.cuh"

namespace {

using bench::Buffer;
using bench::check;
using bench::view;
using coda::Device;
using coda::DType;

struct Model {
  const char* name;
  int64_t hidden, mlp, q_heads, kv_heads, head_dim;
  int64_t qkv() const { return (q_heads + 2 * kv_heads) * head_dim; }
};
constexpr int64_t kTokens = 8192, kVocab = 128256;

struct Case {
  std::string kernel; // "K0" | "K1" | "K2" | "K2g" | "K4" | "K5" | "K6" | "K7"
  const Model* model;
  int64_t m, n, k;
  // fwd: acc = a · wᵀ, w [N, K]; dgrad (K6, K7): acc = a · w, w [K, N].
  coda::GemmLayout layout = coda::GemmLayout::fwd;
  bool fp8 = false; // a and w as E4M3 codes with block scales
  bool backward() const { return layout == coda::GemmLayout::dgrad; }
  std::string name() const { return kernel + (fp8 ? " fp8 " : " ") + model->name; }
};

// The kernels with an E4M3 operand form (K5, the LM head, stays bf16 in FP8 recipes).
bool takes_fp8(const std::string& kernel) { return kernel != "K5"; }

std::vector<Case> bench_cases(const std::vector<Model>& models) {
  std::vector<Case> cases;
  for (const Model& md : models) {
    cases.push_back({"K0", &md, kTokens, md.hidden, md.q_heads * md.head_dim}); // out-proj
    cases.push_back({"K0", &md, kTokens, md.hidden, md.mlp});                   // down-proj
    cases.push_back({"K1", &md, kTokens, md.qkv(), md.hidden});
    cases.push_back({"K2", &md, kTokens, 2 * md.mlp, md.hidden});
    cases.push_back({"K2g", &md, kTokens, 2 * md.mlp, md.hidden}); // K2 with GeGLU
    cases.push_back({"K4", &md, kTokens, md.qkv(), md.hidden});
    cases.push_back({"K5", &md, kTokens, kVocab, md.hidden});
    constexpr coda::GemmLayout kDgrad = coda::GemmLayout::dgrad;
    cases.push_back({"K6", &md, kTokens, md.hidden, md.qkv(), kDgrad});   // attention-input norm
    cases.push_back({"K6", &md, kTokens, md.hidden, 2 * md.mlp, kDgrad}); // MLP-input norm
    cases.push_back({"K7", &md, kTokens, md.mlp, md.hidden, kDgrad});     // down's input gradient
  }
  const size_t bf16_cases = cases.size();
  for (size_t i = 0; i < bf16_cases; ++i)
    if (takes_fp8(cases[i].kernel)) {
      Case c = cases[i];
      c.fp8 = true;
      cases.push_back(c);
    }
  return cases;
}

// ---- the unfused path's kernels: each reads the rounded output of the step before it.

__device__ float bf(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __nv_bfloat16 to_bf(float x) { return __float2bfloat16(x); }

// Sum (or max) over a 128-thread block.
template <bool kMax> __device__ float block_reduce(float x, float* scratch) {
  for (int mask = 16; mask >= 1; mask /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, mask);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < 4; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

// rstd[m] = rsqrt(sum_b partials[m, b] / width + eps).
__global__ void rstd_kernel(const float* partials, int32_t count, int32_t rows, float width,
                            float eps, float* rstd) {
  const int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (m >= rows) return;
  float sum = 0.f;
  for (int b = 0; b < count; ++b) sum += partials[m * count + b];
  rstd[m] = rsqrtf(sum / width + eps);
}

// K0: x = round(y + residual); h = round(x * gamma); partials of x² per 128 columns.
// Grid (M, ceil(N / 128)), 128 threads: one column each.
__global__ void residual_rms_kernel(const __nv_bfloat16* y, const __nv_bfloat16* residual,
                                    const __nv_bfloat16* gamma, __nv_bfloat16* out,
                                    __nv_bfloat16* out_scaled, float* partials, int32_t n) {
  __shared__ float scratch[4];
  const int64_t m = blockIdx.x;
  const int32_t col = blockIdx.y * 128 + threadIdx.x;
  float x = 0.f;
  if (col < n) {
    const int64_t i = m * n + col;
    x = bf(to_bf(bf(y[i]) + bf(residual[i])));
    out[i] = to_bf(x);
    out_scaled[i] = to_bf(x * bf(gamma[col]));
  }
  const float sum = block_reduce<false>(x * x, scratch);
  if (threadIdx.x == 0) partials[m * gridDim.y + blockIdx.y] = sum;
}

// K1: out = round(rstd[m] * y).
__global__ void row_scale_kernel(const __nv_bfloat16* y, const float* rstd, __nv_bfloat16* out,
                                 int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = to_bf(rstd[i / n] * bf(y[i]));
}

// K2 and K2g: preact = round(rstd * y); act[m, j] = round(activation(g) * u) from the rounded
// pair, with silu (K2) or gelu's erf form (K2g).
struct Silu {
  __device__ float operator()(float g) const { return g / (1.f + expf(-g)); }
};
struct Gelu {
  __device__ float operator()(float g) const { return 0.5f * g * (1.f + erff(g * 0.70710678f)); }
};
template <class Activation>
__global__ void gated_kernel(const __nv_bfloat162* y, const float* rstd, __nv_bfloat162* preact,
                             __nv_bfloat16* act, int64_t f, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float r = rstd[i / f];
    const float2 z = __bfloat1622float2(y[i]);
    const __nv_bfloat162 zr = __floats2bfloat162_rn(r * z.x, r * z.y);
    preact[i] = zr;
    const float g = __low2float(zr), u = __high2float(zr);
    const float activated = Activation{}(g);
    act[i] = to_bf(activated * u);
  }
}

// K4: z = round(rstd * y), then rotate-half RoPE on the Q and K heads, rounded.
// Grid (M, heads), head_dim / 2 threads: one pair each.
__global__ void rope_kernel(const __nv_bfloat16* y, const float* rstd, const int32_t* positions,
                            const float* inv_freq, __nv_bfloat16* out, int32_t n, int32_t head_dim,
                            int32_t rotated_heads) {
  const int64_t m = blockIdx.x;
  const int32_t half = head_dim / 2, i = threadIdx.x;
  const int64_t base = m * n + int64_t(blockIdx.y) * head_dim;
  const float r = rstd[m];
  const float a = bf(to_bf(r * bf(y[base + i]))), b = bf(to_bf(r * bf(y[base + i + half])));
  if (int32_t(blockIdx.y) >= rotated_heads) {
    out[base + i] = to_bf(a), out[base + i + half] = to_bf(b);
    return;
  }
  float s, c;
  sincosf(float(positions[m]) * inv_freq[i], &s, &c);
  out[base + i] = to_bf(a * c - b * s);
  out[base + i + half] = to_bf(b * c + a * s);
}

// K5: logits = round(rstd * y); lse partials per 128 columns and the target logit from them.
// Grid (M, ceil(V / 128)), 128 threads.
__global__ void lse_kernel(const __nv_bfloat16* y, const float* rstd, const int32_t* targets,
                           __nv_bfloat16* logits, float* partials, float* target_logit, int32_t v) {
  __shared__ float scratch[4];
  const int64_t m = blockIdx.x;
  const int32_t col = blockIdx.y * 128 + threadIdx.x;
  float l = -INFINITY;
  if (col < v) {
    l = bf(to_bf(rstd[m] * bf(y[m * v + col])));
    logits[m * v + col] = to_bf(l);
    if (targets[m] == col) target_logit[m] = l;
  }
  const float mx = block_reduce<true>(l, scratch);
  const float sum = block_reduce<false>(col < v ? expf(l - mx) : 0.f, scratch);
  if (threadIdx.x == 0) partials[m * gridDim.y + blockIdx.y] = mx + logf(sum);
}

// K6: xh = x * rstd; result = rstd * (g * gamma - xh * zeta); dx = round(dx + result);
// h_hat = round(xh * gamma); dgamma partials of g * xh per 128 rows. Grid (ceil(N / 128),
// ceil(M / 128)), 128 threads: one column each, looping over the block's rows.
__global__ void rms_backward_kernel(const __nv_bfloat16* g, const __nv_bfloat16* x,
                                    const float* rstd, const float* zeta,
                                    const __nv_bfloat16* gamma, __nv_bfloat16* dx,
                                    __nv_bfloat16* h_hat, float* partials, int32_t m_rows,
                                    int32_t n) {
  const int32_t col = blockIdx.x * 128 + threadIdx.x;
  if (col >= n) return;
  const float gm = bf(gamma[col]);
  float sum = 0.f;
  const int32_t row0 = blockIdx.y * 128, row1 = min(row0 + 128, m_rows);
  for (int32_t row = row0; row < row1; ++row) {
    const int64_t i = int64_t(row) * n + col;
    const float r = rstd[row], xh = bf(x[i]) * r, gi = bf(g[i]);
    dx[i] = to_bf(bf(dx[i]) + r * (gi * gm - xh * zeta[row]));
    h_hat[i] = to_bf(xh * gm);
    sum += gi * xh;
  }
  partials[int64_t(col) * gridDim.y + blockIdx.y] = sum;
}

// K7: from dy and the saved pre-activation pair (g, u): act = round(s u), dg, du rounded, and
// the zeta partials of g dg + u du per 128 columns. Grid (M, ceil(F / 128)), 128 threads.
__global__ void swiglu_backward_kernel(const __nv_bfloat16* dy, const __nv_bfloat162* preact,
                                       __nv_bfloat16* act, __nv_bfloat162* dpreact, float* partials,
                                       int32_t f) {
  __shared__ float scratch[4];
  const int64_t m = blockIdx.x;
  const int32_t j = blockIdx.y * 128 + threadIdx.x;
  float z = 0.f;
  if (j < f) {
    const int64_t i = m * f + j;
    const float2 gu = __bfloat1622float2(preact[i]);
    const float d = bf(dy[i]), sig = 1.f / (1.f + expf(-gu.x)), sw = gu.x * sig;
    act[i] = to_bf(sw * gu.y);
    const __nv_bfloat162 dgu =
        __floats2bfloat162_rn(d * gu.y * sig * (1.f + gu.x * (1.f - sig)), d * sw);
    dpreact[i] = dgu;
    z = gu.x * __low2float(dgu) + gu.y * __high2float(dgu);
  }
  const float sum = block_reduce<false>(z, scratch);
  if (threadIdx.x == 0) partials[m * gridDim.y + blockIdx.y] = sum;
}

unsigned grid_for(int64_t total) {
  return unsigned(std::min<int64_t>((total + 255) / 256, 132 * 16));
}

// ---- one case

struct Result {
  Case c;
  double coda_ms, coda_gemm_ms, cublas_ms, unfused_ms, max_rel_diff;
  double cooperative_ms, pingpong_ms, staged_ms; // the fused kernel on each schedule (forward)
  double bf16_fused_ms;                          // FP8 cases: the bf16 kernel on the bf16 inputs
};

// A fused kernel's GEMM operands: bf16 (no scales) or E4M3 codes with their block scales.
struct Operands {
  coda::TensorView a, w, a_scales, w_scales;
};

Result bench_case(const Case& c, const bench::Context& ctx, int runs) {
  const cudaStream_t s = ctx.stream;
  const int64_t M = c.m, N = c.n, K = c.k;
  const Model& md = *c.model;
  const DType bf16 = DType::bf16, f32 = DType::f32;
  const int64_t P_in = (K + 127) / 128, P_out = (N + 127) / 128, P_rows = (M + 127) / 128;
  // K7 reads and writes the [M, 2F] pre-activation pair per GEMM column: twice the GEMM width.
  const int64_t wide = c.kernel == "K7" ? 2 * N : N;
  Buffer a(size_t(M * K * 2)), w(size_t(N * K * 2)), out(size_t(M * wide * 2)),
      side(size_t(M * N * 2)), gemm_out(size_t(M * N * 2)), y(size_t(M * N * 2)),
      unfused_out(size_t(M * wide * 2)), unfused_side(size_t(M * N * 2)),
      residual(size_t(M * wide * 2)), gamma(size_t(N * 2)), partials_in(size_t(M * P_in * 4)),
      partials_out(size_t(std::max(M * P_out, N * P_rows) * 4)), rstd(size_t(M * 4)),
      rstd_unfused(size_t(M * 4)), positions(size_t(M * 4)), inv_freq(size_t(md.head_dim * 2)),
      targets(size_t(M * 4)), target_logit(size_t(M * 4));
  bench::fill_uniform<<<1024, 256, 0, s>>>(a.as<__nv_bfloat16>(), M * K, 1, -1.f, 1.f);
  bench::fill_uniform<<<1024, 256, 0, s>>>(w.as<__nv_bfloat16>(), N * K, 2, -0.05f, 0.05f);
  bench::fill_uniform<<<1024, 256, 0, s>>>(residual.as<__nv_bfloat16>(), M * wide, 3, -1.f, 1.f);
  bench::fill_uniform<<<64, 256, 0, s>>>(gamma.as<__nv_bfloat16>(), N, 4, 0.5f, 1.5f);
  // Sums of squares of K values in [-1, 1] (mean 1/3 each).
  bench::fill_partials<<<256, 256, 0, s>>>(partials_in.as<float>(), M * P_in, 5, 128.f / 3.f);
  bench::fill_ints<<<64, 256, 0, s>>>(positions.as<int32_t>(), M, 6, 8192);
  bench::fill_ints<<<64, 256, 0, s>>>(targets.as<int32_t>(), M, 7, int32_t(N));
  bench::fill_inv_freq<<<1, 128, 0, s>>>(inv_freq.as<float>(), int32_t(md.head_dim / 2),
                                         int32_t(md.head_dim));
  check(cudaGetLastError(), "fill");

  const coda::TensorView A = view(a, bf16, M, K);
  const coda::TensorView W = c.backward() ? view(w, bf16, K, N) : view(w, bf16, N, K);
  const coda::TensorView Pin = view(partials_in, f32, M, P_in);
  const float eps = 1e-5f;
  // The fused kernel's launch on given operands (bf16, or E4M3 with scales), and the unfused
  // path's kernels after its GEMM.
  std::function<std::function<void()>(const Operands&)> make_fused;
  std::function<void()> run_rest;
  const int rstd_grid = int((M + 255) / 256);
  auto unfused_rstd = [&] {
    rstd_kernel<<<rstd_grid, 256, 0, s>>>(partials_in.as<float>(), int32_t(P_in), int32_t(M),
                                          float(K), eps, rstd_unfused.as<float>());
  };
  // Raw pointers for the launch lambdas (the buffers outlive them).
  const auto* Y = y.as<__nv_bfloat16>();
  auto* u_out = unfused_out.as<__nv_bfloat16>();
  auto* u_side = unfused_side.as<__nv_bfloat16>();
  const float* u_rstd = rstd_unfused.as<float>();
  const auto* res = residual.as<__nv_bfloat16>();
  const auto* gam = gamma.as<__nv_bfloat16>();
  float* p_out = partials_out.as<float>();
  const int32_t* pos = positions.as<int32_t>();
  const int32_t* tgt = targets.as<int32_t>();
  const float* freq = inv_freq.as<float>();
  float* tl = target_logit.as<float>();
  const int64_t head_dim = md.head_dim, rotated_heads = md.q_heads + md.kv_heads;
  if (c.kernel == "K0") {
    const coda::ResidualRmsArgs args{A,
                                     W,
                                     view(residual, bf16, M, N),
                                     view(gamma, bf16, N),
                                     view(out, bf16, M, N),
                                     view(side, bf16, M, N),
                                     view(partials_out, f32, M, P_out)};
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::ResidualRmsArgs x = args;
      x.a = o.a, x.w = o.w, x.a_scales = o.a_scales, x.w_scales = o.w_scales;
      return [=] { coda::gpu::gemm_residual_rms(x, s); };
    };
    run_rest = [=] {
      residual_rms_kernel<<<dim3(unsigned(M), unsigned(P_out)), 128, 0, s>>>(
          Y, res, gam, u_out, u_side, p_out, int32_t(N));
    };
  } else if (c.kernel == "K1") {
    const coda::RmsScaleArgs args{A, W, Pin, eps, view(out, bf16, M, N), view(rstd, f32, M)};
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::RmsScaleArgs x = args;
      x.a = o.a, x.w = o.w, x.a_scales = o.a_scales, x.w_scales = o.w_scales;
      return [=] { coda::gpu::gemm_rms_scale(x, s); };
    };
    run_rest = [=] {
      unfused_rstd();
      row_scale_kernel<<<grid_for(M * N), 256, 0, s>>>(Y, u_rstd, u_out, N, M * N);
    };
  } else if (c.kernel == "K2" || c.kernel == "K2g") {
    const bool geglu = c.kernel == "K2g";
    const coda::TensorView preact = view(out, bf16, M, N), act = view(side, bf16, M, N / 2);
    const coda::RmsSwigluArgs k2{A, W, Pin, eps, preact, act, view(rstd, f32, M)};
    const coda::RmsGegluArgs k2g{A, W, Pin, eps, preact, act, view(rstd, f32, M)};
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::RmsSwigluArgs x = k2;
      coda::RmsGegluArgs xg = k2g;
      x.a = xg.a = o.a, x.w = xg.w = o.w;
      x.a_scales = xg.a_scales = o.a_scales, x.w_scales = xg.w_scales = o.w_scales;
      return [=] {
        if (geglu)
          coda::gpu::gemm_rms_geglu(xg, s);
        else
          coda::gpu::gemm_rms_swiglu(x, s);
      };
    };
    const auto gated = geglu ? gated_kernel<Gelu> : gated_kernel<Silu>;
    run_rest = [=] {
      unfused_rstd();
      gated<<<grid_for(M * N / 2), 256, 0, s>>>(reinterpret_cast<const __nv_bfloat162*>(Y), u_rstd,
                                                reinterpret_cast<__nv_bfloat162*>(u_out), u_side,
                                                N / 2, M * N / 2);
    };
  } else if (c.kernel == "K4") {
    coda::RopeSpec rope{view(positions, DType::i32, M), view(inv_freq, f32, md.head_dim / 2),
                        int32_t(md.q_heads), int32_t(md.kv_heads), int32_t(md.head_dim)};
    const coda::RmsRopeArgs args{A, W, Pin, eps, rope, view(out, bf16, M, N), view(rstd, f32, M)};
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::RmsRopeArgs x = args;
      x.a = o.a, x.w = o.w, x.a_scales = o.a_scales, x.w_scales = o.w_scales;
      return [=] { coda::gpu::gemm_rms_rope(x, s); };
    };
    run_rest = [=] {
      unfused_rstd();
      rope_kernel<<<dim3(unsigned(M), unsigned(N / head_dim)), unsigned(head_dim / 2), 0, s>>>(
          Y, u_rstd, pos, freq, u_out, int32_t(N), int32_t(head_dim), int32_t(rotated_heads));
    };
  } else if (c.kernel == "K6") {
    // residual: x; partials_in's first column: zeta; rstd from the fill below; dx accumulates
    // into `out` (its values drift over the runs; the check compares h_hat).
    bench::fill_partials<<<64, 256, 0, s>>>(rstd.as<float>(), M, 8, 1.f);
    coda::RmsBackwardArgs args;
    args.dz = A, args.w = W, args.x = view(residual, bf16, M, N);
    args.rstd = view(rstd, f32, M), args.zeta = view(rstd_unfused, f32, M);
    args.gamma = view(gamma, bf16, N), args.alpha = coda::Scalar{1.f};
    args.accumulate = true;
    args.dx = view(out, bf16, M, N), args.h_hat = view(side, bf16, M, N);
    args.dgamma_partials = view(partials_out, f32, N, P_rows);
    bench::fill_partials<<<64, 256, 0, s>>>(rstd_unfused.as<float>(), M, 9, 0.5f);
    const float* r6 = rstd.as<float>();
    const float* z6 = rstd_unfused.as<float>();
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::RmsBackwardArgs x = args;
      x.dz = o.a, x.w = o.w, x.dz_scales = o.a_scales, x.w_scales = o.w_scales;
      return [=] { coda::gpu::gemm_rms_backward(x, s); };
    };
    run_rest = [=] {
      rms_backward_kernel<<<dim3(unsigned(P_out), unsigned(P_rows)), 128, 0, s>>>(
          Y, res, r6, z6, gam, u_out, u_side, p_out, int32_t(M), int32_t(N));
    };
  } else if (c.kernel == "K7") {
    // residual: the [M, 2F] pre-activation; out: dpreact; side: act.
    coda::SwigluBackwardArgs args;
    args.dx = A, args.w = W, args.preact = view(residual, bf16, M, 2 * N);
    args.act = view(side, bf16, M, N), args.dpreact = view(out, bf16, M, 2 * N);
    args.zeta_partials = view(partials_out, f32, M, P_out);
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::SwigluBackwardArgs x = args;
      x.dx = o.a, x.w = o.w, x.dx_scales = o.a_scales, x.w_scales = o.w_scales;
      return [=] { coda::gpu::gemm_swiglu_backward(x, s); };
    };
    run_rest = [=] {
      swiglu_backward_kernel<<<dim3(unsigned(M), unsigned(P_out)), 128, 0, s>>>(
          Y, reinterpret_cast<const __nv_bfloat162*>(res), u_side,
          reinterpret_cast<__nv_bfloat162*>(u_out), p_out, int32_t(N));
    };
  } else {
    coda::RmsLseArgs args{A,
                          W,
                          Pin,
                          eps,
                          view(targets, DType::i32, M),
                          view(out, bf16, M, N),
                          view(partials_out, f32, M, P_out),
                          view(target_logit, f32, M),
                          view(rstd, f32, M)};
    make_fused = [=](const Operands& o) -> std::function<void()> {
      coda::RmsLseArgs x = args;
      x.a = o.a, x.w = o.w;
      return [=] { coda::gpu::gemm_rms_lse(x, s); };
    };
    run_rest = [=] {
      unfused_rstd();
      lse_kernel<<<dim3(unsigned(M), unsigned(P_out)), 128, 0, s>>>(Y, u_rstd, tgt, u_out, p_out,
                                                                    tl, int32_t(N));
    };
  }

  // The FP8 case's operands, quantized once from the bf16 ones: a by 1 x 128 row blocks; w by
  // 128 x 128 blocks, the input gradients' w ([K, N] as stored) as its transposed copy [N, K].
  const int64_t w_rows = c.backward() ? K : N, w_cols = c.backward() ? N : K;
  const auto blocks = [](int64_t n) { return (n + 127) / 128; };
  Buffer a8(c.fp8 ? size_t(M * K) : 0), a8_scales(c.fp8 ? size_t(M * blocks(K)) : 0),
      w8(c.fp8 ? size_t(N * K) : 0), w8_scales(c.fp8 ? size_t(blocks(N) * blocks(K)) : 0),
      w8_t(c.fp8 && c.backward() ? size_t(N * K) : 0),
      w8_t_scales(c.fp8 && c.backward() ? size_t(blocks(N) * blocks(K)) : 0);
  const Operands bf16_operands{A, W, {}, {}};
  Operands operands = bf16_operands;
  if (c.fp8) {
    const DType e4m3 = DType::e4m3, e8m0 = DType::e8m0;
    coda::QuantizeActivationFp8Args qa;
    qa.x = A, qa.codes = view(a8, e4m3, M, K), qa.scales = view(a8_scales, e8m0, M, blocks(K));
    coda::QuantizeWeightFp8Args qw;
    qw.w = W, qw.codes = view(w8, e4m3, w_rows, w_cols);
    qw.scales = view(w8_scales, e8m0, blocks(w_rows), blocks(w_cols));
    if (c.backward()) {
      qw.codes_t = view(w8_t, e4m3, N, K);
      qw.scales_t = view(w8_t_scales, e8m0, blocks(N), blocks(K));
    }
    coda::gpu::quantize_activation_fp8(qa, s);
    coda::gpu::quantize_weight_fp8(qw, s);
    check(cudaStreamSynchronize(s), "quantize");
    operands = {qa.codes, c.backward() ? qw.codes_t : qw.codes, qa.scales,
                c.backward() ? qw.scales_t : qw.scales};
  }
  const std::function<void()> run_fused = make_fused(operands);
  const std::function<void()> run_bf16_fused = make_fused(bf16_operands);

  coda::GemmArgs plain;
  plain.layout = c.layout;
  plain.a = A, plain.b = W, plain.d = view(gemm_out, bf16, M, N);
  // coda's plain GEMM with its stream-K scratch, as coda::gemm's callers pass it.
  const size_t gemm_ws_bytes = coda::gpu::gemm_workspace_size(plain);
  Buffer gemm_ws(gemm_ws_bytes);
  if (gemm_ws_bytes > 0) plain.workspace = view(gemm_ws, f32, int64_t(gemm_ws_bytes / 4));
  // The FP8 case's floor: gemm_fp8 of the same operands (its forward form), bf16 D.
  coda::Fp8GemmArgs plain_fp8;
  plain_fp8.a = operands.a, plain_fp8.a_scales = operands.a_scales;
  plain_fp8.b = operands.w, plain_fp8.b_scales = operands.w_scales;
  plain_fp8.d = view(gemm_out, bf16, M, N);
  coda::Fp8GemmArgs unfused_fp8 = plain_fp8;
  unfused_fp8.d = view(y, bf16, M, N);
  const bench::CublasGemm cublas(ctx.lt, c.layout, M, N, K, ctx.workspace.p, ctx.kWorkspaceBytes);
  auto run_gemm = [&] {
    if (c.fp8)
      coda::gpu::gemm_fp8(plain_fp8, s);
    else
      coda::gpu::gemm(plain, s);
  };
  auto run_cublas = [&] { cublas.run(a.p, w.p, gemm_out.p, s); };
  auto run_unfused = [&] {
    if (c.fp8)
      coda::gpu::gemm_fp8(unfused_fp8, s);
    else
      cublas.run(a.p, w.p, y.p, s);
    run_rest();
  };
  auto forced = [&](coda::gpu::FusedSchedule schedule) {
    return [&, schedule] {
      coda::gpu::set_fused_schedule(schedule);
      run_fused();
      coda::gpu::set_fused_schedule(coda::gpu::FusedSchedule::automatic);
    };
  };
  const std::function<void()> run_cooperative = forced(coda::gpu::FusedSchedule::cooperative);
  const std::function<void()> run_pingpong = forced(coda::gpu::FusedSchedule::pingpong);
  const std::function<void()> run_staged = forced(coda::gpu::FusedSchedule::staged);
  // Forcing a schedule a kernel lacks runs its default (K7 forced cooperative). K6 has no
  // ping-pong variant: not timed; its staged column is the staged_wide 128 x 256 tile. The FP8
  // kernels run the staged 128 x 128 tile by default where they have it (K1, K2, K2g, K4 at
  // head_dim 64, K7; K6 from K = 3072, which all four K6 shapes are), timed forced on it and on
  // the cooperative 128 x 128 tile (their two columns), and the cooperative one elsewhere; the
  // bf16 kernel too.
  const bool fp8_staged =
      c.fp8 && (c.kernel == "K1" || c.kernel == "K2" || c.kernel == "K2g" || c.kernel == "K6" ||
                c.kernel == "K7" || (c.kernel == "K4" && md.head_dim == 64));
  const bool schedules_run = !c.fp8, pingpong_runs = schedules_run && c.kernel != "K6";
  const bool staged_runs = schedules_run || fp8_staged;
  const bool cooperative_runs = schedules_run || fp8_staged;
  for (int i = 0; i < 3; ++i) {
    run_fused(), run_gemm(), run_cublas(), run_unfused();
    if (cooperative_runs) run_cooperative();
    if (staged_runs) run_staged();
    if (pingpong_runs) run_pingpong();
    if (c.fp8) run_bf16_fused();
  }
  check(cudaStreamSynchronize(s), "warm-up");
  check(cudaGetLastError(), "warm-up");

  bench::Timer timer = ctx.timer();
  std::vector<float> t_fused, t_gemm, t_cublas, t_unfused, t_cooperative, t_pingpong, t_staged,
      t_bf16_fused;
  auto timed = [&](const std::function<void()>& fn, std::vector<float>& times) {
    timer.timed(fn, times);
  };
  for (int i = 0; i < runs; ++i) {
    timed(run_fused, t_fused), timed(run_gemm, t_gemm), timed(run_cublas, t_cublas);
    timed(run_unfused, t_unfused);
    if (cooperative_runs) timed(run_cooperative, t_cooperative);
    if (staged_runs) timed(run_staged, t_staged);
    if (pingpong_runs) timed(run_pingpong, t_pingpong);
    if (c.fp8) timed(run_bf16_fused, t_bf16_fused);
  }
  // The last timed run of the FP8 case was the bf16 kernel's: run the FP8 one again for the
  // comparison with the unfused path below (K6 compares h_hat, which does not accumulate). The
  // staged FP8 kernel's outputs are the cooperative one's bit for bit (the GPU tests hold both
  // to the reference; K6's dx and dgamma partials differ by its rounding of g, its h_hat does
  // not), so the default's stand for both.
  if (c.fp8) run_fused();
  check(cudaGetLastError(), "timed runs");
  using bench::median;
  auto median_or_none = [](const std::vector<float>& t) { return t.empty() ? -1.0 : median(t); };
  // K6's dx accumulates over the runs: compare h_hat. K7: dpreact, 2F wide.
  const double diff = c.kernel == "K6" ? bench::max_rel_diff(side.p, unfused_side.p, M * N)
                                       : bench::max_rel_diff(out.p, unfused_out.p, M * wide);
  return {c,
          median(t_fused),
          median(t_gemm),
          median(t_cublas),
          median(t_unfused),
          diff,
          median_or_none(t_cooperative),
          median_or_none(t_pingpong),
          median_or_none(t_staged),
          median_or_none(t_bf16_fused)};
}

} // namespace

int main(int argc, char** argv) {
  std::string commit, out_path, filter;
  int runs = 50;
  try {
    const bench::Flags flags(argc, argv, {"--commit", "--out", "--runs", "--filter"});
    commit = flags.commit();
    out_path = flags.get("--out", "bench/results/fused.json");
    runs = std::max(1, flags.get_int("--runs", runs));
    filter = flags.get("--filter", "");
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "bench_fused: %s\n", e.what()), 2;
  }
  try {
    if (!coda::gpu::device_supported())
      return std::fprintf(stderr, "bench_fused needs an sm_90 GPU\n"), 1;
    const bench::Context ctx;
    const std::vector<Model> models{{"llama-1b", 2048, 8192, 32, 8, 64},
                                    {"llama-8b", 4096, 14336, 32, 8, 128}};

    std::vector<Result> results;
    // (FP8 rows: gemm ms is gemm_fp8's; the schedule columns give bf16/fp8, the bf16 kernel's
    // time over the FP8 kernel's, in the first.)
    std::printf("%-3s %-4s %-9s %5s %6s %6s  %8s %8s %8s %8s  %9s %9s  %8s %8s %8s  %9s\n", "", "",
                "model", "M", "N", "K", "fused ms", "gemm ms", "cublas", "unfused", "fused/gemm",
                "unf/fused", "coop/gemm", "pp/gemm", "st/gemm", "rel diff");
    for (const Case& c : bench_cases(models)) {
      if (c.name().find(filter) == std::string::npos) continue;
      const Result r = bench_case(c, ctx, runs);
      results.push_back(r);
      auto over_gemm = [&](double ms) { return ms > 0 ? ms / r.coda_gemm_ms : NAN; };
      const double first = c.fp8 ? r.bf16_fused_ms / r.coda_ms : over_gemm(r.cooperative_ms);
      std::printf("%-3s %-4s %-9s %5lld %6lld %6lld  %8.4f %8.4f %8.4f %8.4f  %9.3f %9.3f  %8.3f "
                  "%8.3f %8.3f  %9.2e\n",
                  c.kernel.c_str(), c.fp8 ? "fp8" : "bf16", c.model->name, (long long)c.m,
                  (long long)c.n, (long long)c.k, r.coda_ms, r.coda_gemm_ms, r.cublas_ms,
                  r.unfused_ms, r.coda_ms / r.coda_gemm_ms, r.unfused_ms / r.coda_ms, first,
                  over_gemm(r.pingpong_ms), over_gemm(r.staged_ms), r.max_rel_diff);
      std::fflush(stdout);
    }

    FILE* f = bench::open_json(out_path, ctx.prop, commit, runs);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"kernel\": \"%s\", \"model\": \"%s\", \"layout\": \"%s\", \"m\": %lld, "
                   "\"n\": %lld, \"k\": %lld, \"coda_ms\": %.5f, \"coda_gemm_ms\": %.5f, "
                   "\"cublas_ms\": %.5f, \"unfused_ms\": %.5f",
                   r.c.kernel.c_str(), r.c.model->name, r.c.backward() ? "dgrad" : "fwd",
                   (long long)r.c.m, (long long)r.c.n, (long long)r.c.k, r.coda_ms, r.coda_gemm_ms,
                   r.cublas_ms, r.unfused_ms);
      // The forced schedules a kernel was timed on (K6: no ping-pong).
      const std::pair<const char*, double> forced[] = {{"coda_cooperative_ms", r.cooperative_ms},
                                                       {"coda_pingpong_ms", r.pingpong_ms},
                                                       {"coda_staged_ms", r.staged_ms}};
      for (const auto& [key, ms] : forced)
        if (ms > 0) std::fprintf(f, ", \"%s\": %.5f", key, ms);
      // FP8 operands: coda_gemm_ms is gemm_fp8's, unfused_ms gemm_fp8's plus the rest.
      if (r.c.fp8)
        std::fprintf(f, ", \"precision\": \"fp8\", \"bf16_fused_ms\": %.5f", r.bf16_fused_ms);
      std::fprintf(f, "}%s\n", i + 1 < results.size() ? "," : "");
    }
    bench::close_json(f);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fused: %s\n", e.what());
    return 1;
  }
}
