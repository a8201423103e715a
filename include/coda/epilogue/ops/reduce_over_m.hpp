// ReduceOverM: a reduction over the rows (m) of each column, one partial per (column, tile row
// block): partials[n, m_block], i.e. [N, ceil(M / tile_m)] f32 (the "column partials" of
// coda/kernels/args.hpp), e.g. the RMSNorm weight gradient. Each tile writes its own partials: no
// atomics, bitwise reproducible.
#pragma once

#include <vector>

#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/reduction.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <template <class> class Reduction> struct ReduceOverM {
  using R = Reduction<float>;

  struct Args {
    TensorView partials;        // [N, ceil(M / tile_m)] f32
    Plane plane = Plane::value; // what is reduced
  };

  explicit ReduceOverM(const Args& args) : args_(args) {}

  void begin_tile(const TileCoord& tile) { states_.assign(size_t(tile.cols), R::identity()); }

  void visit(const HostFragment& frag) {
    for (int64_t r = 0; r < frag.tile.rows; ++r)
      for (int64_t c = 0; c < frag.tile.cols; ++c)
        R::add(states_[size_t(c)], plane_at(frag, args_.plane, r, c));
  }

  void end_tile(const TileCoord& tile) {
    for (int64_t c = 0; c < tile.cols; ++c)
      store_float(args_.partials, tile.n0 + c, tile.m_block, R::finish(states_[size_t(c)]));
  }

  // Device: a column is spread over the 8 row groups of each warp (shuffles over lane xor 4, 8,
  // 16), then across the tile's warps (16 rows each) through shared memory, one value per column
  // per warp.
  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_n * (tile_m / 16) * 4;
  }

private:
  Args args_;
  std::vector<typename R::State> states_; // [tile cols]
};

} // namespace coda::epilogue
