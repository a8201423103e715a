// Thread-block-cluster helpers cuda::ptx (CUDA 13.0) lacks: addressing a peer CTA's shared
// memory (mapa) for a remote mbarrier arrive. PTX ISA sections are cited by instruction title.
#pragma once

#include <cstdint>

#include <cuda/ptx>

namespace coda::arch {

// PTX ISA "mapa": the shared::cluster address of the variable at `smem_ptr` in CTA `cta_rank` of
// this cluster.
__device__ __forceinline__ uint32_t map_shared_to_cta(const void* smem_ptr, uint32_t cta_rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(cta_rank));
  return remote;
}

// PTX ISA "mbarrier.arrive" with .shared::cluster: one arrival on the mbarrier at the same
// offset as `bar` in CTA `cta_rank` (possibly this CTA), with the default .release.cta semantics.
// NOTE: not .release.cluster (what cuda::ptx offers): that compiles to MEMBAR.ALL.GPU before
// every arrival, and the consumers' per-stage releases then cost a third of the mainloop's
// throughput. The arrival only says "my wgmmas finished reading this stage"; nothing written
// before it must become visible to the peer.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta_rank) {
  const uint32_t remote = map_shared_to_cta(bar, cta_rank);
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  return cuda::ptx::get_sreg_cluster_ctarank();
}

// All threads of all CTAs of the cluster (barrier.cluster, via cuda::ptx): arrive with release
// semantics and wait with acquire, so mbarrier inits and smem writes before it are visible.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

} // namespace coda::arch
