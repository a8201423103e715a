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
// The asm text must be a literal, so the operand lists are spelled once per N as macros and the
// input type (bf16 or f16) is spliced into the instruction name.
// m64n128k16: 64 accumulator registers %0..%63, then desc_a %64, desc_b %65,
// scale_d %66, imm-trans-a %67, imm-trans-b %68.
#define CODA_WGMMA_N128_ASM(TYPE)                                                                  \
  "{\n"                                                                                            \
  ".reg .pred p;\n"                                                                                \
  "setp.ne.b32 p, %66, 0;\n"                                                                       \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                 \
  "}, %64, %65, p, 1, 1, %67, %68;\n"                                                              \
  "}\n"
#define CODA_WGMMA_N128_ACCUMULATORS                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// m64n256k16: 128 accumulator registers %0..%127, then desc_a %128, desc_b %129,
// scale_d %130, imm-trans-a %131, imm-trans-b %132.
#define CODA_WGMMA_N256_ASM(TYPE)                                                                  \
  "{\n"                                                                                            \
  ".reg .pred p;\n"                                                                                \
  "setp.ne.b32 p, %130, 0;\n"                                                                      \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {"                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "               \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "               \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}, %128, %129, p, 1, 1, %131, %132;\n"                                                          \
  "}\n"
#define CODA_WGMMA_N256_ACCUMULATORS                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),   \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),   \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),   \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),   \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),   \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),   \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),           \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),          \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),          \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),          \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// m64n192k16: 96 accumulator registers %0..%95, then desc_a %96, desc_b %97,
// scale_d %98, imm-trans-a %99, imm-trans-b %100.
#define CODA_WGMMA_N192_ASM(TYPE)                                                                  \
  "{\n"                                                                                            \
  ".reg .pred p;\n"                                                                                \
  "setp.ne.b32 p, %98, 0;\n"                                                                       \
  "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPE "." TYPE " {"                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "               \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"                 \
  "}, %96, %97, p, 1, 1, %99, %100;\n"                                                             \
  "}\n"
#define CODA_WGMMA_N192_ACCUMULATORS                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),   \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),   \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),   \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),   \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),   \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])

// D[64 x N] (+)= A * B for N = 128, 192 or 256 and 16-bit inputs (bf16 when kIsBf16, else f16).
template <int kN, bool kIsBf16, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                             int scale_d) {
  static_assert(kN == 128 || kN == 192 || kN == 256,
                "wgmma wrappers exist for N = 128, 192 and 256");
  if constexpr (kN == 128 && kIsBf16)
    asm volatile(CODA_WGMMA_N128_ASM("bf16")
                 : CODA_WGMMA_N128_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (kN == 128 && !kIsBf16)
    asm volatile(CODA_WGMMA_N128_ASM("f16")
                 : CODA_WGMMA_N128_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (kN == 192 && kIsBf16)
    asm volatile(CODA_WGMMA_N192_ASM("bf16")
                 : CODA_WGMMA_N192_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (kN == 192 && !kIsBf16)
    asm volatile(CODA_WGMMA_N192_ASM("f16")
                 : CODA_WGMMA_N192_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (kN == 256 && kIsBf16)
    asm volatile(CODA_WGMMA_N256_ASM("bf16")
                 : CODA_WGMMA_N256_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
  if constexpr (kN == 256 && !kIsBf16)
    asm volatile(CODA_WGMMA_N256_ASM("f16")
                 : CODA_WGMMA_N256_ACCUMULATORS
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// PTX ISA 9.7.15 (wgmma), "wgmma.mma_async" with .atype = .btype = .e4m3 (FP8), both operands
// from shared memory:
//   D[64 x 128] (+)= A[64 x 32] * B[32 x 128], fp32 accumulate.
// The FP8 form has no transpose immediates (only .f16/.bf16 read MN-major operands): both
// operands are K-major, and each k32 step is 32 bytes of a 128-byte swizzled row, as a k16 step
// of 16-bit elements is. The accumulator fragment is m64nNk16's (fragment.hpp): it depends on
// M, N and the fp32 D only. The instruction is m64n128k32 alone: the FP8 mainloop's
// promotion holds a second accumulator of the same size, and 128 columns are what two of them
// leave room for (docs/fp8.md).
// m64n128k32: 64 accumulator registers %0..%63, then desc_a %64, desc_b %65, scale_d %66;
// imm-scale-a and imm-scale-b are 1 (no negation). TYPE: the FP8 input type (e4m3; e5m2 exists).
#define CODA_WGMMA_K32_N128_ASM(TYPE)                                                              \
  "{\n"                                                                                            \
  ".reg .pred p;\n"                                                                                \
  "setp.ne.b32 p, %66, 0;\n"                                                                       \
  "wgmma.mma_async.sync.aligned.m64n128k32.f32." TYPE "." TYPE " {"                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                 \
  "}, %64, %65, p, 1, 1;\n"                                                                        \
  "}\n"

// D[64 x 128] (+)= A * B over 32 FP8 (E4M3) k values; scale_d == 0 overwrites D.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, int scale_d) {
  asm volatile(CODA_WGMMA_K32_N128_ASM("e4m3")
               : CODA_WGMMA_N128_ACCUMULATORS
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

#undef CODA_WGMMA_K32_N128_ASM
#undef CODA_WGMMA_N128_ASM
#undef CODA_WGMMA_N128_ACCUMULATORS
#undef CODA_WGMMA_N192_ASM
#undef CODA_WGMMA_N192_ACCUMULATORS
#undef CODA_WGMMA_N256_ASM
#undef CODA_WGMMA_N256_ACCUMULATORS

} // namespace coda::arch
