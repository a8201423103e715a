// Stream-K partial sums (see scheduler.hpp): a contributor warpgroup publishes its fp32
// accumulators to global scratch and raises a flag; the owner waits for the flag, adds the
// partial into its accumulators and runs the epilogue on the sum. Each warpgroup handles the
// rows it owns, so no cross-warpgroup synchronization is needed.
//
// Partials are stored [register / 4][thread] as float4, so each store and load instruction of a
// warpgroup covers 2 KB of contiguous memory. They go through L2 only (.cg): the owner's SM has
// never cached those lines, and the flag's acquire orders the loads after the contributor's
// stores. Flags must be zero at launch: the launcher clears them on the launch's stream (the
// caller's workspace holds anything between calls), and the owner resets each flag it consumed,
// so every launch also leaves them zero.
//
// Workspace layout (StreamKSlots::count slots): [partials][pad to 256 bytes][int32 flags].
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda/atomic>

#include "coda/arch/warpgroup.cuh"
#include "coda/core/fragment.hpp"
#include "coda/gemm/scheduler.hpp"

namespace coda::sm90 {

// Slot (worker, cta rank, consumer warpgroup) of StreamKWorkspace.
template <int kClusterM, int kWarpgroups> struct StreamKSlots {
  static constexpr int64_t count(int64_t workers) { return workers * kClusterM * kWarpgroups; }
  CODA_HD static int64_t slot(int64_t worker, uint32_t cta_rank, int warpgroup) {
    return (worker * kClusterM + cta_rank) * kWarpgroups + warpgroup;
  }
};

// Bytes of partials per slot for an accumulator of kRegs registers per thread.
constexpr int64_t stream_k_slot_bytes(int regs_per_thread) {
  return int64_t(regs_per_thread) * arch::kWarpgroupSize * 4;
}

// Bytes of caller workspace that `slots` slots of `slot_bytes` each take, and the views into it.
constexpr size_t stream_k_flags_offset(int64_t slots, int64_t slot_bytes) {
  return (size_t(slots * slot_bytes) + 255) / 256 * 256;
}
constexpr size_t stream_k_workspace_bytes(int64_t slots, int64_t slot_bytes) {
  return stream_k_flags_offset(slots, slot_bytes) + size_t(slots) * sizeof(int32_t);
}
inline StreamKWorkspace carve_stream_k(void* base, int64_t slots, int64_t slot_bytes) {
  return StreamKWorkspace{static_cast<float*>(base),
                          reinterpret_cast<int32_t*>(static_cast<char*>(base) +
                                                     stream_k_flags_offset(slots, slot_bytes))};
}

template <int kBlocks, int kN>
__device__ __forceinline__ float4* stream_k_partial(const StreamKWorkspace& ws, int64_t slot) {
  constexpr int64_t kFloat4s = int64_t(kBlocks) * kN / 2 / 4 * arch::kWarpgroupSize;
  return reinterpret_cast<float4*>(ws.partials) + slot * kFloat4s;
}

// All 128 threads of the contributor warpgroup; `barrier` is a named barrier of the warpgroup.
template <int kBlocks, int kN>
__device__ void stream_k_publish(const Accumulator<kBlocks, kN>& acc, const StreamKWorkspace& ws,
                                 int64_t slot, int thread, uint32_t barrier) {
  float4* dst = stream_k_partial<kBlocks, kN>(ws, slot) + thread;
#pragma unroll
  for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
    for (int i = 0; i < kN / 2; i += 4)
      __stcg(
          dst + (mb * kN / 2 + i) / 4 * arch::kWarpgroupSize,
          make_float4(acc.reg[mb][i], acc.reg[mb][i + 1], acc.reg[mb][i + 2], acc.reg[mb][i + 3]));
  // Every thread's stores happen before the barrier; thread 0's release publishes them all.
  arch::named_barrier_sync(barrier, arch::kWarpgroupSize);
  if (thread == 0)
    cuda::atomic_ref<int32_t, cuda::thread_scope_device>(ws.flags[slot])
        .store(1, cuda::memory_order_release);
}

// All 128 threads of the owner warpgroup: acc += the partial of `slot`, once it is published.
template <int kBlocks, int kN>
__device__ void stream_k_accumulate(Accumulator<kBlocks, kN>& acc, const StreamKWorkspace& ws,
                                    int64_t slot, int thread, uint32_t barrier) {
  if (thread == 0) {
    cuda::atomic_ref<int32_t, cuda::thread_scope_device> flag(ws.flags[slot]);
    while (flag.load(cuda::memory_order_acquire) == 0) {
    }
    flag.store(0, cuda::memory_order_relaxed); // each slot is published once per launch
  }
  arch::named_barrier_sync(barrier, arch::kWarpgroupSize);
  const float4* src = stream_k_partial<kBlocks, kN>(ws, slot) + thread;
#pragma unroll
  for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
    for (int i = 0; i < kN / 2; i += 4) {
      const float4 p = __ldcg(src + (mb * kN / 2 + i) / 4 * arch::kWarpgroupSize);
      acc.reg[mb][i] += p.x, acc.reg[mb][i + 1] += p.y;
      acc.reg[mb][i + 2] += p.z, acc.reg[mb][i + 3] += p.w;
    }
}

} // namespace coda::sm90
