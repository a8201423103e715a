// coda's GEMM against cuBLASLt on the GEMMs of a Llama block (and a few squares), bf16 in and
// out, fp32 accumulate. Both run in this process on the same random inputs; each timed run
// follows a 256 MB write that flushes L2; the median of the timed runs is reported.
//
//   bench_gemm [--commit HASH] [--out bench/results/gemm.json] [--runs 50] [--filter SUBSTRING]
//              [--variants 1]
//
// Prints a table (TFLOP/s of both, cublas_ms / coda_ms) and the geometric mean of that ratio
// over the 24 block GEMMs, and writes the JSON described in docs/PERFORMANCE.md. coda runs
// what coda::gemm would (gpu::gemm's plan). With --variants 1 it also times other plans of
// the same kernels (kernel, raster group, stream-K, deferred stores: see kVariants) in the same
// interleaved loop and prints their ratios; the JSON keeps the default plan only. Each case
// also prints the algorithm cuBLASLt's heuristic chose (tile and stage ids of cublasLt.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm_instances.hpp"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cublasLt status " + std::to_string(int(s)));
}

struct BenchCase {
  std::string name;
  coda::GemmLayout layout;
  const char* layout_name; // "fwd" | "dgrad" | "wgrad" | "square"
  int64_t m, n, k;
};

// The three GEMMs of an nn.Linear with weight [out, in] over `tokens` tokens.
void add_linear(std::vector<BenchCase>& cases, const std::string& name, int64_t out, int64_t in,
                int64_t tokens) {
  cases.push_back({name + ".fwd", coda::GemmLayout::fwd, "fwd", tokens, out, in});
  cases.push_back({name + ".dgrad", coda::GemmLayout::dgrad, "dgrad", tokens, in, out});
  cases.push_back({name + ".wgrad", coda::GemmLayout::wgrad, "wgrad", out, in, tokens});
}

std::vector<BenchCase> bench_cases() {
  std::vector<BenchCase> cases;
  constexpr int64_t kTokens = 8192;
  struct Model {
    const char* name;
    int64_t hidden, mlp, q_heads, kv_heads, head_dim;
  };
  for (const Model& mdl :
       {Model{"llama1b", 2048, 8192, 32, 8, 64}, Model{"llama8b", 4096, 14336, 32, 8, 128}}) {
    const std::string p = mdl.name;
    const int64_t qkv = (mdl.q_heads + 2 * mdl.kv_heads) * mdl.head_dim;
    add_linear(cases, p + ".qkv", qkv, mdl.hidden, kTokens);
    add_linear(cases, p + ".o", mdl.hidden, mdl.q_heads * mdl.head_dim, kTokens);
    add_linear(cases, p + ".gate_up", 2 * mdl.mlp, mdl.hidden, kTokens);
    add_linear(cases, p + ".down", mdl.hidden, mdl.mlp, kTokens);
  }
  for (int64_t s : {2048, 4096, 8192})
    cases.push_back({"square" + std::to_string(s), coda::GemmLayout::fwd, "square", s, s, s});
  return cases;
}

__global__ void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    p[i] = __float2bfloat16(float(x >> 40) * (2.f / 16777216.f) - 1.f);
  }
}

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) { check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// cuBLASLt is column-major: it computes D^T[N, M] = X * Y with X from our B and Y from our A.
struct CublasGemm {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace;
  size_t workspace_bytes;

  CublasGemm(cublasLtHandle_t h, const BenchCase& c, void* ws, size_t ws_bytes)
      : handle(h), workspace(ws), workspace_bytes(ws_bytes) {
    // fwd: X = B[N,K] (col-major K x N, transposed), Y = A[M,K] (col-major K x M).
    // dgrad: X = B[K,N] (col-major N x K), Y = A (K x M). wgrad: X = B[K,N] (N x K), Y = A[K,M]
    // (col-major M x K, transposed).
    const bool tx = c.layout == coda::GemmLayout::fwd, ty = c.layout == coda::GemmLayout::wgrad;
    const cublasOperation_t opx = tx ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opy = ty ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof(opx)),
          "TRANSA");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof(opy)),
          "TRANSB");
    check(tx ? cublasLtMatrixLayoutCreate(&lx, CUDA_R_16BF, c.k, c.n, c.k)
             : cublasLtMatrixLayoutCreate(&lx, CUDA_R_16BF, c.n, c.k, c.n),
          "layout X");
    check(ty ? cublasLtMatrixLayoutCreate(&ly, CUDA_R_16BF, c.m, c.k, c.m)
             : cublasLtMatrixLayoutCreate(&ly, CUDA_R_16BF, c.k, c.m, c.k),
          "layout Y");
    check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, c.n, c.m, c.n), "layout D");
    cublasLtMatmulPreference_t pref;
    check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace_bytes, sizeof(workspace_bytes)),
          "workspace pref");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, op, lx, ly, ld, ld, pref, 1, &result, &found),
          "AlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw std::runtime_error("cuBLASLt has no algorithm for " + c.name);
    algo = result.algo; // the heuristic's first choice: what cuBLAS itself would run
    waves = result.wavesCount;
  }
  float waves = 0;

  // "tile T stages S splitK K swizzle W cluster C waves X": ids of cublasLt.h's enums.
  std::string describe() const {
    uint32_t tile = 0, stages = 0, split_k = 0, swizzle = 0;
    uint16_t cluster = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                         &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof(stages), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k,
                                         sizeof(split_k), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle,
                                         sizeof(swizzle), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                         sizeof(cluster), &got);
    char text[128];
    std::snprintf(text, sizeof(text),
                  "tile %u stages %u splitK %u swizzle %u cluster %u waves %.2f", tile, stages,
                  split_k, swizzle, unsigned(cluster), double(waves));
    return text;
  }
  ~CublasGemm() {
    cublasLtMatrixLayoutDestroy(lx), cublasLtMatrixLayoutDestroy(ly),
        cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
  }
  void run(const void* a, const void* b, void* d, cudaStream_t s) const {
    const float alpha = 1.f, beta = 0.f;
    check(cublasLtMatmul(handle, op, &alpha, b, lx, a, ly, &beta, d, ld, d, ld, &algo, workspace,
                         workspace_bytes, s),
          "cublasLtMatmul");
  }
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Plans timed with --variants 1 besides gpu::gemm's own.
struct Variant {
  const char* name;
  coda::sm90::GemmPlan (*plan)(const coda::GemmArgs&);
};

// The plan of worklog step 3: ping-pong for poor waves, group ~ one wave, no stream-K, stores
// not deferred.
coda::sm90::GemmPlan previous_plan(const coda::GemmArgs& args) {
  using namespace coda::sm90;
  const int64_t m = args.m(), n = args.n(), sms = 132;
  GemmPlan plan;
  const int64_t tiles_m = coda::ceil_div<int64_t>(m, 128);
  const double wide = wave_efficiency(tiles_m * coda::ceil_div<int64_t>(n, 256), sms);
  const double narrow = wave_efficiency(tiles_m * coda::ceil_div<int64_t>(n, 128), sms);
  if (wide < 0.8 && narrow > wide + 0.15) plan.kernel = KernelId::pingpong;
  const int64_t tiles_n = coda::ceil_div<int64_t>(n, plan.kernel == KernelId::wide ? 256 : 128);
  const int64_t units_m = coda::ceil_div<int64_t>(tiles_m, 2);
  int64_t g = coda::ceil_div<int64_t>(sms / 2, tiles_n);
  g = g < 2 ? 2 : g > 16 ? 16 : g;
  plan.group_m = int32_t(g > units_m ? std::max<int64_t>(units_m, 1) : g);
  plan.stream_k = StreamKMode::off;
  plan.defer_stores = false;
  return plan;
}

template <bool kDefer, coda::sm90::StreamKMode kStreamK, int kGroup>
coda::sm90::GemmPlan variant_plan(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = coda::gpu::default_plan(args);
  plan.defer_stores = kDefer;
  plan.stream_k = kStreamK;
  if (kGroup > 0) plan.group_m = kGroup;
  return plan;
}

coda::sm90::GemmPlan pingpong_plan(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = coda::gpu::default_plan(args);
  plan.kernel = coda::sm90::KernelId::pingpong;
  plan.stream_k = coda::sm90::StreamKMode::off;
  return plan;
}

using coda::sm90::StreamKMode;
const Variant kVariants[] = {
    {"same", variant_plan<true, StreamKMode::automatic, 0>}, // the default again: order bias
    {"previous", previous_plan},
    {"no_defer", variant_plan<false, StreamKMode::automatic, 0>},
    {"no_sk", variant_plan<true, StreamKMode::off, 0>},
    {"sk_always", variant_plan<true, StreamKMode::always, 0>},
    {"group4", variant_plan<true, StreamKMode::automatic, 4>},
    {"group16", variant_plan<true, StreamKMode::automatic, 16>},
    {"pingpong", pingpong_plan},
};
constexpr int kNumVariants = int(sizeof(kVariants) / sizeof(kVariants[0]));

struct Result {
  BenchCase c;
  double coda_ms, cublas_ms, max_rel_diff;
  std::vector<double> variant_ms; // kVariants order, when timed
};

// Largest |coda - cublas| / max|cublas| over the first million outputs: a sanity check that
// both computed the same product (the tests check coda against the fp64 reference).
double compare_outputs(const void* d_coda, const void* d_cublas, int64_t numel) {
  const size_t n = size_t(std::min<int64_t>(numel, 1 << 20));
  std::vector<__nv_bfloat16> x(n), y(n);
  check(cudaMemcpy(x.data(), d_coda, n * 2, cudaMemcpyDeviceToHost), "copy D");
  check(cudaMemcpy(y.data(), d_cublas, n * 2, cudaMemcpyDeviceToHost), "copy D");
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(__bfloat162float(x[i]) - __bfloat162float(y[i]))));
    scale = std::max(scale, double(std::fabs(__bfloat162float(y[i]))));
  }
  return diff / scale;
}

Result bench_case(const BenchCase& c, cublasLtHandle_t lt, void* ws, size_t ws_bytes, void* flush,
                  size_t flush_bytes, int runs, bool variants, cudaStream_t s) {
  Buffer a(size_t(c.m * c.k * 2)), b(size_t(c.n * c.k * 2)), d(size_t(c.m * c.n * 2)),
      d_ref(size_t(c.m * c.n * 2));
  fill_uniform<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(a.p), c.m * c.k, 1);
  fill_uniform<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(b.p), c.n * c.k, 2);
  check(cudaGetLastError(), "fill");

  coda::GemmArgs args;
  args.layout = c.layout;
  const bool a_km = c.layout == coda::GemmLayout::wgrad, b_nk = c.layout == coda::GemmLayout::fwd;
  args.a = a_km ? coda::make_view(a.p, coda::DType::bf16, c.k, c.m, coda::Device::cuda)
                : coda::make_view(a.p, coda::DType::bf16, c.m, c.k, coda::Device::cuda);
  args.b = b_nk ? coda::make_view(b.p, coda::DType::bf16, c.n, c.k, coda::Device::cuda)
                : coda::make_view(b.p, coda::DType::bf16, c.k, c.n, coda::Device::cuda);
  args.d = coda::make_view(d.p, coda::DType::bf16, c.m, c.n, coda::Device::cuda);
  CublasGemm cublas(lt, c, ws, ws_bytes);
  std::printf("  cuBLASLt %s: %s\n", c.name.c_str(), cublas.describe().c_str());

  auto run_coda = [&] { coda::gpu::gemm(args, s); };
  auto run_cublas = [&] { cublas.run(a.p, b.p, d_ref.p, s); };
  std::vector<coda::sm90::GemmPlan> plans;
  if (variants)
    for (const Variant& v : kVariants) plans.push_back(v.plan(args));
  // One stream-K workspace (as coda::gemm's callers pass) for the default plan and every variant.
  size_t coda_ws_bytes = coda::gpu::gemm_workspace_size(args);
  for (const auto& plan : plans)
    coda_ws_bytes = std::max(coda_ws_bytes, coda::gpu::gemm_workspace_size(args, plan));
  Buffer coda_ws(std::max<size_t>(coda_ws_bytes, 16));
  if (coda_ws_bytes > 0)
    args.workspace = coda::make_view(coda_ws.p, coda::DType::f32, int64_t(coda_ws_bytes / 4),
                                     coda::Device::cuda);
  for (int i = 0; i < 5; ++i) {
    run_coda(), run_cublas();
    for (const auto& plan : plans) coda::gpu::gemm_with_plan(args, plan, s);
  }
  check(cudaStreamSynchronize(s), "warm-up");

  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event"), check(cudaEventCreate(&stop), "event");
  std::vector<float> t_coda, t_cublas;
  std::vector<std::vector<float>> t_variants(plans.size());
  auto timed = [&](auto&& fn, std::vector<float>& out) {
    check(cudaMemsetAsync(flush, int(out.size() & 0xff), flush_bytes, s), "L2 flush");
    check(cudaEventRecord(start, s), "record");
    fn();
    check(cudaEventRecord(stop, s), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    out.push_back(ms);
  };
  for (int i = 0; i < runs; ++i) {
    timed(run_coda, t_coda), timed(run_cublas, t_cublas); // interleaved
    for (size_t j = 0; j < plans.size(); ++j) { // rotated, so no variant always runs first
      const size_t v = (j + size_t(i)) % plans.size();
      timed([&] { coda::gpu::gemm_with_plan(args, plans[v], s); }, t_variants[v]);
    }
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  // The variants write D too: recompute it with the default plan, which the JSON reports.
  run_coda();
  check(cudaStreamSynchronize(s), "final run");
  Result r{c, median(t_coda), median(t_cublas), compare_outputs(d.p, d_ref.p, c.m * c.n), {}};
  for (const auto& t : t_variants) r.variant_ms.push_back(median(t));
  return r;
}

double tflops(const BenchCase& c, double ms) {
  return 2.0 * double(c.m) * double(c.n) * double(c.k) / (ms * 1e9);
}

} // namespace

int main(int argc, char** argv) {
  std::string commit = "unknown", out_path = "bench/results/gemm.json";
  std::string filter;
  int runs = 50;
  bool variants = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--commit")
      commit = argv[i + 1];
    else if (flag == "--out")
      out_path = argv[i + 1];
    else if (flag == "--runs")
      runs = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--filter")
      filter = argv[i + 1];
    else if (flag == "--variants")
      variants = std::atoi(argv[i + 1]) != 0;
    else
      return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  try {
    if (!coda::gpu::device_supported())
      return std::fprintf(stderr, "bench_gemm needs an sm_90 GPU\n"), 1;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "properties");
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    cublasLtHandle_t lt;
    check(cublasLtCreate(&lt), "cublasLtCreate");
    const size_t ws_bytes = size_t(32) << 20, flush_bytes = size_t(256) << 20;
    Buffer ws(ws_bytes), flush(flush_bytes);

    std::vector<Result> results;
    std::printf("%-24s %6s %6s %6s  %9s %9s  %7s %9s\n", "case", "M", "N", "K", "coda TF/s",
                "cuBLAS", "ratio", "rel diff");
    for (const BenchCase& c : bench_cases()) {
      if (c.name.find(filter) == std::string::npos) continue;
      const Result r = bench_case(c, lt, ws.p, ws_bytes, flush.p, flush_bytes, runs, variants, s);
      results.push_back(r);
      std::printf("%-24s %6lld %6lld %6lld  %9.1f %9.1f  %7.3f %9.2e\n", c.name.c_str(),
                  (long long)c.m, (long long)c.n, (long long)c.k, tflops(c, r.coda_ms),
                  tflops(c, r.cublas_ms), r.cublas_ms / r.coda_ms, r.max_rel_diff);
      for (size_t v = 0; v < r.variant_ms.size(); ++v)
        std::printf("    variant %-10s ratio %.3f\n", kVariants[v].name,
                    r.cublas_ms / r.variant_ms[v]);
      std::fflush(stdout);
    }
    double log_sum = 0, worst = 1e30;
    int blocks = 0;
    for (const Result& r : results)
      if (std::strcmp(r.c.layout_name, "square") != 0) {
        log_sum += std::log(r.cublas_ms / r.coda_ms), ++blocks;
        worst = std::min(worst, r.cublas_ms / r.coda_ms);
      }
    std::printf("geomean cublas_ms/coda_ms over %d block GEMMs: %.3f (min %.3f)\n", blocks,
                std::exp(log_sum / std::max(blocks, 1)), worst);
    for (int v = 0; variants && v < kNumVariants; ++v) {
      double sum = 0, low = 1e30;
      for (const Result& r : results)
        if (std::strcmp(r.c.layout_name, "square") != 0) {
          sum += std::log(r.cublas_ms / r.variant_ms[size_t(v)]);
          low = std::min(low, r.cublas_ms / r.variant_ms[size_t(v)]);
        }
      std::printf("variant %-10s geomean %.3f (min %.3f)\n", kVariants[v].name,
                  std::exp(sum / std::max(blocks, 1)), low);
    }

    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (!f) return std::fprintf(stderr, "cannot write %s\n", out_path.c_str()), 1;
    std::fprintf(
        f, "{\n  \"gpu\": \"%s\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n  \"cases\": [\n",
        prop.name, date, commit.c_str());
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(
          f,
          "    {\"name\": \"%s\", \"layout\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"coda_ms\": %.5f, \"cublas_ms\": %.5f}%s\n",
          r.c.name.c_str(), r.c.layout_name, (long long)r.c.m, (long long)r.c.n, (long long)r.c.k,
          r.coda_ms, r.cublas_ms, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    cublasLtDestroy(lt);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
