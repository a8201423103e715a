// K6 gemm_rms_backward
// STUB: replaced by the GPU implementation in progress.
#include "coda/core/error.hpp"
#include "gpu/kernels_fused.hpp"

namespace coda::gpu {
void gemm_rms_backward(const RmsBackwardArgs&, Stream) {
  throw Error(Status::not_supported, "gemm_rms_backward: not yet on the GPU");
}
} // namespace coda::gpu
