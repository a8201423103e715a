// The fwd-layout GEMM kernels (see gemm_instances.hpp).
#include "gpu/gemm_instances.cuh"

namespace coda::gpu {

template <>
GemmLauncher gemm_launcher<GemmLayout::fwd>(DType in, DType out, sm90::KernelId kernel) {
  return detail::launcher_for_types<GemmLayout::fwd>(in, out, kernel);
}

} // namespace coda::gpu
