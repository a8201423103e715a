// The backward CODA kernels K6 and K7 (coda/kernels/args.hpp has their math): their op lists
// (coda/kernels/op_lists.hpp, the GPU's too) on the host ops, on their input-gradient GEMMs
// (dgrad layout: acc = a · w, w [K, N]; on E4M3 operands gemm_fp8's forward form, w the weight's
// transposed codes [N, K]: FusedGemm).
#include <cstdint>
#include <vector>

#include "cpu/backend.hpp"
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
  // From K = kRmsBackwardRoundedGradientMinK g is rounded to the 16-bit type (the GPU's staged
  // hand-over, its Stage<T>: staged_wide on 16-bit operands, the staged FP8 tile on E4M3 ones; as
  // an unfused dgrad stores it); below it stays fp32.
  const bool round = gemm.k >= kRmsBackwardRoundedGradientMinK;
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
  // tile rounds it there as every other schedule does). With act's FP8 copy in place of act: the
  // 16-bit act, as the GPU's staged tile holds it before it quantizes it, into a buffer of its
  // own, then its transposed copy as quantize_weight_fp8 makes it (the GPU kernel's definition:
  // its codes and scales are these, bit for bit).
  const bool fp8_copy = args.act_codes_t.data != nullptr;
  std::vector<uint16_t> act_values;
  TensorView act = args.act;
  if (fp8_copy) {
    const int64_t m = args.dpreact.shape[0], f = args.dpreact.shape[1] / 2;
    act_values.resize(size_t(m * f));
    act = make_view(act_values.data(), args.dpreact.dtype, m, f);
  }
  kernels::SwigluBackwardOps<HostOps> ops(
      {act.dtype}, {{args.preact, args.dpreact}, {args.zeta_partials}}, {act});
  gemm.run(ops);
  if (fp8_copy)
    quantize_weight_fp8({.w = act,
                         .codes = {},
                         .scales = {},
                         .codes_t = args.act_codes_t,
                         .scales_t = args.act_scales_t});
}

} // namespace coda::cpu
