// rms_stats, the first layer's RMSNorm statistics (no GEMM produces its input):
//   out_scaled = round(x * gamma[n]),  sumsq_partials[m, b] = sum of x² over columns
//   [128 b, 128 b + 128) of row m.
// One warp per row. Each lane takes 8 consecutive columns (one 16-byte vector) of a 256-column
// step, so the two half-warps each cover one 128-column block; each half-warp reduces its block
// by shuffles and its first lane writes the partial. Memory-bound: one read of x, one write.
#include <cuda_runtime.h>

#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/scale_per_col.hpp"
#include "coda/epilogue/reduction.hpp"
#include "gpu/auxiliary/kernels.hpp"
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

constexpr int kRowsPerBlock = 8; // warps of a CTA, one row each

template <class T>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rms_stats_kernel(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ gamma,
                     T* __restrict__ out, int64_t out_stride, float* __restrict__ partials,
                     int64_t partial_stride, int32_t rows, int32_t cols) {
  using R = epilogue::SumOfSquares<float>;
  const int lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return; // whole warps leave together
  for (int32_t step = 0; step < cols; step += 256) {
    const int32_t col = step + 8 * lane;
    typename R::State state = R::identity();
    if (col < cols) { // whole vectors: cols is a multiple of 8
      const uint4 xv = *reinterpret_cast<const uint4*>(x + row * x_stride + col);
      const uint4 gv = *reinterpret_cast<const uint4*>(gamma + col);
      const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
      uint32_t hw[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 xf = epilogue::device::unpack2<T>(xw[k]);
        const float2 gf = epilogue::device::unpack2<T>(gw[k]);
        R::add(state, xf.x);
        R::add(state, xf.y);
        hw[k] = epilogue::device::pack2<T>(epilogue::scale_per_col(xf.x, gf.x),
                                           epilogue::scale_per_col(xf.y, gf.y));
      }
      *reinterpret_cast<uint4*>(out + row * out_stride + col) =
          make_uint4(hw[0], hw[1], hw[2], hw[3]);
    }
#pragma unroll
    for (int mask = 8; mask >= 1; mask /= 2)
      state = R::merge(state, __shfl_xor_sync(0xffffffffu, state, mask));
    const int32_t block = step / 128 + lane / 16;
    if (lane % 16 == 0 && block * 128 < cols) partials[row * partial_stride + block] = state;
  }
}

template <class T> void run_rms_stats(const RmsStatsArgs& args, Stream stream) {
  const int64_t rows = args.x.shape[0], cols = args.x.shape[1];
  const unsigned blocks = unsigned(ceil_div<int64_t>(rows, kRowsPerBlock));
  rms_stats_kernel<T><<<blocks, kRowsPerBlock * 32, 0, stream>>>(
      args.x.ptr<const T>(), args.x.stride[0], args.gamma.ptr<const T>(), args.out_scaled.ptr<T>(),
      args.out_scaled.stride[0], args.sumsq_partials.ptr<float>(), args.sumsq_partials.stride[0],
      int32_t(rows), int32_t(cols));
  sm90::check_cuda(cudaGetLastError(), "launching rms_stats");
}

} // namespace
} // namespace fused

void rms_stats(const RmsStatsArgs& args, Stream stream) {
  fused::require_device("rms_stats");
  fused::with_half_type(args.x.dtype,
                        [&](auto t) { fused::run_rms_stats<decltype(t)>(args, stream); });
}

} // namespace coda::gpu
