// Host side of the GEMM kernel: tensor maps, persistent grid, stream-K scratch, cluster launch.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/core/tensor.hpp"
#include "coda/gemm/config.hpp"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/kernel.cuh"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/problem.hpp"
#include "coda/gemm/tensor_map.hpp"

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

// One GEMM kernel instantiation (a config, a layout, an input type and an epilogue), launched: the
// operands' tensor maps, the tile scheduler (raster group and stream-K split from the plan), the
// stream-K scratch taken from the caller's workspace, the persistent cluster launch. The plain
// GEMM and every fused kernel launch through here; what differs is the epilogue and its Params.
//
// Operands as GemmArgs holds them: a [M, K] (wgrad: [K, M]), b [N, K] (fwd) or [K, N]. The
// mainloop is the one for InT unless given (the FP8 GEMM's B scaling is the mainloop's choice).
template <class Config, GemmLayout kLayout, class InT, class Epi,
          class Main_ = MainloopFor<Config, kLayout, InT>>
struct GemmKernel {
  static constexpr bool kCooperative = Config::kSchedule != Schedule::pingpong;
  using Main = Main_;
  using Slots = StreamKSlots<Config::kClusterM, Config::kConsumerWarpgroups>;
  using Params = KernelParams<Main, Epi>;
  using SharedStorage = KernelSharedStorage<Main, Epi>;
  // The kernel declares its dynamic shared memory 1024-byte aligned: no slack.
  static constexpr size_t kSharedBytes = sizeof(SharedStorage);
  static_assert(
      kSharedBytes <= kMaxSharedBytes,
      "pipeline stages + epilogue buffers exceed the 227 KB of shared memory; use fewer stages");

  struct Problem {
    int64_t m, n, k;
  };

  // The operands' tensor-map shapes (host only, nothing encoded: GemmHost tests check them).
  // The boxes are the mainloop's (Mainloop::kBox*), whose bytes add up to its stage.
  struct OperandShapes {
    TensorMapShape a, b;
  };
  static OperandShapes operand_shapes(const TensorView& a, const TensorView& b, Problem p) {
    constexpr bool kMnA = a_major(kLayout) == Major::mn, kMnB = b_major(kLayout) == Major::mn;
    // Stored as rows x cols: K-major A [M, K], M-major A [K, M]; K-major B [N, K], N-major
    // B [K, N].
    const auto operand = [](const TensorView& t, bool mn_major, int64_t mn, int64_t k,
                            uint32_t box_cols, uint32_t box_rows) {
      return TensorMapShape{.base = t.data,
                            .dtype = t.dtype,
                            .cols = uint64_t(mn_major ? mn : k),
                            .rows = uint64_t(mn_major ? k : mn),
                            .row_stride = uint64_t(t.stride[0]),
                            .box_cols = box_cols,
                            .box_rows = box_rows,
                            .swizzle = CU_TENSOR_MAP_SWIZZLE_128B};
    };
    return {operand(a, kMnA, p.m, p.k, Main::kBoxColsA, Main::kBoxRowsA),
            operand(b, kMnB, p.n, p.k, Main::kBoxColsB, Main::kBoxRowsB)};
  }

  static typename Main::Params mainloop_params(const TensorView& a, const TensorView& b,
                                               Problem p) {
    const OperandShapes shapes = operand_shapes(a, b, p);
    typename Main::Params out{};
    out.a = make_tensor_map("A", shapes.a);
    out.b = make_tensor_map("B", shapes.b);
    return out;
  }

  // The tiles and k-blocks of the problem (shapes only: no data pointer is read).
  static TileScheduler make_scheduler(Problem p, const GemmPlan& plan) {
    TileScheduler s;
    s.tiles_m = int32_t(ceil_div<int64_t>(p.m, Config::kTileM));
    s.tiles_n = int32_t(ceil_div<int64_t>(p.n, Config::kTileN));
    s.cluster_m = Config::kClusterM;
    s.group_m = std::clamp<int32_t>(plan.group_m, 1, std::max<int32_t>(s.units_m(), 1));
    s.k_blocks = int32_t(ceil_div<int64_t>(p.k, Config::kTileK));
    return s;
  }

  // Clusters that fit on the device at once (one CTA per SM), cached per instantiation.
  static int max_active_clusters() {
    static const int cached =
        query_max_active_clusters(kernel_address(), Config::kClusterM, Config::kThreads,
                                  kSharedBytes, "setting a GEMM kernel's shared memory size");
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
  static size_t workspace_size(Problem p, const GemmPlan& plan) {
    const TileScheduler s = make_scheduler(p, plan);
    if (s.num_units() == 0) return 0;
    return stream_k_scratch(s, plan, max_active_clusters()).bytes;
  }

  // Takes stream-K scratch from the caller's workspace (clearing its flags on `stream`);
  // returns the clusters to launch. Without a workspace the launch stays data-parallel.
  static int64_t use_stream_k(Params& p, const GemmPlan& plan, const TensorView& workspace,
                              int64_t max_clusters, cudaStream_t stream) {
    const int64_t data_parallel = std::min(max_clusters, p.scheduler.num_units());
    const StreamKScratch sk = stream_k_scratch(p.scheduler, plan, max_clusters);
    if (sk.bytes == 0 || workspace.data == nullptr) return data_parallel;
    const size_t workspace_bytes = size_t(workspace.numel() * dtype_size(workspace.dtype));
    if (workspace_bytes < sk.bytes)
      throw Error(Status::invalid_argument,
                  "gemm: workspace holds " + std::to_string(workspace_bytes) +
                      " bytes but this call needs " + std::to_string(sk.bytes) +
                      " (coda::gemm_workspace_size(args)); pass a larger one or none");
    const int64_t slot_bytes = stream_k_slot_bytes(Config::kAccumulatorsPerThread);
    p.stream_k = carve_stream_k(workspace.data, sk.slots, slot_bytes);
    check_cuda(cudaMemsetAsync(p.stream_k.flags, 0, size_t(sk.slots) * sizeof(int32_t), stream),
               "clearing the GEMM's stream-K flags");
    p.scheduler.sk_first_unit = sk.split.first_unit;
    p.scheduler.sk_workers = sk.split.workers;
    return max_clusters;
  }

  static void run(const TensorView& a, const TensorView& b, Problem problem,
                  const typename Epi::Params& epilogue, const GemmPlan& plan,
                  const TensorView& workspace, cudaStream_t stream) {
    run(mainloop_params(a, b, problem), problem, epilogue, plan, workspace, stream);
  }

  // With the mainloop's Params given: mainloop_params() and what a mainloop reads beside the
  // operands (the FP8 one's block scales).
  static void run(const typename Main::Params& mainloop, Problem problem,
                  const typename Epi::Params& epilogue, const GemmPlan& plan,
                  const TensorView& workspace, cudaStream_t stream) {
    Params params{};
    params.mainloop = mainloop;
    params.epilogue = epilogue;
    params.scheduler = make_scheduler(problem, plan);
    if (params.scheduler.num_units() == 0) return;
    if (Config::kStaged && params.scheduler.num_units() > kMaxUnits)
      throw Error(Status::not_supported, "gemm: more than 2^31 tiles of " +
                                             std::to_string(Config::kTileM) + " x " +
                                             std::to_string(Config::kTileN) + " in one launch");
    const int64_t clusters = use_stream_k(params, plan, workspace, max_active_clusters(), stream);

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
    check_cuda(cudaLaunchKernelEx(&cfg, gemm_kernel<Config, Main, Epi>, params),
               "launching a GEMM kernel");
  }

private:
  static const void* kernel_address() {
    return reinterpret_cast<const void*>(gemm_kernel<Config, Main, Epi>);
  }
};

} // namespace coda::sm90
