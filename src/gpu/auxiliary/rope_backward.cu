// RoPE backward and zeta (coda/kernels/args.hpp):
//   dz = RoPEᵀ(dqkv) (each Q and K head's pairs (i, i + hd/2) turn by -theta; V passes through)
//   zeta[m] = scale * sum_n qkv[m, n] * dqkv[m, n]
// for any even head_dim and any GQA split (unlike the fused K4, which needs whole heads in a
// tile). One warp per row. A job of a lane is W consecutive pair indices i of one head: it loads
// the W values at i and the W partners at i + hd/2 of dqkv and of qkv (W = 8 is four 16-byte
// loads), adds the W + W products to the lane's zeta, turns the pairs and stores them. W is the
// widest of 8, 4, 2, 1 dividing hd/2, so every access is aligned to its width. The lane keeps the
// cos/sin of its last W indices: when hd/2W divides 32 (hd = 32, 64, 128, ...) a lane sees one
// index group for the whole row and computes its rotations once per row.
// The V columns then add their products and are copied (skipped when dz is dqkv: already there).
//
// zeta sums in a fixed order (each lane its jobs in order, then the xor-shuffle tree), so it is
// bitwise reproducible; it is not the CPU's order, so it agrees with the CPU within fp32 rounding.
// dz is rotated by the shared rope_rotation / rope_rotate_inverse (coda/epilogue/ops/rope.hpp).
// dz may alias dqkv: a lane reads each pair before writing it, and lanes share no element.
#include "coda/epilogue/ops/rope.hpp"
#include "coda/epilogue/reduction.hpp"
#include "gpu/auxiliary/common.cuh"
#include "gpu/auxiliary/kernels.hpp"

namespace coda::gpu {
namespace aux {
namespace {

constexpr int kRowsPerBlock = 8; // warps of a CTA, one row each

template <class T> struct RopeBackwardParams {
  const T* dqkv; // not __restrict__: dz may be the same memory
  int64_t dqkv_stride;
  const T* __restrict__ qkv;
  int64_t qkv_stride;
  T* dz;
  int64_t dz_stride;
  float* __restrict__ zeta;
  const int32_t* __restrict__ positions;
  const float* __restrict__ inv_freq;
  int32_t rows;
  int32_t half;          // head_dim / 2
  int32_t rotated_heads; // n_q_heads + n_kv_heads
  int32_t cols;          // (n_q_heads + 2 n_kv_heads) * head_dim
  float scale;
  bool copy_v; // false when dz is dqkv
};

template <class T, int W>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rope_backward_kernel(const RopeBackwardParams<T> p) {
  using R = epilogue::Sum<float>;
  const int lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= p.rows) return; // whole warps leave together
  const T* dqkv = p.dqkv + row * p.dqkv_stride;
  const T* qkv = p.qkv + row * p.qkv_stride;
  T* dz = p.dz + row * p.dz_stride;
  const int32_t position = p.positions[row];

  typename R::State zeta = R::identity();
  const int32_t groups = p.half / W; // index groups per head
  const int32_t rotated_jobs = p.rotated_heads * groups;
  int32_t cached_group = -1;
  float cosines[W] = {}, sines[W] = {};
  for (int32_t job = lane; job < rotated_jobs; job += 32) {
    const int32_t head = job / groups, group = job - head * groups;
    if (group != cached_group) {
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const epilogue::RopeRotation rot =
            epilogue::rope_rotation(position, p.inv_freq[group * W + k]);
        cosines[k] = rot.cos;
        sines[k] = rot.sin;
      }
      cached_group = group;
    }
    const int64_t first = int64_t(head) * 2 * p.half + int64_t(group) * W;
    const int64_t second = first + p.half;
    float d1[W], d2[W], q1[W], q2[W];
    load_halves<T, W>(dqkv + first, d1);
    load_halves<T, W>(dqkv + second, d2);
    load_halves<T, W>(qkv + first, q1);
    load_halves<T, W>(qkv + second, q2);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      R::add(zeta, q1[k] * d1[k]);
      R::add(zeta, q2[k] * d2[k]);
      epilogue::rope_rotate_inverse(d1[k], d2[k], cosines[k], sines[k]);
    }
    store_halves<T, W>(dz + first, d1);
    store_halves<T, W>(dz + second, d2);
  }

  // V: the columns [rotated_cols, cols), a multiple of 2W wide, starting on a head boundary.
  const int32_t rotated_cols = p.rotated_heads * 2 * p.half;
  const int32_t v_jobs = (p.cols - rotated_cols) / W;
  for (int32_t job = lane; job < v_jobs; job += 32) {
    const int64_t col = rotated_cols + int64_t(job) * W;
    float d[W], q[W];
    load_halves<T, W>(dqkv + col, d);
    load_halves<T, W>(qkv + col, q);
#pragma unroll
    for (int k = 0; k < W; ++k) R::add(zeta, q[k] * d[k]);
    if (p.copy_v) // a 16-bit value converts to fp32 and back exactly: it passes through
      store_halves<T, W>(dz + col, d);
  }

#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2)
    zeta = R::merge(zeta, __shfl_xor_sync(0xffffffffu, zeta, mask));
  if (lane == 0) p.zeta[row] = p.scale * R::finish(zeta);
}

template <class T, int W> void launch(const RopeBackwardParams<T>& p, Stream stream) {
  const auto blocks = unsigned(ceil_div<int64_t>(p.rows, kRowsPerBlock));
  rope_backward_kernel<T, W><<<blocks, kRowsPerBlock * 32, 0, stream>>>(p);
  check_launch("rope_backward");
}

template <class T> void run_rope_backward(const RopeBackwardArgs& args, Stream stream) {
  const RopeSpec& rope = args.rope;
  RopeBackwardParams<T> p;
  p.dqkv = args.dqkv.ptr<const T>();
  p.dqkv_stride = args.dqkv.stride[0];
  p.qkv = args.qkv.ptr<const T>();
  p.qkv_stride = args.qkv.stride[0];
  p.dz = args.dz.ptr<T>();
  p.dz_stride = args.dz.stride[0];
  p.zeta = args.zeta.ptr<float>();
  p.positions = rope.positions.ptr<const int32_t>();
  p.inv_freq = rope.inv_freq.ptr<const float>();
  p.rows = int32_t(args.dqkv.shape[0]);
  p.half = rope.head_dim / 2;
  p.rotated_heads = rope.n_q_heads + rope.n_kv_heads;
  p.cols = int32_t(args.dqkv.shape[1]);
  p.scale = args.scale;
  // The API allows dz to alias dqkv only exactly (same pointer and strides).
  p.copy_v = args.dz.data != args.dqkv.data;
  if (p.half % 8 == 0) return launch<T, 8>(p, stream);
  if (p.half % 4 == 0) return launch<T, 4>(p, stream);
  if (p.half % 2 == 0) return launch<T, 2>(p, stream);
  launch<T, 1>(p, stream);
}

} // namespace
} // namespace aux

void rope_backward(const RopeBackwardArgs& args, Stream stream) {
  aux::require_device("rope_backward");
  const RopeSpec& rope = args.rope;
  // The API checked these; a kernel must never index outside its buffers if one slipped through.
  if (rope.head_dim < 2 || rope.head_dim % 2 != 0 ||
      (int64_t(rope.n_q_heads) + 2 * int64_t(rope.n_kv_heads)) * rope.head_dim !=
          args.dqkv.shape[1])
    throw Error(Status::invalid_argument,
                "gpu::rope_backward: head_dim must be even and the heads must fill the QKV width");
  aux::with_half_type(args.dqkv.dtype,
                      [&](auto t) { aux::run_rope_backward<decltype(t)>(args, stream); });
}

} // namespace coda::gpu
