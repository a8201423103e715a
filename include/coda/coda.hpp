// coda C++ API. Every entry point validates its arguments (throwing coda::Error with a message
// that says what to fix, before touching any output), then runs on the CPU backend when the
// tensors live on the host and on the GPU backend when they live on a CUDA device.
#pragma once

#include <cstddef>

#include "coda/core/error.hpp"
#include "coda/core/stream.hpp"
#include "coda/core/tensor.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda {

// True when this build has the GPU backend and the current CUDA device can run it (an sm_90
// Hopper GPU); false otherwise, without raising (device tensors then get not_supported).
bool gpu_supported();

// D = alpha · op(A)·op(B) + beta · C in the layouts of GemmLayout.
void gemm(const GemmArgs& args, Stream stream = nullptr);
// Bytes of args.workspace that gemm(args) can use (GemmArgs documents the workspace): the
// stream-K scratch of the plan it runs on the current device, from the same computation as the
// launch. 0 for host tensors and for shapes whose plan never uses stream-K. Validates args as
// gemm() does; args.workspace itself may be absent or of any size.
size_t gemm_workspace_size(const GemmArgs& args);
// The same number from the problem alone, before there are tensors (the Llama block sizes its
// workspace so): D [m, n] = op(A)·op(B) over k in `layout`, A and B 16-bit, D of dtype `out`, on
// the current device; 0 where no sm_90 device is current. m, n and k must be >= 1.
size_t gemm_workspace_size(GemmLayout layout, int64_t m, int64_t n, int64_t k, DType out);

// D = dequant(A) · dequant(B)ᵀ with FP8 (E4M3) operands and power-of-two block scales: the
// shapes, scale layouts and order of accumulation are Fp8GemmArgs's (coda/gemm/problem.hpp).
void gemm_fp8(const Fp8GemmArgs& args, Stream stream = nullptr);
// A weight's E4M3 codes and 128 x 128 block scales for gemm_fp8, its transposed copy, or both
// (QuantizeWeightFp8Args, coda/gemm/problem.hpp).
void quantize_weight_fp8(const QuantizeWeightFp8Args& args, Stream stream = nullptr);
// An activation's (or a gradient's) E4M3 codes with a scale per row and 128-column block for
// gemm_fp8, and optionally its transposed copy blocked along M for the weight gradient
// (QuantizeActivationFp8Args, coda/gemm/problem.hpp).
void quantize_activation_fp8(const QuantizeActivationFp8Args& args, Stream stream = nullptr);

// The named CODA kernels K0..K7 and the auxiliary kernels: one
//   void name(const Args& args, Stream stream = nullptr);
// per row of CODA_FUSED_KERNELS and CODA_AUX_KERNELS in coda/kernels/args.hpp, beside the math
// of each Args (gemm_rms_scale(const RmsScaleArgs&, Stream) is K1, ...).
#define CODA_DECLARE_ENTRY_POINT(name, Args) void name(const Args& args, Stream stream = nullptr);
CODA_FUSED_KERNELS(CODA_DECLARE_ENTRY_POINT)
CODA_AUX_KERNELS(CODA_DECLARE_ENTRY_POINT)
#undef CODA_DECLARE_ENTRY_POINT

// Bytes of CrossEntropyArgs::workspace for m rows.
size_t cross_entropy_workspace_size(int64_t m);

// Fused gate/up weight layout (rows interleaved: gate0, up0, gate1, up1, ...) to and from the
// Hugging Face [gate; up] stacking. Both are [2F, K]; src and dst must not overlap. Works on
// any dtype, host or device memory of one kind.
void interleave_gate_up(const TensorView& stacked, const TensorView& fused,
                        Stream stream = nullptr);
void deinterleave_gate_up(const TensorView& fused, const TensorView& stacked,
                          Stream stream = nullptr);

} // namespace coda

// The fused Llama block (first, middle and last layer, forward and backward).
#include "coda/block/llama.hpp"
