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

// T the output's 16-bit type, Operand a's and w's: T, or e4m3 on the FP8 mainloop's tiles
// (docs/fp8.md; Fp8Shape, cooperative 128 x 128, or Fp8StagedShape).
template <class Shape, class T, int kPartials, class Operand = T>
void run_rms_scale(const RmsScaleArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T, kPartials>;
  Launch<kernels::RmsScaleOps<Ops>, Operand>::run_operands(
      args.a, args.a_scales, args.w, args.w_scales, stream, rstd_params<Ops>(args), {},
      Ops::MainStore::params("out", args.out));
}

} // namespace
} // namespace fused

void set_fused_schedule(FusedSchedule schedule) { fused::g_schedule = schedule; }

void gemm_rms_scale(const RmsScaleArgs& args, Stream stream) {
  fused::require_device("gemm_rms_scale");
  if (args.a.dtype == DType::e4m3)
    return fused::with_half_type(args.out.dtype, [&](auto t) {
      fused::with_fp8_rstd_variant([&](auto shape, auto p) {
        fused::run_rms_scale<decltype(shape), decltype(t), decltype(p)::value, e4m3>(args, stream);
      });
    });
  const FusedSchedule schedule = fused::default_schedule(sm90::FusedKernel::k1);
  fused::with_rstd_variant(args.a.dtype, schedule, [&](auto t, auto shape, auto p) {
    fused::run_rms_scale<decltype(shape), decltype(t), decltype(p)::value>(args, stream);
  });
}

} // namespace coda::gpu
