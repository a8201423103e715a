// RoPE backward
// STUB: replaced by the GPU implementation in progress.
#include "coda/core/error.hpp"
#include "gpu/kernels_aux.hpp"

namespace coda::gpu {
void rope_backward(const RopeBackwardArgs&, Stream) {
  throw Error(Status::not_supported, "rope_backward: not yet on the GPU");
}
} // namespace coda::gpu
