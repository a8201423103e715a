// The C++ entry points: validate, then run on the backend of the tensors' device. The CPU
// backend computes synchronously and ignores the stream.
#include "coda/coda.hpp"

#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "cpu/backend.hpp"

#if CODA_WITH_CUDA
#include "gpu/backend.hpp"
#include "gpu/gemm_workspace.hpp"
#include "gpu/kernels_aux.hpp"
#include "gpu/kernels_fused.hpp"
#endif

namespace coda {

void gemm(const GemmArgs& args, Stream stream) {
  if (api::validate(args) == Device::cpu) return cpu::gemm(args);
  api::require_supported_gpu("gemm");
#if CODA_WITH_CUDA
  gpu::gemm(args, stream);
#endif
}

size_t gemm_workspace_size(const GemmArgs& args) {
  if (api::validate(args) == Device::cpu) return 0;
  api::require_supported_gpu("gemm_workspace_size");
#if CODA_WITH_CUDA
  return gpu::gemm_workspace_size(args);
#else
  return 0;
#endif
}

size_t gemm_workspace_size(GemmLayout layout, int64_t m, int64_t n, int64_t k, DType out) {
  if (m < 1 || n < 1 || k < 1)
    throw Error(Status::invalid_argument, "gemm_workspace_size: m, n and k must be >= 1; got " +
                                              std::to_string(m) + ", " + std::to_string(n) +
                                              " and " + std::to_string(k));
#if CODA_WITH_CUDA
  if (!gpu::device_supported()) return 0;
  // Shapes and dtypes only: the GPU query reads no data.
  const bool wgrad = layout == GemmLayout::wgrad;
  GemmArgs g;
  g.layout = layout;
  g.a = wgrad ? make_view(nullptr, DType::bf16, k, m, Device::cuda)
              : make_view(nullptr, DType::bf16, m, k, Device::cuda);
  g.b = layout == GemmLayout::fwd ? make_view(nullptr, DType::bf16, n, k, Device::cuda)
                                  : make_view(nullptr, DType::bf16, k, n, Device::cuda);
  g.d = make_view(nullptr, out, m, n, Device::cuda);
  return gpu::gemm_workspace_size(g);
#else
  (void)layout, (void)out;
  return 0;
#endif
}

namespace {

// Validate, then run on the backend of the tensors' device.
template <class Args, class CpuKernel, class GpuKernel>
void run(const char* name, const Args& args, Stream stream, CpuKernel cpu_kernel,
         GpuKernel gpu_kernel) {
  if (api::validate(args) == Device::cpu) return cpu_kernel(args);
  api::require_supported_gpu(name);
#if CODA_WITH_CUDA
  gpu_kernel(args, stream);
#else
  (void)stream, (void)gpu_kernel;
#endif
}

#if CODA_WITH_CUDA
#define CODA_GPU_KERNEL(fn) [](const auto& x, Stream s) { gpu::fn(x, s); }
#else
#define CODA_GPU_KERNEL(fn) [](const auto&, Stream) {}
#endif

} // namespace

void gemm_residual_rms(const ResidualRmsArgs& args, Stream stream) {
  run(
      "gemm_residual_rms", args, stream,
      [](const ResidualRmsArgs& x) { cpu::gemm_residual_rms(x); },
      CODA_GPU_KERNEL(gemm_residual_rms));
}
void gemm_rms_scale(const RmsScaleArgs& args, Stream stream) {
  run(
      "gemm_rms_scale", args, stream, [](const RmsScaleArgs& x) { cpu::gemm_rms_scale(x); },
      CODA_GPU_KERNEL(gemm_rms_scale));
}
void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  run(
      "gemm_rms_swiglu", args, stream, [](const RmsSwigluArgs& x) { cpu::gemm_rms_swiglu(x); },
      CODA_GPU_KERNEL(gemm_rms_swiglu));
}
void gemm_rms_rope(const RmsRopeArgs& args, Stream stream) {
  run(
      "gemm_rms_rope", args, stream, [](const RmsRopeArgs& x) { cpu::gemm_rms_rope(x); },
      CODA_GPU_KERNEL(gemm_rms_rope));
}
void gemm_rms_lse(const RmsLseArgs& args, Stream stream) {
  run(
      "gemm_rms_lse", args, stream, [](const RmsLseArgs& x) { cpu::gemm_rms_lse(x); },
      CODA_GPU_KERNEL(gemm_rms_lse));
}
void gemm_rms_backward(const RmsBackwardArgs& args, Stream stream) {
  run(
      "gemm_rms_backward", args, stream,
      [](const RmsBackwardArgs& x) { cpu::gemm_rms_backward(x); },
      CODA_GPU_KERNEL(gemm_rms_backward));
}
void gemm_swiglu_backward(const SwigluBackwardArgs& args, Stream stream) {
  run(
      "gemm_swiglu_backward", args, stream,
      [](const SwigluBackwardArgs& x) { cpu::gemm_swiglu_backward(x); },
      CODA_GPU_KERNEL(gemm_swiglu_backward));
}
void rms_stats(const RmsStatsArgs& args, Stream stream) {
  run(
      "rms_stats", args, stream, [](const RmsStatsArgs& x) { cpu::rms_stats(x); },
      CODA_GPU_KERNEL(rms_stats));
}
void rstd_from_partials(const RstdArgs& args, Stream stream) {
  run(
      "rstd_from_partials", args, stream, [](const RstdArgs& x) { cpu::rstd_from_partials(x); },
      CODA_GPU_KERNEL(rstd_from_partials));
}
void reduce_row_partials(const RowReduceArgs& args, Stream stream) {
  run(
      "reduce_row_partials", args, stream,
      [](const RowReduceArgs& x) { cpu::reduce_row_partials(x); },
      CODA_GPU_KERNEL(reduce_row_partials));
}
void reduce_col_partials(const ColReduceArgs& args, Stream stream) {
  run(
      "reduce_col_partials", args, stream,
      [](const ColReduceArgs& x) { cpu::reduce_col_partials(x); },
      CODA_GPU_KERNEL(reduce_col_partials));
}
void rope_backward(const RopeBackwardArgs& args, Stream stream) {
  run(
      "rope_backward", args, stream, [](const RopeBackwardArgs& x) { cpu::rope_backward(x); },
      CODA_GPU_KERNEL(rope_backward));
}
void cross_entropy(const CrossEntropyArgs& args, Stream stream) {
  run(
      "cross_entropy", args, stream, [](const CrossEntropyArgs& x) { cpu::cross_entropy(x); },
      CODA_GPU_KERNEL(cross_entropy));
}

// One f32 loss and one i32 "counted" flag per row, each region 256-byte aligned, so the GPU
// reduces the loss deterministically without atomics.
size_t cross_entropy_workspace_size(int64_t m) {
  if (m < 0)
    throw Error(Status::invalid_argument,
                "cross_entropy_workspace_size: m must be >= 0; got " + std::to_string(m));
  const auto region = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  return region(size_t(m) * sizeof(float)) + region(size_t(m) * sizeof(int32_t));
}

} // namespace coda
