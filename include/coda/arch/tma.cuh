// The TMA pieces cuda::ptx (CUDA 13.0) lacks. The loads, stores, multicast, bulk groups and
// mbarriers themselves come from <cuda/ptx>. PTX ISA sections are cited by instruction title.
#pragma once

#include <cstdint>

namespace coda::arch {

// PTX ISA "prefetch" with .tensormap: brings a kernel-parameter tensor map into the cache ahead
// of the first cp.async.bulk.tensor that uses it.
__device__ __forceinline__ void prefetch_tensormap(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// PTX ISA "cp.async.bulk.prefetch.tensor" (.2d, .L2, .tile): asks for the box at {c0, c1} of the
// tensor to be brought into L2, with no shared memory and no completion to wait for; a later
// cp.async.bulk.tensor of the same box then reads L2 instead of DRAM. Out-of-bounds boxes are
// harmless (nothing is fetched for them).
__device__ __forceinline__ void prefetch_tensor_l2(const void* tensor_map, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(tensor_map),
      "r"(c0), "r"(c1)
      : "memory");
}

} // namespace coda::arch
