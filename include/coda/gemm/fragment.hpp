// Where each fp32 accumulator of a consumer warpgroup lives in the output tile. Plain C++ shared
// by device code (epilogues) and CPU tests.
//
// wgmma .m64nNk16 (PTX ISA 9.7.15.5.1.1.1, "Matrix Fragments for wgmma.mma_async.m64nNk16",
// accumulator D): thread t of the warpgroup, warp w = t/32, lane quad position q = t%4 and
// row-in-warp r = (t%32)/4, holds N/2 floats; register i is at
//   row = 16 w + r + 8 * ((i >> 1) & 1)          (within the 64-row block)
//   col = 8 * (i >> 2) + 2 q + (i & 1)
// so registers (i, i+1), i even, are the column pair (2k, 2k+1) of one row, and a 32-column
// slab of the block is the 16 consecutive registers [16 s, 16 s + 16).
#pragma once

#include "coda/core/types.hpp"

namespace coda::gemm {

struct FragmentMap {
  CODA_HD static constexpr int row(int thread, int reg) {
    return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((reg >> 1) & 1);
  }
  CODA_HD static constexpr int col(int thread, int reg) {
    return 8 * (reg >> 2) + 2 * (thread % 4) + (reg & 1);
  }
};

// The accumulators of one consumer warpgroup: kBlocksM blocks of 64 rows by kN columns.
template <int kBlocksM, int kN> struct Accumulator {
  static constexpr int kBlocks = kBlocksM;
  static constexpr int kColumns = kN;
  static constexpr int kRegsPerBlock = kN / 2;
  float reg[kBlocksM][kN / 2]; // [64-row block][register]: (row, col) from FragmentMap
};

} // namespace coda::gemm
