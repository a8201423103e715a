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

} // namespace coda::arch
