// Device side of ScaleByScalar (coda/epilogue/ops/scalar.hpp): x * s, one factor per call, given
// as a value or as value * (*tensor) read from device memory (e.g. alpha * dloss).
#pragma once

#include "coda/core/scalar.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/ops/scalar.hpp"

namespace coda::epilogue::device {

struct ScaleByScalar : OpBase {
  static constexpr bool kBeforeStage = true; // may run in the consumers, before a Stage
  struct Params {
    float value = 1.f;
    const float* tensor = nullptr; // optional [1]
  };

  using Ctx = OpContext<Params, SharedStorage>;

  float factor;

  // Read before the mainloop; used after it.
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile, uint32_t) {
    factor = c.params.tensor != nullptr ? c.params.value * *c.params.tensor : c.params.value;
  }

  __device__ void visit(const Ctx&, const Subtile&, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = scale_by_scalar(v[i], factor);
  }

  static Params params(const Scalar& s) {
    return Params{s.value, s.has_tensor() ? s.tensor.ptr<const float>() : nullptr};
  }
};

} // namespace coda::epilogue::device
