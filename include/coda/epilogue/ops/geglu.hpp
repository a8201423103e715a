// GeGLU forward, a pair to one (2 -> 1): act[m, j] = gelu(gate) * up on the interleaved
// (gate, up) columns, with GELU's erf form (PyTorch's default, approximate="none"):
//   gelu(x) = x Φ(x) = x / 2 * (1 + erf(x / sqrt 2)).
// GatedPairStore<GegluGate> applies it to a tile on the host and the device.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/math.hpp"

namespace coda::epilogue {

// erf is math.hpp's (CUDA's erff on the device, std::erf on the host).
template <class T> CODA_HD T gelu(T x) {
  return T(0.5) * x * (T(1) + math::erf(x * T(0.70710678118654752440)));
}

template <class T> CODA_HD T geglu(T gate, T up) { return gelu(gate) * up; }

// GeGLU as the gate of GatedPairStore (ops/gated_pair.hpp, device/ops/gated_pair.cuh).
struct GegluGate {
  template <class F> CODA_HD F operator()(F gate, F up) const { return geglu(gate, up); }
};

} // namespace coda::epilogue
