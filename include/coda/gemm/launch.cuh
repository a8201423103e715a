// Host side of one GEMM kernel instantiation: tensor maps, persistent grid, cluster launch.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "coda/gemm/config.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/kernel.cuh"
#include "coda/gemm/linear_epilogue.cuh"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/problem.hpp"
#include "coda/gemm/tensor_map.hpp"
#include "coda/kernels/args.hpp"

namespace coda::sm90 {

// The largest dynamic shared memory an sm_90 CTA may opt into (227 KB).
constexpr size_t kMaxSharedBytes = 232448;

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(Status::cuda_error, std::string(what) + ": " + cudaGetErrorString(e));
}

// Clusters of `cluster_m` CTAs (`threads` threads, `shared_bytes` of dynamic shared memory each)
// that fit on the current device at once, at least 1; first raises the kernel's dynamic shared
// memory limit to `shared_bytes`. `what` names the kernel in errors. Launchers cache the answer
// per kernel (it is a property of the kernel and the device).
inline int query_max_active_clusters(const void* kernel, int cluster_m, int threads,
                                     size_t shared_bytes, const char* what) {
  check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)),
      what);
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "querying the SM count");
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cluster_m);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3(unsigned(sms / cluster_m * cluster_m));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = shared_bytes;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg),
             "cudaOccupancyMaxActiveClusters");
  return std::max(clusters, 1);
}

// The stream-K split of one launch and the workspace bytes it needs (0: no stream-K).
struct StreamKScratch {
  StreamKSplit split;
  int64_t slots = 0;
  size_t bytes = 0;
};

template <class Config, GemmLayout kLayout, class InT, class OutT> struct GemmKernel {
  static constexpr bool kCooperative = Config::kSchedule == Schedule::cooperative;
  using Main = Mainloop<Config, kLayout, std::is_same_v<InT, bf16>>;
  // Cooperative: both warpgroups finish their MMAs at once, so the stores are deferred into the
  // next mainloop; ping-pong: the other warpgroup's MMAs already overlap them.
  using Epi = LinearEpilogue<OutT, Config::kConsumerWarpgroups, kCooperative>;
  using Slots = StreamKSlots<Config::kClusterM, Config::kConsumerWarpgroups>;
  using Params = KernelParams<Main, Epi>;
  using SharedStorage = KernelSharedStorage<Main, Epi>;
  // NOTE: + 1024 is alignment slack: the kernel rounds the dynamic smem base up to 1024 bytes.
  static constexpr size_t kSharedBytes = sizeof(SharedStorage) + 1024;
  static_assert(
      kSharedBytes <= kMaxSharedBytes,
      "pipeline stages + epilogue buffers exceed the 227 KB of shared memory; use fewer stages");

  static Params make_params(const GemmArgs& args, const GemmPlan& plan) {
    const int64_t M = args.m(), N = args.n(), K = args.k();
    constexpr bool kMnA = a_major(kLayout) == Major::mn, kMnB = b_major(kLayout) == Major::mn;
    const CUtensorMapSwizzle sw128 = CU_TENSOR_MAP_SWIZZLE_128B;
    Params p{};
    p.mainloop.a = make_tensor_map(
        "A", kMnA ? TensorMapShape{args.a.data, args.a.dtype, uint64_t(M), uint64_t(K),
                                   uint64_t(args.a.stride[0]), 64, 64, sw128}
                  : TensorMapShape{args.a.data, args.a.dtype, uint64_t(K), uint64_t(M),
                                   uint64_t(args.a.stride[0]), 64, Config::kTileM, sw128});
    p.mainloop.b = make_tensor_map(
        "B", kMnB ? TensorMapShape{args.b.data, args.b.dtype, uint64_t(N), uint64_t(K),
                                   uint64_t(args.b.stride[0]), 64, 64, sw128}
                  : TensorMapShape{args.b.data, args.b.dtype, uint64_t(K), uint64_t(N),
                                   uint64_t(args.b.stride[0]), 64, Main::kSliceRowsB, sw128});

    const CUtensorMapSwizzle sw_out =
        Epi::kRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    auto out_map = [&](const char* what, const TensorView& t) {
      return make_tensor_map(what, TensorMapShape{t.data, t.dtype, uint64_t(N), uint64_t(M),
                                                  uint64_t(t.stride[0]), uint32_t(Epi::kSubCols),
                                                  uint32_t(Epi::kSubRows), sw_out});
    };
    p.epilogue.d = out_map("D", args.d);
    p.epilogue.load_c = args.has_c() && args.beta != 0.f;
    p.epilogue.c = p.epilogue.load_c ? out_map("C", args.c) : p.epilogue.d;
    p.epilogue.alpha = args.alpha.value;
    p.epilogue.alpha_tensor =
        args.alpha.has_tensor() ? args.alpha.tensor.ptr<const float>() : nullptr;
    p.epilogue.beta = args.beta;
    p.epilogue.defer_stores = plan.defer_stores;

    p.scheduler = make_scheduler(args, plan);
    return p;
  }

  // The tiles and k-blocks of the problem (shapes only: no data pointer is read).
  static TileScheduler make_scheduler(const GemmArgs& args, const GemmPlan& plan) {
    TileScheduler s;
    s.tiles_m = int32_t(ceil_div<int64_t>(args.m(), Config::kTileM));
    s.tiles_n = int32_t(ceil_div<int64_t>(args.n(), Config::kTileN));
    s.cluster_m = Config::kClusterM;
    s.group_m = plan.group_m;
    s.k_blocks = int32_t(ceil_div<int64_t>(args.k(), Config::kTileK));
    return s;
  }

  // Clusters that fit on the device at once (one CTA per SM), cached per instantiation.
  static int max_active_clusters(const void* kernel) {
    static const int cached =
        query_max_active_clusters(kernel, Config::kClusterM, Config::kThreads, kSharedBytes,
                                  "setting the GEMM kernel's shared memory size");
    return cached;
  }

  // Stream-K over the last waves when the plan allows it and the cost model says it pays.
  static StreamKScratch stream_k_scratch(const TileScheduler& s, const GemmPlan& plan,
                                         int64_t max_clusters) {
    const int64_t units = s.num_units();
    if (!kCooperative || units == 0) return {StreamKSplit{units, 0}};
    const StreamKSplit split = plan_stream_k(units, max_clusters, s.k_blocks, plan.stream_k);
    if (split.workers == 0) return {split};
    const int64_t slots = Slots::count(split.workers);
    const int64_t slot_bytes = stream_k_slot_bytes(Config::kAccumulatorsPerThread);
    return {split, slots, stream_k_workspace_bytes(slots, slot_bytes)};
  }

  // Workspace bytes a launch of `plan` needs for stream-K; the same computation as run()'s.
  static size_t workspace_size(const GemmArgs& args, const GemmPlan& plan) {
    const TileScheduler s = make_scheduler(args, plan);
    if (s.num_units() == 0) return 0;
    return stream_k_scratch(s, plan, max_active_clusters(kernel_address())).bytes;
  }

  // Takes stream-K scratch from the caller's workspace (clearing its flags on `stream`);
  // returns the clusters to launch. Without a workspace the launch stays data-parallel.
  static int64_t use_stream_k(Params& p, const GemmArgs& args, const GemmPlan& plan,
                              int64_t max_clusters, Stream stream) {
    const int64_t data_parallel = std::min(max_clusters, p.scheduler.num_units());
    const StreamKScratch sk = stream_k_scratch(p.scheduler, plan, max_clusters);
    if (sk.bytes == 0 || !args.has_workspace()) return data_parallel;
    if (args.workspace_bytes() < sk.bytes)
      throw Error(Status::invalid_argument,
                  "gemm: workspace holds " + std::to_string(args.workspace_bytes()) +
                      " bytes but this call needs " + std::to_string(sk.bytes) +
                      " (coda::gemm_workspace_size(args)); pass a larger one or none");
    const int64_t slot_bytes = stream_k_slot_bytes(Config::kAccumulatorsPerThread);
    p.stream_k = carve_stream_k(args.workspace.data, sk.slots, slot_bytes);
    check_cuda(cudaMemsetAsync(p.stream_k.flags, 0, size_t(sk.slots) * sizeof(int32_t), stream),
               "clearing the GEMM's stream-K flags");
    p.scheduler.sk_first_unit = sk.split.first_unit;
    p.scheduler.sk_workers = sk.split.workers;
    return max_clusters;
  }

  static void run(const GemmArgs& args, const GemmPlan& plan, Stream stream) {
    const auto kernel = gemm_kernel<Config, Main, Epi>;
    Params params = make_params(args, plan);
    if (params.scheduler.num_units() == 0) return;
    const int64_t clusters =
        use_stream_k(params, args, plan, max_active_clusters(kernel_address()), stream);

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
    check_cuda(cudaLaunchKernelEx(&cfg, kernel, params), "launching the GEMM kernel");
  }

private:
  static const void* kernel_address() {
    return reinterpret_cast<const void*>(gemm_kernel<Config, Main, Epi>);
  }
};

} // namespace coda::sm90
