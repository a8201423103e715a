// The fwd-layout GEMM kernels (see gemm/instances.hpp).
#include "gpu/gemm/instances.cuh"

namespace coda::gpu {

template <>
GemmLauncher gemm_launcher<GemmLayout::fwd>(DType in, DType out, sm90::KernelId kernel) {
  return detail::launcher_for_types<GemmLayout::fwd>(in, out, kernel);
}

} // namespace coda::gpu
