// K2 gemm_rms_swiglu: z = round(rstd[m] * (a · wᵀ)) on the fused interleaved gate/up weight;
// preact = z, act[m, j] = round(silu(z[m, 2j]) * z[m, 2j + 1]) from z as stored. The launch is
// fused/k2.cuh's, with the SwiGLU gate.
#include "gpu/fused/k2.cuh"

namespace coda::gpu {

void gemm_rms_swiglu(const RmsSwigluArgs& args, Stream stream) {
  fused::gemm_rms_gated<epilogue::SwigluGate>("gemm_rms_swiglu", args, stream);
}

} // namespace coda::gpu
