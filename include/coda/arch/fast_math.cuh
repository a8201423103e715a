// The SFU's approximate transcendentals with subnormals flushed to zero. PTX ISA sections are
// cited by instruction title.
//
// Without .ftz, ex2.approx.f32 and rcp.approx.f32 compile to the MUFU instruction plus a range
// test and two predicated scalings per call (so that results below 2^-126 come out subnormal):
// five instructions where .ftz needs one. The epilogues call these once or twice per output
// element with one warp per scheduler (docs/epilogue.md, K7's profile), where those extra
// instructions were a sixth of the epilogue's issue slots. What .ftz changes: a result below
// 2^-126 is +0 instead of a subnormal, and a subnormal input reads as 0; the epilogues' uses
// (sigmoid's 1 / (1 + e^-g), the log-sum-exp's sum of e^(x - max) >= 1) are unaffected above
// 2^-126 of their result.
#pragma once

namespace coda::arch {

// PTX ISA "ex2": 2^x by the hardware approximation; ex2(-inf) = +0, ex2(+inf) = +inf, NaN stays.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// PTX ISA "rcp": 1 / x by the hardware approximation; rcp(inf) = +0, rcp(+-0) = +-inf.
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

} // namespace coda::arch
