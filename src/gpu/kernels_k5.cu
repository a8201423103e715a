// K5 gemm_rms_lse: l = rstd[m] * (a · wᵀ) with w the LM head; logits = round(l), lse_partials =
// row partials of logsumexp over round(l) (columns past the vocabulary masked), target_logit
// = round(l)[m, targets[m]] in fp32 (0 where the target is outside [0, V)): the numbers the
// cross-entropy reads (coda/epilogue/ops/round.hpp says why).
#include "coda/epilogue/device/ops/round.cuh"
#include "gpu/kernels_fused.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T>
using RmsLseEpilogue =
    dev::FusedEpilogue<Shape, dev::ScalePerRow<Shape>, dev::TileStore<Shape, T>,
                       dev::RoundTo<Shape, T>, dev::ReduceOverN<Shape, epilogue::LogSumExp>,
                       dev::SelectPerRow<Shape>>;

template <class Shape, class T> void run_rms_lse(const RmsLseArgs& args, Stream stream) {
  using Epi = RmsLseEpilogue<Shape, T>;
  const int64_t m = args.a.shape[0], vocab = args.w.shape[0];
  typename Epi::Params p{};
  dev::get<0>(p) = rstd_params<dev::ScalePerRow<Shape>>(args.sumsq_partials, args.a.shape[1],
                                                        args.eps, args.rstd_out);
  dev::get<1>(p) = dev::TileStore<Shape, T>::params("logits", args.logits);
  dev::get<3>(p) = row_partials_params<Shape, epilogue::LogSumExp>(args.lse_partials, vocab);
  dev::get<4>(p) = {args.targets.ptr<const int32_t>(), args.target_logit.ptr<float>(), int32_t(m),
                    int32_t(vocab)};
  dev::FusedGemm<Epi, T>::run(args.a, args.w, p, stream);
}

} // namespace
} // namespace fused

void gemm_rms_lse(const RmsLseArgs& args, Stream stream) {
  fused::require_device("gemm_rms_lse");
  fused::with_half_type(args.a.dtype, [&](auto t) {
    fused::with_schedule<false>(FusedSchedule::pingpong, [&](auto shape) {
      fused::run_rms_lse<decltype(shape), decltype(t)>(args, stream);
    });
  });
}

} // namespace coda::gpu
