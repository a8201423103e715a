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

// The named CODA kernels (coda/kernels/args.hpp has the math of each).
void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream = nullptr);       // K0
void gemm_rms_scale(const RmsScaleArgs& args, Stream stream = nullptr);             // K1
void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream stream = nullptr);           // K2
void gemm_rms_rope(const RmsRopeArgs& args, Stream stream = nullptr);               // K4
void gemm_rms_lse(const RmsLseArgs& args, Stream stream = nullptr);                 // K5
void gemm_rms_backward(const RmsBackwardArgs& args, Stream stream = nullptr);       // K6
void gemm_swiglu_backward(const SwigluBackwardArgs& args, Stream stream = nullptr); // K7

// Auxiliary kernels.
void rms_stats(const RmsStatsArgs& args, Stream stream = nullptr);
void rstd_from_partials(const RstdArgs& args, Stream stream = nullptr);
void reduce_row_partials(const RowReduceArgs& args, Stream stream = nullptr);
void reduce_col_partials(const ColReduceArgs& args, Stream stream = nullptr);
void rope_backward(const RopeBackwardArgs& args, Stream stream = nullptr);
void cross_entropy(const CrossEntropyArgs& args, Stream stream = nullptr);
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
