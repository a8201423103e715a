// The unfused baseline of bench_block: one middle Llama block (attention output of layer l ->
// post-RoPE QKV of layer l+1) as PyTorch eager runs it, cuBLASLt GEMMs plus the simplest correct
// separate CUDA kernel for each other operation, in eager's order: residual add, RMSNorm (saving
// rstd), SwiGLU, RoPE forward; RoPE backward, RMSNorm backward, dgamma reduction (two passes),
// residual-gradient add, SwiGLU backward. The forward saves what eager autograd saves (the
// normalized GEMM inputs h1, h2 and the SwiGLU output y1 among them), so its backward recomputes
// nothing. The GEMM-only side runs the same GEMMs on the same buffers and nothing else.
//
// Header-only, like harness.cuh (whose types have internal linkage): bench_block.cu includes it
// once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "harness.cuh"

namespace {
namespace bench {

using bf16 = __nv_bfloat16;

// ---- The kernels. Each reads the rounded bf16 output of the step before it and does
// its math in fp32. Rows are multiples of 8 elements, so every thread moves 16 bytes at a time.

constexpr int kThreads = 256;

__device__ inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// N consecutive bf16 values (N = 4 or 8: one 8- or 16-byte access) to and from fp32.
template <int N> using Packed = std::conditional_t<N == 8, uint4, uint2>;
template <int N> __device__ inline void load_bf16(const bf16* p, float (&v)[N]) {
  static_assert(N == 4 || N == 8, "one 8- or 16-byte access");
  const Packed<N> raw = *reinterpret_cast<const Packed<N>*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < N / 2; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
template <int N> __device__ inline void store_bf16(bf16* p, const float (&v)[N]) {
  static_assert(N == 4 || N == 8, "one 8- or 16-byte access");
  Packed<N> raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < N / 2; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<Packed<N>*>(p) = raw;
}

// Sum over the kThreads threads of a block; every thread gets the total.
__device__ float block_sum(float x) {
  __shared__ float scratch[kThreads / 32];
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) x += __shfl_xor_sync(0xffffffffu, x, mask);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n);                        \
       i += int64_t(gridDim.x) * blockDim.x)

// out = a + b (out may be a). n8: elements / 8.
__global__ void add_kernel(const bf16* a, const bf16* b, bf16* out, int64_t n8) {
  GRID_STRIDE(i, n8) {
    float x[8], y[8];
    load_bf16(a + 8 * i, x), load_bf16(b + 8 * i, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] += y[k];
    store_bf16(out + 8 * i, x);
  }
}

// RMSNorm of each row (one block per row): rstd = 1 / sqrt(mean(x²) + eps),
// out = round(round(x * rstd) * gamma), Hugging Face's LlamaRMSNorm order; rstd is saved.
__global__ void rmsnorm_kernel(const bf16* x, const bf16* gamma, bf16* out, float* rstd, int32_t d,
                               float eps) {
  const bf16* row = x + int64_t(blockIdx.x) * d;
  float sum = 0.f;
  for (int32_t c = threadIdx.x * 8; c < d; c += kThreads * 8) {
    float v[8];
    load_bf16(row + c, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += v[k] * v[k];
  }
  const float r = rsqrtf(block_sum(sum) / float(d) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int32_t c = threadIdx.x * 8; c < d; c += kThreads * 8) {
    float v[8], g[8];
    load_bf16(row + c, v), load_bf16(gamma + c, g);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = round_bf16(v[k] * r) * g[k];
    store_bf16(out + int64_t(blockIdx.x) * d + c, v);
  }
}

// RMSNorm backward of one row (one block per row), from dh = d loss / d out:
//   u = dh * gamma;  dx = rstd * (u - x * rstd² * mean(u * x)).
__global__ void rmsnorm_backward_kernel(const bf16* dh, const bf16* x, const float* rstd,
                                        const bf16* gamma, bf16* dx, int32_t d) {
  const int64_t base = int64_t(blockIdx.x) * d;
  const float r = rstd[blockIdx.x];
  float dot = 0.f;
  for (int32_t c = threadIdx.x * 8; c < d; c += kThreads * 8) {
    float g[8], v[8], w[8];
    load_bf16(dh + base + c, g), load_bf16(x + base + c, v), load_bf16(gamma + c, w);
#pragma unroll
    for (int k = 0; k < 8; ++k) dot += g[k] * w[k] * v[k];
  }
  const float coef = r * r * block_sum(dot) / float(d);
  for (int32_t c = threadIdx.x * 8; c < d; c += kThreads * 8) {
    float g[8], v[8], w[8];
    load_bf16(dh + base + c, g), load_bf16(x + base + c, v), load_bf16(gamma + c, w);
#pragma unroll
    for (int k = 0; k < 8; ++k) g[k] = r * (g[k] * w[k] - v[k] * coef);
    store_bf16(dx + base + c, g);
  }
}

// dgamma, first pass: partials[s, n] = sum over the rows of split s of dh[m, n] * round(x * rstd)
// (the normalized input as the forward rounded it). Grid (ceil(d / (8 kThreads)), splits).
__global__ void dgamma_partials_kernel(const bf16* dh, const bf16* x, const float* rstd,
                                       float* partials, int32_t d, int64_t rows,
                                       int32_t rows_per_split) {
  const int32_t c = (int32_t(blockIdx.x) * kThreads + int32_t(threadIdx.x)) * 8;
  if (c >= d) return;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_split;
  const int64_t end = std::min<int64_t>(rows, begin + rows_per_split);
  float acc[8] = {};
  for (int64_t m = begin; m < end; ++m) {
    const float r = rstd[m];
    float g[8], v[8];
    load_bf16(dh + m * d + c, g), load_bf16(x + m * d + c, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += g[k] * round_bf16(v[k] * r);
  }
  float4* out = reinterpret_cast<float4*>(partials + int64_t(blockIdx.y) * d + c);
  out[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  out[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

__device__ inline void store_value(float* p, float v) { *p = v; }
__device__ inline void store_value(bf16* p, float v) { *p = __float2bfloat16(v); }

// dgamma, second pass: out[n] = sum_s partials[s, n]. Blocks of 32 x 8 threads: 32 columns,
// each summed by 8 threads over interleaved splits, then across those 8.
template <class Out>
__global__ void column_sum_kernel(const float* partials, int32_t splits, int32_t d, Out* out) {
  __shared__ float sums[8][33];
  const int32_t c = int32_t(blockIdx.x) * 32 + int32_t(threadIdx.x);
  float sum = 0.f;
  if (c < d)
    for (int32_t s = int32_t(threadIdx.y); s < splits; s += 8) sum += partials[int64_t(s) * d + c];
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) total += sums[k][threadIdx.x];
    store_value(out + c, total);
  }
}

// SwiGLU on the interleaved gate/up output: y[m, j] = silu(z[m, 2j]) * z[m, 2j+1], four pairs
// per thread. n4: elements of y / 4.
__global__ void swiglu_kernel(const bf16* z, bf16* y, int64_t n4) {
  GRID_STRIDE(i, n4) {
    float v[8], o[4];
    load_bf16(z + 8 * i, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float g = v[2 * k], u = v[2 * k + 1];
      o[k] = g / (1.f + __expf(-g)) * u;
    }
    store_bf16(y + 4 * i, o);
  }
}

// SwiGLU backward: with s = sigmoid(g), dg = dy * u * s * (1 + g (1 - s)), du = dy * g * s,
// written interleaved like z.
__global__ void swiglu_backward_kernel(const bf16* z, const bf16* dy, bf16* dz, int64_t n4) {
  GRID_STRIDE(i, n4) {
    float v[8], d[4], o[8];
    load_bf16(z + 8 * i, v), load_bf16(dy + 4 * i, d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float g = v[2 * k], u = v[2 * k + 1];
      const float s = 1.f / (1.f + __expf(-g));
      o[2 * k] = d[k] * u * s * (1.f + g * (1.f - s));
      o[2 * k + 1] = d[k] * g * s;
    }
    store_bf16(dz + 8 * i, o);
  }
}

// Rotate-half RoPE (Hugging Face) on heads [0, rotated_heads) of each row of [M, width]:
// for pair i < head_dim / 2 with angle t = position * inv_freq[i], forward
//   (a, b) -> (a cos t - b sin t, b cos t + a sin t),
// backward (the transpose) (da, db) -> (da cos t + db sin t, db cos t - da sin t). Eight pairs
// per thread; heads at or past rotated_heads are copied (backward into a separate output) or
// left alone (forward, in place). items = M * heads * (head_dim / 16).
template <bool kBackward>
__global__ void rope_kernel(const bf16* in, bf16* out, const int32_t* positions,
                            const float* inv_freq, int32_t width, int32_t head_dim, int32_t heads,
                            int32_t rotated_heads, int64_t items) {
  const int32_t half = head_dim / 2, chunks = half / 8;
  GRID_STRIDE(item, items) {
    const int32_t c = int32_t(item % chunks);
    const int64_t t = item / chunks;
    const int32_t h = int32_t(t % heads);
    const int64_t m = t / heads;
    const int64_t offset = m * width + int64_t(h) * head_dim + c * 8;
    float a[8], b[8];
    load_bf16(in + offset, a), load_bf16(in + offset + half, b);
    if (h < rotated_heads) {
      const float pos = float(positions[m]);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float sn, cs;
        sincosf(pos * inv_freq[c * 8 + k], &sn, &cs);
        const float x = a[k], y = b[k];
        a[k] = kBackward ? x * cs + y * sn : x * cs - y * sn;
        b[k] = kBackward ? y * cs - x * sn : y * cs + x * sn;
      }
    }
    store_bf16(out + offset, a), store_bf16(out + offset + half, b);
  }
}

// ---- The block: its buffers, its GEMMs and the two passes.

// The widths of one middle block: M tokens, hidden D, MLP F, attention A = q_heads head_dim, QKV
// Nq; weight and gamma gradients in grad_dtype (bf16 or f32).
struct BlockDims {
  int64_t M, D, F, A, Nq;
  int32_t q_heads, kv_heads, head_dim;
  float eps;
  DType grad_dtype;
};

// The inputs it reads (device buffers the caller owns and fills): the residual stream and
// attention output entering the block, the incoming QKV gradient, the RoPE tables, the weights.
struct BlockInputs {
  const Buffer &x0, &y0, &dqkv, &positions, &inv_freq;
  const Buffer &w_out, &ffn_norm, &w_gate_up, &w_down, &attn_norm, &w_qkv;
};

inline size_t bf16_bytes(int64_t n) { return size_t(n) * 2; }

struct UnfusedBlock : BlockDims {
  const BlockInputs in;
  const size_t gsize = size_t(coda::dtype_size(grad_dtype)); // bytes per weight-gradient element
  static constexpr int32_t kDgammaRows = 32;                 // rows per dgamma partial
  const int32_t dgamma_splits = int32_t((M + kDgammaRows - 1) / kDgammaRows);
  const int grid_limit; // blocks of a grid-stride launch: 8 of kThreads fill an SM

  // What eager autograd saves (x1, r1, h1, z1, y1, x2, r2, h2), the outputs, the gradients,
  // scratch (tmp: a GEMM's output before its residual add, or the gradient of a norm's output;
  // dxn: a norm's input gradient before it is added to dx). dx holds d loss / d x2 on entry to
  // the backward and d loss / d x0 on exit.
  Buffer x1{bf16_bytes(M * D)}, r1{size_t(M) * 4}, h1{bf16_bytes(M * D)}, z1{bf16_bytes(M * 2 * F)},
      y1{bf16_bytes(M * F)}, x2{bf16_bytes(M * D)}, r2{size_t(M) * 4}, h2{bf16_bytes(M * D)},
      qkv{bf16_bytes(M * Nq)}, tmp{bf16_bytes(M * D)};
  Buffer dz2{bf16_bytes(M * Nq)}, dy1{bf16_bytes(M * F)}, dz1{bf16_bytes(M * 2 * F)},
      dxn{bf16_bytes(M * D)}, dx{bf16_bytes(M * D)}, dy0{bf16_bytes(M * A)},
      partials{size_t(dgamma_splits) * size_t(D) * 4};
  Buffer d_w_out{gsize * size_t(D * A)}, d_ffn_norm{gsize * size_t(D)},
      d_w_gate_up{gsize * size_t(2 * F * D)}, d_w_down{gsize * size_t(D * F)},
      d_attn_norm{gsize * size_t(D)}, d_w_qkv{gsize * size_t(Nq * D)};

  // cuBLASLt, named <weight>_<layout>, M = tokens; weight gradients in grad_dtype.
  const Context& ctx;
  const cudaDataType_t gt = grad_dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  void* const ws = ctx.workspace.p;
  static constexpr size_t kWs = Context::kWorkspaceBytes;
  const CublasGemm o_fwd{ctx.lt, coda::GemmLayout::fwd, M, D, A, ws, kWs},
      gate_up_fwd{ctx.lt, coda::GemmLayout::fwd, M, 2 * F, D, ws, kWs},
      down_fwd{ctx.lt, coda::GemmLayout::fwd, M, D, F, ws, kWs},
      qkv_fwd{ctx.lt, coda::GemmLayout::fwd, M, Nq, D, ws, kWs},
      qkv_dgrad{ctx.lt, coda::GemmLayout::dgrad, M, D, Nq, ws, kWs},
      qkv_wgrad{ctx.lt, coda::GemmLayout::wgrad, Nq, D, M, ws, kWs, gt},
      down_dgrad{ctx.lt, coda::GemmLayout::dgrad, M, F, D, ws, kWs},
      down_wgrad{ctx.lt, coda::GemmLayout::wgrad, D, F, M, ws, kWs, gt},
      gate_up_dgrad{ctx.lt, coda::GemmLayout::dgrad, M, D, 2 * F, ws, kWs},
      gate_up_wgrad{ctx.lt, coda::GemmLayout::wgrad, 2 * F, D, M, ws, kWs, gt},
      o_dgrad{ctx.lt, coda::GemmLayout::dgrad, M, A, D, ws, kWs},
      o_wgrad{ctx.lt, coda::GemmLayout::wgrad, D, A, M, ws, kWs, gt};

  UnfusedBlock(const BlockDims& dims, const BlockInputs& inputs, const Context& context)
      : BlockDims(dims), in(inputs), grid_limit(context.prop.multiProcessorCount * 8),
        ctx(context) {}

  unsigned grid_for(int64_t items) const {
    return unsigned(
        std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, grid_limit)));
  }

  // ---- The GEMMs alone: the forward's 4 and the backward's 8, on the unfused path's buffers.
  void gemm_forward(cudaStream_t s) const {
    o_fwd.run(in.y0.p, in.w_out.p, tmp.p, s);
    gate_up_fwd.run(h1.p, in.w_gate_up.p, z1.p, s);
    down_fwd.run(y1.p, in.w_down.p, tmp.p, s);
    qkv_fwd.run(h2.p, in.w_qkv.p, qkv.p, s);
  }
  void gemm_backward(cudaStream_t s) const {
    qkv_dgrad.run(dz2.p, in.w_qkv.p, tmp.p, s);
    qkv_wgrad.run(dz2.p, h2.p, d_w_qkv.p, s);
    down_dgrad.run(dx.p, in.w_down.p, dy1.p, s);
    down_wgrad.run(dx.p, y1.p, d_w_down.p, s);
    gate_up_dgrad.run(dz1.p, in.w_gate_up.p, tmp.p, s);
    gate_up_wgrad.run(dz1.p, h1.p, d_w_gate_up.p, s);
    o_dgrad.run(dx.p, in.w_out.p, dy0.p, s);
    o_wgrad.run(dx.p, in.y0.p, d_w_out.p, s);
  }

  // ---- The unfused path: the same GEMMs, each followed by the separate kernels of its math.
  void add(const Buffer& a, const Buffer& b, const Buffer& out, cudaStream_t s) const {
    add_kernel<<<grid_for(M * D / 8), kThreads, 0, s>>>(a.as<bf16>(), b.as<bf16>(), out.as<bf16>(),
                                                        M * D / 8);
  }
  void rmsnorm(const Buffer& x, const Buffer& gamma, const Buffer& out, const Buffer& rstd,
               cudaStream_t s) const {
    rmsnorm_kernel<<<unsigned(M), kThreads, 0, s>>>(x.as<bf16>(), gamma.as<bf16>(), out.as<bf16>(),
                                                    rstd.as<float>(), int32_t(D), eps);
  }
  // Forward: in place on the q and k heads. Backward: every head into `out` (v copied).
  void rope(bool backward, const Buffer& from, const Buffer& out, cudaStream_t s) const {
    const int32_t rotated = q_heads + kv_heads;
    const int32_t heads = backward ? rotated + kv_heads : rotated;
    const int64_t items = M * heads * (head_dim / 16);
    const auto kernel = backward ? rope_kernel<true> : rope_kernel<false>;
    kernel<<<grid_for(items), kThreads, 0, s>>>(from.as<bf16>(), out.as<bf16>(),
                                                in.positions.as<int32_t>(), in.inv_freq.as<float>(),
                                                int32_t(Nq), head_dim, heads, rotated, items);
  }
  // From dh (the gradient of the norm's output): the input gradient, added to dx (through dxn),
  // and the gamma gradient (partials, then their sum).
  void rmsnorm_backward(const Buffer& dh, const Buffer& x, const Buffer& rstd, const Buffer& gamma,
                        const Buffer& dgamma, cudaStream_t s) const {
    rmsnorm_backward_kernel<<<unsigned(M), kThreads, 0, s>>>(dh.as<bf16>(), x.as<bf16>(),
                                                             rstd.as<float>(), gamma.as<bf16>(),
                                                             dxn.as<bf16>(), int32_t(D));
    const dim3 grid(unsigned((D + 8 * kThreads - 1) / (8 * kThreads)), unsigned(dgamma_splits));
    dgamma_partials_kernel<<<grid, kThreads, 0, s>>>(dh.as<bf16>(), x.as<bf16>(), rstd.as<float>(),
                                                     partials.as<float>(), int32_t(D), M,
                                                     kDgammaRows);
    const unsigned cols = unsigned((D + 31) / 32);
    if (grad_dtype == DType::f32)
      column_sum_kernel<<<cols, dim3(32, 8), 0, s>>>(partials.as<float>(), dgamma_splits,
                                                     int32_t(D), dgamma.as<float>());
    else
      column_sum_kernel<<<cols, dim3(32, 8), 0, s>>>(partials.as<float>(), dgamma_splits,
                                                     int32_t(D), dgamma.as<bf16>());
    add(dx, dxn, dx, s);
  }
  void forward(cudaStream_t s) const {
    o_fwd.run(in.y0.p, in.w_out.p, tmp.p, s);
    add(in.x0, tmp, x1, s);              // x1 = x0 + y0 W0ᵀ
    rmsnorm(x1, in.ffn_norm, h1, r1, s); // h1
    gate_up_fwd.run(h1.p, in.w_gate_up.p, z1.p, s);
    swiglu_kernel<<<grid_for(M * F / 4), kThreads, 0, s>>>(z1.as<bf16>(), y1.as<bf16>(),
                                                           M * F / 4); // y1
    down_fwd.run(y1.p, in.w_down.p, tmp.p, s);
    add(x1, tmp, x2, s);                  // x2 = x1 + y1 W2ᵀ
    rmsnorm(x2, in.attn_norm, h2, r2, s); // h2
    qkv_fwd.run(h2.p, in.w_qkv.p, qkv.p, s);
    rope(false, qkv, qkv, s); // qkv
    check(cudaGetLastError(), "unfused forward");
  }
  void backward(cudaStream_t s) const {
    rope(true, in.dqkv, dz2, s);                                 // d z2 (pre-RoPE)
    qkv_dgrad.run(dz2.p, in.w_qkv.p, tmp.p, s);                  // d h2
    qkv_wgrad.run(dz2.p, h2.p, d_w_qkv.p, s);                    // d W3
    rmsnorm_backward(tmp, x2, r2, in.attn_norm, d_attn_norm, s); // d x2 in full
    down_dgrad.run(dx.p, in.w_down.p, dy1.p, s);                 // d y1
    down_wgrad.run(dx.p, y1.p, d_w_down.p, s);                   // d W2
    swiglu_backward_kernel<<<grid_for(M * F / 4), kThreads, 0, s>>>(
        z1.as<bf16>(), dy1.as<bf16>(), dz1.as<bf16>(), M * F / 4); // d z1
    gate_up_dgrad.run(dz1.p, in.w_gate_up.p, tmp.p, s);            // d h1
    gate_up_wgrad.run(dz1.p, h1.p, d_w_gate_up.p, s);              // d W1
    rmsnorm_backward(tmp, x1, r1, in.ffn_norm, d_ffn_norm, s);     // d x1 (= d x0)
    o_dgrad.run(dx.p, in.w_out.p, dy0.p, s);                       // d y0
    o_wgrad.run(dx.p, in.y0.p, d_w_out.p, s);                      // d W0
    check(cudaGetLastError(), "unfused backward");
  }
};

} // namespace bench
} // namespace
