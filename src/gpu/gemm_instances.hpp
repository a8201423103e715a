// The table of compiled GEMM kernels: one launcher per (layout, input dtype, output dtype,
// kernel). Each layout's instantiations live in their own translation unit (gemm_<layout>.cu)
// so they compile in parallel.
#pragma once

#include "coda/core/types.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::gpu {

using GemmLauncher = void (*)(const GemmArgs& args, int32_t group_m, Stream stream);

// nullptr when the combination is not compiled.
template <GemmLayout kLayout>
GemmLauncher gemm_launcher(DType in, DType out, gemm::KernelId kernel);

template <> GemmLauncher gemm_launcher<GemmLayout::fwd>(DType, DType, gemm::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::dgrad>(DType, DType, gemm::KernelId);
template <> GemmLauncher gemm_launcher<GemmLayout::wgrad>(DType, DType, gemm::KernelId);

} // namespace coda::gpu
