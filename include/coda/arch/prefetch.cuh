// Cache prefetches. PTX ISA sections are cited by title.
#pragma once

namespace coda::arch {

// PTX ISA "prefetch, prefetchu": brings the line holding `ptr` (global memory) into L2.
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr));
}

} // namespace coda::arch
