// The shared-memory ring between the TMA producer and the wgmma consumers: per stage a `full`
// mbarrier (armed by the producer with the stage's byte count, completed by TMA) and an `empty`
// mbarrier (one arrival per consumer warp of every CTA that received the stage).
//
// Phase bits: a barrier's phase flips each time it completes. A (stage, phase) state walks the
// ring and flips `phase` when it wraps; consumers wait on `full` with `phase`, the producer waits
// on `empty` with `phase ^ 1`, so its first pass over fresh barriers does not block.
#pragma once

#include <cstdint>

#include <cuda/ptx>

#include "coda/arch/cluster.cuh"

namespace coda::sm90 {

template <int kStages> struct PipelineState {
  uint32_t index = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++index == kStages) index = 0, phase ^= 1;
  }
  __device__ __forceinline__ void advance(uint32_t steps) {
    for (uint32_t s = 0; s < steps; ++s) advance();
  }
};

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, phase)) {
  }
}

template <int kStages> struct PipelineBarriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

// One CTA's view of the ring. `releasers` = consumer warps that release each stage, per CTA.
template <int kStages, int kClusterM> struct MainloopPipeline {
  PipelineBarriers<kStages>& bars;

  // One thread, before the cluster-wide sync that publishes the barriers.
  __device__ void init(int releasers_per_cta) {
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&bars.full[s], 1);
      cuda::ptx::mbarrier_init(&bars.empty[s], releasers_per_cta * kClusterM);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }

  // Producer: wait for the slot, then announce the bytes TMA will deliver into it (the full box,
  // even where it hangs over the tensor's edge: TMA zero-fills and still counts those bytes).
  __device__ __forceinline__ void producer_acquire(PipelineState<kStages> st, uint32_t bytes) {
    producer_wait(st);
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                         cuda::ptx::space_shared, &bars.full[st.index], bytes);
  }
  // A producer that writes part of a stage without arming it (the FP8 mainloop's scale warps,
  // whose asynchronous stores complete bytes of the stage's transaction count): the slot's wait.
  __device__ __forceinline__ void producer_wait(PipelineState<kStages> st) {
    mbarrier_wait(&bars.empty[st.index], st.phase ^ 1);
  }
  __device__ __forceinline__ uint64_t* full_barrier(PipelineState<kStages> st) {
    return &bars.full[st.index];
  }

  __device__ __forceinline__ void consumer_wait(PipelineState<kStages> st) {
    mbarrier_wait(&bars.full[st.index], st.phase);
  }

  // Called by every lane of a consumer warp once the warp's wgmmas reading the stage are done:
  // lane r < kClusterM arrives on CTA r's barrier (the stage held multicast data of every CTA).
  __device__ __forceinline__ void consumer_release(PipelineState<kStages> st, uint32_t lane) {
    if constexpr (kClusterM == 1) {
      if (lane == 0) cuda::ptx::mbarrier_arrive(&bars.empty[st.index]);
    } else {
      if (lane < kClusterM) arch::mbarrier_arrive_cluster(&bars.empty[st.index], lane);
    }
  }
};

} // namespace coda::sm90
