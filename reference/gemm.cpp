// Reference GEMM: a plain triple loop per layout, written so the innermost loop walks memory
// contiguously (the tests multiply a few hundred million terms in fp64). The accumulation order
// over k is sequential and the same for every layout; nothing here tries to be clever. Large
// products split their rows over threads: each row is computed by one thread exactly as alone,
// so the result does not depend on the split (the GPU suites multiply billions of terms a seed,
// and their machine has 16 cores).
#include "reference/gemm.hpp"

#include <algorithm>
#include <thread>
#include <vector>

namespace coda::ref {
namespace {

// Below this many multiply-adds a product stays on the calling thread.
constexpr int64_t kMinTermsPerThread = int64_t(1) << 22;

// D[m, :] = sum_k A(m, k) * B(k, :), accumulated in Acc, for rows [m0, m1).
template <class T, class Acc>
void gemm_rows(Layout layout, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* D,
               int64_t m0, int64_t m1) {
  std::vector<Acc> row(size_t(N), Acc(0));
  for (int64_t m = m0; m < m1; ++m) {
    if (layout == Layout::fwd) {
      // B is [N, K]: each output is a dot product of two contiguous rows.
      for (int64_t n = 0; n < N; ++n) {
        Acc acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += Acc(A[m * K + k]) * Acc(B[n * K + k]);
        row[size_t(n)] = acc;
      }
    } else {
      // B is [K, N]: accumulate scaled rows of B into the output row.
      std::fill(row.begin(), row.end(), Acc(0));
      for (int64_t k = 0; k < K; ++k) {
        const Acc a = Acc(A[a_index(layout, M, K, m, k)]);
        const T* b = B + k * N;
        for (int64_t n = 0; n < N; ++n) row[size_t(n)] += a * Acc(b[n]);
      }
    }
    for (int64_t n = 0; n < N; ++n) D[m * N + n] = T(row[size_t(n)]);
  }
}

template <class T, class Acc>
void gemm_impl(Layout layout, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* D) {
  if (M <= 0 || N <= 0) return;
  const int64_t terms = M * N * std::max<int64_t>(K, 1);
  const int64_t threads =
      std::min<int64_t>({int64_t(std::max(1u, std::thread::hardware_concurrency())), M,
                         std::max<int64_t>(1, terms / kMinTermsPerThread)});
  if (threads <= 1) return gemm_rows<T, Acc>(layout, M, N, K, A, B, D, 0, M);
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads));
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back(gemm_rows<T, Acc>, layout, M, N, K, A, B, D, M * t / threads,
                      M * (t + 1) / threads);
  for (std::thread& th : pool) th.join();
}

} // namespace

void gemm(Layout layout, int64_t M, int64_t N, int64_t K, const double* A, const double* B,
          double* D) {
  gemm_impl<double, double>(layout, M, N, K, A, B, D);
}

void gemm_fp32(Layout layout, int64_t M, int64_t N, int64_t K, const float* A, const float* B,
               float* D) {
  gemm_impl<float, float>(layout, M, N, K, A, B, D);
}

} // namespace coda::ref
