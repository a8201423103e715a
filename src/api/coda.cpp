// The C++ entry points: validate, then run on the backend of the tensors' device. The CPU
// backend computes synchronously and ignores the stream.
#include "coda/coda.hpp"

#include "api/checks.hpp"
#include "api/device.hpp"
#include "cpu/backend.hpp"

#if CODA_WITH_CUDA
#include "gpu/backend.hpp"
#endif

namespace coda {

void gemm(const GemmArgs& args, Stream stream) {
  if (api::validate(args) == Device::cpu) return cpu::gemm(args);
  api::require_supported_gpu("gemm");
#if CODA_WITH_CUDA
  gpu::gemm(args, stream);
#endif
}

namespace {

// Kernels the GPU backend does not have yet: validated the same way, then not_supported on
// device memory. Each moves to the pattern of gemm() when its gpu:: function lands.
template <class Args, class CpuKernel>
void run_cpu_only(const char* name, const Args& args, CpuKernel cpu_kernel) {
  if (api::validate(args) == Device::cpu) return cpu_kernel(args);
  api::gpu_not_implemented(name);
}

} // namespace

void gemm_residual_rms(const ResidualRmsArgs& args, Stream) {
  run_cpu_only("gemm_residual_rms", args,
               [](const ResidualRmsArgs& x) { cpu::gemm_residual_rms(x); });
}
void gemm_rms_scale(const RmsScaleArgs& args, Stream) {
  run_cpu_only("gemm_rms_scale", args, [](const RmsScaleArgs& x) { cpu::gemm_rms_scale(x); });
}
void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream) {
  run_cpu_only("gemm_rms_swiglu", args, [](const RmsSwigluArgs& x) { cpu::gemm_rms_swiglu(x); });
}
void gemm_rms_rope(const RmsRopeArgs& args, Stream) {
  run_cpu_only("gemm_rms_rope", args, [](const RmsRopeArgs& x) { cpu::gemm_rms_rope(x); });
}
void gemm_rms_lse(const RmsLseArgs& args, Stream) {
  run_cpu_only("gemm_rms_lse", args, [](const RmsLseArgs& x) { cpu::gemm_rms_lse(x); });
}
void gemm_rms_backward(const RmsBackwardArgs& args, Stream) {
  run_cpu_only("gemm_rms_backward", args,
               [](const RmsBackwardArgs& x) { cpu::gemm_rms_backward(x); });
}
void gemm_swiglu_backward(const SwigluBackwardArgs& args, Stream) {
  run_cpu_only("gemm_swiglu_backward", args,
               [](const SwigluBackwardArgs& x) { cpu::gemm_swiglu_backward(x); });
}
void rms_stats(const RmsStatsArgs& args, Stream) {
  run_cpu_only("rms_stats", args, [](const RmsStatsArgs& x) { cpu::rms_stats(x); });
}
void rstd_from_partials(const RstdArgs& args, Stream) {
  run_cpu_only("rstd_from_partials", args, [](const RstdArgs& x) { cpu::rstd_from_partials(x); });
}
void reduce_row_partials(const RowReduceArgs& args, Stream) {
  run_cpu_only("reduce_row_partials", args,
               [](const RowReduceArgs& x) { cpu::reduce_row_partials(x); });
}
void reduce_col_partials(const ColReduceArgs& args, Stream) {
  run_cpu_only("reduce_col_partials", args,
               [](const ColReduceArgs& x) { cpu::reduce_col_partials(x); });
}
void rope_backward(const RopeBackwardArgs& args, Stream) {
  run_cpu_only("rope_backward", args, [](const RopeBackwardArgs& x) { cpu::rope_backward(x); });
}
void cross_entropy(const CrossEntropyArgs& args, Stream) {
  run_cpu_only("cross_entropy", args, [](const CrossEntropyArgs& x) { cpu::cross_entropy(x); });
}

} // namespace coda
