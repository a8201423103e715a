// ScalePerCol: x * s[n], one factor per output column (n), e.g. the RMSNorm weight gamma.
#pragma once

#include <vector>

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T scale_per_col(T x, T factor) { return x * factor; }

struct ScalePerCol {
  struct Args {
    TensorView factors; // [N], any float dtype
  };

  explicit ScalePerCol(const Args& args) : args_(args) {}

  void begin_tile(const TileCoord& tile) {
    factors_.resize(size_t(tile.cols));
    for (int64_t c = 0; c < tile.cols; ++c)
      factors_[size_t(c)] = load_float(args_.factors, tile.n0 + c);
  }

  void visit(const HostFragment& frag) const {
    for (int64_t r = 0; r < frag.tile.rows; ++r)
      for (int64_t c = 0; c < frag.tile.cols; ++c)
        frag.value(r, c) = scale_per_col(frag.value(r, c), factors_[size_t(c)]);
  }

  void end_tile(const TileCoord&) {}

  // Device: the tile's factors are staged once in shared memory as fp32 (holding them in
  // registers would cost a register per column).
  static constexpr int64_t shared_bytes(int64_t, int64_t tile_n) { return tile_n * 4; }

private:
  Args args_;
  std::vector<float> factors_; // [tile cols]
};

} // namespace coda::epilogue
