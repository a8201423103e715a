// The GEMM problem as the host sees it: layouts, operands and the plain epilogue.
// Host-only (plain C++), shared by the public API, the CPU backend and the GPU dispatch.
#pragma once

#include "coda/core/tensor.hpp"

namespace coda {

// Storage shapes, all row-major; D is [M, N]:
//   fwd   : D = A · Bᵀ   A [M, K], B [N, K]  (nn.Linear forward; B is the weight as stored)
//   dgrad : D = A · B    A [M, K], B [K, N]  (input gradient: dY · W)
//   wgrad : D = Aᵀ · B   A [K, M], B [K, N]  (weight gradient: dYᵀ · X, tokens = K)
enum class GemmLayout : int32_t { fwd = 0, dgrad = 1, wgrad = 2 };

// D = alpha · op(A)·op(B) + beta · C. C (optional) has D's shape; C may alias D (beta = 1 then
// accumulates, e.g. gradient accumulation). A and B are bf16 or f16 (the same); D and C are
// bf16, f16 or f32.
struct GemmArgs {
  GemmLayout layout = GemmLayout::fwd;
  TensorView a, b, d;
  TensorView c;         // c.data == nullptr: no C
  float alpha = 1.f;
  float beta = 0.f;

  int64_t m() const { return d.shape[0]; }
  int64_t n() const { return d.shape[1]; }
  int64_t k() const { return layout == GemmLayout::wgrad ? a.shape[0] : a.shape[1]; }
  bool has_c() const { return c.data != nullptr; }
};

} // namespace coda
