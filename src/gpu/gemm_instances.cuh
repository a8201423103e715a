// Defines gemm_launcher<kLayout>: included once per layout by gemm_<layout>.cu.
#pragma once

#include "coda/gemm/launch.cuh"
#include "gpu/gemm_instances.hpp"

namespace coda::gpu::detail {

template <class Kernel> constexpr GemmLauncher launcher() {
  return GemmLauncher{&Kernel::run, &Kernel::workspace_size};
}

template <GemmLayout kLayout, class InT, class OutT>
GemmLauncher launcher_for(sm90::KernelId kernel) {
  switch (kernel) {
  case sm90::KernelId::wide:
    return launcher<sm90::GemmKernel<sm90::WideConfig<OutT>, kLayout, InT, OutT>>();
  case sm90::KernelId::pingpong:
    return launcher<sm90::GemmKernel<sm90::PingpongConfig<OutT>, kLayout, InT, OutT>>();
  }
  return {};
}

template <GemmLayout kLayout, class InT>
GemmLauncher launcher_for_out(DType out, sm90::KernelId kernel) {
  switch (out) {
  case DType::bf16:
    return launcher_for<kLayout, InT, bf16>(kernel);
  case DType::f16:
    return launcher_for<kLayout, InT, f16>(kernel);
  case DType::f32:
    return launcher_for<kLayout, InT, float>(kernel);
  default:
    return {};
  }
}

template <GemmLayout kLayout>
GemmLauncher launcher_for_types(DType in, DType out, sm90::KernelId kernel) {
  switch (in) {
  case DType::bf16:
    return launcher_for_out<kLayout, bf16>(out, kernel);
  case DType::f16:
    return launcher_for_out<kLayout, f16>(out, kernel);
  default:
    return {};
  }
}

} // namespace coda::gpu::detail
