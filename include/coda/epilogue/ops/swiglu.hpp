// SwiGLU forward, a pair to one (2 -> 1): columns (2j, 2j + 1) hold (gate, up) of feature j
// (the interleaved fused gate/up layout), and act[m, j] = silu(gate) * up.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T sigmoid(T x) { return math::reciprocal(T(1) + math::exp(-x)); }

// silu(g) = g * sigmoid(g), spelled as the backward recomputes it (so both agree bit for bit).
// For g below about -88, exp(-g) overflows to inf and silu is -0, its limit.
template <class T> CODA_HD T silu(T gate) { return gate * sigmoid(gate); }

template <class T> CODA_HD T swiglu(T gate, T up) { return silu(gate) * up; }

// Leaves the fragment as it is (the pre-activation is usually stored too) and writes the
// half-width output itself.
struct SwigluForward : NoTileState {
  struct Args {
    TensorView act; // [M, N / 2]
  };

  // Precondition: tiles start at even columns and hold whole pairs.
  explicit SwigluForward(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c + 1 < tile.cols; c += 2)
        store_float(args_.act, tile.m0 + r, (tile.n0 + c) / 2,
                    swiglu(frag.value(r, c), frag.value(r, c + 1)));
  }

  // Device: the half-width output tile is staged for its TMA store (by the driver's store path).
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue
