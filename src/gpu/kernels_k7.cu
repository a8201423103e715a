// K7 gemm_swiglu_backward: the SwiGLU backward in the down projection's input-gradient GEMM
// (dgrad layout: dy = dx · w, w [K, F]). The op chain of the CPU backend
// (src/cpu/backward_kernels.cpp), on the device:
//   act = silu(g) u, dpreact = (dg, du) interleaved    SwigluBackward (preact by TMA as 32-bit
//                                                      (g, u) containers, dpreact stored alike)
//   zeta_partials = row partials of g dg + u du        ReduceOverN<Sum> on its aux (AuxReduce)
//   act                                                TileStore
//
// Always the ping-pong 128 x 128 schedule (an exp per element: a heavy epilogue, as K2's); its
// preact ring of 3 slots and 4 pipeline stages fill the 227 KB exactly (the container subtiles
// are 8 KB; one more slot would cost a stage). The cooperative 128 x 256 variant spills a
// register (ptxas, 4 bytes) with its stream-K state beside the 128 accumulators, so
// set_fused_schedule does not apply here.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

using Shape = dev::PingpongShape;

template <class T>
using SwigluBackwardEpilogue = dev::FusedEpilogue<
    Shape, dev::AuxReduce<dev::SwigluBackward<Shape, T, 3>, dev::ReduceOverN<Shape, epilogue::Sum>>,
    dev::TileStore<Shape, T>>;

template <class T> using Gemm = dev::FusedGemm<SwigluBackwardEpilogue<T>, T, GemmLayout::dgrad>;
static_assert(Gemm<bf16>::Config::kStages == 4 && Gemm<f16>::Config::kStages == 4,
              "K7's epilogue buffers leave room for 4 pipeline stages (see the file comment)");

template <class T> void run_swiglu_backward(const SwigluBackwardArgs& args, Stream stream) {
  const int64_t f = args.w.shape[1];
  typename SwigluBackwardEpilogue<T>::Params p{};
  dev::get<0>(p).op = dev::SwigluBackward<Shape, T, 3>::params(args.preact, args.dpreact);
  dev::get<0>(p).reduce = row_partials_params<Shape, epilogue::Sum>(args.zeta_partials, f);
  dev::get<1>(p) = dev::TileStore<Shape, T>::params("act", args.act);
  Gemm<T>::run(args.dx, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_swiglu_backward(const SwigluBackwardArgs& args, Stream stream) {
  fused::require_device("gemm_swiglu_backward");
  fused::with_half_type(args.dx.dtype,
                        [&](auto t) { fused::run_swiglu_backward<decltype(t)>(args, stream); });
}

} // namespace coda::gpu
