// gpu::gemm_fp8: the block-scaled FP8 GEMM's kernel is not written yet; device tensors get
// not_supported (the CPU backend runs host tensors).
#include "coda/core/error.hpp"
#include "gpu/backend.hpp"

namespace coda::gpu {

void gemm_fp8(const Fp8GemmArgs&, Stream) {
  throw Error(Status::not_supported, "gemm_fp8: the GPU kernel is not built yet");
}

} // namespace coda::gpu
