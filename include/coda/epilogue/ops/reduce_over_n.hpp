// ReduceOverN: a reduction over the columns (n) of each row, one partial per (row, tile column
// block): partials[m, n_block], i.e. [M, ceil(N / tile_n)] f32 (the "row partials" of
// coda/kernels/args.hpp). Reductions: Sum, SumOfSquares, LogSumExp (coda/epilogue/reduction.hpp).
//
// The host follows the device's order: the four lanes of a quad each reduce their own columns of
// the row (coda::quad_lane_of_col) in increasing order, then the lane states merge as the xor-1,
// xor-2 shuffles do. Each tile writes its own partials: no atomics, bitwise reproducible.
#pragma once

#include <array>
#include <vector>

#include "coda/core/fragment.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/reduction.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <template <class> class Reduction> struct ReduceOverN {
  using R = Reduction<float>;
  using QuadStates = std::array<typename R::State, 4>; // one per lane of the row's quad

  struct Args {
    TensorView partials;        // [M, ceil(N / tile_n)] f32
    Plane plane = Plane::value; // what is reduced
    float scale = 1.f;          // applied to each finished partial
  };

  explicit ReduceOverN(const Args& args) : args_(args) {}

  void begin_tile(const TileCoord& tile) {
    QuadStates empty;
    empty.fill(R::identity());
    states_.assign(size_t(tile.rows), empty);
  }

  void visit(const HostFragment& frag) {
    for (int64_t r = 0; r < frag.tile.rows; ++r)
      for (int64_t c = 0; c < frag.tile.cols; ++c)
        R::add(states_[size_t(r)][size_t(quad_lane_of_col(int(c)))],
               plane_at(frag, args_.plane, r, c));
  }

  void end_tile(const TileCoord& tile) {
    for (int64_t r = 0; r < tile.rows; ++r) {
      const QuadStates& s = states_[size_t(r)];
      const auto row = R::merge(R::merge(s[0], s[1]), R::merge(s[2], s[3]));
      store_float(args_.partials, tile.m0 + r, tile.n_block, args_.scale * R::finish(row));
    }
  }

  // Device: quad shuffles; each warp owns whole rows, so nothing crosses warps.
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
  std::vector<QuadStates> states_; // [tile rows][quad lane]
};

} // namespace coda::epilogue
