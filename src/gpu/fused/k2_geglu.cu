// K2g gemm_rms_geglu: K2 with GeGLU, act[m, j] = round(gelu(z[m, 2j]) * z[m, 2j + 1]) from
// z = round(rstd[m] * (a · wᵀ)) as stored (coda/epilogue/ops/geglu.hpp). K2's launch
// (fused/k2.cuh) with the GeGLU gate: K2's schedules and defaults, which were measured with
// SwiGLU (GeGLU's erf is a few more epilogue instructions per value than silu's exp).
#include "coda/epilogue/ops/geglu.hpp"
#include "gpu/fused/k2.cuh"

namespace coda::gpu {

void gemm_rms_geglu(const RmsGegluArgs& args, Stream stream) {
  fused::gemm_rms_gated<epilogue::GegluGate>("gemm_rms_geglu", args, stream);
}

} // namespace coda::gpu
