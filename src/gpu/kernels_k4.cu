// K4 gemm_rms_rope: out = round(RoPE(rstd[m] * (a · wᵀ))) on the fused [Q; K; V] projection;
// RoPE turns the Q and K heads (GQA: any n_q_heads, n_kv_heads), V passes through. Both tile
// widths (256 and 128 columns) hold whole heads for head_dim 64 and 128, the instantiated ones.
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T, int kHeadDim>
using RmsRopeEpilogue = dev::FusedEpilogue<Shape, dev::ScalePerRow<Shape, dev::Pass::prepass>,
                                           dev::Rope<Shape, kHeadDim>, dev::TileStore<Shape, T>>;

template <class Shape, class T, int kHeadDim>
void run_rms_rope(const RmsRopeArgs& args, Stream stream) {
  using Epi = RmsRopeEpilogue<Shape, T, kHeadDim>;
  const RopeSpec& rope = args.rope;
  typename Epi::Params p{};
  dev::get<0>(p) = rstd_params<dev::ScalePerRow<Shape, dev::Pass::prepass>>(
      args.sumsq_partials, args.a.shape[1], args.eps, args.rstd_out);
  dev::get<1>(p) = {rope.positions.ptr<const int32_t>(), rope.inv_freq.ptr<const float>(),
                    int32_t(args.a.shape[0]),
                    int32_t((rope.n_q_heads + rope.n_kv_heads) * rope.head_dim)};
  dev::get<2>(p) = dev::TileStore<Shape, T>::params("out", args.out);
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
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
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule(FusedSchedule::cooperative, [&](auto shape) {
      using Shape = decltype(shape);
      if (head_dim == 64)
        fused::run_rms_rope<Shape, decltype(t), 64>(args, stream);
      else
        fused::run_rms_rope<Shape, decltype(t), 128>(args, stream);
    });
  });
}

} // namespace coda::gpu
