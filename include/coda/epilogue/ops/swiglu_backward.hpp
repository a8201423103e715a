// SwiGLU backward, one gradient plus a pair to two (1 + pair -> 2). The fragment holds
// dy = dL/d act[m, j]; the saved pre-activation gives g = z[m, 2j], u = z[m, 2j + 1]. With
// sig = sigmoid(g) and s = g sig (so act = s u):
//   d act / dg = u sig (1 + g (1 - sig))      d act / du = s
// and the RMSNorm backward of the producer needs zeta = sum_k z dz, whose per-pair part is
// g dg + u du.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/ops/swiglu.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> struct SwigluGrad {
  T act;       // s u, the recomputed forward output
  T dgate;     // dy u sig (1 + g (1 - sig))
  T dup;       // dy s
  T zeta_term; // g dgate + u dup
};

template <class T> CODA_HD SwigluGrad<T> swiglu_backward(T gate, T up, T dy) {
  const T sig = sigmoid(gate);
  const T s = gate * sig;
  const T dgate = dy * up * sig * (T(1) + gate * (T(1) - sig));
  const T dup = dy * s;
  return {s * up, dgate, dup, gate * dgate + up * dup};
}

// Replaces the fragment's value by the recomputed act (the main output), leaves the zeta term
// in the aux plane (for a ReduceOverN<Sum> after it) and writes the interleaved gradient pair.
struct SwigluBackward : NoTileState {
  struct Args {
    TensorView preact;  // [M, 2F] saved (gate, up) pairs
    TensorView dpreact; // [M, 2F] output
  };

  explicit SwigluBackward(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r) {
      const int64_t m = tile.m0 + r;
      for (int64_t c = 0; c < tile.cols; ++c) {
        const int64_t j = tile.n0 + c;
        const auto grad = swiglu_backward(load_float(args_.preact, m, 2 * j),
                                          load_float(args_.preact, m, 2 * j + 1), frag.value(r, c));
        store_float(args_.dpreact, m, 2 * j, grad.dgate);
        store_float(args_.dpreact, m, 2 * j + 1, grad.dup);
        frag.value(r, c) = grad.act;
        frag.aux(r, c) = grad.zeta_term;
      }
    }
  }

  // Device: the pre-activation tile arrives as 32-bit (gate, up) containers by TMA, one per
  // accumulator element (2 x the output tile at 16 bits).
  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_m * tile_n * 4;
  }

private:
  Args args_;
};

} // namespace coda::epilogue
