// Device side of RoundTo (coda/epilogue/ops/round.hpp): each value rounded to T and back to fp32,
// so the ops after it see what a 16-bit store at this point wrote.
#pragma once

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tile_io.cuh"

namespace coda::epilogue::device {

template <class Shape, class T> struct RoundTo : OpBase {
  static_assert(sizeof(T) == 2, "rounds to a 16-bit dtype");
  struct Params {};
  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx&, const Subtile&, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = to_float<T>(from_float<T>(v[i]));
  }
};

} // namespace coda::epilogue::device
