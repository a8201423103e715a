// Placeholders for CPU backend entry points that are not written yet, so libcoda links while
// the backend is built up. Each one is removed as its real definition lands.
#include "cpu/backend.hpp"

#include "coda/core/error.hpp"

namespace coda::cpu {

namespace {
[[noreturn]] void not_implemented(const char* name) {
  throw Error(Status::internal, std::string("cpu::") + name + ": not implemented yet");
}
} // namespace

void gemm(const GemmArgs&) { not_implemented("gemm"); }
void gemm_residual_rms(const ResidualRmsArgs&, Tile) { not_implemented("gemm_residual_rms"); }
void gemm_rms_scale(const RmsScaleArgs&, Tile) { not_implemented("gemm_rms_scale"); }
void gemm_rms_swiglu(const RmsSwigluArgs&, Tile) { not_implemented("gemm_rms_swiglu"); }
void gemm_rms_rope(const RmsRopeArgs&, Tile) { not_implemented("gemm_rms_rope"); }
void gemm_rms_lse(const RmsLseArgs&, Tile) { not_implemented("gemm_rms_lse"); }
void gemm_rms_backward(const RmsBackwardArgs&, Tile) { not_implemented("gemm_rms_backward"); }
void gemm_swiglu_backward(const SwigluBackwardArgs&, Tile) { not_implemented("gemm_swiglu_backward"); }
void rms_stats(const RmsStatsArgs&) { not_implemented("rms_stats"); }
void rstd_from_partials(const RstdArgs&) { not_implemented("rstd_from_partials"); }
void reduce_row_partials(const RowReduceArgs&) { not_implemented("reduce_row_partials"); }
void reduce_col_partials(const ColReduceArgs&) { not_implemented("reduce_col_partials"); }
void rope_backward(const RopeBackwardArgs&) { not_implemented("rope_backward"); }
void cross_entropy(const CrossEntropyArgs&) { not_implemented("cross_entropy"); }

} // namespace coda::cpu
