// Cross-entropy forward and backward from K5's outputs (coda/kernels/args.hpp), in two launches:
//
// 1. One CTA per row. The row's lse is merged from its LSE partials first (LogSumExp of
//    coda/epilogue/reduction.hpp: each thread merges a strided subset in order, then a
//    xor-shuffle tree per warp, then the warps in order), so one pass over the logits computes
//    dlogits = exp(l - lse) - onehot and zeta = sum l * dlogits: each logit is read once (16-byte
//    loads, four in flight per thread) and each gradient written once, in the logits dtype.
//    dlogits may alias logits: a thread reads each vector before it writes the same vector, and no
//    other thread touches it (plain coherent loads, no __restrict__). The row's loss
//    lse - target_logit and a valid flag go to the workspace; ignored rows write zeros there and
//    to dlogits and zeta without reading the logits.
// 2. One CTA sums the per-row losses (in fp64, as the CPU does) and valid flags in a fixed order
//    and writes loss and grad_scale.
// No atomics: every sum has a fixed order, so the outputs are bitwise reproducible. The order is
// not the CPU's (which merges partials and sums zeta sequentially), so lse, zeta and dlogits agree
// with the CPU within fp32 rounding; the loss sum in fp64 is exact for typical losses, and
// grad_scale = 1 / #valid is bitwise equal.
//
// A target outside [0, V) that is not ignore_index (an error on the CPU backend, which checks the
// host targets before writing) cannot be reported from a kernel: such a row is treated exactly as
// an ignored row, as K5 already writes target_logit 0 for it.
#include "coda/coda.hpp"
#include "coda/epilogue/device/ops/reduce_over_n.cuh"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/reduction.hpp"
#include "gpu/auxiliary/common.cuh"
#include "gpu/auxiliary/kernels.hpp"

namespace coda::gpu {
namespace aux {
namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kUnroll = 4; // 16-byte loads in flight per thread
constexpr int kFinishThreads = 1024;

// The workspace (api/gate_up.cpp, cross_entropy_workspace_size): [M] f32 losses, then at the
// next 256-byte boundary [M] i32 valid flags.
constexpr size_t flags_offset(int64_t rows) { return (size_t(rows) * 4 + 255) / 256 * 256; }

template <class T> struct RowParams {
  const T* logits; // not __restrict__: dlogits may be the same memory
  int64_t logits_stride;
  T* dlogits;
  int64_t dlogits_stride;
  const float* __restrict__ lse_partials;
  int64_t lse_stride;
  int32_t lse_count;
  const float* __restrict__ target_logit;
  const int32_t* __restrict__ targets;
  int32_t ignore_index;
  int32_t vocab;
  float* __restrict__ zeta;
  float* __restrict__ row_loss; // workspace
  int32_t* __restrict__ row_valid;
};

using Lse = epilogue::LogSumExp<float>;
using Sum = epilogue::Sum<float>;

template <class T>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_rows_kernel(const RowParams<T> p) {
  __shared__ Lse::State warp_lse[kRowWarps];
  __shared__ float warp_zeta[kRowWarps];
  __shared__ float row_lse;
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int64_t row = blockIdx.x;
  const int32_t target = p.targets[row];
  const int32_t vectors = p.vocab / 8; // V is a multiple of 8
  uint4* out = reinterpret_cast<uint4*>(p.dlogits + row * p.dlogits_stride);

  if (target == p.ignore_index || target < 0 || target >= p.vocab) {
    for (int32_t v = tid; v < vectors; v += kRowThreads) __stcs(out + v, make_uint4(0, 0, 0, 0));
    if (tid == 0) {
      p.zeta[row] = 0.f;
      p.row_loss[row] = 0.f;
      p.row_valid[row] = 0;
    }
    return;
  }

  // lse: strided in-order merges, the warp's xor tree, then the warps in order by thread 0.
  Lse::State lse = Lse::identity();
  const float* partials = p.lse_partials + row * p.lse_stride;
  for (int32_t b = tid; b < p.lse_count; b += kRowThreads)
    lse = Lse::merge(lse, Lse::from_finished(partials[b]));
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2)
    lse = Lse::merge(lse, epilogue::device::shuffle_xor(lse, mask));
  if (lane == 0) warp_lse[warp] = lse;
  __syncthreads();
  if (tid == 0) {
    Lse::State all = warp_lse[0];
    for (int w = 1; w < kRowWarps; ++w) all = Lse::merge(all, warp_lse[w]);
    row_lse = Lse::finish(all);
    p.row_loss[row] = row_lse - p.target_logit[row];
    p.row_valid[row] = 1;
  }
  __syncthreads();
  const float l_max = row_lse; // the row's log-sum-exp

  const uint4* in = reinterpret_cast<const uint4*>(p.logits + row * p.logits_stride);
  typename Sum::State zeta = Sum::identity();
  for (int32_t base = tid; base < vectors; base += kRowThreads * kUnroll) {
    uint4 words[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t v = base + u * kRowThreads;
      if (v < vectors) words[u] = __ldcs(in + v); // streamed: read once
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t v = base + u * kRowThreads;
      if (v >= vectors) continue;
      const uint32_t w[4] = {words[u].x, words[u].y, words[u].z, words[u].w};
      uint32_t g[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 l = dev::unpack2<T>(w[k]);
        const int32_t col = 8 * v + 2 * k;
        const float d0 = epilogue::math::exp(l.x - l_max) - (col == target ? 1.f : 0.f);
        const float d1 = epilogue::math::exp(l.y - l_max) - (col + 1 == target ? 1.f : 0.f);
        Sum::add(zeta, l.x * d0);
        Sum::add(zeta, l.y * d1);
        g[k] = dev::pack2<T>(d0, d1);
      }
      __stcs(out + v, make_uint4(g[0], g[1], g[2], g[3]));
    }
  }

#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2)
    zeta = Sum::merge(zeta, __shfl_xor_sync(0xffffffffu, zeta, mask));
  if (lane == 0) warp_zeta[warp] = zeta;
  __syncthreads();
  if (tid == 0) {
    typename Sum::State all = warp_zeta[0];
    for (int w = 1; w < kRowWarps; ++w) all = Sum::merge(all, warp_zeta[w]);
    p.zeta[row] = Sum::finish(all);
  }
}

// loss and grad_scale from the per-row losses and flags: strided fp64 sums per thread, then a
// fixed tree over the block.
__global__ void __launch_bounds__(kFinishThreads)
    cross_entropy_finish_kernel(const float* __restrict__ row_loss,
                                const int32_t* __restrict__ row_valid, int32_t rows, bool mean,
                                float* __restrict__ loss, float* __restrict__ grad_scale) {
  __shared__ double sums[kFinishThreads];
  __shared__ int32_t counts[kFinishThreads];
  const int tid = int(threadIdx.x);
  double sum = 0;
  int32_t count = 0;
  for (int32_t i = tid; i < rows; i += kFinishThreads) {
    sum += double(row_loss[i]);
    count += row_valid[i];
  }
  sums[tid] = sum;
  counts[tid] = count;
  __syncthreads();
  for (int half = kFinishThreads / 2; half > 0; half /= 2) {
    if (tid < half) {
      sums[tid] += sums[tid + half];
      counts[tid] += counts[tid + half];
    }
    __syncthreads();
  }
  if (tid != 0) return;
  const double total = sums[0];
  const int32_t valid = counts[0];
  // As the CPU backend: a mean over no valid row is 0 with grad_scale 0 (not torch's NaN).
  const bool none = valid == 0;
  *loss = mean ? (none ? 0.f : float(total / double(valid))) : float(total);
  *grad_scale = mean ? (none ? 0.f : 1.f / float(valid)) : 1.f;
}

template <class T> void run_cross_entropy(const CrossEntropyArgs& args, Stream stream) {
  const int64_t rows = args.logits.shape[0];
  auto* workspace = args.workspace.ptr<unsigned char>();
  RowParams<T> p;
  p.logits = args.logits.ptr<const T>();
  p.logits_stride = args.logits.stride[0];
  p.dlogits = args.dlogits.ptr<T>();
  p.dlogits_stride = args.dlogits.stride[0];
  p.lse_partials = args.lse_partials.ptr<const float>();
  p.lse_stride = args.lse_partials.stride[0];
  p.lse_count = int32_t(args.lse_partials.shape[1]);
  p.target_logit = args.target_logit.ptr<const float>();
  p.targets = args.targets.ptr<const int32_t>();
  p.ignore_index = args.ignore_index;
  p.vocab = int32_t(args.logits.shape[1]);
  p.zeta = args.zeta.ptr<float>();
  p.row_loss = reinterpret_cast<float*>(workspace);
  p.row_valid = reinterpret_cast<int32_t*>(workspace + flags_offset(rows));
  cross_entropy_rows_kernel<T><<<unsigned(rows), kRowThreads, 0, stream>>>(p);
  check_launch("cross_entropy");
  cross_entropy_finish_kernel<<<1, kFinishThreads, 0, stream>>>(
      p.row_loss, p.row_valid, int32_t(rows), args.reduction == LossReduction::mean,
      args.loss.ptr<float>(), args.grad_scale.ptr<float>());
  check_launch("cross_entropy (loss reduction)");
}

} // namespace
} // namespace aux

void cross_entropy(const CrossEntropyArgs& args, Stream stream) {
  aux::require_device("cross_entropy");
  if (args.workspace.data == nullptr ||
      size_t(args.workspace.numel()) * size_t(dtype_size(args.workspace.dtype)) <
          cross_entropy_workspace_size(args.logits.shape[0]))
    throw Error(Status::invalid_argument,
                "gpu::cross_entropy: workspace must hold cross_entropy_workspace_size(M) bytes");
  aux::with_half_type(args.logits.dtype,
                      [&](auto t) { aux::run_cross_entropy<decltype(t)>(args, stream); });
}

} // namespace coda::gpu
