// The finishing sums of the partial reductions (coda/kernels/args.hpp): rstd from the row
// partials of the sum of squares, a scaled row sum (zeta from K7's partials), and a column sum
// into f32, bf16 or f16, maybe accumulated (dgamma from K6's partials).
//
// Each row of partials is summed by one thread in b order from 0, exactly as the CPU backend sums
// it (cpu/statistics.cpp), so the sums are bitwise equal to the CPU's, and so are the row and
// column reduces. rstd then goes through the shared rstd_from_sum_of_squares, whose device rsqrt
// (rsqrtf, as the fused GPU epilogue uses) may differ from the host's 1/sqrt by an ulp or two.
//
// A thread per row would read memory with a row-stride between lanes. Instead a warp owns 32
// rows and walks their partials 32 at a time: the lanes load a 32 x 32 block row by row
// (128 coalesced bytes per row), transposed into shared memory, then lane r sums row r's 32
// values in order. No atomics: each row is one thread's sequential sum.
#include <type_traits>

#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/reduction.hpp"
#include "gpu/auxiliary/common.cuh"
#include "gpu/auxiliary/kernels.hpp"

namespace coda::gpu {
namespace aux {
namespace {

constexpr int kWarps = 4; // per CTA, 32 rows each

template <class Finish>
__global__ void __launch_bounds__(kWarps * 32)
    row_sum_kernel(const float* __restrict__ partials, int64_t stride, int32_t rows, int32_t count,
                   Finish finish) {
  using R = epilogue::Sum<float>;
  __shared__ float block[kWarps][32][33]; // [row][partial], padded: both walks conflict-free
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * 32;
  if (row0 >= rows) return; // whole warps leave together
  const int my_rows = rows - row0 < 32 ? int(rows - row0) : 32;
  float(&tile)[32][33] = block[warp];
  typename R::State sum = R::identity();
  for (int32_t b0 = 0; b0 < count; b0 += 32) {
    const int cols = min(32, count - b0);
    if (lane < cols) {
      const float* column = partials + row0 * stride + b0 + lane;
      for (int r = 0; r < my_rows; ++r) tile[r][lane] = column[r * stride];
    }
    __syncwarp();
    if (lane < my_rows)
      for (int j = 0; j < cols; ++j) R::add(sum, tile[lane][j]);
    __syncwarp(); // the block is read before the next one overwrites it
  }
  if (lane < my_rows) finish(row0 + lane, R::finish(sum));
}

struct RstdFinish {
  float* rstd;
  float width, eps;
  __device__ void operator()(int64_t row, float sum) const {
    rstd[row] = epilogue::rstd_from_sum_of_squares(sum, width, eps);
  }
};

// out[row] = factor * sum, factor = value * (*tensor) when the device scalar is given (the CPU's
// ScaleByScalar factor), so it is rounded once before the product, as on the host.
struct RowScaleFinish {
  float* out;
  float value;
  const float* tensor; // optional [1]
  __device__ void operator()(int64_t row, float sum) const {
    const float factor = tensor != nullptr ? value * *tensor : value;
    out[row] = factor * sum;
  }
};

template <class T> struct ColFinish {
  T* out;
  bool accumulate;
  __device__ void operator()(int64_t row, float sum) const {
    out[row] = store_from_float<T>(accumulate ? load_as_float(out[row]) + sum : sum);
  }
};

template <class Finish>
void launch_row_sum(const TensorView& partials, const Finish& finish, Stream stream,
                    const char* kernel) {
  const int64_t rows = partials.shape[0];
  const auto blocks = unsigned(ceil_div<int64_t>(rows, 32 * kWarps));
  row_sum_kernel<<<blocks, kWarps * 32, 0, stream>>>(partials.ptr<const float>(),
                                                     partials.stride[0], int32_t(rows),
                                                     int32_t(partials.shape[1]), finish);
  check_launch(kernel);
}

} // namespace
} // namespace aux

void rstd_from_partials(const RstdArgs& args, Stream stream) {
  aux::require_device("rstd_from_partials");
  aux::launch_row_sum(args.partials,
                      aux::RstdFinish{args.rstd.ptr<float>(), float(args.n), args.eps}, stream,
                      "rstd_from_partials");
}

void reduce_row_partials(const RowReduceArgs& args, Stream stream) {
  aux::require_device("reduce_row_partials");
  // The scale's tensor pointer is null when it has none.
  aux::launch_row_sum(args.partials,
                      aux::RowScaleFinish{args.out.ptr<float>(), args.scale.value,
                                          args.scale.tensor.ptr<const float>()},
                      stream, "reduce_row_partials");
}

void reduce_col_partials(const ColReduceArgs& args, Stream stream) {
  aux::require_device("reduce_col_partials");
  const auto run = [&](auto t) {
    using T = decltype(t);
    aux::launch_row_sum(args.partials, aux::ColFinish<T>{args.out.ptr<T>(), args.accumulate},
                        stream, "reduce_col_partials");
  };
  if (args.out.dtype == DType::f32) return run(float{});
  aux::with_half_type(args.out.dtype, run);
}

} // namespace coda::gpu
