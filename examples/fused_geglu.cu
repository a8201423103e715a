// Runs the GEMM + GeGLU kernel of fused_geglu.cuh once and checks it against an fp64 host
// computation with the project's tolerance rule (no worse than twice the error of the unfused
// path: a bf16 GEMM output, then GeGLU rounded again). Exit 0: passed, 1: failed, 77: no sm_90
// GPU (ctest reports the example as skipped).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "fused_geglu.cuh"

int main() {
  using coda::bf16;
  if (!coda::gpu_supported())
    return std::puts("fused_geglu: no sm_90 GPU, skipped"), 77;
  const int64_t M = 300, F = 520, K = 256;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<bf16> a(M * K), w(2 * F * K), act(M * F);
  for (auto& x : a) x = bf16::from(uniform(rng));
  for (auto& x : w) x = bf16::from(uniform(rng));

  void *da, *dw, *dact;
  cudaMalloc(&da, a.size() * 2), cudaMalloc(&dw, w.size() * 2), cudaMalloc(&dact, act.size() * 2);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  using coda::DType, coda::Device;
  coda::examples::gemm_geglu<bf16>(coda::make_view(da, DType::bf16, M, K, Device::cuda),
                                   coda::make_view(dw, DType::bf16, 2 * F, K, Device::cuda),
                                   coda::make_view(dact, DType::bf16, M, F, Device::cuda), nullptr);
  if (cudaMemcpy(act.data(), dact, act.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
    return std::puts("fused_geglu: CUDA error"), 1;

  double fused_error = 0, unfused_error = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < F; ++j) {
      double z[2] = {0, 0};
      for (int p = 0; p < 2; ++p)
        for (int64_t k = 0; k < K; ++k)
          z[p] += double(a[m * K + k].to_float()) * double(w[(2 * j + p) * K + k].to_float());
      const double exact = coda::examples::GegluGate{}(z[0], z[1]);
      const float g = coda::round_to<bf16>(float(z[0])), u = coda::round_to<bf16>(float(z[1]));
      const double unfused = coda::round_to<bf16>(coda::examples::GegluGate{}(g, u));
      fused_error = std::fmax(fused_error, std::fabs(act[m * F + j].to_float() - exact));
      unfused_error = std::fmax(unfused_error, std::fabs(unfused - exact));
    }
  cudaFree(da), cudaFree(dw), cudaFree(dact);
  const bool pass = fused_error <= 2 * unfused_error + 1e-6;
  std::printf("fused_geglu %lldx%lldx%lld: max error %.3g (unfused path %.3g): %s\n", (long long)M,
              (long long)F, (long long)K, fused_error, unfused_error, pass ? "passed" : "FAILED");
  return pass ? 0 : 1;
}
