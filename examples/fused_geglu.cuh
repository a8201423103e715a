// A new fused kernel written against the device epilogue API: GEMM + GeGLU.
//   z = a · wᵀ        a [M, K]; w [2F, K] with gate and up rows interleaved (gate0, up0, ...),
//                     the layout coda::interleave_gate_up makes from a [gate; up] checkpoint
//   act[m, j] = gelu(z[m, 2j]) * z[m, 2j + 1]      act [M, F]; GELU with erf (torch's default)
// One functor holds the math; the op list says what happens to each output tile; one launch.
// z never reaches memory: the pairwise op reads it from the accumulator registers.
#pragma once

#include <cmath>

#include "coda/epilogue/device/epilogue.cuh"

namespace coda::examples {

// gelu(gate) * up. __host__ __device__, so a host check can call the same function.
struct GegluGate {
  template <class F> CODA_HD F operator()(F gate, F up) const {
#if defined(__CUDA_ARCH__)
    const F e = erff(gate * F(0.70710678118654752440));
#else
    const F e = std::erf(gate * F(0.70710678118654752440));
#endif
    return F(0.5) * gate * (F(1) + e) * up;
  }
};

namespace ep = coda::epilogue::device;

// Per output tile: the pairs (2j, 2j + 1) of the fp32 accumulator -> GegluGate -> round to T ->
// shared memory -> TMA store into act.
template <class T>
using GegluEpilogue =
    ep::FusedEpilogue<ep::FusedShape, ep::GatedPairStore<ep::FusedShape, T, GegluGate>>;

// act = GeGLU(a · wᵀ) on device tensors of type T (bf16 or f16), launched on `stream`.
template <class T>
void gemm_geglu(const TensorView& a, const TensorView& w, const TensorView& act, Stream stream) {
  using Epi = GegluEpilogue<T>;
  typename Epi::Params params{};
  ep::get<0>(params) = ep::GatedPairStore<ep::FusedShape, T, GegluGate>::params("act", act);
  ep::FusedGemm<Epi, T>::run(a, w, params, stream);
}

} // namespace coda::examples
