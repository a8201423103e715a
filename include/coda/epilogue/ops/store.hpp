// TileStore: writes the fragment's current values to an output, rounded once to its dtype (the
// main output, or a side output taken at this point of the op chain).
#pragma once

#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

struct TileStore : NoTileState {
  struct Args {
    TensorView out; // [M, N], bf16, f16 or f32
  };

  explicit TileStore(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c < tile.cols; ++c)
        store_float(args_.out, tile.m0 + r, tile.n0 + c, frag.value(r, c));
  }

  // Device: registers -> shared memory (stmatrix) -> TMA store, staged by the driver.
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue
