// What the fused-kernel translation units (kernels_*.cu) share: the op chains' common pieces and
// their host-side parameters.
#pragma once

#include <string>
#include <utility>

#include "coda/core/error.hpp"
#include "coda/epilogue/device/epilogue.cuh"
#include "gpu/backend.hpp"
#include "gpu/kernels_fused.hpp"

namespace coda::gpu::fused {

namespace dev = coda::epilogue::device;

// True when a kernel whose default schedule is `kernel_default` runs ping-pong now.
bool use_pingpong(FusedSchedule kernel_default);

// f(dev::CooperativeShape{}) or f(dev::PingpongShape{}), by use_pingpong(kernel_default).
template <class F> void with_schedule(FusedSchedule kernel_default, F&& f) {
  if (use_pingpong(kernel_default)) return f(dev::PingpongShape{});
  return f(dev::CooperativeShape{});
}

using gpu::require_device;

// f(bf16{}) or f(f16{}) for the call's 16-bit dtype.
template <class F> void with_half_type(DType dtype, F&& f) {
  gpu::with_half_type(dtype, "the fused GPU kernels", std::forward<F>(f));
}

// rstd[m] = rsqrt(sum_b partials[m, b] / width + eps), optionally written to rstd_out.
template <class Op>
typename Op::Params rstd_params(const TensorView& partials, int64_t width, float eps,
                                const TensorView& rstd_out) {
  typename Op::Params p;
  p.partials = partials.ptr<const float>();
  p.stride = partials.stride[0];
  p.count = int32_t(partials.shape[1]);
  p.rows = int32_t(partials.shape[0]);
  p.width = float(width);
  p.eps = eps;
  p.factors_out = rstd_out.ptr<float>();
  return p;
}

// Row partials [M, ceil(N / kReduceBlock)] of an [M, N] output.
template <class Shape, template <class> class Reduction>
typename dev::ReduceOverN<Shape, Reduction>::Params row_partials_params(const TensorView& partials,
                                                                        int64_t cols) {
  typename dev::ReduceOverN<Shape, Reduction>::Params p;
  p.partials = partials.ptr<float>();
  p.stride = partials.stride[0];
  p.rows = int32_t(partials.shape[0]);
  p.cols = int32_t(cols);
  p.blocks = int32_t(partials.shape[1]);
  return p;
}

} // namespace coda::gpu::fused
