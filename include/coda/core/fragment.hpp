// The fp32 accumulator fragment of wgmma.m64nNk16 (PTX ISA 9.7.15.5.1, "Register fragment
// layout for accumulator D"): which element of the 64 x N tile each register of each of the 128
// threads of a warpgroup holds, and the partner relations the pairwise epilogue ops rely on.
//
// Thread t: warp w = t / 32, lane l = t % 32, group g = l / 4 (0..7), quad lane q = l % 4.
// Register i in [0, N/2) holds
//   row(i) = 16 w + g + 8 ((i / 2) % 2)        col(i) = 8 (i / 4) + 2 q + i % 2
// so registers 4j .. 4j+3 hold (r, c), (r, c+1), (r+8, c), (r+8, c+1) with r = 16 w + g and
// c = 8 j + 2 q. Consequences the epilogue uses:
//  * a thread holds two rows (its row slots 0 and 1) and a row lives in the 4 lanes of one quad;
//  * columns 2j and 2j+1 of a row are registers i and i+1 (i even) of one thread (SwiGLU pairs);
//  * columns c and c + d, d a multiple of 8, are registers i and i + d/2 of one thread, so
//    rotate-half RoPE (d = head_dim / 2) is thread-local when a tile holds whole heads.
// Host and device code alike (the CPU tests check the map exhaustively).
#pragma once

#include "coda/core/types.hpp"

namespace coda {

struct FragmentCoord {
  int row;
  int col;
};

// The lane within its quad (thread % 4) of the thread holding a column, whatever the row: the
// four lanes that share a row split its columns by this, and a reduction over the row's columns
// merges the four lanes' partial states.
CODA_HD constexpr int quad_lane_of_col(int col) { return (col % 8) / 2; }

template <int N> struct AccumulatorMap {
  static_assert(N >= 8 && N <= 256 && N % 8 == 0,
                "wgmma m64nNk16: N must be a multiple of 8 in [8, 256]");

  static constexpr int kRows = 64;
  static constexpr int kCols = N;
  static constexpr int kThreads = 128;     // one warpgroup
  static constexpr int kRegisters = N / 2; // fp32 accumulator registers per thread
  static constexpr int kRowSlots = 2;      // rows per thread
  static constexpr int kRegistersPerRow = kRegisters / kRowSlots;

  // The row slot (0 or 1) of register `reg`: slot s holds row first_row(thread) + 8 s.
  CODA_HD static constexpr int row_slot(int reg) { return (reg >> 1) & 1; }
  CODA_HD static constexpr int slot_row(int thread, int slot) {
    return 16 * (thread / 32) + (thread % 32) / 4 + 8 * slot;
  }

  CODA_HD static constexpr int row(int thread, int reg) { return slot_row(thread, row_slot(reg)); }
  CODA_HD static constexpr int col(int thread, int reg) {
    return 8 * (reg >> 2) + 2 * (thread % 4) + (reg & 1);
  }
  CODA_HD static constexpr FragmentCoord coord(int thread, int reg) {
    return {row(thread, reg), col(thread, reg)};
  }

  // Pairs: (row, 2j) is an even register and (row, 2j + 1) the next one, in the same thread.
  CODA_HD static constexpr bool is_pair_first(int reg) { return (reg & 1) == 0; }
  CODA_HD static constexpr int pair_partner(int reg) { return reg ^ 1; }

  // The register of the same thread that holds (row, col + offset), for an offset that is a
  // multiple of 8 (negative allowed); -1 when that column lies outside the tile.
  CODA_HD static constexpr int register_at_col_offset(int reg, int offset) {
    const int target = reg + offset / 2;
    return offset % 8 == 0 && target >= 0 && target < kRegisters ? target : -1;
  }

  // Rotate-half within heads of head_dim columns (heads start at column 0; head_dim a multiple
  // of 16 dividing N): column c pairs with c + head_dim/2 in a head's first half and with
  // c - head_dim/2 in its second half. Which half is independent of the thread, since the
  // thread's offset 2q + i%2 stays inside one group of 8 columns.
  CODA_HD static constexpr bool in_first_half(int reg, int head_dim) {
    return (8 * (reg >> 2)) % head_dim < head_dim / 2;
  }
  CODA_HD static constexpr int rotate_half_partner(int reg, int head_dim) {
    return in_first_half(reg, head_dim) ? reg + head_dim / 4 : reg - head_dim / 4;
  }

  // f(slot, row) for the two rows of `thread`.
  template <class F> CODA_HD static void for_each_row(int thread, F&& f) {
    for (int slot = 0; slot < kRowSlots; ++slot) f(slot, slot_row(thread, slot));
  }
  // f(reg) for the registers of one row slot, in increasing column order.
  template <class F> CODA_HD static void for_each_register_of_row(int slot, F&& f) {
    for (int j = 0; j < kRegisters / 4; ++j) {
      f(4 * j + 2 * slot);
      f(4 * j + 2 * slot + 1);
    }
  }
  // f(reg_even, row, col_even) for every column pair (col_even, col_even + 1) of `thread`.
  template <class F> CODA_HD static void for_each_pair(int thread, F&& f) {
    for (int reg = 0; reg < kRegisters; reg += 2) f(reg, row(thread, reg), col(thread, reg));
  }
  // f(reg_first, reg_second) for every rotate-half pair (c, c + head_dim/2) of a thread.
  template <class F> CODA_HD static void for_each_rotate_half_pair(int head_dim, F&& f) {
    for (int reg = 0; reg < kRegisters; ++reg)
      if (in_first_half(reg, head_dim)) f(reg, reg + head_dim / 4);
  }
};

// The fp32 accumulators of one consumer warpgroup: kBlocksM blocks of 64 rows by kN columns.
// Register i of block b holds row 64 b + Map::row(thread, i) and column Map::col(thread, i); a
// 32-column slab s of a block is registers [16 s, 16 s + 16), laid out as AccumulatorMap<32>.
template <int kBlocksM, int kN> struct Accumulator {
  using Map = AccumulatorMap<kN>;
  static constexpr int kBlocks = kBlocksM;
  static constexpr int kColumns = kN;
  static constexpr int kRegsPerBlock = Map::kRegisters;
  float reg[kBlocksM][Map::kRegisters]; // [64-row block][register]
};

} // namespace coda
