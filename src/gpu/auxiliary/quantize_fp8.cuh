// What the two FP8 quantizers' GPU kernels share (quantize_fp8.cu: a weight w [N, K] in 128 x 128
// blocks; quantize_activation_fp8.cu: an activation x [M, K] in 1 x 128 blocks both ways): the
// kernel parameters, filled from either call's Args, and the input dtype's dispatch.
#pragma once

#include <cstdint>
#include <string>

#include "coda/core/error.hpp"
#include "coda/core/tensor.hpp"
#include "coda/core/types.hpp"

namespace coda::gpu::aux {

// The input [rows, cols] and its codes [rows, cols] with their scales, and optionally the
// transposed copy (codes_t [cols, rows] and scales_t; null when absent). Strides in elements.
template <class T> struct QuantizeFp8Params {
  const T* in = nullptr;
  uint8_t *codes = nullptr, *scales = nullptr, *codes_t = nullptr, *scales_t = nullptr;
  int64_t in_stride = 0, codes_stride = 0, scales_stride = 0, codes_t_stride = 0,
          scales_t_stride = 0;
  int32_t rows = 0, cols = 0;
};

// From QuantizeWeightFp8Args (in = w) or QuantizeActivationFp8Args (in = x): the same output
// fields; the sizes were checked to fit 32 bits by the caller.
template <class T, class Args>
QuantizeFp8Params<T> quantize_fp8_params(const TensorView& in, const Args& args) {
  QuantizeFp8Params<T> p;
  p.in = in.ptr<const T>();
  p.in_stride = in.stride[0];
  p.codes = args.codes.template ptr<uint8_t>();
  p.scales = args.scales.template ptr<uint8_t>();
  p.codes_stride = args.codes.stride[0];
  p.scales_stride = args.scales.stride[0];
  if (args.codes_t.data != nullptr) {
    p.codes_t = args.codes_t.template ptr<uint8_t>();
    p.scales_t = args.scales_t.template ptr<uint8_t>();
    p.codes_t_stride = args.codes_t.stride[0];
    p.scales_t_stride = args.scales_t.stride[0];
  }
  p.rows = int32_t(in.shape[0]);
  p.cols = int32_t(in.shape[1]);
  return p;
}

// f(bf16{}), f(f16{}) or f(float{}) for the input's dtype; `what` names the input in the error.
template <class F> void with_quantizer_input(const TensorView& in, const char* what, F&& f) {
  switch (in.dtype) {
  case DType::bf16:
    return f(bf16{});
  case DType::f16:
    return f(f16{});
  case DType::f32:
    return f(float{});
  default:
    throw Error(Status::type_error, std::string(what) + " must be bf16, f16 or f32");
  }
}

} // namespace coda::gpu::aux
