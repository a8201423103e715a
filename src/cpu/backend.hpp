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

// The tile a kernel runs on unless a test asks for another: the one whose width is the block of
// its row partials.
template <class Args> inline constexpr Tile kTileOf = {};
template <> inline constexpr Tile kTileOf<RmsLseArgs> = kStagedTile;
template <> inline constexpr Tile kTileOf<SwigluBackwardArgs> = kStagedTile;

void gemm(const GemmArgs& args);
// The block-scaled FP8 GEMM (gemm_fp8.cpp).
void gemm_fp8(const Fp8GemmArgs& args);
// A weight's FP8 codes and block scales, and its transposed copy (quantize_fp8.cpp).
void quantize_weight_fp8(const QuantizeWeightFp8Args& args);
// An activation's FP8 codes with row-block scales, and its transposed copy blocked along M
// (quantize_fp8.cpp).
void quantize_activation_fp8(const QuantizeActivationFp8Args& args);
// One function per row of the kernel tables (coda/kernels/args.hpp): the GEMMs with a fused
// epilogue in forward_kernels.cpp and backward_kernels.cpp, the auxiliary kernels in
// statistics.cpp, rope_backward.cpp and cross_entropy.cpp.
#define CODA_DECLARE_FUSED(fn, Args) void fn(const Args& args, Tile tile = kTileOf<Args>);
#define CODA_DECLARE_AUX(fn, Args) void fn(const Args& args);
CODA_FUSED_KERNELS(CODA_DECLARE_FUSED)
CODA_AUX_KERNELS(CODA_DECLARE_AUX)
#undef CODA_DECLARE_AUX
#undef CODA_DECLARE_FUSED

} // namespace coda::cpu
