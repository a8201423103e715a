// The CPU backend: the same epilogue math as the GPU (include/coda/epilogue/ops), applied by a
// host executor that walks output tiles. Entry points take validated arguments.
#pragma once

#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::cpu {

// Output tile of the executor. The partial-reduction block of the public API is kReduceBlock,
// kStagedReduceBlock columns for K5's and K7's row partials (kStagedTile); tests may run the
// executor with other tiles to check the partial layouts.
struct Tile {
  int64_t m = kReduceBlock;
  int64_t n = kReduceBlock;
};
inline constexpr Tile kStagedTile{kReduceBlock, kStagedReduceBlock};

void gemm(const GemmArgs& args);
void gemm_residual_rms(const ResidualRmsArgs& args, Tile tile = {});
void gemm_rms_scale(const RmsScaleArgs& args, Tile tile = {});
void gemm_rms_swiglu(const RmsSwigluArgs& args, Tile tile = {});
void gemm_rms_rope(const RmsRopeArgs& args, Tile tile = {});
void gemm_rms_lse(const RmsLseArgs& args, Tile tile = kStagedTile);
void gemm_rms_backward(const RmsBackwardArgs& args, Tile tile = {});
void gemm_swiglu_backward(const SwigluBackwardArgs& args, Tile tile = kStagedTile);

void rms_stats(const RmsStatsArgs& args);
void rstd_from_partials(const RstdArgs& args);
void reduce_row_partials(const RowReduceArgs& args);
void reduce_col_partials(const ColReduceArgs& args);
void rope_backward(const RopeBackwardArgs& args);
void cross_entropy(const CrossEntropyArgs& args);

} // namespace coda::cpu
