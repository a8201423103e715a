// The dgrad-layout GEMM kernels (see gemm/instances.hpp).
#include "gpu/gemm/instances.cuh"

namespace coda::gpu {

template <>
GemmLauncher gemm_launcher<GemmLayout::dgrad>(DType in, DType out, sm90::KernelId kernel) {
  return detail::launcher_for_types<GemmLayout::dgrad>(in, out, kernel);
}

} // namespace coda::gpu
