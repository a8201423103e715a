// K4 gemm_rms_rope: out = round(RoPE(round(rstd[m] * (a · wᵀ)))) on the fused [Q; K; V] projection;
// RoPE turns the Q and K heads (GQA: any n_q_heads, n_kv_heads), V passes through. Both tile
// widths (256 and 128 columns) hold whole heads for head_dim 64 and 128, the instantiated ones.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

// K4's device ops: Rope on its head_dim; the scale and the rounding before RoPE in the
// consumers before the hand-over (staged), in the prepass with RoPE (the register schedules:
// rotate-half partners straddle subtiles).
template <class Shape, class T, int kHeadDim, int kPartials>
struct RopeDeviceOps : DeviceOps<Shape, T, kPartials> {
  using ScalePerRow =
      std::conditional_t<Shape::kStaged, typename DeviceOps<Shape, T, kPartials>::ScalePerRow,
                         dev::ScalePerRow<Shape, dev::Pass::prepass>>;
  using Stage = dev::Stage<T, /*prepass=*/!Shape::kStaged>;
  using Rope = dev::Rope<Shape, kHeadDim>;
};

// T the output's 16-bit type, Operand a's and w's: T, or e4m3 on the FP8 mainloop's tile
// (docs/fp8.md; Fp8Shape, cooperative 128 x 128: whole heads of 64 or 128 columns; RoPE and the
// rstd scale in the prepass, as on the cooperative 16-bit tile).
template <class Shape, class T, int kHeadDim, int kPartials, class Operand = T>
void run_rms_rope(const RmsRopeArgs& args, Stream stream) {
  using Ops = RopeDeviceOps<Shape, T, kHeadDim, kPartials>;
  const RopeSpec& rope = args.rope;
  Launch<kernels::RmsRopeOps<Ops>, Operand>::run_operands(
      args.a, args.a_scales, args.w, args.w_scales, stream, rstd_params<Ops>(args), {},
      Ops::Rope::params(rope.positions, rope.inv_freq, args.a.shape[0],
                        (rope.n_q_heads + rope.n_kv_heads) * rope.head_dim),
      Ops::MainStore::params("out", args.out));
}

} // namespace
} // namespace fused

void gemm_rms_rope(const RmsRopeArgs& args, Stream stream) {
  fused::require_device("gemm_rms_rope");
  const int32_t head_dim = args.rope.head_dim;
  if (head_dim != 64 && head_dim != 128)
    throw Error(Status::not_supported, "the GPU gemm_rms_rope supports head_dim 64 and 128; got " +
                                           std::to_string(head_dim) +
                                           " (use the CPU backend for other head sizes)");
  if (args.a.dtype == DType::e4m3)
    return fused::with_half_type(args.out.dtype, [&](auto t) {
      if (head_dim == 128) // (cooperative only: not tried staged, whose prepass holds a head)
        return fused::run_rms_rope<fused::dev::Fp8Shape, decltype(t), 128, 32, e4m3>(args, stream);
      fused::with_fp8_rstd_variant([&](auto shape, auto p) {
        fused::run_rms_rope<decltype(shape), decltype(t), 64, decltype(p)::value, e4m3>(args,
                                                                                        stream);
      });
    });
  // head_dim 64 has a staged variant (a 192-column tile holds 3 heads), 128 none (it would cut
  // its heads); which runs by default: sm90::fused_schedule.
  const FusedSchedule schedule = fused::default_schedule(sm90::FusedKernel::k4, head_dim);
  if (head_dim == 64)
    fused::with_rstd_variant(args.a.dtype, schedule, [&](auto t, auto shape, auto p) {
      fused::run_rms_rope<decltype(shape), decltype(t), 64, decltype(p)::value>(args, stream);
    });
  else
    fused::with_half_type(args.a.dtype, [&](auto t) {
      fused::with_schedule<false>(schedule, [&](auto shape) {
        fused::run_rms_rope<decltype(shape), decltype(t), 128, 32>(args, stream);
      });
    });
}

} // namespace coda::gpu
