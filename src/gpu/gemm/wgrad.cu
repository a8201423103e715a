// The wgrad-layout GEMM kernels (see gemm/instances.hpp).
#include "gpu/gemm/instances.cuh"

namespace coda::gpu {

template <>
GemmLauncher gemm_launcher<GemmLayout::wgrad>(DType in, DType out, sm90::KernelId kernel) {
  return detail::launcher_for_types<GemmLayout::wgrad>(in, out, kernel);
}

} // namespace coda::gpu
