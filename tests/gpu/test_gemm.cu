// GPU GEMM against the fp64 reference, with the tolerance rule of tests/common/check.hpp: the
// baseline is an fp32-accumulated GEMM (accumulated the way Hopper tensor cores do, see
// tensor_core_fp32_gemm) rounded to the output dtype. Results go through the public coda::gemm
// (validation and dispatch included); cases that force a kernel path (ping-pong, stream-K,
// stores not deferred) call the backend with a plan. Each call gets a workspace of the size the
// query gives (filled with garbage), unless a case says otherwise. Skipped (not passed) where there
// is no sm_90 device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "coda/arch/smem_desc.hpp"
#include "coda/coda.hpp"
#include "coda/core/error.hpp"
#include "coda/core/fragment.hpp"
#include "coda/epilogue/device/linear.cuh"
#include "coda/gemm/heuristic.hpp"
#include "coda/gemm/launch.cuh"
#include "coda/gemm/scheduler.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/instances.hpp"
#include "reference/gemm.hpp"
#include "tests/common/check.hpp"

namespace coda {
namespace {

bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  return gpu::device_supported();
}

#define CODA_REQUIRE_SM90()                                                                        \
  do {                                                                                             \
    if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU";                                              \
  } while (0)

void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, std::max<size_t>(bytes, 16)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

enum class CMode { none, separate, alias_d };

struct Case {
  GemmLayout layout;
  DType in, out;
  int64_t m, n, k;
  float alpha = 1.f, beta = 0.f;
  CMode c = CMode::none;
  std::optional<sm90::GemmPlan> plan = std::nullopt; // forced; default: coda::gemm's own
  bool workspace = true; // pass one of the size the query asks for (false: none, no stream-K)
};

std::string describe(const Case& c) {
  static const char* layouts[] = {"fwd", "dgrad", "wgrad"};
  static const char* cmodes[] = {"", " +C", " +C aliasing D"};
  static const char* stream_k[] = {"off", "auto", "always"};
  std::string plan = c.out == DType::f32 || c.out == c.in ? "coda::gemm" : "gpu::gemm";
  if (c.plan)
    plan = std::string("plan ") + sm90::kernel_name(c.plan->kernel) + " stream-K " +
           stream_k[int(c.plan->stream_k)] + (c.plan->defer_stores ? "" : " stores not deferred");
  return std::string(layouts[int(c.layout)]) + " " + dtype_name(c.in) + "->" + dtype_name(c.out) +
         " M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         cmodes[int(c.c)] + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " (" + plan + (c.workspace ? "" : ", no workspace") +
         ")";
}

sm90::GemmPlan forced(sm90::KernelId kernel, sm90::StreamKMode stream_k, bool defer = true) {
  sm90::GemmPlan plan;
  plan.kernel = kernel;
  plan.stream_k = stream_k;
  plan.defer_stores = defer;
  return plan;
}
const sm90::GemmPlan kStreamK = forced(sm90::KernelId::wide, sm90::StreamKMode::always);
const sm90::GemmPlan kPingpong = forced(sm90::KernelId::pingpong, sm90::StreamKMode::off);
const sm90::GemmPlan kNotDeferred =
    forced(sm90::KernelId::wide, sm90::StreamKMode::off, /*defer=*/false);
const sm90::GemmPlan kStaged = forced(sm90::KernelId::staged, sm90::StreamKMode::automatic);
// The kernels of the schedule study (bf16 in and out only): heuristic.hpp's KernelId.
constexpr sm90::KernelId kStudyKernels[] = {
    sm90::KernelId::wide_3stages, sm90::KernelId::wide192,       sm90::KernelId::staged,
    sm90::KernelId::staged192,    sm90::KernelId::pingpong_wide, sm90::KernelId::staged_wide,
    sm90::KernelId::staged128};

ref::Layout ref_layout(GemmLayout l) {
  return l == GemmLayout::fwd     ? ref::Layout::fwd
         : l == GemmLayout::dgrad ? ref::Layout::dgrad
                                  : ref::Layout::wgrad;
}

// Host tensor of any dtype, as raw bytes plus float values (already rounded to the dtype).
struct HostTensor {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

HostTensor random_tensor(DType t, size_t n, uint64_t seed) {
  HostTensor h{t, {}, {}};
  h.bytes.resize(n * size_t(dtype_size(t)));
  if (t == DType::bf16) {
    auto v = test::random_vector<bf16>(n, seed);
    std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
    h.values = test::to_float(v);
  } else if (t == DType::f16) {
    auto v = test::random_vector<f16>(n, seed);
    std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
    h.values = test::to_float(v);
  } else {
    h.values = test::random_vector<float>(n, seed);
    std::memcpy(h.bytes.data(), h.values.data(), h.bytes.size());
  }
  return h;
}

double element(DType t, const uint8_t* p) {
  if (t == DType::bf16) return bf16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
  if (t == DType::f16) return f16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
  return *reinterpret_cast<const float*>(p);
}

float round_out(DType t, float x) {
  return t == DType::bf16 ? round_to<bf16>(x) : t == DType::f16 ? round_to<f16>(x) : x;
}

// The baseline of the tolerance rule: what an ordinary fp32-accumulating GEMM computes on this
// hardware. Hopper tensor cores (wgmma, and cuBLAS's kernels) add the exact sum of each group of
// 16 products to the fp32 accumulator rounding toward zero; over long K that drifts several
// times further from the exact result than a round-to-nearest sequential sum, so a sequential
// fp32 baseline would reject cuBLAS itself for fp32 outputs. a: [rows, K] (op(A) rows),
// bt: [N, K] (op(B) transposed); returns [rows, N].
std::vector<float> tensor_core_fp32_gemm(const std::vector<float>& a, const std::vector<float>& bt,
                                         int64_t rows, int64_t n, int64_t k) {
  std::vector<float> out(size_t(rows * n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float* x = &a[size_t(i * k)];
      const float* y = &bt[size_t(j * k)];
      float acc = 0.f;
      for (int64_t k0 = 0; k0 < k; k0 += 16) {
        double chunk = 0; // 16 products of 16-bit floats: exact in double
        for (int64_t kk = k0; kk < std::min(k, k0 + 16); ++kk)
          chunk += double(x[kk]) * double(y[kk]);
        const double exact = double(acc) + chunk;
        float rounded = float(exact);
        if (std::fabs(double(rounded)) > std::fabs(exact)) rounded = std::nextafter(rounded, 0.f);
        acc = rounded;
      }
      out[size_t(i * n + j)] = acc;
    }
  return out;
}

// Rows of D to check: all of them when the reference is cheap, else a random sample that always
// includes the first and last rows (the tile edges). Keeps the fp64 reference around 64M MACs.
std::vector<int64_t> rows_to_check(const Case& c, uint64_t seed) {
  const int64_t budget = int64_t(1) << 26;
  const int64_t per_row = std::max<int64_t>(c.n * c.k, 1);
  const int64_t max_rows = std::max<int64_t>(budget / per_row, 4);
  std::vector<int64_t> rows;
  if (c.m <= max_rows) {
    for (int64_t r = 0; r < c.m; ++r) rows.push_back(r);
    return rows;
  }
  std::mt19937_64 rng(seed);
  rows = {0, c.m - 1};
  while (int64_t(rows.size()) < max_rows) rows.push_back(int64_t(rng() % uint64_t(c.m)));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

TensorView device_view(void* p, DType t, int64_t rows, int64_t cols) {
  return make_view(p, t, rows, cols, Device::cuda);
}

void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const uint64_t seed =
      test::test_seed() ^ (uint64_t(c.m) * 1000003u + uint64_t(c.n) * 10007u + uint64_t(c.k) +
                           uint64_t(c.layout) * 31u + uint64_t(c.in) * 7u + uint64_t(c.out));
  const bool a_km = c.layout == GemmLayout::wgrad; // A stored [K, M]
  const bool b_nk = c.layout == GemmLayout::fwd;   // B stored [N, K]
  HostTensor a = random_tensor(c.in, size_t(c.m * c.k), seed + 1);
  HostTensor b = random_tensor(c.in, size_t(c.n * c.k), seed + 2);
  HostTensor cin = random_tensor(c.out, c.c == CMode::none ? 0 : size_t(c.m * c.n), seed + 3);

  const size_t d_bytes = size_t(c.m * c.n * dtype_size(c.out));
  DeviceBuffer da(a.bytes.size()), db(b.bytes.size()), dd(d_bytes), dc(cin.bytes.size());
  ASSERT_TRUE(da.ptr && db.ptr && dd.ptr && dc.ptr) << "cudaMalloc failed";
  cuda_ok(cudaMemcpy(da.ptr, a.bytes.data(), a.bytes.size(), cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(db.ptr, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice));
  cuda_ok(cudaMemset(dd.ptr, 0xff, d_bytes)); // NaN in every dtype
  if (c.c == CMode::separate)
    cuda_ok(cudaMemcpy(dc.ptr, cin.bytes.data(), cin.bytes.size(), cudaMemcpyHostToDevice));
  if (c.c == CMode::alias_d)
    cuda_ok(cudaMemcpy(dd.ptr, cin.bytes.data(), cin.bytes.size(), cudaMemcpyHostToDevice));

  GemmArgs args;
  args.layout = c.layout;
  args.a = a_km ? device_view(da.ptr, c.in, c.k, c.m) : device_view(da.ptr, c.in, c.m, c.k);
  args.b = b_nk ? device_view(db.ptr, c.in, c.n, c.k) : device_view(db.ptr, c.in, c.k, c.n);
  args.d = device_view(dd.ptr, c.out, c.m, c.n);
  if (c.c == CMode::separate) args.c = device_view(dc.ptr, c.out, c.m, c.n);
  if (c.c == CMode::alias_d) args.c = args.d;
  args.alpha = c.alpha;
  args.beta = c.beta;
  // The public API takes one 16-bit dtype per call; other pairs reach the backend only.
  const bool public_dtypes = c.out == DType::f32 || c.out == c.in;
  size_t workspace_bytes = 0;
  ASSERT_NO_THROW(workspace_bytes = c.plan          ? gpu::gemm_workspace_size(args, *c.plan)
                                    : public_dtypes ? coda::gemm_workspace_size(args)
                                                    : gpu::gemm_workspace_size(args));
  if (c.plan && c.plan->kernel == sm90::KernelId::wide &&
      c.plan->stream_k == sm90::StreamKMode::always)
    EXPECT_GT(workspace_bytes, 0u) << "a forced stream-K plan needs scratch";
  // Garbage in the workspace (flags of -1): each launch must clear what it uses.
  if (!c.workspace) workspace_bytes = 0;
  DeviceBuffer workspace(workspace_bytes);
  ASSERT_TRUE(workspace.ptr) << "cudaMalloc failed";
  cuda_ok(cudaMemset(workspace.ptr, 0xff, workspace_bytes));
  if (workspace_bytes > 0)
    args.workspace =
        make_view(workspace.ptr, DType::f32, int64_t(workspace_bytes / 4), Device::cuda);
  if (c.plan)
    ASSERT_NO_THROW(gpu::gemm_with_plan(args, *c.plan, nullptr));
  else if (public_dtypes)
    ASSERT_NO_THROW(coda::gemm(args, nullptr));
  else
    ASSERT_NO_THROW(gpu::gemm(args, nullptr));
  cuda_ok(cudaDeviceSynchronize());
  std::vector<uint8_t> out(d_bytes);
  cuda_ok(cudaMemcpy(out.data(), dd.ptr, d_bytes, cudaMemcpyDeviceToHost));

  // Reference on the checked rows only: op(A) restricted to those rows, in the same layout.
  const std::vector<int64_t> rows = rows_to_check(c, seed + 4);
  const int64_t r = int64_t(rows.size());
  std::vector<double> a64(size_t(r * c.k)), b64(b.values.begin(), b.values.end());
  std::vector<float> a_rows(size_t(r * c.k)), bt(size_t(c.n * c.k));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t k = 0; k < c.k; ++k) {
      const float v =
          a.values[size_t(a_km ? k * c.m + rows[size_t(i)] : rows[size_t(i)] * c.k + k)];
      a64[size_t(a_km ? k * r + i : i * c.k + k)] = v;
      a_rows[size_t(i * c.k + k)] = v;
    }
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t k = 0; k < c.k; ++k)
      bt[size_t(j * c.k + k)] = b.values[size_t(b_nk ? j * c.k + k : k * c.n + j)];
  std::vector<double> ref64(size_t(r * c.n));
  ref::gemm(ref_layout(c.layout), r, c.n, c.k, a64.data(), b64.data(), ref64.data());
  const std::vector<float> acc32 = tensor_core_fp32_gemm(a_rows, bt, r, c.n, c.k);

  std::vector<double> got(size_t(r * c.n)), ref(size_t(r * c.n)), baseline(size_t(r * c.n));
  const bool use_c = c.c != CMode::none && c.beta != 0.f;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t n = 0; n < c.n; ++n) {
      const size_t at = size_t(i * c.n + n), src = size_t(rows[size_t(i)] * c.n + n);
      const float cv = use_c ? cin.values[src] : 0.f;
      got[at] = element(c.out, out.data() + src * size_t(dtype_size(c.out)));
      ref[at] = double(c.alpha) * ref64[at] + double(c.beta) * double(cv);
      baseline[at] = round_out(c.out, std::fma(c.beta, cv, c.alpha * acc32[at]));
    }
  CODA_EXPECT_PASSES(test::check_against_baseline(describe(c), got, ref, baseline));
}

constexpr GemmLayout kLayouts[] = {GemmLayout::fwd, GemmLayout::dgrad, GemmLayout::wgrad};

// wgrad's A is [K, M]: its rows need M to be a multiple of 8 (16-byte TMA strides); K, an
// outer dimension of both operands there, may be anything.
int64_t legal_m(GemmLayout layout, int64_t m) {
  return layout == GemmLayout::wgrad ? (m + 7) / 8 * 8 : m;
}

TEST(GpuGemm, EveryLayoutAndDtype) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    for (DType in : {DType::bf16, DType::f16})
      for (DType out : {DType::bf16, DType::f16, DType::f32})
        run_case({layout, in, out, 1000, 264, 1032});
}

TEST(GpuGemm, RaggedShapes) {
  CODA_REQUIRE_SM90();
  const int64_t ms[] = {1, 127, 1000, 8191};
  const int64_t nks[][2] = {{8, 8}, {264, 1032}, {1032, 264}, {4104, 4104}};
  for (GemmLayout layout : kLayouts)
    for (int64_t m : ms)
      for (auto nk : nks)
        run_case({layout, DType::bf16, DType::bf16, legal_m(layout, m), nk[0], nk[1]});
}

TEST(GpuGemm, LongK) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    run_case({layout, DType::bf16, DType::f32, legal_m(layout, 127), 264, 16384});
}

TEST(GpuGemm, AlphaBetaWithC) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    for (DType out : {DType::bf16, DType::f16, DType::f32}) {
      run_case({layout, DType::bf16, out, 1000, 264, 520, 0.5f, -1.5f, CMode::separate});
      run_case(
          {layout, DType::f16, out, 1000, 264, 520, 2.f, 0.f, CMode::separate}); // C never read
    }
}

TEST(GpuGemm, BetaWithCAliasingD) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    for (DType out : {DType::bf16, DType::f32})
      run_case({layout, DType::bf16, out, 1000, 1032, 264, 1.f, 1.f, CMode::alias_d});
}

// wgrad with a token count K that is not a multiple of 8 (nor of the 64-deep k-block): TMA
// zero-fills the rows of both operands past K.
TEST(GpuGemm, WgradRaggedK) {
  CODA_REQUIRE_SM90();
  for (int64_t k : {1, 63, 1005})
    for (DType out : {DType::bf16, DType::f32})
      run_case({GemmLayout::wgrad, DType::bf16, out, 1000, 264, k});
  run_case({GemmLayout::wgrad, DType::f16, DType::f16, 3072, 2048, 1005, 1.f, 1.f, CMode::alias_d});
  run_case({GemmLayout::wgrad, DType::bf16, DType::bf16, 1000, 1032, 1005, 1.f, 0.f, CMode::none,
            kStreamK});
}

// Stream-K on every unit, whatever the cost model says: units split over several clusters
// (contributors and owners), ranges inside one unit, and (K = 64: 1 k-block) empty ranges.
TEST(GpuGemm, StreamK) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts) {
    run_case({layout, DType::bf16, DType::bf16, 1000, 1032, 4104, 1.f, 0.f, CMode::none, kStreamK});
    run_case({layout, DType::f16, DType::f32, legal_m(layout, 8191), 264, 1032, 0.5f, 1.f,
              CMode::alias_d, kStreamK});
    run_case({layout, DType::bf16, DType::f16, legal_m(layout, 127), 264, 64, 1.f, 0.f, CMode::none,
              kStreamK});
    run_case(
        {layout, DType::bf16, DType::bf16, 3000, 2056, 520, 2.f, -1.f, CMode::separate, kStreamK});
  }
}

// Without a workspace the GEMM runs data-parallel and stays correct, on shapes where the
// heuristic (the first: 96 units of 128 x 256 on an H100's or H200's 66 clusters; f16, since in
// bf16 the 128 x 192 tile fills those rounds and needs no stream-K) or the plan would use
// stream-K.
TEST(GpuGemm, StreamKShapesWithoutWorkspace) {
  CODA_REQUIRE_SM90();
  Case few_waves{GemmLayout::wgrad, DType::f16, DType::f16, 3072, 2048, 8192};
  few_waves.workspace = false;
  GemmArgs shape; // the size query reads shapes and dtypes only
  shape.layout = GemmLayout::wgrad;
  shape.a = device_view(nullptr, DType::f16, few_waves.k, few_waves.m);
  shape.d = device_view(nullptr, DType::f16, few_waves.m, few_waves.n);
  EXPECT_GT(gpu::gemm_workspace_size(shape), 0u) << "the heuristic no longer uses stream-K here";
  run_case(few_waves);
  run_case({GemmLayout::fwd, DType::bf16, DType::bf16, 1000, 1032, 4104, 1.f, 0.f, CMode::none,
            kStreamK, /*workspace=*/false});
}

// The heuristic's own stream-K (no forced plan) with the caller's workspace, as coda::gemm runs it
// (f16: in bf16 this shape takes the 128 x 192 tile without stream-K).
TEST(GpuGemm, StreamKFromTheHeuristic) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts) run_case({layout, DType::f16, DType::f16, 3072, 2048, 8192});
}

// A stream-K GEMM captured into a CUDA graph with the caller's workspace and replayed (twice,
// the workspace left dirty in between) gives the bits of the eager launch.
TEST(GpuGemm, StreamKGraphReplayMatchesEager) {
  CODA_REQUIRE_SM90();
  constexpr int64_t M = 1000, N = 1032, K = 4104;
  const uint64_t seed = test::test_seed() + 77;
  HostTensor a = random_tensor(DType::bf16, size_t(M * K), seed);
  HostTensor b = random_tensor(DType::bf16, size_t(N * K), seed + 1);
  const size_t d_bytes = size_t(M * N) * 2;
  DeviceBuffer da(a.bytes.size()), db(b.bytes.size()), dd(d_bytes);
  ASSERT_TRUE(da.ptr && db.ptr && dd.ptr) << "cudaMalloc failed";
  cuda_ok(cudaMemcpy(da.ptr, a.bytes.data(), a.bytes.size(), cudaMemcpyHostToDevice));
  cuda_ok(cudaMemcpy(db.ptr, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice));
  GemmArgs args;
  args.a = device_view(da.ptr, DType::bf16, M, K);
  args.b = device_view(db.ptr, DType::bf16, N, K);
  args.d = device_view(dd.ptr, DType::bf16, M, N);
  const size_t bytes = gpu::gemm_workspace_size(args, kStreamK);
  ASSERT_GT(bytes, 0u);
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(workspace.ptr) << "cudaMalloc failed";
  args.workspace = make_view(workspace.ptr, DType::f32, int64_t(bytes / 4), Device::cuda);

  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda_ok(cudaMemsetAsync(dd.ptr, 0xff, d_bytes, stream));
  ASSERT_NO_THROW(gpu::gemm_with_plan(args, kStreamK, stream));
  std::vector<uint8_t> eager(d_bytes), replayed(d_bytes);
  cuda_ok(cudaStreamSynchronize(stream));
  cuda_ok(cudaMemcpy(eager.data(), dd.ptr, d_bytes, cudaMemcpyDeviceToHost));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_NO_THROW(gpu::gemm_with_plan(args, kStreamK, stream));
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    cuda_ok(cudaMemsetAsync(dd.ptr, 0xff, d_bytes, stream));
    cuda_ok(cudaMemsetAsync(workspace.ptr, 0xff, bytes, stream)); // garbage flags
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    cuda_ok(cudaMemcpy(replayed.data(), dd.ptr, d_bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), d_bytes), 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  // And the eager result is a correct GEMM (the same shape and plan through run_case).
  run_case({GemmLayout::fwd, DType::bf16, DType::bf16, M, N, K, 1.f, 0.f, CMode::none, kStreamK});
}

// The tile stores of the wide kernel without deferral (coda::gemm defers them for 16-bit D).
TEST(GpuGemm, StoresNotDeferred) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    for (DType out : {DType::bf16, DType::f16})
      run_case({layout, DType::bf16, out, 1000, 1032, 520, 0.5f, 0.f, CMode::none, kNotDeferred});
}

// A few small shapes, cheap enough for compute-sanitizer (tools/gpu_check.sh runs these).
TEST(GpuGemm, SmallForSanitizer) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts) {
    run_case({layout, DType::bf16, DType::bf16, legal_m(layout, 127), 264, 200});
    run_case(
        {layout, DType::f16, DType::f32, legal_m(layout, 300), 520, 72, 0.5f, 1.f, CMode::alias_d});
    run_case({layout, DType::bf16, DType::bf16, 1000, 1032, 200, 1.f, 0.f, CMode::none, kPingpong});
    run_case({layout, DType::bf16, DType::bf16, 1000, 1032, 328, 1.f, 0.f, CMode::none, kStreamK});
    run_case({layout, DType::bf16, DType::bf16, 1000, 1032, 328, 1.f, 0.f, CMode::none, kStaged});
  }
  run_case({GemmLayout::wgrad, DType::bf16, DType::bf16, 264, 520, 1005});
}

// The schedule study's kernels (128 x 192 tiles, the staged schedule) in every layout, on ragged
// shapes (N = 1032 is 5.4 tiles of 192), with a scaling alpha, data-parallel and stream-K.
TEST(GpuGemm, ScheduleStudyKernels) {
  CODA_REQUIRE_SM90();
  for (sm90::KernelId kernel : kStudyKernels)
    for (GemmLayout layout : kLayouts)
      for (sm90::StreamKMode sk : {sm90::StreamKMode::off, sm90::StreamKMode::always})
        run_case({layout, DType::bf16, DType::bf16, legal_m(layout, 1000), 1032, 776, 0.5f, 0.f,
                  CMode::none, forced(kernel, sk)});
}

// The 128 x 192 kernel as the default plan picks it (bf16 -> bf16 where its rounds are much
// fuller: M = 3072, N = 2048 on 132 SMs, heuristic.hpp), through coda::gemm, accumulating into D
// (a weight gradient's beta = 1) and plain; and forced in every layout with C aliasing D.
TEST(GpuGemm, NarrowTileWhereItsRoundsAreFuller) {
  CODA_REQUIRE_SM90();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  if (sm90::choose_plan(3072, 2048, 264, sms, true).kernel != sm90::KernelId::wide192)
    GTEST_SKIP() << "the shape picks the 128 x 192 tile on 132 SMs; this device has " << sms;
  for (float beta : {0.f, 1.f})
    run_case({GemmLayout::wgrad, DType::bf16, DType::bf16, 3072, 2048, 264, 1.f, beta,
              beta != 0.f ? CMode::alias_d : CMode::none});
  for (GemmLayout layout : kLayouts)
    run_case({layout, DType::bf16, DType::bf16, legal_m(layout, 1000), 1032, 520, 0.5f, 1.f,
              CMode::alias_d, forced(sm90::KernelId::wide192, sm90::StreamKMode::automatic)});
}

// The staged kernel with the device scalar alpha the LM head's weight gradient takes.
TEST(GpuGemm, StagedKernelOnLongK) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    run_case({layout, DType::bf16, DType::bf16, legal_m(layout, 520), 776, 4104, 1.f, 0.f,
              CMode::none, kStaged});
}

// The 128 x 128 ping-pong kernel in every layout and output dtype, with C aliasing D.
TEST(GpuGemm, PingpongKernel) {
  CODA_REQUIRE_SM90();
  for (GemmLayout layout : kLayouts)
    for (DType out : {DType::bf16, DType::f16, DType::f32})
      run_case({layout, DType::f16, out, 1000, 1032, 520, 0.5f, 1.f, CMode::alias_d, kPingpong});
}

// Host-side pieces of the kernel (no GPU needed).

TEST(GemmHost, SchedulerVisitsEveryTileOnce) {
  for (int32_t cluster : {1, 2})
    for (int32_t group : {1, 3, 8})
      for (auto shape : {std::pair{1, 1}, std::pair{7, 5}, std::pair{64, 12}, std::pair{33, 112}}) {
        sm90::TileScheduler s;
        s.tiles_m = shape.first, s.tiles_n = shape.second, s.cluster_m = cluster, s.group_m = group;
        std::vector<int> hits(size_t(s.units_m() * cluster * s.tiles_n), 0);
        for (int64_t u = 0; u < s.num_units(); ++u)
          for (int32_t r = 0; r < cluster; ++r) {
            const sm90::TileCoord t = s.tile(u, r);
            ASSERT_TRUE(t.m_block >= 0 && t.m_block < s.units_m() * cluster && t.n_block >= 0 &&
                        t.n_block < s.tiles_n);
            // The staged schedule's 32-bit arithmetic gives the same tile.
            const sm90::TileCoord t32 = s.tile<uint32_t>(u, r);
            ASSERT_EQ(t32.m_block, t.m_block);
            ASSERT_EQ(t32.n_block, t.n_block);
            ++hits[size_t(t.m_block * s.tiles_n + t.n_block)];
          }
        for (int h : hits) EXPECT_EQ(h, 1);
      }
}

// The launcher's operand tensor maps: the stored shape of each operand and the mainloop's TMA
// boxes, whose bytes per stage are what the producer arms each stage with (a mismatch hangs
// the kernel: the consumers wait for bytes that never come). Every compiled configuration and
// layout, host side only.
template <class Config, GemmLayout kLayout> void check_operand_shapes() {
  using Kernel =
      sm90::GemmKernel<Config, kLayout, bf16,
                       epilogue::device::LinearEpilogue<bf16, Config::kConsumerWarpgroups>>;
  using Main = typename Kernel::Main;
  SCOPED_TRACE(std::to_string(Config::kTileM) + "x" + std::to_string(Config::kTileN) + " layout " +
               std::to_string(int(kLayout)));
  const int64_t m = 1000, n = 776, k = 520;
  const bool a_km = kLayout == GemmLayout::wgrad, b_nk = kLayout == GemmLayout::fwd;
  const TensorView a = a_km ? make_view(nullptr, DType::bf16, k, m, Device::cuda)
                            : make_view(nullptr, DType::bf16, m, k, Device::cuda);
  const TensorView b = b_nk ? make_view(nullptr, DType::bf16, n, k, Device::cuda)
                            : make_view(nullptr, DType::bf16, k, n, Device::cuda);
  const auto shapes = Kernel::operand_shapes(a, b, {m, n, k});
  EXPECT_EQ(shapes.a.rows, uint64_t(a.shape[0]));
  EXPECT_EQ(shapes.a.cols, uint64_t(a.shape[1]));
  EXPECT_EQ(shapes.b.rows, uint64_t(b.shape[0]));
  EXPECT_EQ(shapes.b.cols, uint64_t(b.shape[1]));
  EXPECT_EQ(shapes.a.row_stride, uint64_t(a.stride[0]));
  EXPECT_EQ(shapes.b.row_stride, uint64_t(b.stride[0]));
  EXPECT_EQ(shapes.a.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(shapes.b.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  // One swizzle span deep in the contiguous dimension; the stage's bytes exactly.
  EXPECT_EQ(shapes.a.box_cols * 2, 128u);
  EXPECT_EQ(shapes.b.box_cols * 2, 128u);
  EXPECT_EQ(uint64_t(shapes.a.box_cols) * shapes.a.box_rows * 2 * Main::kBoxesA +
                uint64_t(shapes.b.box_cols) * shapes.b.box_rows * 2 * Main::kBoxesB,
            uint64_t(Main::kStageBytes));
}

template <class Config> void check_operand_shapes_every_layout() {
  check_operand_shapes<Config, GemmLayout::fwd>();
  check_operand_shapes<Config, GemmLayout::dgrad>();
  check_operand_shapes<Config, GemmLayout::wgrad>();
}

TEST(GemmHost, OperandBoxesFillTheStage) {
  using sm90::GemmConfig, sm90::Schedule;
  check_operand_shapes_every_layout<sm90::WideConfig<bf16>>();
  check_operand_shapes_every_layout<sm90::PingpongConfig<bf16>>();
  check_operand_shapes_every_layout<GemmConfig<128, 192, 4, 2, Schedule::cooperative>>();
  check_operand_shapes_every_layout<GemmConfig<128, 192, 4, 2, Schedule::pingpong>>();
  check_operand_shapes_every_layout<GemmConfig<128, 256, 3, 2, Schedule::staged>>();
  check_operand_shapes_every_layout<GemmConfig<128, 192, 4, 2, Schedule::staged>>();
}

// Every (unit, k-block) is handed out exactly once, over data-parallel and stream-K work; each
// worker's stream-K pieces come backwards; each contributor is read by exactly the owner of its
// unit, and owners only wait for lower-numbered workers.
TEST(GemmHost, StreamKCoversEveryKBlockOnce) {
  struct Shape {
    int32_t tiles_m, tiles_n, k_blocks;
    int64_t clusters;
  };
  for (const Shape sh : {Shape{24, 8, 128, 66}, Shape{64, 8, 32, 66}, Shape{8, 5, 65, 66},
                         Shape{2, 1, 1, 66}, Shape{7, 3, 3, 4}, Shape{64, 56, 64, 66}})
    for (sm90::StreamKMode mode : {sm90::StreamKMode::automatic, sm90::StreamKMode::always}) {
      sm90::TileScheduler s;
      s.tiles_m = sh.tiles_m, s.tiles_n = sh.tiles_n, s.cluster_m = 2, s.group_m = 8;
      s.k_blocks = sh.k_blocks;
      const sm90::StreamKSplit split =
          sm90::plan_stream_k(s.num_units(), sh.clusters, s.k_blocks, mode);
      s.sk_first_unit = split.first_unit, s.sk_workers = split.workers;
      SCOPED_TRACE(std::to_string(s.num_units()) + " units, " + std::to_string(s.k_blocks) +
                   " k-blocks, stream-K from " + std::to_string(split.first_unit) + " on " +
                   std::to_string(split.workers));
      if (mode == sm90::StreamKMode::always) EXPECT_TRUE(s.has_stream_k());
      std::vector<int> hits(size_t(s.num_units() * s.k_blocks), 0);
      std::vector<int> read(size_t(sh.clusters), 0);
      for (int64_t c = 0; c < sh.clusters; ++c) {
        sm90::WorkIterator work(s, c, sh.clusters);
        int64_t last_sk_unit = INT64_MAX;
        for (sm90::WorkItem item; work.next(item);) {
          ASSERT_TRUE(item.unit >= 0 && item.unit < s.num_units());
          ASSERT_TRUE(0 <= item.k_begin && item.k_begin < item.k_end && item.k_end <= s.k_blocks);
          ASSERT_TRUE(0 <= item.k_rotation && item.k_rotation < item.k_end - item.k_begin);
          for (int32_t k = item.k_begin; k < item.k_end; ++k)
            ++hits[size_t(item.unit * s.k_blocks + k)];
          if (item.unit < s.dp_units()) {
            EXPECT_EQ(item.k_end - item.k_begin, s.k_blocks);
            continue;
          }
          EXPECT_LT(item.unit, last_sk_unit); // backwards
          last_sk_unit = item.unit;
          if (item.k_end < s.k_blocks) EXPECT_TRUE(s.sk_contributes(int32_t(c)));
          if (item.k_end == s.k_blocks && item.k_begin > 0) { // owner
            const int32_t first =
                s.sk_contributors_begin(int32_t(c), int32_t(item.unit - s.dp_units()));
            int32_t covered = 0;
            for (int32_t w = first; w < int32_t(c); ++w)
              if (s.sk_contributes(w)) {
                ++read[size_t(w)];
                covered += s.sk_begin(w + 1) -
                           std::max<int32_t>(s.sk_begin(w),
                                             int32_t(item.unit - s.dp_units()) * s.k_blocks);
              }
            EXPECT_EQ(covered, item.k_begin); // the contributors hold exactly k-blocks [0, k_begin)
          }
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1);
      for (int32_t w = 0; w < s.sk_workers; ++w)
        EXPECT_EQ(read[size_t(w)], s.sk_contributes(w) ? 1 : 0);
    }
}

TEST(GemmHost, HeuristicSpreadsTheLastWave) {
  EXPECT_EQ(sm90::choose_plan(8192, 4096, 4096, 132).kernel, sm90::KernelId::wide);
  EXPECT_EQ(sm90::choose_plan(8192, 28672, 4096, 132).group_m, 8); // square-ish waves
  EXPECT_GE(sm90::choose_plan(1, 8, 8, 132).group_m, 1);
  // Llama-1B's qkv weight gradient: 96 wide units on 66 clusters, 132 of 128 x 192 (bf16 only).
  EXPECT_EQ(sm90::choose_plan(3072, 2048, 8192, 132, true).kernel, sm90::KernelId::wide192);
  EXPECT_EQ(sm90::choose_plan(3072, 2048, 8192, 132, false).kernel, sm90::KernelId::wide);
  // Rounds filled alike (Llama-8B's gate/up weight gradient) or better by the wide tile
  // (Llama-1B's out-projection): the wide tile.
  EXPECT_EQ(sm90::choose_plan(28672, 4096, 8192, 132, true).kernel, sm90::KernelId::wide);
  EXPECT_EQ(sm90::choose_plan(8192, 2048, 2048, 132, true).kernel, sm90::KernelId::wide);
  // 3072 x 2048 x 8192: 96 units on 66 clusters (1.45 rounds) -> stream-K over all of them.
  EXPECT_EQ(sm90::plan_stream_k(96, 66, 128).workers, 66);
  EXPECT_EQ(sm90::plan_stream_k(96, 66, 128).first_unit, 0);
  // 256 units: the partial round (58 of 66) saves less than stream-K costs (measured).
  EXPECT_EQ(sm90::plan_stream_k(256, 66, 32).workers, 0);
  EXPECT_EQ(sm90::plan_stream_k(256, 66, 128).workers, 0);
  // 1792 units: the last round holds 10; stream-K over it and the round before.
  EXPECT_EQ(sm90::plan_stream_k(1792, 66, 64).first_unit, 1792 - 76);
  EXPECT_EQ(sm90::plan_stream_k(132, 66, 64).workers, 0); // whole rounds
}

// The fused kernels' defaults, which heuristic.hpp records beside the measurements that chose
// them: K4 by its head size (a 192-column tile holds whole heads of 64 only), K6 by its rounding
// contract (the staged_wide hand-over rounds g), the rest by kernel.
TEST(GemmHost, FusedKernelSchedules) {
  using sm90::FusedKernel, sm90::Schedule;
  EXPECT_EQ(sm90::fused_schedule(FusedKernel::k0), Schedule::cooperative);
  for (FusedKernel k : {FusedKernel::k1, FusedKernel::k2, FusedKernel::k5, FusedKernel::k7})
    EXPECT_EQ(sm90::fused_schedule(k), Schedule::staged) << int(k);
  EXPECT_EQ(sm90::fused_schedule(FusedKernel::k4, 64), Schedule::staged);
  EXPECT_EQ(sm90::fused_schedule(FusedKernel::k4, 128), Schedule::cooperative);
  EXPECT_EQ(sm90::fused_schedule(FusedKernel::k6, 0, true), Schedule::staged_wide);
  EXPECT_EQ(sm90::fused_schedule(FusedKernel::k6, 0, false), Schedule::cooperative);
}

// The epilogue reads a 32-column subtile s of a wgmma block as registers [16 s, 16 s + 16) laid
// out as a 32-column accumulator: check that against the 256-column map.
TEST(GemmHost, SubtileRegistersFollowTheNarrowMap) {
  using Wide = AccumulatorMap<256>;
  using Subtile = AccumulatorMap<32>;
  for (int t = 0; t < 128; ++t)
    for (int s = 0; s < 8; ++s)
      for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(Wide::row(t, 16 * s + i), Subtile::row(t, i));
        EXPECT_EQ(Wide::col(t, 16 * s + i), 32 * s + Subtile::col(t, i));
      }
}

TEST(GemmHost, SwizzlePermutesChunksWithinRows) {
  for (arch::Swizzle mode : {arch::Swizzle::b64, arch::Swizzle::b128}) {
    const uint32_t span = uint32_t(mode);
    for (uint32_t row = 0; row < 16; ++row) {
      std::vector<int> seen(span / 16, 0);
      for (uint32_t chunk = 0; chunk < span / 16; ++chunk) {
        const uint32_t off = arch::swizzle_offset(mode, row * span + chunk * 16 + 4);
        EXPECT_EQ(off / span, row);
        EXPECT_EQ(off % 16, 4u);
        ++seen[(off % span) / 16];
      }
      for (int s : seen) EXPECT_EQ(s, 1);
    }
  }
  EXPECT_EQ(arch::swizzle_offset(arch::Swizzle::b128, 128 + 16), 128u); // row 1, chunk 1 -> 0
  const uint64_t desc = arch::make_wgmma_desc_sw128(0x1230, 8192, 1024);
  EXPECT_EQ(desc & 0x3fff, 0x123u);
  EXPECT_EQ((desc >> 16) & 0x3fff, 8192u >> 4);
  EXPECT_EQ((desc >> 32) & 0x3fff, 1024u >> 4);
  EXPECT_EQ(desc >> 62, 1u);
  // The mainloop advances a tile's descriptor by offsets instead of making each step's: the same
  // descriptor wherever the sum stays in the shared window (below 2^18 bytes).
  for (uint32_t addr = 0; addr < (1u << 18); addr += 1024 * 7 + 16)
    for (uint32_t bytes = 0; addr + bytes < (1u << 18); bytes += 32 * 37)
      for (uint32_t leading : {16u, 8192u})
        ASSERT_EQ(arch::advance_wgmma_desc(arch::make_wgmma_desc_sw128(addr, leading, 1024), bytes),
                  arch::make_wgmma_desc_sw128(addr + bytes, leading, 1024))
            << "addr " << addr << " + " << bytes;
}

} // namespace
} // namespace coda
