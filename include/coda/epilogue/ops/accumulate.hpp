// Accumulate: out[m, n] + value, adding the tile into the output's existing contents (gradient
// accumulation, K6's dx). The existing value is read once and the sum rounded once, by the store
// that follows. (The device may instead store by TMA reduce-add, which rounds twice; see the GPU
// epilogue driver.)
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T accumulate(T existing, T x) { return existing + x; }

struct Accumulate : NoTileState {
  struct Args {
    TensorView out; // [M, N], read here and written by a TileStore after this op
  };

  explicit Accumulate(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c < tile.cols; ++c)
        frag.value(r, c) =
            accumulate(load_float(args_.out, tile.m0 + r, tile.n0 + c), frag.value(r, c));
  }

  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_m * tile_n * 2; // the existing 16-bit tile, loaded by TMA
  }

private:
  Args args_;
};

} // namespace coda::epilogue
