// The dgrad-layout GEMM kernels (see gemm_instances.hpp).
#include "gpu/gemm_instances.cuh"

namespace coda::gpu {

template <>
GemmLauncher gemm_launcher<GemmLayout::dgrad>(DType in, DType out, sm90::KernelId kernel) {
  return detail::launcher_for_types<GemmLayout::dgrad>(in, out, kernel);
}

} // namespace coda::gpu
