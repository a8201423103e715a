// The GPU backend (sm_90a). Entry points take validated arguments whose tensors are on the
// current CUDA device; they launch on `stream` and return without synchronizing. Built only
// with CODA_WITH_CUDA.
#pragma once

#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::gpu {

// True when the current device can run the sm_90a kernels (compute capability 9.0).
bool device_supported();

void gemm(const GemmArgs& args, Stream stream);

} // namespace coda::gpu
