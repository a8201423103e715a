// K0 gemm_residual_rms: x = a · wᵀ + residual (fp32); out = round(x), sumsq_partials = row
// partials of x² from the unrounded x, out_scaled = round(x * gamma[n]). Its op list
// (coda/kernels/op_lists.hpp, the CPU backend's too) on the device ops.
#include <tuple>

#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

// The op list's Params in list order.
template <class Shape, class Ops> auto residual_rms_params(const ResidualRmsArgs& args) {
  const int64_t n = args.w.shape[0];
  return std::make_tuple(Ops::ResidualAdd::params(args.residual, 1.f),
                         Ops::TileStore::params("out", args.out),
                         row_partials_params<Shape, epilogue::SumOfSquares>(args.sumsq_partials, n),
                         Ops::ScalePerCol::params(args.gamma, n),
                         Ops::TileStore::params("out_scaled", args.out_scaled));
}

template <class Shape, class T> void run_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T>;
  std::apply(
      [&](const auto&... params) {
        Launch<kernels::ResidualRmsOps<Ops>, T>::run(args.a, args.w, stream, params...);
      },
      residual_rms_params<Shape, Ops>(args));
}

// E4M3 a and w (docs/fp8.md): the same ops on the FP8 mainloop's tile (Fp8Shape, cooperative
// 128 x 128: whole 128-column reduction blocks), T the outputs' 16-bit type.
template <class T> void run_residual_rms_fp8(const ResidualRmsArgs& args, Stream stream) {
  using Ops = DeviceOps<dev::Fp8Shape, T>;
  std::apply(
      [&](const auto&... params) {
        Launch<kernels::ResidualRmsOps<Ops>, e4m3>::run_fp8(args.a, args.a_scales, args.w,
                                                            args.w_scales, stream, params...);
      },
      residual_rms_params<dev::Fp8Shape, Ops>(args));
}

} // namespace
} // namespace fused

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  fused::require_device("gemm_residual_rms");
  if (args.a.dtype == DType::e4m3)
    return fused::with_half_type(
        args.out.dtype, [&](auto t) { fused::run_residual_rms_fp8<decltype(t)>(args, stream); });
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<false>(fused::default_schedule(sm90::FusedKernel::k0), [&](auto shape) {
      fused::run_residual_rms<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
