// The table of compiled GEMM kernels: one launcher per (layout, input dtype, output dtype,
// kernel). Each layout's instantiations live in their own translation unit (gemm/<layout>.cu)
// so they compile in parallel.
#pragma once

#include <cstddef>

#include "coda/core/types.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/gemm/scheduler.hpp"
#include "coda/kernels/args.hpp"
#include "gpu/gemm/workspace.hpp"

namespace coda::gpu {

// One compiled kernel: its launch, and the workspace bytes a launch of `plan` takes (the same
// stream-K split, see sm90::GemmKernel).
struct GemmLauncher {
  void (*run)(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream) = nullptr;
  size_t (*workspace_size)(const GemmArgs& args, const sm90::GemmPlan& plan) = nullptr;
  explicit operator bool() const { return run != nullptr; }
};

// Empty when the combination is not compiled.
template <GemmLayout kLayout>
GemmLauncher gemm_launcher(DType in, DType out, sm90::KernelId kernel);

template <> GemmLauncher gemm_launcher<GemmLayout::fwd>(DType, DType, sm90::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::dgrad>(DType, DType, sm90::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::wgrad>(DType, DType, sm90::KernelId);

// gpu::gemm with a given plan instead of the heuristic's (tests and benchmarks force kernels,
// raster groups, stream-K and deferred stores with it). Same checks as gpu::gemm; stream-K runs
// only with args.workspace of at least gemm_workspace_size(args, plan) bytes.
void gemm_with_plan(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream);
size_t gemm_workspace_size(const GemmArgs& args, const sm90::GemmPlan& plan);

// The plan gpu::gemm uses for `args` on the current device.
sm90::GemmPlan default_plan(const GemmArgs& args);

} // namespace coda::gpu
