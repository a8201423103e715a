// SwiGLU forward, a pair to one (2 -> 1): columns (2j, 2j + 1) hold (gate, up) of feature j
// (the interleaved fused gate/up layout), and act[m, j] = silu(gate) * up;
// GatedPairStore<SwigluGate> applies it to a tile.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/math.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T sigmoid(T x) { return math::reciprocal(T(1) + math::exp(-x)); }

// silu(g) = g * sigmoid(g), spelled as the backward recomputes it (so both agree bit for bit).
// For g below about -88, exp(-g) overflows to inf and silu is -0, its limit.
template <class T> CODA_HD T silu(T gate) { return gate * sigmoid(gate); }

template <class T> CODA_HD T swiglu(T gate, T up) { return silu(gate) * up; }

// SwiGLU as the gate of GatedPairStore (ops/gated_pair.hpp, device/ops/gated_pair.cuh), on the
// host and the device.
struct SwigluGate {
  template <class F> CODA_HD F operator()(F gate, F up) const { return swiglu(gate, up); }
};

} // namespace coda::epilogue
