// The store protocol of the epilogues whose warps write a 64 x 32 subtile into shared memory
// together and have one thread TMA-store it: the fused driver (FusedEpilogue) and the plain
// GEMM's LinearEpilogue. Subtiles alternate between two buffer slots, so that one subtile's
// stores and the next one's loads are in flight while it is computed; TMA reads a slot's buffers
// asynchronously, so a slot is written again only once the stores from it have read it. Per
// subtile, every thread of those warps, in order:
//   begin_slot_write(thread, barrier, threads)   then loads of the next subtile, from one thread
//   the math, and the thread's values into the slot's buffers
//   end_slot_write(barrier, threads)
//   thread 0: the TMA stores from the slot, then commit_slot_stores()
// NOTE: steps, not one function taking the loads and the math as callables: that form changed the
// plain GEMM's PTX (the order of a predicate's operands, which register holds which copy), and so
// did a barrier passed as a callable.
#pragma once

#include <cstdint>

#include <cuda/ptx>

#include "coda/arch/warpgroup.cuh"

namespace coda::epilogue::device {

// Thread 0 waits until the bulk stores that last used this slot have read it (every group but
// the newest kPendingReads: 1, the other slot's), then the warps' named barrier (`threads` of
// them): everyone is also done with the loads of the subtile before, whose buffers may be
// refilled.
template <int kPendingReads = 1>
__device__ __forceinline__ void begin_slot_write(int thread, uint32_t barrier, uint32_t threads) {
  if (thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<kPendingReads>{});
  arch::named_barrier_sync(barrier, threads);
}

// After the writes: a proxy fence (they become visible to TMA), then the barrier.
__device__ __forceinline__ void end_slot_write(uint32_t barrier, uint32_t threads) {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  arch::named_barrier_sync(barrier, threads);
}

// Thread 0, after issuing the slot's stores: they form one bulk group, the unit the next
// begin_slot_write waits for.
__device__ __forceinline__ void commit_slot_stores() { cuda::ptx::cp_async_bulk_commit_group(); }

// Thread 0, once before the kernel exits: every bulk store has completed (the CTA's shared
// memory may not go away under a store still reading it).
__device__ __forceinline__ void drain_stores(bool issuer) {
  if (issuer) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

} // namespace coda::epilogue::device
