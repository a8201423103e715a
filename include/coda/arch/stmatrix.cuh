// Register <-> shared-memory matrix moves of 16-bit 8x8 matrices (the epilogue's subtiles and the
// staged accumulator tile). PTX ISA sections are cited by title.
#pragma once

#include <cstdint>

namespace coda::arch {

// PTX ISA "stmatrix" (Warp Level Matrix Instructions), .m8n8.x4.b16, not transposed: four 8x8
// matrices of 16-bit elements. Register r_i of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of
// matrix i; lanes 8i..8i+7 give the shared addresses of the 8 rows (16 bytes each) of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1,
                                            uint32_t r2, uint32_t r3) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared::cta.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
      "r"(r0), "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}

// PTX ISA "ldmatrix" (Warp Level Matrix Instructions), .m8n8.x4.b16, not transposed: the inverse
// of stmatrix_x4 with the same lane addresses, so a stmatrix_x4 / ldmatrix_x4 pair returns each
// lane the registers it stored.
__device__ __forceinline__ void ldmatrix_x4(uint32_t smem_addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared::cta.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr)
               : "memory");
}

// PTX ISA "ldmatrix", .m8n8.x4.trans.b16: the same four matrices read transposed. Register r_i of
// lane l holds rows 2(l%4), 2(l%4)+1 of column l/4 of matrix i (low half first), where lanes
// 8i..8i+7 give the addresses of its 8 rows, 16 bytes each: a lane gets two consecutive rows of
// one column, e.g. two consecutive tokens of one feature of a row-major activation tile.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t smem_addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr)
               : "memory");
}

} // namespace coda::arch
