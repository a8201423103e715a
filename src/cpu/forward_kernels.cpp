// The forward CODA kernels K0, K1, K2, K2g, K4, K5 (coda/kernels/args.hpp has their math): their
// op lists (coda/kernels/op_lists.hpp, the GPU's too) on the host ops, on acc = a · wᵀ. The Stage
// of K1, K2, K2g, K4 and K5 rounds z = rstd * acc to the call's 16-bit type, as the GPU's staged
// schedule hands its tile over (and its other schedules' Stage op rounds), so both backends run
// the same numbers.
#include <string>

#include "coda/epilogue/ops/geglu.hpp"
#include "coda/epilogue/ops/swiglu.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

namespace {

// rstd[m] = rsqrt(sum_b sumsq_partials[m, b] / K + eps), K the normalized width (a's columns).
template <class NormedArgs> ep::ScalePerRow::Args rstd_scale(const NormedArgs& args) {
  ep::ScalePerRow::Args scale;
  scale.sumsq_partials = args.sumsq_partials;
  scale.width = args.a.shape[1];
  scale.eps = args.eps;
  scale.factors_out = args.rstd_out;
  return scale;
}

// K2 and its variants with another gated activation (Gate: ep::SwigluGate, ...).
template <class Gate, class GatedArgs>
void run_rms_gated(const char* kernel, const GatedArgs& args, Tile tile) {
  const FusedGemm gemm(kernel, GemmLayout::fwd, args.a, args.w, tile, args.a_scales, args.w_scales);
  require(gemm.n % 2 == 0,
          std::string("cpu::") + kernel + ": the fused gate/up width must be even");
  kernels::RmsGatedOps<HostOps, Gate> ops(rstd_scale(args), {args.preact.dtype}, {args.preact},
                                          {args.act});
  gemm.run(ops);
}

} // namespace

void gemm_residual_rms(const ResidualRmsArgs& args, Tile tile) {
  const FusedGemm gemm("gemm_residual_rms", GemmLayout::fwd, args.a, args.w, tile, args.a_scales,
                       args.w_scales);
  gemm.require_row_partials(args.sumsq_partials, "sumsq_partials");
  kernels::ResidualRmsOps<HostOps> ops({args.residual, 1.f}, {args.out}, {args.sumsq_partials},
                                       {args.gamma}, {args.out_scaled});
  gemm.run(ops);
}

void gemm_rms_scale(const RmsScaleArgs& args, Tile tile) {
  const FusedGemm gemm("gemm_rms_scale", GemmLayout::fwd, args.a, args.w, tile, args.a_scales,
                       args.w_scales);
  kernels::RmsScaleOps<HostOps> ops(rstd_scale(args), {args.out.dtype}, {args.out});
  gemm.run(ops);
}

void gemm_rms_swiglu(const RmsSwigluArgs& args, Tile tile) {
  run_rms_gated<ep::SwigluGate>("gemm_rms_swiglu", args, tile);
}

void gemm_rms_geglu(const RmsGegluArgs& args, Tile tile) {
  run_rms_gated<ep::GegluGate>("gemm_rms_geglu", args, tile);
}

void gemm_rms_rope(const RmsRopeArgs& args, Tile tile) {
  tile = checked_tile(tile, "gemm_rms_rope");
  const int64_t head_dim = args.rope.head_dim;
  require(head_dim >= 2 && head_dim % 2 == 0 && args.w.shape[0] % head_dim == 0,
          "cpu::gemm_rms_rope: head_dim must be even and divide the QKV width");
  // RoPE pairs columns half a head apart, so a tile holds whole heads. K4 writes no partials,
  // so the tile width is free to grow to a multiple of head_dim.
  tile.n = ceil_div(tile.n, head_dim) * head_dim;
  const FusedGemm gemm("gemm_rms_rope", GemmLayout::fwd, args.a, args.w, tile, args.a_scales,
                       args.w_scales);
  kernels::RmsRopeOps<HostOps> ops(rstd_scale(args), {args.out.dtype},
                                   rope_args(args.rope, /*inverse=*/false), {args.out});
  gemm.run(ops);
}

void gemm_rms_lse(const RmsLseArgs& args, Tile tile) {
  const FusedGemm gemm("gemm_rms_lse", GemmLayout::fwd, args.a, args.w, tile);
  gemm.require_row_partials(args.lse_partials, "lse_partials");
  // The log-sum-exp and the target logit of the logits as stored (rounded at the Stage), the
  // numbers cross_entropy will read.
  kernels::RmsLseOps<HostOps> ops(rstd_scale(args), {args.logits.dtype}, {args.logits},
                                  {args.lse_partials}, {args.targets, gemm.n, args.target_logit});
  gemm.run(ops);
}

} // namespace coda::cpu
