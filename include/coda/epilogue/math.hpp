// Scalar math for the epilogue ops, one spelling for host and device and for float and double
// (so an fp64 reference can instantiate the same op math). Device code uses the accurate CUDA
// functions (expf, not __expf): the epilogue is memory-bound, and accuracy is what the tests hold
// it to.
#pragma once

#include <cmath>
#include <limits>

#include "coda/core/types.hpp"

namespace coda::epilogue::math {

// The device pass calls CUDA's math library, the host pass the C++ one; one signature for both.
#if defined(__CUDA_ARCH__)
CODA_HD float exp(float x) { return ::expf(x); }
CODA_HD double exp(double x) { return ::exp(x); }
CODA_HD float log(float x) { return ::logf(x); }
CODA_HD double log(double x) { return ::log(x); }
CODA_HD float rsqrt(float x) { return ::rsqrtf(x); }
CODA_HD double rsqrt(double x) { return ::rsqrt(x); }
CODA_HD float sin(float x) { return ::sinf(x); }
CODA_HD float cos(float x) { return ::cosf(x); }
CODA_HD float rint(float x) { return ::rintf(x); }
CODA_HD float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
#else
CODA_HD float exp(float x) { return std::exp(x); }
CODA_HD double exp(double x) { return std::exp(x); }
CODA_HD float log(float x) { return std::log(x); }
CODA_HD double log(double x) { return std::log(x); }
CODA_HD float rsqrt(float x) { return 1.f / std::sqrt(x); }
CODA_HD double rsqrt(double x) { return 1.0 / std::sqrt(x); }
CODA_HD float sin(float x) { return std::sin(x); }
CODA_HD float cos(float x) { return std::cos(x); }
CODA_HD float rint(float x) { return std::rint(x); }
CODA_HD float fma(float a, float b, float c) { return std::fma(a, b, c); }
#endif

template <class T> CODA_HD T max(T a, T b) { return a > b ? a : b; }
template <class T> CODA_HD constexpr T infinity() { return std::numeric_limits<T>::infinity(); }

} // namespace coda::epilogue::math
