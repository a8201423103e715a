// What the GPU benchmarks share: error checks, deterministic random fills, device buffers,
// cuBLASLt's GEMM in coda's three layouts, the timer (L2 flush, CUDA events, median), command-line
// flags, the JSON header and the GEMM shapes of a Llama block. Each benchmark is one translation
// unit that includes this header once, so everything here has internal linkage.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "coda/core/tensor.hpp"
#include "coda/gemm/problem.hpp"

namespace {
namespace bench {

using coda::Device;
using coda::DType;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cublasLt status " + std::to_string(int(s)));
}

// ---- Deterministic random inputs: element i of a tensor with seed s is a function of (i, s)
// alone, the same on the host and the device.

__host__ __device__ inline uint64_t mix(uint64_t x) {
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return x;
}
// Uniform in [lo, hi) from the top 24 bits of the hash.
__host__ __device__ inline float uniform(uint64_t i, uint64_t seed, float lo, float hi) {
  return lo + (hi - lo) * float(mix(i + seed) >> 40) / 16777216.f;
}

__global__ void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(uniform(uint64_t(i), seed, lo, hi));
}
__global__ void fill_partials(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = scale * (0.5f + float(mix(uint64_t(i) + seed) >> 40) / 16777216.f);
}
__global__ void fill_ints(int32_t* p, int64_t n, uint64_t seed, int32_t modulo) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = int32_t(mix(uint64_t(i) + seed) % uint64_t(modulo));
}
// Llama's rotary frequencies, base 500000.
__host__ __device__ inline float rope_inv_freq(int32_t i, int32_t head_dim) {
  return powf(500000.f, -2.f * float(i) / float(head_dim));
}
__global__ void fill_inv_freq(float* p, int32_t half, int32_t head_dim) {
  const int i = threadIdx.x;
  if (i < half) p[i] = rope_inv_freq(i, head_dim);
}

// ---- Device memory.

struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
    check(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc");
  }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
};

inline coda::TensorView view(const Buffer& b, DType t, int64_t rows, int64_t cols) {
  return coda::make_view(b.p, t, rows, cols, Device::cuda);
}
inline coda::TensorView view(const Buffer& b, DType t, int64_t n) {
  return coda::make_view(b.p, t, n, Device::cuda);
}

// Largest |a - b| / max|b| over the first million elements of two bf16 tensors: a sanity check
// that two sides computed the same thing (infinite where a holds a NaN or an infinity, e.g. an
// element a poisoned output never received).
inline double max_rel_diff(const void* a, const void* b, int64_t numel) {
  const size_t n = size_t(std::min<int64_t>(numel, 1 << 20));
  std::vector<__nv_bfloat16> x(n), y(n);
  check(cudaMemcpy(x.data(), a, n * 2, cudaMemcpyDeviceToHost), "copy");
  check(cudaMemcpy(y.data(), b, n * 2, cudaMemcpyDeviceToHost), "copy");
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(__bfloat162float(x[i]))) return INFINITY;
    diff = std::max(diff, double(std::fabs(__bfloat162float(x[i]) - __bfloat162float(y[i]))));
    scale = std::max(scale, double(std::fabs(__bfloat162float(y[i]))));
  }
  return diff / scale;
}

// The same over every element, on the device: largest |a - b| over largest |b| (infinite where
// either holds a NaN or an infinity). For tensors too large to copy to the host.
__global__ void abs_max_diff(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n,
                             unsigned* out) { // out: max |a - b|, max |b| (float bits), non-finite
  float diff = 0.f, scale = 0.f;
  unsigned bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!isfinite(x) || !isfinite(y)) bad = 1;
    diff = fmaxf(diff, fabsf(x - y)), scale = fmaxf(scale, fabsf(y));
  }
  for (int o = 16; o > 0; o /= 2) {
    diff = fmaxf(diff, __shfl_xor_sync(0xffffffffu, diff, o));
    scale = fmaxf(scale, __shfl_xor_sync(0xffffffffu, scale, o));
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if (threadIdx.x % 32 == 0) { // non-negative floats order as their bits do
    atomicMax(&out[0], __float_as_uint(diff)), atomicMax(&out[1], __float_as_uint(scale));
    if (bad) atomicOr(&out[2], 1u);
  }
}
inline double max_rel_diff_all(const void* a, const void* b, int64_t numel, cudaStream_t s) {
  Buffer out(3 * sizeof(unsigned));
  check(cudaMemsetAsync(out.p, 0, out.bytes, s), "clear");
  abs_max_diff<<<1024, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                    static_cast<const __nv_bfloat16*>(b), numel,
                                    out.as<unsigned>());
  check(cudaGetLastError(), "abs_max_diff");
  unsigned host[3];
  check(cudaMemcpyAsync(host, out.p, sizeof(host), cudaMemcpyDeviceToHost, s), "copy");
  check(cudaStreamSynchronize(s), "abs_max_diff sync");
  if (host[2]) return INFINITY;
  float diff, scale;
  std::memcpy(&diff, &host[0], 4), std::memcpy(&scale, &host[1], 4);
  return double(diff) / std::max(double(scale), 1e-30);
}

// ---- The GEMMs of a Llama block: each nn.Linear's forward, input-gradient and weight-gradient
// GEMM (coda's layouts, below), for Llama-3.2-1B and Llama-3.1-8B at 8192 tokens.
struct GemmCase {
  std::string name;
  coda::GemmLayout layout;
  const char* layout_name; // "fwd" | "dgrad" | "wgrad" | "square"
  int64_t m, n, k;
};

// The three GEMMs of an nn.Linear with weight [out, in] over `tokens` tokens.
inline void add_linear(std::vector<GemmCase>& cases, const std::string& name, int64_t out,
                       int64_t in, int64_t tokens) {
  cases.push_back({name + ".fwd", coda::GemmLayout::fwd, "fwd", tokens, out, in});
  cases.push_back({name + ".dgrad", coda::GemmLayout::dgrad, "dgrad", tokens, in, out});
  cases.push_back({name + ".wgrad", coda::GemmLayout::wgrad, "wgrad", out, in, tokens});
}

// The 24 block GEMMs: qkv, o, gate_up (the fused [2F, D] weight) and down, fwd / dgrad / wgrad.
inline std::vector<GemmCase> llama_block_gemms() {
  std::vector<GemmCase> cases;
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
  return cases;
}
inline GemmCase square_gemm(int64_t s) {
  return {"square" + std::to_string(s), coda::GemmLayout::fwd, "square", s, s, s};
}

// "tile T stages S splitK K swizzle W cluster C waves X" for a cuBLASLt algorithm: ids of
// cublasLt.h's enums, and the heuristic's wave count.
inline std::string describe_algo(const cublasLtMatmulAlgo_t& algo, float waves) {
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
  std::snprintf(text, sizeof(text), "tile %u stages %u splitK %u swizzle %u cluster %u waves %.2f",
                tile, stages, split_k, swizzle, unsigned(cluster), double(waves));
  return text;
}

// ---- cuBLASLt in coda's layouts (coda/gemm/problem.hpp), 16-bit inputs, fp32 accumulate:
//   fwd   D[M, N] = A[M, K] · B[N, K]ᵀ     dgrad D[M, N] = A[M, K] · B[K, N]
//   wgrad D[M, N] = A[K, M]ᵀ · B[K, N]
// cuBLASLt is column-major: it computes Dᵀ[N, M] = X · Y with X from our B and Y from our A.
// The algorithm is the heuristic's first choice: what cuBLAS itself would run.
// cuBLASLt's first algorithm for `op` on layouts a, b and d (c = d) within `workspace_bytes`:
// the heuristic's status; `found` is 0 when it has none.
inline cublasStatus_t first_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                 cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t d, size_t workspace_bytes,
                                 cublasLtMatmulHeuristicResult_t& result, int& found) {
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof(workspace_bytes)),
        "workspace pref");
  found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  return status;
}

struct CublasGemm {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace;
  size_t workspace_bytes;
  float waves = 0;

  CublasGemm(cublasLtHandle_t h, coda::GemmLayout layout, int64_t m, int64_t n, int64_t k, void* ws,
             size_t ws_bytes, cudaDataType_t out = CUDA_R_16BF, cudaDataType_t in = CUDA_R_16BF)
      : handle(h), workspace(ws), workspace_bytes(ws_bytes) {
    // fwd: X = B[N,K] (col-major K x N, transposed), Y = A[M,K] (col-major K x M).
    // dgrad: X = B[K,N] (col-major N x K), Y = A (K x M). wgrad: X = B[K,N] (N x K), Y = A[K,M]
    // (col-major M x K, transposed).
    const bool tx = layout == coda::GemmLayout::fwd, ty = layout == coda::GemmLayout::wgrad;
    const cublasOperation_t opx = tx ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opy = ty ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof(opx)),
          "TRANSA");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof(opy)),
          "TRANSB");
    check(tx ? cublasLtMatrixLayoutCreate(&lx, in, k, n, k)
             : cublasLtMatrixLayoutCreate(&lx, in, n, k, n),
          "layout X");
    check(ty ? cublasLtMatrixLayoutCreate(&ly, in, m, k, m)
             : cublasLtMatrixLayoutCreate(&ly, in, k, m, k),
          "layout Y");
    check(cublasLtMatrixLayoutCreate(&ld, out, n, m, n), "layout D");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(first_algo(handle, op, lx, ly, ld, workspace_bytes, result, found), "AlgoGetHeuristic");
    if (found == 0)
      throw std::runtime_error("cuBLASLt has no algorithm for M " + std::to_string(m) + " N " +
                               std::to_string(n) + " K " + std::to_string(k));
    algo = result.algo;
    waves = result.wavesCount;
  }
  ~CublasGemm() {
    cublasLtMatrixLayoutDestroy(lx), cublasLtMatrixLayoutDestroy(ly),
        cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
  }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  std::string describe() const { return describe_algo(algo, waves); }

  void run(const void* a, const void* b, void* d, cudaStream_t s) const {
    const float alpha = 1.f, beta = 0.f;
    check(cublasLtMatmul(handle, op, &alpha, b, lx, a, ly, &beta, d, ld, d, ld, &algo, workspace,
                         workspace_bytes, s),
          "cublasLtMatmul");
  }
};

// ---- Timing.

inline double median(std::vector<float> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times one call of a function on a stream: a write of the flush buffer (larger than L2) first,
// so no run finds its inputs in L2, then CUDA events around the function alone.
class Timer {
public:
  Timer(void* flush, size_t flush_bytes, cudaStream_t s)
      : flush_(flush), flush_bytes_(flush_bytes), stream_(s) {
    check(cudaEventCreate(&start_), "event"), check(cudaEventCreate(&stop_), "event");
  }
  ~Timer() { cudaEventDestroy(start_), cudaEventDestroy(stop_); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Appends the milliseconds of fn() to times.
  template <class Fn> void timed(Fn&& fn, std::vector<float>& times) {
    check(cudaMemsetAsync(flush_, int(times.size() & 0xff), flush_bytes_, stream_), "L2 flush");
    check(cudaEventRecord(start_, stream_), "record");
    fn();
    check(cudaEventRecord(stop_, stream_), "record");
    check(cudaEventSynchronize(stop_), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
    times.push_back(ms);
  }

private:
  void* flush_;
  size_t flush_bytes_;
  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
};

// ---- What every benchmark sets up: device 0's properties, a stream, a cuBLASLt handle with a
// 32 MB workspace, and a 256 MB buffer whose write flushes L2 (50 MB on an H100 / H200).
struct Context {
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20, kFlushBytes = size_t(256) << 20;
  Buffer workspace{kWorkspaceBytes}, flush{kFlushBytes};

  Context() {
    check(cudaGetDeviceProperties(&prop, 0), "properties");
    check(cudaStreamCreate(&stream), "stream");
    check(cublasLtCreate(&lt), "cublasLtCreate");
  }
  ~Context() {
    cublasLtDestroy(lt);
    cudaStreamDestroy(stream);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Timer timer() const { return Timer(flush.p, kFlushBytes, stream); }
};

// ---- Command line: "--name value" or "--name=value"; `known` lists the accepted names.
class Flags {
public:
  Flags(int argc, char** argv, const std::vector<std::string>& known) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i], value;
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1), arg = arg.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        throw std::invalid_argument("flag " + arg + " needs a value");
      }
      if (std::find(known.begin(), known.end(), arg) == known.end())
        throw std::invalid_argument("unknown flag " + arg);
      values_[arg] = value;
    }
  }
  std::string get(const std::string& name, const std::string& fallback) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  int get_int(const std::string& name, int fallback) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : std::atoi(it->second.c_str());
  }
  // --commit, else $CODA_COMMIT, else "unknown".
  std::string commit() const {
    const char* env = std::getenv("CODA_COMMIT");
    return get("--commit", env && *env ? env : "unknown");
  }

private:
  std::map<std::string, std::string> values_;
};

// ---- JSON: {"gpu": ..., "date": ..., "commit": ..., "runs": ..., <extra> "cases": [ ... ]}.
// `runs` is the number of timed runs each median is taken over (tools/perf_tables.py states it
// under every table); `extra` is inserted as is (lines of '  "key": value,\n').
inline FILE* open_json(const std::string& path, const cudaDeviceProp& prop,
                       const std::string& commit, int runs, const std::string& extra = "") {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot write " + path);
  std::fprintf(
      f, "{\n  \"gpu\": \"%s\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n  \"runs\": %d,\n%s",
      prop.name, date, commit.c_str(), runs, extra.c_str());
  std::fprintf(f, "  \"cases\": [\n");
  return f;
}
inline void close_json(FILE* f) {
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

} // namespace bench
} // namespace
