// Defines gemm_launcher<kLayout>: included once per layout by gemm/<layout>.cu.
//
// The plain GEMM D = alpha * acc (+ beta * C) on each compiled configuration: the register
// schedules store through LinearEpilogue; the staged schedule (16-bit D, no C) runs the same
// device epilogue driver as the fused kernels: alpha in the consumers, the rounded tile staged,
// and stored from there in place by the epilogue warpgroup.
#pragma once

#include <type_traits>

#include "coda/epilogue/device/epilogue.cuh"
#include "coda/epilogue/device/linear.cuh"
#include "coda/gemm/launch.cuh"
#include "gpu/gemm/instances.hpp"

namespace coda::gpu::detail {

namespace dev = coda::epilogue::device;

template <class Config, GemmLayout kLayout, class InT, class OutT> struct PlainGemm {
  static constexpr bool kStaged = Config::kStaged;
  static_assert(!kStaged || sizeof(OutT) == 2, "the staged schedule stores 16-bit outputs");
  using Shape = dev::TileShape<1, Config::kTileM, Config::kTileN, /*staged=*/true,
                               Config::kEpilogueInProducer ? Config::kEpilogueWarps : 4>;
  using StagedStore = dev::TileStore<Shape, OutT, /*reduce_add=*/false, /*in_place=*/true>;
  using StagedEpi = dev::FusedEpilogue<Shape, dev::ScaleByScalar, dev::Stage<OutT>, StagedStore>;
  // Cooperative: both warpgroups finish their MMAs at once, so the stores are deferred into the
  // next mainloop; ping-pong: the other warpgroup's MMAs already overlap them.
  using RegisterEpi = dev::LinearEpilogue<OutT, Config::kConsumerWarpgroups,
                                          Config::kSchedule == sm90::Schedule::cooperative>;
  using Epi = std::conditional_t<kStaged, StagedEpi, RegisterEpi>;
  using Kernel = sm90::GemmKernel<Config, kLayout, InT, Epi>;

  static typename Kernel::Problem problem(const GemmArgs& args) {
    return {args.m(), args.n(), args.k()};
  }

  static typename Epi::Params epilogue_params(const GemmArgs& args, const sm90::GemmPlan& plan) {
    typename Epi::Params p{};
    if constexpr (kStaged) {
      if (args.has_c() && args.beta != 0.f)
        throw Error(Status::internal, "the staged GEMM kernel takes no C (plan it elsewhere)");
      dev::get<0>(p) = dev::ScaleByScalar::params(args.alpha);
      dev::get<2>(p) = StagedStore::params("D", args.d); // its own box shape (in place: 16 rows)
    } else {
      p.d = Epi::output_map("D", args.d, args.m(), args.n());
      p.load_c = args.has_c() && args.beta != 0.f;
      p.c = p.load_c ? Epi::output_map("C", args.c, args.m(), args.n()) : p.d;
      p.alpha = args.alpha.value;
      p.alpha_tensor =
          args.alpha.has_tensor() ? args.alpha.tensor.template ptr<const float>() : nullptr;
      p.beta = args.beta;
      p.defer_stores = plan.defer_stores;
    }
    return p;
  }

  static void run(const GemmArgs& args, const sm90::GemmPlan& plan, Stream stream) {
    Kernel::run(args.a, args.b, problem(args), epilogue_params(args, plan), plan, args.workspace,
                stream);
  }
  static size_t workspace_size(const GemmArgs& args, const sm90::GemmPlan& plan) {
    return Kernel::workspace_size(problem(args), plan);
  }
};

template <class Gemm> constexpr GemmLauncher launcher() {
  return GemmLauncher{&Gemm::run, &Gemm::workspace_size};
}

// Kernels compiled for bf16 -> bf16 only: the configurations of the schedule study
// (docs/gemm-worklog.md, step 9), measured against the default ones by bench_gemm --variants.
template <class Config, GemmLayout kLayout, class InT, class OutT>
constexpr GemmLauncher study_launcher() {
  if constexpr (std::is_same_v<InT, bf16> && std::is_same_v<OutT, bf16>)
    return launcher<PlainGemm<Config, kLayout, InT, OutT>>();
  else
    return {};
}

template <GemmLayout kLayout, class InT, class OutT>
GemmLauncher launcher_for(sm90::KernelId kernel) {
  using namespace sm90;
  switch (kernel) {
  case KernelId::wide:
    return launcher<PlainGemm<WideConfig<OutT>, kLayout, InT, OutT>>();
  case KernelId::pingpong:
    return launcher<PlainGemm<PingpongConfig<OutT>, kLayout, InT, OutT>>();
  case KernelId::wide_3stages:
    return study_launcher<GemmConfig<128, 256, 3, 2, Schedule::cooperative>, kLayout, InT, OutT>();
  case KernelId::wide192:
    return study_launcher<GemmConfig<128, 192, 4, 2, Schedule::cooperative>, kLayout, InT, OutT>();
  case KernelId::staged:
    return study_launcher<GemmConfig<128, 256, 3, 2, Schedule::staged>, kLayout, InT, OutT>();
  case KernelId::staged192:
    return study_launcher<GemmConfig<128, 192, 4, 2, Schedule::staged>, kLayout, InT, OutT>();
  case KernelId::staged_wide:
    return study_launcher<GemmConfig<128, 256, 3, 2, Schedule::staged_wide>, kLayout, InT, OutT>();
  case KernelId::pingpong_wide:
    return study_launcher<GemmConfig<64, 256, 4, 2, Schedule::pingpong>, kLayout, InT, OutT>();
  case KernelId::staged128:
    return study_launcher<GemmConfig<128, 128, 5, 2, Schedule::staged>, kLayout, InT, OutT>();
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
