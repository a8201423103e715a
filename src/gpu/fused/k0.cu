// K0 gemm_residual_rms: x = a · wᵀ + residual (fp32); out = round(x), sumsq_partials = row
// partials of x² from the unrounded x, out_scaled = round(x * gamma[n]). Its op list
// (coda/kernels/op_lists.hpp, the CPU backend's too) on the device ops.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

// Shape's tile, T the outputs' 16-bit type, Operand a's and w's: T, or e4m3 on the FP8 mainloop's
// tile (docs/fp8.md; Fp8Shape, cooperative 128 x 128: whole 128-column reduction blocks).
template <class Shape, class T, class Operand = T>
void run_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T>;
  const int64_t n = args.w.shape[0];
  Launch<kernels::ResidualRmsOps<Ops>, Operand>::run_operands(
      args.a, args.a_scales, args.w, args.w_scales, stream,
      Ops::ResidualAdd::params(args.residual, 1.f), Ops::TileStore::params("out", args.out),
      row_partials_params<Shape, epilogue::SumOfSquares>(args.sumsq_partials, n),
      Ops::ScalePerCol::params(args.gamma, n),
      Ops::TileStore::params("out_scaled", args.out_scaled));
}

} // namespace
} // namespace fused

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  fused::require_device("gemm_residual_rms");
  if (args.a.dtype == DType::e4m3)
    return fused::with_half_type(args.out.dtype, [&](auto t) {
      fused::run_residual_rms<fused::dev::Fp8Shape, decltype(t), e4m3>(args, stream);
    });
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<false>(fused::default_schedule(sm90::FusedKernel::k0), [&](auto shape) {
      fused::run_residual_rms<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
