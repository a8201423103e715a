// ResidualAdd: value + scale * tile[m, n], a same-shape tile loaded and added (the residual
// stream in K0; beta * C in a plain GEMM). scale = 1 adds exactly.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T residual_add(T x, T residual, T scale) { return x + scale * residual; }

struct ResidualAdd : NoTileState {
  struct Args {
    TensorView residual; // [M, N]; may be the output itself (read before any store of the tile)
    float scale = 1.f;
  };

  explicit ResidualAdd(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c < tile.cols; ++c)
        frag.value(r, c) = residual_add(
            frag.value(r, c), load_float(args_.residual, tile.m0 + r, tile.n0 + c), args_.scale);
  }

  // Device: the tile arrives by TMA into shared memory, here sized for 16-bit elements.
  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_m * tile_n * 2;
  }

private:
  Args args_;
};

} // namespace coda::epilogue
