// Element access to host tensors for the host side of the epilogue ops: every dtype read as and
// written from fp32, one rounding per store (the bit-exact conversions of coda/core/types.hpp).
#pragma once

#include <cstdint>

#include "coda/core/fp8.hpp"
#include "coda/core/tensor.hpp"

namespace coda::epilogue {

inline int64_t element_offset(const TensorView& t, int64_t i, int64_t j = 0) {
  return t.rank == 1 ? i * t.stride[0] : i * t.stride[0] + j * t.stride[1];
}

// Element (i, j) of a rank-2 view, or element i of a rank-1 view (j = 0), as fp32.
inline float load_float(const TensorView& t, int64_t i, int64_t j = 0) {
  const int64_t at = element_offset(t, i, j);
  switch (t.dtype) {
  case DType::bf16:
    return t.ptr<const bf16>()[at].to_float();
  case DType::f16:
    return t.ptr<const f16>()[at].to_float();
  case DType::f32:
    return t.ptr<const float>()[at];
  case DType::i32:
    return float(t.ptr<const int32_t>()[at]);
  case DType::e4m3:
    return t.ptr<const e4m3>()[at].to_float();
  case DType::e8m0:
    return t.ptr<const e8m0>()[at].to_float();
  }
  return 0.f;
}

inline int32_t load_int(const TensorView& t, int64_t i) {
  return t.ptr<const int32_t>()[element_offset(t, i)];
}

// Rounds x once to the view's dtype and stores it.
inline void store_float(const TensorView& t, int64_t i, int64_t j, float x) {
  const int64_t at = element_offset(t, i, j);
  switch (t.dtype) {
  case DType::bf16:
    t.ptr<bf16>()[at] = bf16::from(x);
    return;
  case DType::f16:
    t.ptr<f16>()[at] = f16::from(x);
    return;
  case DType::f32:
    t.ptr<float>()[at] = x;
    return;
  case DType::i32:
    t.ptr<int32_t>()[at] = int32_t(x);
    return;
  case DType::e4m3:
    t.ptr<e4m3>()[at] = e4m3::from(x);
    return;
  case DType::e8m0: // scales are written by their exponent (e8m0::of_exponent), not from a value
    break;
  }
}
inline void store_float(const TensorView& t, int64_t i, float x) { store_float(t, i, 0, x); }

inline bool is_given(const TensorView& t) { return t.data != nullptr; }

// Row i of [rows, P] partial sums finished: sum_b partials[i, b] in b order, in fp32, as the
// consumer kernels finish them.
inline float sum_partials(const TensorView& partials, int64_t i) {
  float sum = 0.f;
  for (int64_t b = 0; b < partials.shape[1]; ++b) sum += load_float(partials, i, b);
  return sum;
}

} // namespace coda::epilogue
