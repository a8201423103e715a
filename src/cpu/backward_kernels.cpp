// The backward CODA kernels K6 and K7 (coda/kernels/args.hpp has their math): their op lists
// (coda/kernels/op_lists.hpp, the GPU's too) on the host ops, on their input-gradient GEMMs
// (dgrad layout: acc = a · w, w [K, N]; on E4M3 operands gemm_fp8's forward form, w the weight's
// transposed codes [N, K]: FusedGemm).
#include "cpu/executor.hpp"

namespace coda::cpu {

namespace {

// K6 on one of its lists: g rounded or not, dx accumulated or not.
template <bool kRounded, bool kAccumulate, class... OpArgs>
void run_rms_backward(const FusedGemm& gemm, const OpArgs&... op_args) {
  kernels::RmsBackwardOps<HostOps, kRounded, kAccumulate> ops(op_args...);
  gemm.run(ops);
}

} // namespace

void gemm_rms_backward(const RmsBackwardArgs& args, Tile tile) {
  const FusedGemm gemm("gemm_rms_backward", GemmLayout::dgrad, args.dz, args.w, tile,
                       args.dz_scales, args.w_scales);
  gemm.require_col_partials(args.dgamma_partials, "dgamma_partials");
  const ep::ScaleByScalar::Args alpha{args.alpha.value, args.alpha.tensor};
  const ep::RoundTo::Args rounded{args.dx.dtype};
  using Norm = HostOps::AuxReduce<ep::RmsNormBackward, ep::ReduceOverM<ep::Sum>>;
  const Norm::Args norm{{args.x, args.rstd, args.zeta, args.gamma, args.h_hat},
                        {args.dgamma_partials}};
  const ep::ResidualAdd::Args existing{args.dx, 1.f}; // read once, rounded once by the store
  const ep::TileStore::Args dx{args.dx};
  // From K = kRmsBackwardRoundedGradientMinK g is rounded to the 16-bit type (the GPU's
  // staged_wide hand-over, its Stage<T>: as an unfused dgrad stores it); below it stays fp32, and
  // at every K on E4M3 operands (the GPU's FP8 tile hands nothing over).
  const bool round = args.dz.dtype != DType::e4m3 && gemm.k >= kRmsBackwardRoundedGradientMinK;
  if (round && args.accumulate)
    run_rms_backward<true, true>(gemm, alpha, rounded, norm, existing, dx);
  else if (round)
    run_rms_backward<true, false>(gemm, alpha, rounded, norm, dx);
  else if (args.accumulate)
    run_rms_backward<false, true>(gemm, alpha, norm, existing, dx);
  else
    run_rms_backward<false, false>(gemm, alpha, norm, dx);
}

void gemm_swiglu_backward(const SwigluBackwardArgs& args, Tile tile) {
  const FusedGemm gemm("gemm_swiglu_backward", GemmLayout::dgrad, args.dx, args.w, tile,
                       args.dx_scales, args.w_scales);
  gemm.require_row_partials(args.zeta_partials, "zeta_partials");
  // dy rounded at the Stage, as an unfused dgrad stores it, on E4M3 operands too (the GPU's FP8
  // tile rounds it there as every other schedule does).
  kernels::SwigluBackwardOps<HostOps> ops(
      {args.act.dtype}, {{args.preact, args.dpreact}, {args.zeta_partials}}, {args.act});
  gemm.run(ops);
}

} // namespace coda::cpu
