// SelectPerRow: out[m] = value[m, index[m]], one value per row picked at a column given per row
// (the target logit of the cross-entropy), and 0 where index[m] is outside [0, N) (e.g. the
// ignore index). Exactly one tile holds each selected column, so exactly one tile writes each row.
#pragma once

#include <cstdint>

#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

CODA_HD bool selects_column(int32_t index, int64_t width) { return index >= 0 && index < width; }

struct SelectPerRow : NoTileState {
  struct Args {
    TensorView index;  // [M] i32
    int64_t width = 0; // N
    TensorView out;    // [M] f32
  };

  explicit SelectPerRow(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r) {
      const int32_t index = load_int(args_.index, tile.m0 + r);
      if (!selects_column(index, args_.width)) {
        if (tile.n_block == 0) store_float(args_.out, tile.m0 + r, 0.f);
      } else if (index >= tile.n0 && index < tile.n0 + tile.cols) {
        store_float(args_.out, tile.m0 + r, frag.value(r, index - tile.n0));
      }
    }
  }

  // Device: the indices of a thread's two rows in registers; the holder of the column stores.
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue
