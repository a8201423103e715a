// The accumulator map is checked exhaustively for every wgmma width the GEMM may use: against an
// independent statement of the layout (CuTe's (thread, value) -> m + 64 n layout of
// m64nNk16 fp32 accumulators), for being a bijection onto the tile, and for every partner
// relation the pairwise epilogue ops rely on.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coda/core/fragment.hpp"

namespace {

using coda::AccumulatorMap;

// Thread shape (4, 8, 4) with strides (128, 1, 16), value shape (2, 2, N/8) with strides
// (64, 8, 512), over the column-major index m + 64 n of the 64 x N tile.
template <int N> std::pair<int, int> cute_layout(int thread, int reg) {
  const int t0 = thread % 4, t1 = (thread / 4) % 8, t2 = thread / 32;
  const int v0 = reg % 2, v1 = (reg / 2) % 2, v2 = reg / 4;
  const int index = 128 * t0 + t1 + 16 * t2 + 64 * v0 + 8 * v1 + 512 * v2;
  return {index % 64, index / 64};
}

// Compile-time use: the map is constexpr, so a kernel can index registers with constants.
using Map128 = AccumulatorMap<128>;
static_assert(Map128::kRegisters == 64);
static_assert(Map128::col(7, Map128::register_at_col_offset(5, 64)) == Map128::col(7, 5) + 64);
static_assert(Map128::row(7, Map128::rotate_half_partner(5, 128)) == Map128::row(7, 5));

template <int N> void check_map() {
  using Map = AccumulatorMap<N>;
  SCOPED_TRACE("N = " + std::to_string(N));
  std::set<std::pair<int, int>> seen;
  for (int t = 0; t < Map::kThreads; ++t) {
    for (int i = 0; i < Map::kRegisters; ++i) {
      const auto [row, col] = Map::coord(t, i);
      ASSERT_EQ(std::make_pair(row, col), cute_layout<N>(t, i)) << "thread " << t << " reg " << i;
      ASSERT_TRUE(row >= 0 && row < 64 && col >= 0 && col < N);
      ASSERT_TRUE(seen.insert({row, col}).second) << "element held twice: " << row << "," << col;
      EXPECT_EQ(row, Map::slot_row(t, Map::row_slot(i)));
      EXPECT_EQ(coda::quad_lane_of_col(col), t % 4);
    }
  }
  EXPECT_EQ(seen.size(), size_t(64 * N)); // a bijection onto the whole tile
}

template <int N> void check_rows() {
  using Map = AccumulatorMap<N>;
  SCOPED_TRACE("N = " + std::to_string(N));
  for (int t = 0; t < Map::kThreads; ++t) {
    // A row is shared by exactly the 4 lanes of a quad, all in one warp.
    for (int other = 0; other < Map::kThreads; ++other) {
      const bool same_rows = Map::slot_row(t, 0) == Map::slot_row(other, 0);
      EXPECT_EQ(same_rows, t / 4 == other / 4);
    }
    std::vector<int> rows;
    Map::for_each_row(t, [&](int slot, int row) {
      rows.push_back(row);
      std::vector<int> cols;
      Map::for_each_register_of_row(slot, [&](int reg) {
        EXPECT_EQ(Map::row(t, reg), row);
        cols.push_back(Map::col(t, reg));
      });
      ASSERT_EQ(int(cols.size()), Map::kRegistersPerRow);
      for (size_t k = 1; k < cols.size(); ++k) EXPECT_LT(cols[k - 1], cols[k]);
    });
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[1], rows[0] + 8);
  }
}

template <int N> void check_pairs_and_offsets() {
  using Map = AccumulatorMap<N>;
  SCOPED_TRACE("N = " + std::to_string(N));
  for (int t = 0; t < Map::kThreads; ++t) {
    int pairs = 0;
    Map::for_each_pair(t, [&](int reg, int row, int col) {
      ++pairs;
      EXPECT_TRUE(Map::is_pair_first(reg));
      EXPECT_EQ(col % 2, 0);
      EXPECT_EQ(Map::coord(t, reg).row, row);
      EXPECT_EQ(Map::coord(t, reg).col, col);
      const int partner = Map::pair_partner(reg);
      EXPECT_EQ(Map::pair_partner(partner), reg);
      EXPECT_EQ(Map::row(t, partner), row);
      EXPECT_EQ(Map::col(t, partner), col + 1);
    });
    EXPECT_EQ(pairs, Map::kRegisters / 2);

    for (int i = 0; i < Map::kRegisters; ++i) {
      for (int offset = -N; offset <= N; ++offset) {
        const int target = Map::register_at_col_offset(i, offset);
        const int col = Map::col(t, i) + offset;
        if (offset % 8 != 0 || col < 0 || col >= N) {
          EXPECT_EQ(target, -1) << "reg " << i << " offset " << offset;
          continue;
        }
        ASSERT_GE(target, 0) << "reg " << i << " offset " << offset;
        EXPECT_EQ(Map::row(t, target), Map::row(t, i));
        EXPECT_EQ(Map::col(t, target), col);
      }
    }
  }
}

template <int N> void check_rotate_half() {
  using Map = AccumulatorMap<N>;
  for (int head_dim = 16; head_dim <= N; head_dim *= 2) {
    if (N % head_dim != 0) continue; // heads must tile the fragment
    SCOPED_TRACE("N = " + std::to_string(N) + ", head_dim = " + std::to_string(head_dim));
    std::vector<int> visits(Map::kRegisters, 0);
    Map::for_each_rotate_half_pair(head_dim, [&](int first, int second) {
      ++visits.at(size_t(first));
      ++visits.at(size_t(second));
    });
    for (int i = 0; i < Map::kRegisters; ++i) EXPECT_EQ(visits[i], 1) << "reg " << i;

    for (int t = 0; t < Map::kThreads; ++t) {
      for (int i = 0; i < Map::kRegisters; ++i) {
        const int col = Map::col(t, i);
        const int within = col % head_dim;
        const int partner = Map::rotate_half_partner(i, head_dim);
        ASSERT_TRUE(partner >= 0 && partner < Map::kRegisters);
        EXPECT_EQ(Map::in_first_half(i, head_dim), within < head_dim / 2);
        EXPECT_EQ(Map::rotate_half_partner(partner, head_dim), i);
        EXPECT_EQ(Map::row(t, partner), Map::row(t, i));
        const int expected = within < head_dim / 2 ? col + head_dim / 2 : col - head_dim / 2;
        EXPECT_EQ(Map::col(t, partner), expected);
        EXPECT_EQ(Map::col(t, partner) / head_dim, col / head_dim); // the same head
      }
    }
  }
}

// Calls check(std::integral_constant<int, N>) for every N the GEMM's tile widths use.
template <class Check> void for_each_wgmma_width(Check&& check) {
  [&]<int... Ns>(std::integer_sequence<int, Ns...>) {
    (check(std::integral_constant<int, Ns>{}), ...);
  }
  (std::integer_sequence<int, 8, 16, 24, 32, 64, 96, 128, 192, 256>{});
}

TEST(AccumulatorMap, MatchesCuteLayoutAndCoversTile) {
  for_each_wgmma_width([](auto n) { check_map<decltype(n)::value>(); });
}
TEST(AccumulatorMap, RowsAndRowSlots) {
  for_each_wgmma_width([](auto n) { check_rows<decltype(n)::value>(); });
}
TEST(AccumulatorMap, PairsAndColumnOffsets) {
  for_each_wgmma_width([](auto n) { check_pairs_and_offsets<decltype(n)::value>(); });
}
TEST(AccumulatorMap, RotateHalfPartners) {
  for_each_wgmma_width([](auto n) { check_rotate_half<decltype(n)::value>(); });
}

} // namespace
