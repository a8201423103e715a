// The block of a partial reduction: ReduceOverN writes one partial per kReduceBlock columns of a
// row ("row partials" [M, ceil(N / kReduceBlock)]), ReduceOverM one per kReduceBlock rows of a
// column. Fixed at 128 in the API (docs/DESIGN.md), so a partial buffer's shape is a function of
// the problem alone; CODA_REDUCE_BLOCK in coda.h is the same number.
//
// The exception: the row partials of K5 (log-sum-exp) and K7 (zeta) are kStagedReduceBlock = 64
// columns wide (CODA_STAGED_REDUCE_BLOCK), so that the staged schedule's 128 x 192 tiles hold
// whole blocks (a 128-column block would straddle two tiles; docs/epilogue.md). The sums of
// squares stay 128 wide: the fused kernels that read them stage them per row in shared memory.
#pragma once

#include <cstdint>

namespace coda {

constexpr int64_t kReduceBlock = 128;
// ceil(n / kReduceBlock) for n >= 0, written so that no n overflows (n + 127 would near 2^63).
constexpr int64_t num_reduce_blocks(int64_t n) {
  return n / kReduceBlock + (n % kReduceBlock > 0 ? 1 : 0);
}

constexpr int64_t kStagedReduceBlock = 64;
// ceil(n / kStagedReduceBlock), overflow-free as num_reduce_blocks.
constexpr int64_t num_staged_reduce_blocks(int64_t n) {
  return n / kStagedReduceBlock + (n % kStagedReduceBlock > 0 ? 1 : 0);
}

} // namespace coda
