// A gated activation of a pair, 2 -> 1: columns (2j, 2j + 1) hold (gate, up) of feature j (the
// interleaved fused gate/up layout), and act[m, j] = Gate{}(gate, up). The host twin of
// device::GatedPairStore (device/ops/gated_pair.cuh). Gate is a functor
// `F operator()(F gate, F up) const`: SwigluGate (ops/swiglu.hpp), GegluGate (ops/geglu.hpp).
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

// Leaves the fragment as it is (the pre-activation is usually stored too) and writes the
// half-width output itself.
template <class Gate> struct GatedPairStore : NoTileState {
  struct Args {
    TensorView act; // [M, N / 2]
  };

  // Precondition: tiles start at even columns and hold whole pairs.
  explicit GatedPairStore(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c + 1 < tile.cols; c += 2)
        store_float(args_.act, tile.m0 + r, (tile.n0 + c) / 2,
                    Gate{}(frag.value(r, c), frag.value(r, c + 1)));
  }

  // Device: the half-width output tile is staged for its TMA store (by the driver's store path).
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue
