// K5 gemm_rms_lse: l = rstd[m] * (a · wᵀ) with w the LM head; logits = round(l), lse_partials =
// row partials of logsumexp over round(l) per kStagedReduceBlock columns (columns past the
// vocabulary masked), target_logit = round(l)[m, targets[m]] in fp32 (0 where the target is
// outside [0, V)): the numbers the cross-entropy reads (coda/epilogue/ops/round.hpp says why).
//
// One op list on every schedule (coda/kernels/op_lists.hpp, the CPU backend's too): the Stage
// rounds the logits (on the staged schedule the consumers hand them over there), the logits are
// stored, and the log-sum-exp and the target logit are taken from them.
#include "gpu/fused/common.cuh"

namespace coda::gpu {
namespace fused {
namespace {

template <class Shape, class T, int kPartials>
void run_rms_lse(const RmsLseArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T, kPartials>;
  const int64_t m = args.a.shape[0], vocab = args.w.shape[0];
  Launch<kernels::RmsLseOps<Ops>, T>::run(
      args.a, args.w, stream, rstd_params<Ops>(args), {},
      Ops::MainStore::params("logits", args.logits),
      row_partials_params<Shape, epilogue::LogSumExp, kStagedReduceBlock>(args.lse_partials, vocab),
      Ops::SelectPerRow::params(args.targets, args.target_logit, m, vocab));
}

} // namespace
} // namespace fused

void gemm_rms_lse(const RmsLseArgs& args, Stream stream) {
  fused::require_device("gemm_rms_lse");
  // Staged by default (H200, bench_fused: 1.26x the plain GEMM at Llama-1B against ping-pong's
  // 1.52x, 1.07x against 1.25x at Llama-8B).
  const FusedSchedule schedule = fused::default_schedule(sm90::FusedKernel::k5);
  fused::with_rstd_variant(args.a.dtype, schedule, [&](auto t, auto shape, auto p) {
    fused::run_rms_lse<decltype(shape), decltype(t), decltype(p)::value>(args, stream);
  });
}

} // namespace coda::gpu
