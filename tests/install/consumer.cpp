// A C++ program against an installed coda: the C++ API (views, a kernel, the block's workspace
// query, coda::Error) and the installed fp64 reference. Exit 0 when all hold.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "coda/coda.hpp"
#include "reference/gemm.hpp"

int main() {
  using namespace coda;
  constexpr int64_t M = 5, N = 16, K = 24;
  std::vector<bf16> a(M * K), b(N * K), d(M * N);
  std::vector<double> ad(M * K), bd(N * K), ref(M * N);
  for (int64_t i = 0; i < M * K; ++i) a[i] = bf16::from(0.25f * float(i % 7) - 0.75f);
  for (int64_t i = 0; i < N * K; ++i) b[i] = bf16::from(0.5f * float(i % 4) - 0.75f);
  for (int64_t i = 0; i < M * K; ++i) ad[i] = a[i].to_float();
  for (int64_t i = 0; i < N * K; ++i) bd[i] = b[i].to_float();

  GemmArgs g;
  g.a = make_view(a.data(), DType::bf16, M, K);
  g.b = make_view(b.data(), DType::bf16, N, K);
  g.d = make_view(d.data(), DType::bf16, M, N);
  gemm(g);
  ref::gemm(ref::Layout::fwd, M, N, K, ad.data(), bd.data(), ref.data());
  for (int64_t i = 0; i < M * N; ++i)
    if (d[i].to_float() != float(ref[i])) // small exact products: bf16 holds them
      return std::printf("cpp_consumer: d[%lld] = %g, reference %g\n", (long long)i,
                         d[i].to_float(), ref[i]),
             1;

  try {
    g.d = make_view(d.data(), DType::bf16, M, N + 8); // a wrong shape
    gemm(g);
    return std::puts("cpp_consumer: a wrong shape was accepted"), 1;
  } catch (const Error& e) {
    if (e.status() != Status::invalid_argument || std::string(e.what()).empty())
      return std::printf("cpp_consumer: unexpected error %s\n", e.what()), 1;
  }

  llama::Config config;
  config.hidden = 64, config.intermediate = 128, config.n_heads = 4, config.n_kv_heads = 2;
  config.head_dim = 16, config.vocab = 256;
  if (llama::workspace_size(llama::Layer::middle, llama::Pass::backward, config, 32) == 0)
    return std::puts("cpp_consumer: the block needs a workspace"), 1;
  std::printf("cpp_consumer: GEMM, reference, error path and block query ok (gpu_supported %d)\n",
              int(gpu_supported()));
  return 0;
}
