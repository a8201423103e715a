// What the fused-kernel translation units (fused/*.cu) share: the op chains' common pieces and
// their host-side parameters.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "coda/core/error.hpp"
#include "coda/epilogue/device/epilogue.cuh"
#include "coda/gemm/heuristic.hpp"
#include "coda/kernels/op_lists.hpp"
#include "gpu/backend.hpp"
#include "gpu/fused/kernels.hpp"

namespace coda::gpu::fused {

namespace dev = coda::epilogue::device;

// The schedule a kernel whose default is `kernel_default` runs now (set_fused_schedule).
FusedSchedule schedule_for(FusedSchedule kernel_default);

// A named kernel's default (sm90::fused_schedule, heuristic.hpp: where every kernel choice is
// made) as the FusedSchedule the helpers below take: K6's staged_wide is its staged variant.
inline FusedSchedule default_schedule(sm90::FusedKernel kernel, int32_t head_dim = 0,
                                      bool rounded_gradient = false) {
  switch (sm90::fused_schedule(kernel, head_dim, rounded_gradient)) {
  case sm90::Schedule::cooperative:
    return FusedSchedule::cooperative;
  case sm90::Schedule::pingpong:
    return FusedSchedule::pingpong;
  case sm90::Schedule::staged:
  case sm90::Schedule::staged_wide:
    return FusedSchedule::staged;
  }
  return FusedSchedule::cooperative;
}

// f(dev::CooperativeShape{}), f(dev::PingpongShape{}) or (kStaged: the kernel has a staged
// variant) f(dev::StagedShape{}), by schedule_for(kernel_default); a kernel without a staged
// variant asked for one runs its default.
template <bool kStaged, class F> void with_schedule(FusedSchedule kernel_default, F&& f) {
  FusedSchedule s = schedule_for(kernel_default);
  if (s == FusedSchedule::staged && !kStaged) s = kernel_default;
  if constexpr (kStaged)
    if (s == FusedSchedule::staged) return f(dev::StagedShape{});
  if (s == FusedSchedule::pingpong) return f(dev::PingpongShape{});
  return f(dev::CooperativeShape{});
}

using gpu::require_device;

// The shape of the ops before a Stage: on the staged schedule they run in the consumer
// warpgroups, each on its 64-row block (the cooperative view of the tile); elsewhere the list's.
template <class Shape>
using BeforeStage = std::conditional_t<Shape::kStaged, dev::TileShape<2, 64, Shape::kCols>, Shape>;

// A kernel's main output: stored from the staged tile itself on the staged schedule, through
// its own buffers elsewhere.
template <class Shape, class T>
using MainStore = dev::TileStore<Shape, T, /*reduce_add=*/false, /*in_place=*/true>;

// The device op family of the kernels' op lists (coda/kernels/op_lists.hpp): the ops of
// coda/epilogue/device on Shape and T, each as most kernels run it. kRstdPartials: the rstd
// partials a ScalePerRow stages per row (with_rstd_variant). A kernel that runs an op
// otherwise, or one not here (K4's Rope on its head_dim), derives its own family from this one,
// beside its launch.
template <class Shape, class T, int kRstdPartials = 32> struct DeviceOps {
  template <class... Ops> using List = dev::FusedEpilogue<Shape, Ops...>;
  template <class Op, class Reduce> using AuxReduce = dev::AuxReduce<Op, Reduce>;
  template <class Gate> using GatedPairStore = dev::GatedPairStore<Shape, T, Gate>;
  template <template <class> class R, int64_t kBlock = kReduceBlock>
  using ReduceOverN = dev::ReduceOverN<Shape, R, kBlock>;
  template <template <class> class R> using ReduceOverM = dev::ReduceOverM<Shape, R>;
  using ResidualAdd = dev::ResidualAdd<Shape, T>;
  using RmsNormBackward = dev::RmsNormBackward<Shape, T>;
  using ScaleByScalar = dev::ScaleByScalar;
  using ScalePerCol = dev::ScalePerCol<Shape, T>;
  using ScalePerRow = dev::ScalePerRow<BeforeStage<Shape>, dev::Pass::subtile, kRstdPartials>;
  using SelectPerRow = dev::SelectPerRow<Shape>;
  using SwigluBackward = dev::SwigluBackward<Shape, T>;
  using TileStore = dev::TileStore<Shape, T>;
  using Stage = dev::Stage<T>;
  using MainStore = fused::MainStore<Shape, T>;
};

// f(shape, std::integral_constant<int, P>{}) for a kernel on E4M3 operands whose ScalePerRow
// finishes rstd from the row partials: the FP8 mainloop's staged tile (Fp8StagedShape,
// P = dev::kPartialsInRegisters) by default, its cooperative tile (Fp8Shape, P = 32) when another
// schedule is forced (set_fused_schedule). The staged tile measured faster in all seven cases
// timed (K1, K2, K2g, K4 at head_dim 64; 3-10%, H100, 2026-12-06, 6fb950e; docs/fp8.md, "The
// ordered issue").
template <class F> void with_fp8_rstd_variant(F&& f) {
  if (schedule_for(FusedSchedule::staged) == FusedSchedule::staged)
    return f(dev::Fp8StagedShape{}, std::integral_constant<int, dev::kPartialsInRegisters>{});
  f(dev::Fp8Shape{}, std::integral_constant<int, 32>{});
}

// f(shape) for a kernel on E4M3 operands with no ops before its Stage (K7): the FP8 mainloop's
// staged tile (Fp8StagedShape) by default, its cooperative tile (Fp8Shape) when another schedule
// is forced (set_fused_schedule), as with_fp8_rstd_variant chooses.
template <class F> void with_fp8_schedule(F&& f) {
  if (schedule_for(FusedSchedule::staged) == FusedSchedule::staged) return f(dev::Fp8StagedShape{});
  f(dev::Fp8Shape{});
}

// f(bf16{}) or f(f16{}) for the call's 16-bit dtype.
template <class F> void with_half_type(DType dtype, F&& f) {
  gpu::with_half_type(dtype, "the fused GPU kernels", std::forward<F>(f));
}

// f(t, shape, std::integral_constant<int, P>{}) for a kernel with a staged variant whose
// ScalePerRow finishes rstd from the row partials: t the call's 16-bit type (with_half_type),
// shape its schedule's (with_schedule<true>), P the partials the ScalePerRow stages per row. On
// the staged schedule none (dev::kPartialsInRegisters: its consumers hold up to 32 per row in
// registers across the mainloop, so that 4 pipeline stages fit beside the staged tile; shared
// memory for 32 left 3); 32 otherwise.
template <class F> void with_rstd_variant(DType dtype, FusedSchedule kernel_default, F&& f) {
  with_half_type(dtype, [&](auto t) {
    with_schedule<true>(kernel_default, [&](auto shape) {
      if constexpr (decltype(shape)::kStaged)
        f(t, shape, std::integral_constant<int, dev::kPartialsInRegisters>{});
      else
        f(t, shape, std::integral_constant<int, 32>{});
    });
  });
}

// Runs the fused GEMM of an op list (Epi, a FusedEpilogue) on a and w, its ops' Params given in
// list order, as the CPU backend builds the same list's ops from their Args.
template <class Epi, class T, GemmLayout kLayout = GemmLayout::fwd> struct Launch;
template <class Shape, class... Ops, class T, GemmLayout kLayout>
struct Launch<dev::FusedEpilogue<Shape, Ops...>, T, kLayout> {
  using Epi = dev::FusedEpilogue<Shape, Ops...>;
  static void run(const TensorView& a, const TensorView& w, Stream stream,
                  const typename Ops::Params&... params) {
    dev::FusedGemm<Epi, T, kLayout>::run(a, w, typename Epi::Params{{params}...}, stream);
  }
  // E4M3 a and w (T = e4m3, Shape = Fp8Shape) with gemm_fp8's block scales.
  static void run_fp8(const TensorView& a, const TensorView& a_scales, const TensorView& w,
                      const TensorView& w_scales, Stream stream,
                      const typename Ops::Params&... params) {
    dev::FusedGemm<Epi, T, kLayout>::run_fp8(a, a_scales, w, w_scales,
                                             typename Epi::Params{{params}...}, stream);
  }
  // Either, by the operands' type T: run_fp8 for e4m3, else run (the scales absent), so that a
  // kernel's one launch serves both forms with its Params written once.
  static void run_operands(const TensorView& a, const TensorView& a_scales, const TensorView& w,
                           const TensorView& w_scales, Stream stream,
                           const typename Ops::Params&... params) {
    if constexpr (std::is_same_v<T, e4m3>)
      run_fp8(a, a_scales, w, w_scales, stream, params...);
    else
      run(a, w, stream, params...);
  }
};

// The Params of the family Ops' ScalePerRow for a kernel normalizing a (K1, K2, K4, K5):
// rstd[m] = rsqrt(sum_b sumsq_partials[m, b] / K + eps), K = a's columns, written to rstd_out
// when given.
template <class Ops, class NormedArgs>
typename Ops::ScalePerRow::Params rstd_params(const NormedArgs& args) {
  typename Ops::ScalePerRow::Params p;
  p.partials = args.sumsq_partials.template ptr<const float>();
  p.stride = args.sumsq_partials.stride[0];
  p.count = int32_t(args.sumsq_partials.shape[1]);
  p.rows = int32_t(args.sumsq_partials.shape[0]);
  p.width = float(args.a.shape[1]);
  p.eps = args.eps;
  p.factors_out = args.rstd_out.template ptr<float>();
  return p;
}

// Row partials [M, ceil(N / kBlock)] of an [M, N] output.
template <class Shape, template <class> class Reduction, int64_t kBlock = kReduceBlock>
typename dev::ReduceOverN<Shape, Reduction, kBlock>::Params
row_partials_params(const TensorView& partials, int64_t cols) {
  typename dev::ReduceOverN<Shape, Reduction, kBlock>::Params p;
  p.partials = partials.ptr<float>();
  p.stride = partials.stride[0];
  p.rows = int32_t(partials.shape[0]);
  p.cols = int32_t(cols);
  p.blocks = int32_t(partials.shape[1]);
  return p;
}

} // namespace coda::gpu::fused
