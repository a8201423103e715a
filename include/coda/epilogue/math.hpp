// Scalar math for the epilogue ops, one spelling for host and device and for float and double
// (so an fp64 reference can instantiate the same op math).
//
// Device exp is the hardware ex2.approx on x * log2(e) (2 instructions, relative error about
// 2^-21 for the |x| < 30 that logits and gates reach; subnormal results flushed to zero:
// arch/fast_math.cuh), not the accurate expf (about 10 instructions with its range reduction).
// The fused epilogue runs with one warp per scheduler beside the MMAs, so its instruction count
// and latency chains decide whether it hides under them (docs/epilogue.md); and the outputs it
// feeds are rounded to 16 bits (2^-9) or compared under the rule of ARCHITECTURE section 7,
// whose baseline error is that rounding. Host code (the CPU backend and the references) keeps
// the accurate std::exp.
#pragma once

#include <cmath>
#include <limits>

#include "coda/core/types.hpp"
#if defined(__CUDACC__)
#include "coda/arch/fast_math.cuh"
#endif

namespace coda::epilogue::math {

// The device pass calls CUDA's math library, the host pass the C++ one; one signature for both.
#if defined(__CUDA_ARCH__)
CODA_HD float exp(float x) { return arch::ex2_approx_ftz(x * 1.44269504088896341f); } // log2(e)
CODA_HD double exp(double x) { return ::exp(x); }
CODA_HD float log(float x) { return ::logf(x); }
CODA_HD double log(double x) { return ::log(x); }
CODA_HD float rsqrt(float x) { return ::rsqrtf(x); }
CODA_HD double rsqrt(double x) { return ::rsqrt(x); }
// sin and cos of an argument already reduced to [-pi, pi] (RoPE's angles, ops/rope.hpp), by the
// hardware MUFU.SIN / MUFU.COS (__sincosf): absolute error 2^-21.4 on that range (CUDA C++
// Programming Guide, intrinsic functions), against the accurate sinf/cosf's ~40 instructions
// each with a Payne-Hanek slow path that the reduced argument never takes.
CODA_HD void sincos_reduced(float x, float* s, float* c) { ::__sincosf(x, s, c); }
CODA_HD float rint(float x) { return ::rintf(x); }
CODA_HD float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
// 1 / x by the hardware reciprocal (1 instruction; about 1 ulp; 1 / inf = 0, and 0 for
// |x| > 2^126, where the true value is subnormal): no IEEE division with its slow path.
CODA_HD float reciprocal(float x) { return arch::rcp_approx_ftz(x); }
CODA_HD double reciprocal(double x) { return 1.0 / x; }
// erf by CUDA's math library (erff: at most 2 ulp, CUDA Math API); GeGLU's exact GELU.
CODA_HD float erf(float x) { return ::erff(x); }
CODA_HD double erf(double x) { return ::erf(x); }
#else
CODA_HD float exp(float x) { return std::exp(x); }
CODA_HD double exp(double x) { return std::exp(x); }
CODA_HD float log(float x) { return std::log(x); }
CODA_HD double log(double x) { return std::log(x); }
CODA_HD float rsqrt(float x) { return 1.f / std::sqrt(x); }
CODA_HD double rsqrt(double x) { return 1.0 / std::sqrt(x); }
CODA_HD void sincos_reduced(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
CODA_HD float rint(float x) { return std::rint(x); }
CODA_HD float fma(float a, float b, float c) { return std::fma(a, b, c); }
CODA_HD float reciprocal(float x) { return 1.f / x; }
CODA_HD double reciprocal(double x) { return 1.0 / x; }
CODA_HD float erf(float x) { return std::erf(x); }
CODA_HD double erf(double x) { return std::erf(x); }
#endif

template <class T> CODA_HD T max(T a, T b) { return a > b ? a : b; }
template <class T> CODA_HD constexpr T infinity() { return std::numeric_limits<T>::infinity(); }

} // namespace coda::epilogue::math
