// A scale factor given as a number, or as a number times a [1] f32 tensor that the call reads
// from its own device (e.g. a loss scale or 1 / #valid tokens computed on the GPU), so no host
// read-back is needed. Used by the plain GEMM's alpha, the row reduce's scale and K6's alpha.
#pragma once

#include "coda/core/tensor.hpp"

namespace coda {

// value * tensor[0] when the optional [1] f32 tensor is given (rounded once, in fp32, before it
// scales anything), value alone otherwise.
struct Scalar {
  float value = 1.f;
  TensorView tensor; // optional [1] f32 on the call's device; absent: data == nullptr

  Scalar() = default;
  // NOTE: not explicit, so a plain number still reads as before: `args.alpha = 2.f;`.
  Scalar(float v) : value(v) {} // NOLINT(google-explicit-constructor)
  Scalar(float v, const TensorView& t) : value(v), tensor(t) {}

  bool has_tensor() const { return tensor.data != nullptr; }
};

} // namespace coda
