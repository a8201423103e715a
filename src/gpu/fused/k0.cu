// K0 gemm_residual_rms: x = a · wᵀ + residual (fp32); out = round(x), sumsq_partials = row
// partials of x² from the unrounded x, out_scaled = round(x * gamma[n]). Its op list
// (coda/kernels/op_lists.hpp, the CPU backend's too) on the device ops.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T> void run_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T>;
  const int64_t n = args.w.shape[0];
  Launch<kernels::ResidualRmsOps<Ops>, T>::run(
      args.a, args.w, stream, Ops::ResidualAdd::params(args.residual, 1.f),
      Ops::TileStore::params("out", args.out),
      row_partials_params<Shape, epilogue::SumOfSquares>(args.sumsq_partials, n),
      Ops::ScalePerCol::params(args.gamma, n),
      Ops::TileStore::params("out_scaled", args.out_scaled));
}

} // namespace
} // namespace fused

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  fused::require_device("gemm_residual_rms");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<false>(fused::default_schedule(sm90::FusedKernel::k0), [&](auto shape) {
      fused::run_residual_rms<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
