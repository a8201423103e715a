// K7 gemm_swiglu_backward: the SwiGLU backward in the down projection's input-gradient GEMM
// (dgrad layout: dy = round(dx · w), w [K, F]; on E4M3 operands gemm_fp8's forward form, w the
// weight's transposed codes [F, K]). Its op list (coda/kernels/op_lists.hpp, the CPU backend's
// too) on the device ops:
//   dy rounded to T                                    Stage (the staged schedule's hand-over)
//   act = silu(g) u, dpreact = (dg, du) interleaved    SwigluBackward (ping-pong: preact by TMA as
//                                                      32-bit (g, u) containers, dpreact stored
//                                                      alike) or SwigluBackwardGlobal (staged:
//                                                      each thread's containers from and to
//                                                      global memory)
//   zeta_partials = row partials of g dg + u du        ReduceOverN<Sum> on its aux (AuxReduce), one
//                                                      per kStagedReduceBlock columns
//   act                                                TileStore
//
// Ping-pong 128 x 128: its preact ring of 3 slots and 4 pipeline stages fill the 227 KB exactly
// (the container subtiles are 8 KB; one more slot would cost a stage). Staged 128 x 192: no
// epilogue buffers beside the staged tile, so 4 stages. The cooperative 128 x 256 variant
// spills a register (ptxas, 4 bytes) with its stream-K state beside the 128 accumulators, so
// it is not built: forcing cooperative runs the default.
// E4M3 dx and w (docs/fp8.md): by default the staged ops on the FP8 mainloop's staged 128 x 128
// tile (Fp8StagedShape, 6 stages; its consumers run no op before the Stage, so the register split
// gives them 176 and the epilogue warpgroup 136: at 104 it spilled 12 bytes, gemm/config.hpp);
// with another schedule forced, the ping-pong's ops (SwigluBackward's TMA ring of 3 slots: 4
// pipeline stages, 1 KB to spare) on the cooperative 128 x 128 tile (Fp8Shape: each warpgroup's
// 64 x 128 half). Either tile's 128 columns are two zeta reduction blocks; dy is rounded at its
// Stage as on the 16-bit tiles.
// With act_codes_t (E4M3 operands only): act's transposed FP8 copy in place of act, the MainStore
// role played by QuantizeTileTransposed (a staged 128 x 128 tile is one of its scale blocks), on
// the staged FP8 tile whatever schedule is forced (the op needs the staged tile; its 16 bytes of
// shared memory keep the 6 stages).
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

// K7's device ops: its SwigluBackward per schedule (see the file comment).
template <class Shape, class T> struct SwigluBackwardDeviceOps : DeviceOps<Shape, T> {
  using SwigluBackward = std::conditional_t<Shape::kStaged, dev::SwigluBackwardGlobal<Shape, T>,
                                            dev::SwigluBackward<Shape, T, 3>>;
};
template <class Shape, class T>
using SwigluBackwardEpilogue = kernels::SwigluBackwardOps<SwigluBackwardDeviceOps<Shape, T>>;
template <class Shape, class T>
using Gemm = dev::FusedGemm<SwigluBackwardEpilogue<Shape, T>, T, GemmLayout::dgrad>;

static_assert(Gemm<dev::PingpongShape, bf16>::Config::kStages == 4 &&
                  Gemm<dev::PingpongShape, f16>::Config::kStages == 4,
              "K7's epilogue buffers leave room for 4 pipeline stages (see the file comment)");
static_assert(Gemm<dev::StagedShape, bf16>::Config::kStages == 4 &&
                  Gemm<dev::StagedShape, f16>::Config::kStages == 4,
              "the staged K7 keeps no epilogue buffers: 4 pipeline stages");
static_assert(SwigluBackwardEpilogue<dev::StagedShape, bf16>::kWarpLocal,
              "the staged K7's epilogue runs warp-local (no warpgroup barrier per subtile)");
template <class T> using Fp8Gemm = dev::FusedGemm<SwigluBackwardEpilogue<dev::Fp8Shape, T>, e4m3>;
static_assert(Fp8Gemm<bf16>::Config::kStages == 4 && Fp8Gemm<f16>::Config::kStages == 4,
              "on the FP8 tile K7's ring of 3 slots leaves room for 4 pipeline stages (4: 3)");
template <class T>
using Fp8StagedGemm = dev::FusedGemm<SwigluBackwardEpilogue<dev::Fp8StagedShape, T>, e4m3>;
static_assert(SwigluBackwardEpilogue<dev::Fp8StagedShape, bf16>::kWarpLocal,
              "the staged FP8 K7's epilogue runs warp-local, as the 16-bit staged one");

// The staged FP8 K7 writing act's transposed FP8 copy (act_codes_t) in place of act.
template <class T>
struct SwigluBackwardFp8CopyOps : SwigluBackwardDeviceOps<dev::Fp8StagedShape, T> {
  using MainStore = dev::QuantizeTileTransposed<dev::Fp8StagedShape, T>;
};
template <class T> using Fp8CopyEpilogue = kernels::SwigluBackwardOps<SwigluBackwardFp8CopyOps<T>>;
static_assert(Fp8CopyEpilogue<bf16>::kWarpLocal && Fp8CopyEpilogue<f16>::kWarpLocal,
              "each warp stores its rows of the FP8 copy and releases the staged tile itself, "
              "which the driver's per-warp release wait covers only on a warp-local list");
static_assert(dev::FusedGemm<Fp8CopyEpilogue<bf16>, e4m3>::Config::kStages ==
                      Fp8StagedGemm<bf16>::Config::kStages &&
                  dev::FusedGemm<Fp8CopyEpilogue<f16>, e4m3>::Config::kStages ==
                      Fp8StagedGemm<f16>::Config::kStages,
              "the FP8 copy's 16 bytes of shared memory keep the staged FP8 K7's stages");

// K7 on Shape's tile with the device ops Ops, Operand dx's and w's: the outputs' 16-bit type in
// the dgrad layout (w [K, F]), or e4m3 on an FP8 tile in the forward form (w the weight's
// transposed codes [F, K], SwigluBackwardArgs); `main_store` the list's MainStore parameters
// (act's 16-bit store, or its FP8 copy).
template <class Shape, class Ops, class Operand>
void launch_swiglu_backward(const SwigluBackwardArgs& args,
                            const typename Ops::MainStore::Params& main_store, Stream stream) {
  constexpr bool kFp8 = std::is_same_v<Operand, e4m3>;
  const int64_t f = kFp8 ? args.w.shape[0] : args.w.shape[1];
  Launch<kernels::SwigluBackwardOps<Ops>, Operand, kFp8 ? GemmLayout::fwd : GemmLayout::dgrad>::
      run_operands(
          args.dx, args.dx_scales, args.w, args.w_scales, stream, {},
          {Ops::SwigluBackward::params(args.preact, args.dpreact),
           row_partials_params<Shape, epilogue::Sum, kStagedReduceBlock>(args.zeta_partials, f)},
          main_store);
}

// Shape's tile, T the outputs' 16-bit type, act stored in 16 bits.
template <class Shape, class T, class Operand = T>
void run_swiglu_backward(const SwigluBackwardArgs& args, Stream stream) {
  using Ops = SwigluBackwardDeviceOps<Shape, T>;
  launch_swiglu_backward<Shape, Ops, Operand>(args, Ops::MainStore::params("act", args.act),
                                              stream);
}

// act's FP8 copy (act_codes_t, act_scales_t) on the staged FP8 tile, T the outputs' 16-bit type.
template <class T>
void run_swiglu_backward_fp8_copy(const SwigluBackwardArgs& args, Stream stream) {
  using Ops = SwigluBackwardFp8CopyOps<T>;
  launch_swiglu_backward<dev::Fp8StagedShape, Ops, e4m3>(
      args, Ops::MainStore::params(args.act_codes_t, args.act_scales_t), stream);
}

// Ping-pong or staged, staged by default. With its epilogue's instruction count trimmed
// (c6f7324: ftz transcendentals, one row pointer per subtile) the staged kernel measured 1.469x
// the plain GEMM at Llama-1B (ping-pong 1.511) and 1.116x at Llama-8B (ping-pong 1.342) on the
// H200. The cooperative variant is not built (see the file comment): forcing cooperative runs
// the staged kernel.
template <class F> void with_k7_schedule(F&& f) {
  if (schedule_for(default_schedule(sm90::FusedKernel::k7)) == FusedSchedule::pingpong)
    return f(dev::PingpongShape{});
  f(dev::StagedShape{});
}

} // namespace
} // namespace fused

void gemm_swiglu_backward(const SwigluBackwardArgs& args, Stream stream) {
  fused::require_device("gemm_swiglu_backward");
  if (args.dx.dtype == DType::e4m3 && args.act_codes_t.data != nullptr)
    return fused::with_half_type(args.dpreact.dtype, [&](auto t) {
      fused::run_swiglu_backward_fp8_copy<decltype(t)>(args, stream);
    });
  if (args.dx.dtype == DType::e4m3)
    return fused::with_half_type(args.act.dtype, [&](auto t) {
      fused::with_fp8_schedule([&](auto shape) {
        fused::run_swiglu_backward<decltype(shape), decltype(t), e4m3>(args, stream);
      });
    });
  fused::with_half_type(args.dx.dtype, [&](auto t) {
    fused::with_k7_schedule([&](auto shape) {
      fused::run_swiglu_backward<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
