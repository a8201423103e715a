// Defines gemm_launcher<kLayout>: included once per layout by gemm_<layout>.cu.
#pragma once

#include "coda/gemm/launch.cuh"
#include "gpu/gemm_instances.hpp"

namespace coda::gpu::detail {

template <class Kernel> void launch(const GemmArgs& args, const sm90::GemmPlan& plan, Stream s) {
  Kernel::run(args, plan, &stream_k_workspace, s);
}

template <GemmLayout kLayout, class InT, class OutT>
GemmLauncher launcher_for(sm90::KernelId kernel) {
  switch (kernel) {
  case sm90::KernelId::wide:
    return &launch<sm90::GemmKernel<sm90::WideConfig<OutT>, kLayout, InT, OutT>>;
  case sm90::KernelId::pingpong:
    return &launch<sm90::GemmKernel<sm90::PingpongConfig<OutT>, kLayout, InT, OutT>>;
  }
  return nullptr;
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
    return nullptr;
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
    return nullptr;
  }
}

} // namespace coda::gpu::detail
