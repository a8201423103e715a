// The table of compiled GEMM kernels: one launcher per (layout, input dtype, output dtype,
// kernel). Each layout's instantiations live in their own translation unit (gemm_<layout>.cu)
// so they compile in parallel.
#pragma once

#include <cstddef>

#include "coda/core/types.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/gemm/scheduler.hpp"
#include "coda/kernels/args.hpp"

namespace coda::gpu {

using GemmLauncher = void (*)(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream);

// nullptr when the combination is not compiled.
template <GemmLayout kLayout>
GemmLauncher gemm_launcher(DType in, DType out, sm90::KernelId kernel);

template <> GemmLauncher gemm_launcher<GemmLayout::fwd>(DType, DType, sm90::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::dgrad>(DType, DType, sm90::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::wgrad>(DType, DType, sm90::KernelId);

// gpu::gemm with a given plan instead of the heuristic's (tests and benchmarks force kernels,
// raster groups, stream-K and deferred stores with it). Same checks as gpu::gemm.
void gemm_with_plan(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream);

// The plan gpu::gemm uses for `args` on the current device.
sm90::GemmPlan default_plan(const GemmArgs& args);

// Stream-K scratch of the GPU backend (gemm.cu): see sm90::StreamKWorkspaceFn.
sm90::StreamKWorkspace stream_k_workspace(size_t partial_bytes, size_t flag_bytes, Stream stream);

} // namespace coda::gpu
