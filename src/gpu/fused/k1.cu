// K1 gemm_rms_scale: out = round(rstd[m] * (a · wᵀ)), rstd finished from the row partials.
// The schedule switch (set_fused_schedule) lives here too.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {

namespace {
FusedSchedule g_schedule = FusedSchedule::automatic;
} // namespace

FusedSchedule schedule_for(FusedSchedule kernel_default) {
  return g_schedule == FusedSchedule::automatic ? kernel_default : g_schedule;
}

namespace {

template <class Shape, class T, int kPartials>
void run_rms_scale(const RmsScaleArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T, kPartials>;
  using Epi = kernels::RmsScaleOps<Ops>;
  typename Epi::Params p{};
  dev::get<0>(p) = rstd_params<typename Ops::ScalePerRow>(args.sumsq_partials, args.a.shape[1],
                                                          args.eps, args.rstd_out);
  dev::get<2>(p) = Ops::MainStore::params("out", args.out);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void set_fused_schedule(FusedSchedule schedule) { fused::g_schedule = schedule; }

void gemm_rms_scale(const RmsScaleArgs& args, Stream stream) {
  fused::require_device("gemm_rms_scale");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<true>(FusedSchedule::staged, [&](auto shape) {
      using Shape = decltype(shape);
      fused::with_staged_partials<Shape>([&](auto partials) {
        fused::run_rms_scale<Shape, decltype(t), decltype(partials)::value>(args, stream);
      });
    });
  });
}

} // namespace coda::gpu
