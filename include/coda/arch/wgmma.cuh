// Warpgroup-level MMA (wgmma) wrappers: the asynchronous tensor-core instructions of sm_90a.
// The operand lists of the mma_async wrappers were emitted by a script (128 accumulator operands
// are not written by hand); their asm text is the PTX ISA form verbatim.
//
// PTX ISA sections are cited by title, in the chapter "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions". Accumulator fragment of m64nNk16 ("Register Fragments:
// Matrix D"): thread t of the warpgroup holds N/2 floats; coda/core/fragment.hpp gives the
// (row, col) of each.
#pragma once

#include <cstdint>

namespace coda::arch {

// PTX ISA "wgmma.fence": orders register accesses (accumulators written by ordinary
// instructions) before the next wgmma.mma_async of this warpgroup.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// PTX ISA "wgmma.commit_group": closes the batch of mma_async issued so far.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// PTX ISA "wgmma.wait_group": waits until at most N committed batches are pending.
template <int kPending> __device__ __forceinline__ void wgmma_wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Not an instruction: tells the compiler the accumulators are read and written here, so it
// neither moves their uses across an in-flight wgmma nor touches them while one is pending
// (ptxas warning C7515 otherwise).
template <int kRegs> __device__ __forceinline__ void wgmma_fence_operand(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// PTX ISA "wgmma.mma_async", both operands from shared memory through matrix descriptors:
//   D[64 x N] (+)= A[64 x 16] * B[16 x N], fp32 accumulate.
// scale_d == 0 overwrites D (first k-step of a tile); kTransA / kTransB: 0 = the operand is
// K-major in shared memory, 1 = MN-major (the "transpose" immediates imm-trans-a / imm-trans-b).
// The asm text must be a literal, so it is assembled from string-literal macros: the instruction
// (its shape and the input type spliced into the name), the accumulator registers in pieces of
// 32 ("%0, ..., %31" in the text, "+f"(d[0]), ... as operands), and the operands after them.
#define CODA_WGMMA_ASM(SHAPE, TYPE, REGISTERS, SCALE_D, OPERANDS)                                  \
  "{\n"                                                                                            \
  ".reg .pred p;\n"                                                                                \
  "setp.ne.b32 p, " SCALE_D ", 0;\n"                                                               \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" REGISTERS "}, " OPERANDS ";\n"  \
  "}\n"
#define CODA_WGMMA_R0_47                                                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define CODA_WGMMA_R0_63                                                                           \
  CODA_WGMMA_R0_47                                                                                 \
      ", "                                                                                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CODA_WGMMA_R64_95                                                                          \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define CODA_WGMMA_R96_127                                                                         \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// "+f"(d[i]) .. "+f"(d[i + 31]): 32 accumulator operands from i on.
#define CODA_WGMMA_D8(i)                                                                           \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),      \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define CODA_WGMMA_D32(i)                                                                          \
  CODA_WGMMA_D8(i), CODA_WGMMA_D8(i + 8), CODA_WGMMA_D8(i + 16), CODA_WGMMA_D8(i + 24)
// m64n128k16: 64 accumulator registers %0..%63, then desc_a %64, desc_b %65, scale_d %66,
// imm-trans-a %67, imm-trans-b %68. m64n192k16: 96, then %96 .. %100. m64n256k16: 128, then
// %128 .. %132.
#define CODA_WGMMA_N128_ASM(TYPE)                                                                  \
  CODA_WGMMA_ASM("m64n128k16", TYPE, CODA_WGMMA_R0_63, "%66", "%64, %65, p, 1, 1, %67, %68")
#define CODA_WGMMA_N192_ASM(TYPE)                                                                  \
  CODA_WGMMA_ASM("m64n192k16", TYPE, CODA_WGMMA_R0_63 ", " CODA_WGMMA_R64_95, "%98",               \
                 "%96, %97, p, 1, 1, %99, %100")
#define CODA_WGMMA_N256_ASM(TYPE)                                                                  \
  CODA_WGMMA_ASM("m64n256k16", TYPE,                                                               \
                 CODA_WGMMA_R0_63 ", " CODA_WGMMA_R64_95 ", " CODA_WGMMA_R96_127, "%130",          \
                 "%128, %129, p, 1, 1, %131, %132")
#define CODA_WGMMA_N96_ACCUMULATORS CODA_WGMMA_D32(0), CODA_WGMMA_D8(32), CODA_WGMMA_D8(40)
#define CODA_WGMMA_N128_ACCUMULATORS CODA_WGMMA_D32(0), CODA_WGMMA_D32(32)
#define CODA_WGMMA_N192_ACCUMULATORS CODA_WGMMA_N128_ACCUMULATORS, CODA_WGMMA_D32(64)
#define CODA_WGMMA_N256_ACCUMULATORS CODA_WGMMA_N192_ACCUMULATORS, CODA_WGMMA_D32(96)
// One m64nNk16 with the input type TYPE, the operands of wgmma_m64k16 below.
#define CODA_WGMMA_M64K16(N, TYPE)                                                                 \
  asm volatile(CODA_WGMMA_N##N##_ASM(TYPE)                                                         \
               : CODA_WGMMA_N##N##_ACCUMULATORS                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))
template <int kN, bool kIsBf16, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
  static_assert(kN == 128 || kN == 192 || kN == 256,
                "wgmma wrappers exist for N = 128, 192 and 256");
  if constexpr (kN == 128 && kIsBf16) CODA_WGMMA_M64K16(128, "bf16");
  if constexpr (kN == 128 && !kIsBf16) CODA_WGMMA_M64K16(128, "f16");
  if constexpr (kN == 192 && kIsBf16) CODA_WGMMA_M64K16(192, "bf16");
  if constexpr (kN == 192 && !kIsBf16) CODA_WGMMA_M64K16(192, "f16");
  if constexpr (kN == 256 && kIsBf16) CODA_WGMMA_M64K16(256, "bf16");
  if constexpr (kN == 256 && !kIsBf16) CODA_WGMMA_M64K16(256, "f16");
}

// PTX ISA 9.7.15 (wgmma), "wgmma.mma_async" with .atype = .btype = .e4m3 (FP8), both operands
// from shared memory:
//   D[64 x N] (+)= A[64 x 32] * B[32 x N], fp32 accumulate.
// The FP8 form has no transpose immediates (only .f16/.bf16 read MN-major operands): both
// operands are K-major, and each k32 step is 32 bytes of a 128-byte swizzled row, as a k16 step
// of 16-bit elements is. The accumulator fragment is m64nNk16's (fragment.hpp): it depends on
// M, N and the fp32 D only. The shapes are the FP8 mainloop's (fp8_mainloop.cuh; the section's
// "Matrix Shape" allows m64nNk32 for .e4m3 with N a multiple of 8 up to 256): N = 128, the
// partial of the 128-column tile; N = 192, the 192-column tile's with one partial; N = 96, one
// half of that tile's when the halves' promotions overlap.
// Operands: the N/2 accumulator registers %0 .., then desc_a, desc_b and scale_d; imm-scale-a
// and imm-scale-b are 1 (no negation).
#define CODA_WGMMA_K32_ASM(SHAPE, REGISTERS, DESCRIPTORS, SCALE_D)                                 \
  CODA_WGMMA_ASM(SHAPE, "e4m3", REGISTERS, SCALE_D, DESCRIPTORS ", p, 1, 1")

// D[64 x kN] (+)= A * B over 32 FP8 (E4M3) k values; scale_d == 0 overwrites D.
template <int kN>
__device__ __forceinline__ void wgmma_m64k32_e4m3(float (&d)[kN / 2], uint64_t desc_a,
                                                  uint64_t desc_b, int scale_d) {
  static_assert(kN == 96 || kN == 128 || kN == 192,
                "FP8 wgmma wrappers exist for N = 96, 128 and 192");
  if constexpr (kN == 96)
    asm volatile(CODA_WGMMA_K32_ASM("m64n96k32", CODA_WGMMA_R0_47, "%48, %49", "%50")
                 : CODA_WGMMA_N96_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  if constexpr (kN == 128)
    asm volatile(CODA_WGMMA_K32_ASM("m64n128k32", CODA_WGMMA_R0_63, "%64, %65", "%66")
                 : CODA_WGMMA_N128_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  if constexpr (kN == 192)
    asm volatile(
        CODA_WGMMA_K32_ASM("m64n192k32", CODA_WGMMA_R0_63 ", " CODA_WGMMA_R64_95, "%96, %97", "%98")
        : CODA_WGMMA_N192_ACCUMULATORS
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

#undef CODA_WGMMA_K32_ASM
#undef CODA_WGMMA_ASM
#undef CODA_WGMMA_R0_47
#undef CODA_WGMMA_R0_63
#undef CODA_WGMMA_R64_95
#undef CODA_WGMMA_R96_127
#undef CODA_WGMMA_D8
#undef CODA_WGMMA_D32
#undef CODA_WGMMA_M64K16
#undef CODA_WGMMA_N128_ASM
#undef CODA_WGMMA_N96_ACCUMULATORS
#undef CODA_WGMMA_N128_ACCUMULATORS
#undef CODA_WGMMA_N192_ASM
#undef CODA_WGMMA_N192_ACCUMULATORS
#undef CODA_WGMMA_N256_ASM
#undef CODA_WGMMA_N256_ACCUMULATORS

} // namespace coda::arch
