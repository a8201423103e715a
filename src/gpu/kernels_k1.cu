// K1 gemm_rms_scale: out = round(rstd[m] * (a · wᵀ)), rstd finished from the row partials.
// The schedule switch (set_fused_schedule) lives here too.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {

namespace {
FusedSchedule g_schedule = FusedSchedule::automatic;
} // namespace

bool use_pingpong(FusedSchedule kernel_default) {
  const FusedSchedule s = g_schedule == FusedSchedule::automatic ? kernel_default : g_schedule;
  return s == FusedSchedule::pingpong;
}

namespace {

template <class Shape, class T>
using RmsScaleEpilogue =
    dev::FusedEpilogue<Shape, dev::ScalePerRow<Shape>, dev::TileStore<Shape, T>>;

template <class Shape, class T> void run_rms_scale(const RmsScaleArgs& args, Stream stream) {
  using Epi = RmsScaleEpilogue<Shape, T>;
  typename Epi::Params p{};
  dev::get<0>(p) = rstd_params<dev::ScalePerRow<Shape>>(args.sumsq_partials, args.a.shape[1],
                                                        args.eps, args.rstd_out);
  dev::get<1>(p) = dev::TileStore<Shape, T>::params("out", args.out);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void set_fused_schedule(FusedSchedule schedule) { fused::g_schedule = schedule; }

void gemm_rms_scale(const RmsScaleArgs& args, Stream stream) {
  fused::require_device("gemm_rms_scale");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule(FusedSchedule::cooperative, [&](auto shape) {
      fused::run_rms_scale<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
