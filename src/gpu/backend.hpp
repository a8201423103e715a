// The GPU backend (sm_90a). Entry points take validated arguments whose tensors are on the
// current CUDA device; they launch on `stream` and return without synchronizing. Built only
// with CODA_WITH_CUDA.
#pragma once

#include <string>

#include "coda/core/error.hpp"
#include "coda/core/types.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::gpu {

// True when the current device can run the sm_90a kernels (compute capability 9.0).
bool device_supported();
// Throws Status::not_supported ("the GPU <kernel> needs an sm_90 (Hopper) device") unless
// device_supported().
void require_device(const char* kernel);

// f(bf16{}) or f(f16{}) for the call's 16-bit dtype; any other dtype is a type_error saying that
// `kernels` (e.g. "the fused GPU kernels") take bf16 or f16 tensors.
template <class F> void with_half_type(DType dtype, const char* kernels, F&& f) {
  if (dtype == DType::bf16) return f(bf16{});
  if (dtype == DType::f16) return f(f16{});
  throw Error(Status::type_error, std::string(kernels) + " take bf16 or f16 tensors");
}

void gemm(const GemmArgs& args, Stream stream);
// The block-scaled FP8 GEMM (gemm/fp8.cu), on the tile sm90::choose_fp8_tile picks.
void gemm_fp8(const Fp8GemmArgs& args, Stream stream);
// The same on a given tile (tests and benchmarks force each; automatic: the pick above). The
// 192-column tiles take B scaled by blocks: with B by rows they are not_supported.
void gemm_fp8_with_tile(const Fp8GemmArgs& args, sm90::Fp8Tile tile, Stream stream);
// The tile gemm_fp8 runs for `args` on the current device.
sm90::Fp8Tile gemm_fp8_tile(const Fp8GemmArgs& args);
// A weight's FP8 codes and block scales, and its transposed copy (auxiliary/quantize_fp8.cu).
void quantize_weight_fp8(const QuantizeWeightFp8Args& args, Stream stream);
// An activation's FP8 codes with row-block scales, and its transposed copy blocked along M
// (auxiliary/quantize_activation_fp8.cu).
void quantize_activation_fp8(const QuantizeActivationFp8Args& args, Stream stream);

} // namespace coda::gpu
