// Warp and warpgroup control: register reallocation, one-lane election, named barriers.
// PTX ISA sections are cited by instruction title.
#pragma once

#include <cstdint>

namespace coda::arch {

constexpr int kWarpSize = 32;
constexpr int kWarpgroupSize = 128;

// PTX ISA "setmaxnreg": every warp of the warpgroup must execute it with the same count, and the
// kernel needs a register cap at entry (__launch_bounds__ with minBlocks 1), else ptxas ignores it
// (warning C7508).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// PTX ISA "elect.sync": true in exactly one active lane of the (fully active) warp.
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t elected = 0;
  asm volatile("{\n"
               ".reg .pred p;\n"
               "elect.sync _|p, 0xffffffff;\n"
               "selp.u32 %0, 1, 0, p;\n"
               "}\n"
               : "=r"(elected));
  return elected != 0;
}

// PTX ISA "bar.sync / bar.arrive" (barrier.cta with an id and a thread count): a barrier among a
// subset of the CTA's warps. Id 0 is __syncthreads(); the kernel names the others (enum).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

} // namespace coda::arch
