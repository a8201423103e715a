// The forward CODA kernels K0, K1, K2, K2g, K4, K5 (coda/kernels/args.hpp has their math) as
// ordered epilogue-op chains on acc = a · wᵀ. K1, K2, K2g and K4 round z = rstd * acc to the call's
// 16-bit type before the rest of the chain, as the GPU's staged schedule hands its tile over (and
// its other schedules' Stage op rounds), so both backends run the same numbers.
#include <string>

#include "coda/epilogue/ops/gated_pair.hpp"
#include "coda/epilogue/ops/geglu.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/rope.hpp"
#include "coda/epilogue/ops/round.hpp"
#include "coda/epilogue/ops/scale_per_col.hpp"
#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/ops/select_per_row.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "coda/epilogue/ops/swiglu.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

namespace {

struct ForwardProblem {
  int64_t m, n, k;
};
ForwardProblem forward_problem(const TensorView& a, const TensorView& w) {
  return {a.shape[0], w.shape[0], a.shape[1]};
}

// rstd[m] = rsqrt(sum_b sumsq_partials[m, b] / K + eps), K the normalized width (a's columns).
ep::ScalePerRow rstd_scale(const TensorView& sumsq_partials, int64_t k, float eps,
                           const TensorView& rstd_out) {
  ep::ScalePerRow::Args args;
  args.sumsq_partials = sumsq_partials;
  args.width = k;
  args.eps = eps;
  args.factors_out = rstd_out;
  return ep::ScalePerRow(args);
}

// K2 and its variants with another gated activation (Gate: ep::SwigluGate, ...):
// preact = z = round(rstd * acc), act[m, j] = Gate(z[m, 2j], z[m, 2j + 1]) from z as stored, as
// the GPU's Stage<T> hands the gate the rounded tile.
template <class Gate, class GatedArgs>
void run_rms_gated(const char* kernel, const GatedArgs& args, Tile tile) {
  require_tile(tile, kernel);
  const auto [m, n, k] = forward_problem(args.a, args.w);
  require(n % 2 == 0, std::string("cpu::") + kernel + ": the fused gate/up width must be even");
  const GemmMainloop mainloop(GemmLayout::fwd, args.a, args.w, m, n, k);
  auto rstd = rstd_scale(args.sumsq_partials, k, args.eps, args.rstd_out);
  ep::RoundTo staged({args.preact.dtype});
  ep::TileStore preact({args.preact});
  ep::GatedPairStore<Gate> act({args.act});
  run_epilogue(mainloop, m, n, tile, rstd, staged, preact, act);
}

} // namespace

void gemm_residual_rms(const ResidualRmsArgs& args, Tile tile) {
  require_tile(tile, "gemm_residual_rms");
  const auto [m, n, k] = forward_problem(args.a, args.w);
  require_partials(args.sumsq_partials, m, ceil_div(n, tile.n), "gemm_residual_rms",
                   "sumsq_partials");
  const GemmMainloop mainloop(GemmLayout::fwd, args.a, args.w, m, n, k);
  ep::ResidualAdd residual({args.residual, 1.f});
  ep::TileStore out({args.out});
  ep::ReduceOverN<ep::SumOfSquares> sumsq({args.sumsq_partials});
  ep::ScalePerCol gamma({args.gamma});
  ep::TileStore out_scaled({args.out_scaled});
  run_epilogue(mainloop, m, n, tile, residual, out, sumsq, gamma, out_scaled);
}

void gemm_rms_scale(const RmsScaleArgs& args, Tile tile) {
  require_tile(tile, "gemm_rms_scale");
  const auto [m, n, k] = forward_problem(args.a, args.w);
  const GemmMainloop mainloop(GemmLayout::fwd, args.a, args.w, m, n, k);
  auto rstd = rstd_scale(args.sumsq_partials, k, args.eps, args.rstd_out);
  ep::RoundTo staged({args.out.dtype}); // the GPU's Stage<T> (stored as is: the same rounding)
  ep::TileStore out({args.out});
  run_epilogue(mainloop, m, n, tile, rstd, staged, out);
}

void gemm_rms_swiglu(const RmsSwigluArgs& args, Tile tile) {
  run_rms_gated<ep::SwigluGate>("gemm_rms_swiglu", args, tile);
}

void gemm_rms_geglu(const RmsGegluArgs& args, Tile tile) {
  run_rms_gated<ep::GegluGate>("gemm_rms_geglu", args, tile);
}

void gemm_rms_rope(const RmsRopeArgs& args, Tile tile) {
  require_tile(tile, "gemm_rms_rope");
  const auto [m, n, k] = forward_problem(args.a, args.w);
  const RopeSpec& rope = args.rope;
  const int64_t head_dim = rope.head_dim;
  require(head_dim >= 2 && head_dim % 2 == 0 && n % head_dim == 0,
          "cpu::gemm_rms_rope: head_dim must be even and divide the QKV width");
  // RoPE pairs columns half a head apart, so a tile holds whole heads. K4 writes no partials,
  // so the tile width is free to grow to a multiple of head_dim.
  tile.n = ceil_div(tile.n, head_dim) * head_dim;
  const GemmMainloop mainloop(GemmLayout::fwd, args.a, args.w, m, n, k);
  auto rstd = rstd_scale(args.sumsq_partials, k, args.eps, args.rstd_out);
  ep::Rope::Args rope_args;
  rope_args.positions = rope.positions;
  rope_args.inv_freq = rope.inv_freq;
  rope_args.head_dim = head_dim;
  rope_args.rotated_cols = (int64_t(rope.n_q_heads) + rope.n_kv_heads) * head_dim; // Q and K
  ep::Rope rotate(rope_args);
  ep::TileStore out({args.out});
  ep::RoundTo staged({args.out.dtype}); // the GPU's Stage<T>: RoPE on z as stored
  run_epilogue(mainloop, m, n, tile, rstd, staged, rotate, out);
}

void gemm_rms_lse(const RmsLseArgs& args, Tile tile) {
  require_tile(tile, "gemm_rms_lse");
  const auto [m, n, k] = forward_problem(args.a, args.w);
  require_partials(args.lse_partials, m, ceil_div(n, tile.n), "gemm_rms_lse", "lse_partials");
  const GemmMainloop mainloop(GemmLayout::fwd, args.a, args.w, m, n, k);
  auto rstd = rstd_scale(args.sumsq_partials, k, args.eps, args.rstd_out);
  ep::TileStore logits({args.logits});
  ep::RoundTo as_stored({args.logits.dtype}); // the lse of the logits cross_entropy will read
  ep::ReduceOverN<ep::LogSumExp> lse({args.lse_partials});
  ep::SelectPerRow target_logit({args.targets, n, args.target_logit});
  run_epilogue(mainloop, m, n, tile, rstd, logits, as_stored, lse, target_logit);
}

} // namespace coda::cpu
