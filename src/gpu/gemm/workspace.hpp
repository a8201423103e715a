// The GPU GEMM's workspace query (gemm.cu), for the public API and the block schedule.
// Plain C++; built only with CODA_WITH_CUDA.
#pragma once

#include <cstddef>

#include "coda/gemm/problem.hpp"

namespace coda::gpu {

// Bytes of stream-K scratch gpu::gemm(args) takes from args.workspace on the current device:
// 0 when its plan never uses stream-K. Reads the layout, shapes and dtypes of args only (data
// pointers may be null). Throws not_supported where gpu::gemm would (no sm_90 device, no kernel
// for the dtypes, K = 0).
size_t gemm_workspace_size(const GemmArgs& args);

} // namespace coda::gpu
