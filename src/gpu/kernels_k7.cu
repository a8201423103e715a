// K7 gemm_swiglu_backward
// STUB: replaced by the GPU implementation in progress.
#include "coda/core/error.hpp"
#include "gpu/kernels_fused.hpp"

namespace coda::gpu {
void gemm_swiglu_backward(const SwigluBackwardArgs&, Stream) {
  throw Error(Status::not_supported, "gemm_swiglu_backward: not yet on the GPU");
}
} // namespace coda::gpu
