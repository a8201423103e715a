// Plain shared-memory loads and stores the compiler would otherwise emit as generic ones (LD.E,
// ST.E, with 64-bit address arithmetic), when it cannot prove that a pointer into a struct of
// dynamic shared memory is shared. PTX ISA sections are cited by title.
#pragma once

#include <cstdint>

namespace coda::arch {

// PTX ISA "st" with the .shared::cta state space, 32 bits, at a shared-window address
// (__cvta_generic_to_shared).
__device__ __forceinline__ void store_shared_u32(uint32_t smem_addr, uint32_t value) {
  asm volatile("st.shared::cta.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(value) : "memory");
}

// PTX ISA "ld" with the .shared::cta state space, 32 bits. Volatile: it stays after the mbarrier
// wait (also volatile asm) that makes the TMA-written data visible.
__device__ __forceinline__ uint32_t load_shared_u32(uint32_t smem_addr) {
  uint32_t value;
  asm volatile("ld.shared::cta.b32 %0, [%1];\n" : "=r"(value) : "r"(smem_addr));
  return value;
}
// The same at 64 bits (two words; the address 8-byte aligned).
__device__ __forceinline__ void load_shared_u32x2(uint32_t smem_addr, uint32_t& lo, uint32_t& hi) {
  asm volatile("ld.shared::cta.v2.b32 {%0, %1}, [%2];\n" : "=r"(lo), "=r"(hi) : "r"(smem_addr));
}

} // namespace coda::arch
