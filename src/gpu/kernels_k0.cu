// K0 gemm_residual_rms: x = a · wᵀ + residual (fp32); out = round(x), sumsq_partials = row
// partials of x² from the unrounded x, out_scaled = round(x * gamma[n]). The op chain of the CPU
// backend (src/cpu/forward_kernels.cpp), on the device. Shared memory holds only the residual's
// ring (3 subtiles); out and out_scaled go from registers to global memory (DirectStore), so
// that the cooperative 128 x 256 tile keeps 4 pipeline stages. (Out by TMA from a ring of 2
// needs 34816 bytes beside 4 stages, 1 KB more than the 227 KB hold.)
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T>
using ResidualRmsEpilogue =
    dev::FusedEpilogue<Shape, dev::ResidualAdd<Shape, T, 3>, dev::DirectStore<Shape, T>,
                       dev::ReduceOverN<Shape, epilogue::SumOfSquares>, dev::ScalePerCol<Shape, T>,
                       dev::DirectStore<Shape, T>>;
static_assert(dev::FusedGemm<ResidualRmsEpilogue<dev::CooperativeShape, bf16>, bf16>::Config::kStages == 4,
              "K0's epilogue buffers leave room for 4 pipeline stages (see the file comment)");

template <class Shape, class T> void run_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  using Epi = ResidualRmsEpilogue<Shape, T>;
  const int64_t n = args.w.shape[0];
  typename Epi::Params p{};
  dev::get<0>(p) = dev::ResidualAdd<Shape, T, 3>::params(args.residual, 1.f);
  dev::get<1>(p) = dev::DirectStore<Shape, T>::params(args.out);
  dev::get<2>(p) = row_partials_params<Shape, epilogue::SumOfSquares>(args.sumsq_partials, n);
  dev::get<3>(p) = {args.gamma.ptr<const T>(), int32_t(n)};
  dev::get<4>(p) = dev::DirectStore<Shape, T>::params(args.out_scaled);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  fused::require_device("gemm_residual_rms");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<false>(FusedSchedule::cooperative, [&](auto shape) {
      fused::run_residual_rms<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
