// Host side of a fused GEMM: D-shaped outputs of the accumulator produced by a FusedEpilogue, on
// the persistent warp-specialized GEMM kernel (coda/gemm/kernel.cuh), in one of two layouts:
//   GemmLayout::fwd   acc = a · wᵀ   a [M, K], w [N, K] as nn.Linear stores it (the forward);
//   GemmLayout::dgrad acc = a · w    a [M, K], w [K, N] (an input gradient: B is N-contiguous,
//                                    loaded in 64 x 64 boxes, the mainloop's MN-major path).
// The epilogue's TileShape picks the configuration:
//   CooperativeShape (64 x 256 per consumer warpgroup): 128 x 256 tiles, both warpgroups on one
//     tile. The plain GEMM's workhorse; the epilogue runs while the tensor cores wait.
//   PingpongShape (128 x 128 per warpgroup): 128 x 128 tiles, the warpgroups on alternate tiles,
//     so one's epilogue runs while the other's MMAs do (for heavy epilogues).
// Both use clusters of 2 along M sharing B and as many pipeline stages (up to the plain GEMM's 4
// and 6) as fit beside the epilogue's shared memory. The mainloop is the plain GEMM's.
#pragma once

#include <algorithm>
#include <type_traits>

#include <cuda_runtime.h>

#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/gemm/config.hpp"
#include "coda/gemm/kernel.cuh"
#include "coda/gemm/launch.cuh"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/tensor_map.hpp"

namespace coda::epilogue::device {

using CooperativeShape = TileShape<2, 64, 256>;
using PingpongShape = TileShape<2, 128, 128>;
using FusedShape = CooperativeShape; // the default

template <class Shape> struct ScheduleOf;
template <> struct ScheduleOf<CooperativeShape> {
  static constexpr sm90::Schedule kSchedule = sm90::Schedule::cooperative;
  static constexpr int kMaxStages = 4;
};
template <> struct ScheduleOf<PingpongShape> {
  static constexpr sm90::Schedule kSchedule = sm90::Schedule::pingpong;
  static constexpr int kMaxStages = 6;
};

template <class Shape, int kStages>
using FusedConfig = sm90::GemmConfig<128, Shape::kCols, kStages, 2, ScheduleOf<Shape>::kSchedule>;

// Dynamic shared memory of the kernel with kStages pipeline stages (+ 1024 bytes of alignment
// slack: the kernel rounds the base up to 1024 bytes).
template <class Epi, class InT, int kStages, GemmLayout kLayout = GemmLayout::fwd>
constexpr size_t fused_shared_bytes() {
  using Config = FusedConfig<typename Epi::TileShape, kStages>;
  using Main = sm90::Mainloop<Config, kLayout, std::is_same_v<InT, bf16>>;
  return sizeof(sm90::KernelSharedStorage<Main, Epi>) + 1024;
}

// As many stages as fit beside the epilogue's shared memory, at most kStages.
template <class Epi, class InT, GemmLayout kLayout = GemmLayout::fwd,
          int kStages = ScheduleOf<typename Epi::TileShape>::kMaxStages>
constexpr int fused_stages() {
  if constexpr (kStages <= 2)
    return 2;
  else if constexpr (fused_shared_bytes<Epi, InT, kStages, kLayout>() <= sm90::kMaxSharedBytes)
    return kStages;
  else
    return fused_stages<Epi, InT, kLayout, kStages - 1>();
}

template <class Epi, class InT, GemmLayout kLayout = GemmLayout::fwd> struct FusedGemm {
  static_assert(kLayout == GemmLayout::fwd || kLayout == GemmLayout::dgrad,
                "fused epilogues run on the forward and input-gradient layouts");
  using Shape = typename Epi::TileShape;
  using Config = FusedConfig<Shape, fused_stages<Epi, InT, kLayout>()>;
  using Main = sm90::Mainloop<Config, kLayout, std::is_same_v<InT, bf16>>;
  using Params = sm90::KernelParams<Main, Epi>;
  static constexpr size_t kSharedBytes = fused_shared_bytes<Epi, InT, Config::kStages, kLayout>();
  static_assert(Config::kMmaBlocksM == Shape::kBlocks,
                "the epilogue's TileShape is the configuration's warpgroup tile");
  static_assert(kSharedBytes <= sm90::kMaxSharedBytes,
                "pipeline stages + epilogue buffers exceed the 227 KB of shared memory");

  // a [M, K] and w ([N, K] for fwd, [K, N] for dgrad; 16-byte aligned rows); `epilogue` holds
  // the ops' parameters.
  static void run(const TensorView& a, const TensorView& w, const typename Epi::Params& epilogue,
                  Stream stream) {
    constexpr bool kDgrad = kLayout == GemmLayout::dgrad;
    const int64_t m = a.shape[0], k = a.shape[1], n = kDgrad ? w.shape[1] : w.shape[0];
    if (m == 0 || n == 0) return;
    if (k == 0) throw Error(Status::not_supported, "the fused GPU GEMMs need K > 0");
    const auto kernel = sm90::gemm_kernel<Config, Main, Epi>;
    Params params{};
    const CUtensorMapSwizzle sw128 = CU_TENSOR_MAP_SWIZZLE_128B;
    params.mainloop.a =
        sm90::make_tensor_map("a", {a.data, a.dtype, uint64_t(k), uint64_t(m),
                                    uint64_t(a.stride[0]), 64, uint32_t(Config::kTileM), sw128});
    // The B boxes of the mainloop (coda/gemm/mainloop.cuh, Params): K-major for fwd, one
    // 64 x 64 swizzle atom per box for the N-contiguous dgrad weight (as gemm/launch.cuh builds
    // it).
    if constexpr (kDgrad)
      params.mainloop.b = sm90::make_tensor_map(
          "w", {w.data, w.dtype, uint64_t(n), uint64_t(k), uint64_t(w.stride[0]), 64, 64, sw128});
    else
      params.mainloop.b = sm90::make_tensor_map("w", {w.data, w.dtype, uint64_t(k), uint64_t(n),
                                                      uint64_t(w.stride[0]), 64,
                                                      uint32_t(Main::kSliceRowsB), sw128});
    params.epilogue = epilogue;
    params.scheduler.tiles_m = int32_t(ceil_div<int64_t>(m, Config::kTileM));
    params.scheduler.tiles_n = int32_t(ceil_div<int64_t>(n, Config::kTileN));
    params.scheduler.cluster_m = Config::kClusterM;
    params.scheduler.k_blocks = int32_t(ceil_div<int64_t>(k, Config::kTileK)); // no stream-K

    const int64_t units = params.scheduler.num_units();
    const int64_t clusters = std::min<int64_t>(max_active_clusters(kernel), units);
    // About one wave of clusters per raster group, 2 to 16 unit-rows (coda/gemm/heuristic.hpp).
    const int64_t group = ceil_div<int64_t>(clusters, params.scheduler.tiles_n);
    params.scheduler.group_m = int32_t(std::clamp<int64_t>(
        std::min<int64_t>(std::max<int64_t>(group, 2), 16), 1, params.scheduler.units_m()));

    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = Config::kClusterM;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(unsigned(clusters * Config::kClusterM));
    cfg.blockDim = dim3(Config::kThreads);
    cfg.dynamicSmemBytes = kSharedBytes;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    sm90::check_cuda(cudaLaunchKernelEx(&cfg, kernel, params), "launching a fused GEMM kernel");
  }

private:
  // Clusters that fit on the device at once (one CTA per SM), cached per instantiation.
  template <class Kernel> static int64_t max_active_clusters(Kernel kernel) {
    static const int cached = sm90::query_max_active_clusters(
        reinterpret_cast<const void*>(kernel), Config::kClusterM, Config::kThreads, kSharedBytes,
        "setting a fused GEMM kernel's shared memory size");
    return cached;
  }
};

} // namespace coda::epilogue::device
