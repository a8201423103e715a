// Reference GEMM in every layout the block needs. Plain C++: no CUDA.
//
// Storage shapes (all row-major), D is always [M, N]:
//   fwd   : D = A · Bᵀ   A [M, K] activations, B [N, K] weight as nn.Linear stores it
//   dgrad : D = A · B    A [M, K] output gradient, B [K, N] the same nn.Linear weight
//   wgrad : D = Aᵀ · B   A [K, M] output gradient, B [K, N] activations (tokens = K)
#pragma once

#include <cstdint>

namespace coda::ref {

enum class Layout { fwd, dgrad, wgrad };

// Element (m, k) of op(A) and (k, n) of op(B), given the storage layout.
inline int64_t a_index(Layout l, int64_t M, int64_t K, int64_t m, int64_t k) {
  return l == Layout::wgrad ? k * M + m : m * K + k;
}
inline int64_t b_index(Layout l, int64_t N, int64_t K, int64_t k, int64_t n) {
  return l == Layout::fwd ? n * K + k : k * N + n;
}

// fp64 accumulation: the ground truth.
void gemm(Layout layout, int64_t M, int64_t N, int64_t K, const double* A, const double* B,
          double* D);

// fp32 accumulation over inputs already rounded to the low-precision type: what an ordinary
// unfused low-precision GEMM computes before it rounds its output.
void gemm_fp32(Layout layout, int64_t M, int64_t N, int64_t K, const float* A, const float* B,
               float* D);

} // namespace coda::ref
