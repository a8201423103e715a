// The small auxiliary kernels around the partial reductions: the first layer's RMSNorm
// statistics, and the finishing sums of row and column partials.
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/scale_per_col.hpp"
#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

using ep::load_float;
using ep::store_float;
using ep::sum_partials;

// h = round(x * gamma) and row partials of x^2, on x itself (no GEMM before it). The partials
// buffer [M, P] may have any width P >= 1: blocks are kReduceBlock wide, or wider when P is
// smaller than ceil(N / kReduceBlock) (P = 1: whole rows); entries past the last block are 0.
void rms_stats(const RmsStatsArgs& args) {
  const int64_t m = args.x.shape[0], n = args.x.shape[1];
  const int64_t p = args.sumsq_partials.shape[1];
  require(p >= 1, "cpu::rms_stats: sumsq_partials needs at least one column");
  const Tile tile{kReduceBlock, std::max(kReduceBlock, ceil_div(n, p))};
  const TensorMainloop mainloop(args.x);
  ep::ReduceOverN<ep::SumOfSquares> sumsq({args.sumsq_partials});
  ep::ScalePerCol gamma({args.gamma});
  ep::TileStore out_scaled({args.out_scaled});
  run_epilogue(mainloop, m, n, tile, sumsq, gamma, out_scaled);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = ceil_div(n, tile.n); b < p; ++b) store_float(args.sumsq_partials, i, b, 0.f);
}

void rstd_from_partials(const RstdArgs& args) {
  for (int64_t i = 0; i < args.partials.shape[0]; ++i)
    store_float(
        args.rstd, i,
        ep::rstd_from_sum_of_squares(sum_partials(args.partials, i), float(args.n), args.eps));
}

// out = factor * sum, the factor rounded once before (value * tensor[0] when the scale has a
// tensor), as ScaleByScalar forms it.
void reduce_row_partials(const RowReduceArgs& args) {
  const float factor = args.scale.has_tensor() ? args.scale.value * load_float(args.scale.tensor, 0)
                                               : args.scale.value;
  for (int64_t i = 0; i < args.partials.shape[0]; ++i)
    store_float(args.out, i, factor * sum_partials(args.partials, i));
}

void reduce_col_partials(const ColReduceArgs& args) {
  for (int64_t i = 0; i < args.partials.shape[0]; ++i) {
    const float sum = sum_partials(args.partials, i);
    store_float(args.out, i, args.accumulate ? load_float(args.out, i) + sum : sum);
  }
}

} // namespace coda::cpu
