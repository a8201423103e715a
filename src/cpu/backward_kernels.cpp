// The backward CODA kernels K6 and K7 (coda/kernels/args.hpp has their math) as ordered
// epilogue-op chains on their input-gradient GEMMs (dgrad layout: acc = a · w, w [K, N]).
#include "coda/epilogue/ops/accumulate.hpp"
#include "coda/epilogue/ops/reduce_over_m.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/rms_norm_backward.hpp"
#include "coda/epilogue/ops/round.hpp"
#include "coda/epilogue/ops/scalar.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "coda/epilogue/ops/swiglu_backward.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

void gemm_rms_backward(const RmsBackwardArgs& args, Tile tile) {
  require_tile(tile, "gemm_rms_backward");
  const int64_t m = args.dz.shape[0], k = args.dz.shape[1], n = args.w.shape[1];
  require_partials(args.dgamma_partials, n, ceil_div(m, tile.m), "gemm_rms_backward",
                   "dgamma_partials");
  const GemmMainloop mainloop(GemmLayout::dgrad, args.dz, args.w, m, n, k);
  ep::ScaleByScalar alpha({args.alpha.value, args.alpha.tensor});
  ep::RmsNormBackward norm({args.x, args.rstd, args.zeta, args.gamma, args.h_hat});
  ep::ReduceOverM<ep::Sum> dgamma({args.dgamma_partials, ep::Plane::aux});
  ep::TileStore dx({args.dx});
  // From K = kRmsBackwardRoundedGradientMinK g is rounded to the 16-bit type (the GPU's
  // staged_wide hand-over, its Stage<T>: as an unfused dgrad stores it); below it stays fp32
  // (RoundTo to f32 leaves the values as they are).
  ep::RoundTo staged({k >= kRmsBackwardRoundedGradientMinK ? args.dx.dtype : DType::f32});
  if (args.accumulate) {
    ep::Accumulate existing({args.dx});
    run_epilogue(mainloop, m, n, tile, alpha, staged, norm, dgamma, existing, dx);
  } else {
    run_epilogue(mainloop, m, n, tile, alpha, staged, norm, dgamma, dx);
  }
}

void gemm_swiglu_backward(const SwigluBackwardArgs& args, Tile tile) {
  require_tile(tile, "gemm_swiglu_backward");
  const int64_t m = args.dx.shape[0], k = args.dx.shape[1], f = args.w.shape[1];
  require_partials(args.zeta_partials, m, ceil_div(f, tile.n), "gemm_swiglu_backward",
                   "zeta_partials");
  const GemmMainloop mainloop(GemmLayout::dgrad, args.dx, args.w, m, f, k);
  ep::RoundTo staged({args.act.dtype}); // the GPU's Stage<T>: dy as an unfused dgrad stores it
  ep::SwigluBackward swiglu({args.preact, args.dpreact});
  ep::TileStore act({args.act});
  ep::ReduceOverN<ep::Sum> zeta({args.zeta_partials, ep::Plane::aux});
  run_epilogue(mainloop, m, f, tile, staged, swiglu, act, zeta);
}

} // namespace coda::cpu
