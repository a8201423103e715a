// MultiplyTile: aux = value * tile[m, n], the per-element terms of a row-wise dot product with a
// loaded tile (zeta = sum_n z dz) for a ReduceOverN<Sum> that reads the aux plane. The value
// itself is left as it is.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T multiply_tile(T x, T tile_value) { return x * tile_value; }

struct MultiplyTile : NoTileState {
  struct Args {
    TensorView tile; // [M, N]
  };

  explicit MultiplyTile(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c < tile.cols; ++c)
        frag.aux(r, c) =
            multiply_tile(frag.value(r, c), load_float(args_.tile, tile.m0 + r, tile.n0 + c));
  }

  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_m * tile_n * 2; // the 16-bit tile, loaded by TMA
  }

private:
  Args args_;
};

} // namespace coda::epilogue
