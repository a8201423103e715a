// Device-resident scalars in the plain GEMM and the row reduce (coda/core/scalar.hpp): alpha given
// as value * tensor[0], with the [1] f32 tensor in device memory, gives the bits of the same fp32
// product given as a number,
//  * in every layout (fwd, dgrad, wgrad), 16-bit and f32 outputs, with and without C;
//  * on every kernel path: the heuristic's plan through coda::gemm, stream-K with the caller's
//    workspace (alpha is applied once, by the owner of each unit, after the partials are added),
//    the same plan without a workspace (data-parallel), ping-pong, stores not deferred;
//  * read when the kernel runs, not when it is enqueued: a CUDA graph replayed after the tensor
//    changed uses the new value.
// reduce_row_partials' scale likewise, and the same bits as the CPU backend's. Skipped (not
// passed) without an sm_90 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/gemm/instances.hpp"
#include "tests/common/check.hpp"
#include "tests/gpu/gpu_fixtures.hpp"

namespace coda {
namespace {

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

TensorView device_view(void* p, DType t, int64_t rows, int64_t cols) {
  return make_view(p, t, rows, cols, Device::cuda);
}
TensorView device_scalar(void* p) { return make_view(p, DType::f32, 1, Device::cuda); }

sm90::GemmPlan forced(sm90::KernelId kernel, sm90::StreamKMode stream_k, bool defer = true) {
  sm90::GemmPlan plan;
  plan.kernel = kernel;
  plan.stream_k = stream_k;
  plan.defer_stores = defer;
  return plan;
}

struct Path {
  const char* name;
  std::optional<sm90::GemmPlan> plan; // none: coda::gemm, the heuristic's plan
  bool workspace;                     // pass one of the size the query asks for
};
const Path kPaths[] = {
    {"coda::gemm (heuristic plan, workspace)", std::nullopt, true},
    {"stream-K on every unit, workspace", forced(sm90::KernelId::wide, sm90::StreamKMode::always),
     true},
    {"stream-K plan without a workspace (data-parallel)",
     forced(sm90::KernelId::wide, sm90::StreamKMode::always), false},
    {"ping-pong", forced(sm90::KernelId::pingpong, sm90::StreamKMode::off), true},
    {"stores not deferred", forced(sm90::KernelId::wide, sm90::StreamKMode::off, false), true},
};

constexpr GemmLayout kLayouts[] = {GemmLayout::fwd, GemmLayout::dgrad, GemmLayout::wgrad};
const char* layout_name(GemmLayout l) {
  return l == GemmLayout::fwd ? "fwd" : l == GemmLayout::dgrad ? "dgrad" : "wgrad";
}

// M x N x K with bf16 inputs: 4 x 5 wide tiles (M = 1000 is ragged; a multiple of 8 for wgrad's
// [K, M] A) and 65 k-blocks, so the forced stream-K plan splits units between clusters.
constexpr int64_t kM = 1000, kN = 1032, kK = 4104;

// The device operands of one problem, reused for every alpha and path.
class GemmProblem {
public:
  GemmProblem(GemmLayout layout, DType out, bool with_c)
      : layout_(layout), out_(out), with_c_(with_c), d_bytes_(size_t(kM * kN * dtype_size(out))),
        a_(size_t(kM * kK) * 2), b_(size_t(kN * kK) * 2), c_(d_bytes_), d_(d_bytes_) {
    const uint64_t seed = test::test_seed() + 500 + uint64_t(layout) * 7 + uint64_t(out);
    const auto a = test::random_vector<bf16>(size_t(kM * kK), seed);
    const auto b = test::random_vector<bf16>(size_t(kN * kK), seed + 1);
    cuda_ok(cudaMemcpy(a_.ptr, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
    cuda_ok(cudaMemcpy(b_.ptr, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    if (with_c_) {
      std::vector<uint8_t> c(d_bytes_);
      if (out == DType::f32) {
        const auto v = test::random_vector<float>(size_t(kM * kN), seed + 2);
        std::memcpy(c.data(), v.data(), d_bytes_);
      } else {
        const auto v = test::random_vector<bf16>(size_t(kM * kN), seed + 2);
        std::memcpy(c.data(), v.data(), d_bytes_);
      }
      cuda_ok(cudaMemcpy(c_.ptr, c.data(), d_bytes_, cudaMemcpyHostToDevice));
    }
  }

  bool ready() const { return a_.ptr && b_.ptr && c_.ptr && d_.ptr; }

  GemmArgs args(const Scalar& alpha) const {
    const bool wgrad = layout_ == GemmLayout::wgrad, fwd = layout_ == GemmLayout::fwd;
    GemmArgs g;
    g.layout = layout_;
    g.a =
        wgrad ? device_view(a_.ptr, DType::bf16, kK, kM) : device_view(a_.ptr, DType::bf16, kM, kK);
    g.b = fwd ? device_view(b_.ptr, DType::bf16, kN, kK) : device_view(b_.ptr, DType::bf16, kK, kN);
    g.d = device_view(d_.ptr, out_, kM, kN);
    if (with_c_) {
      g.c = device_view(c_.ptr, out_, kM, kN);
      g.beta = -0.5f;
    }
    g.alpha = alpha;
    return g;
  }

  // D (poisoned with NaN first) after one GEMM on `path`; the workspace starts as garbage.
  std::vector<uint8_t> run(const Scalar& alpha, const Path& path) {
    GemmArgs g = args(alpha);
    size_t bytes = 0;
    if (path.workspace) {
      bytes = path.plan ? gpu::gemm_workspace_size(g, *path.plan) : coda::gemm_workspace_size(g);
      if (path.plan && path.plan->stream_k == sm90::StreamKMode::always)
        EXPECT_GT(bytes, 0u) << "a forced stream-K plan needs scratch";
    }
    DeviceBuffer workspace(bytes);
    EXPECT_TRUE(workspace.ptr) << "cudaMalloc failed";
    cuda_ok(cudaMemset(workspace.ptr, 0xff, bytes));
    if (bytes > 0)
      g.workspace = make_view(workspace.ptr, DType::f32, int64_t(bytes / 4), Device::cuda);
    cuda_ok(cudaMemset(d_.ptr, 0xff, d_bytes_)); // NaN in every dtype
    if (path.plan)
      EXPECT_NO_THROW(gpu::gemm_with_plan(g, *path.plan, nullptr));
    else
      EXPECT_NO_THROW(coda::gemm(g, nullptr));
    cuda_ok(cudaDeviceSynchronize());
    return read_d();
  }

  std::vector<uint8_t> read_d() const {
    std::vector<uint8_t> out(d_bytes_);
    cuda_ok(cudaMemcpy(out.data(), d_.ptr, d_bytes_, cudaMemcpyDeviceToHost));
    return out;
  }
  void poison_d() const { cuda_ok(cudaMemset(d_.ptr, 0xff, d_bytes_)); }

  // Whether every element of D was written (none is the NaN poison).
  bool all_written(const std::vector<uint8_t>& d) const {
    const size_t size = size_t(dtype_size(out_));
    for (size_t i = 0; i < d.size(); i += size) {
      const double v = out_ == DType::f32
                           ? double(*reinterpret_cast<const float*>(&d[i]))
                           : double(bf16_bits_to_float(*reinterpret_cast<const uint16_t*>(&d[i])));
      if (std::isnan(v)) return false;
    }
    return true;
  }

private:
  GemmLayout layout_;
  DType out_;
  bool with_c_;
  size_t d_bytes_;
  DeviceBuffer a_, b_, c_, d_;
};

// One [1] f32 device tensor holding `value`.
struct DeviceScalar {
  DeviceBuffer buffer{sizeof(float)};
  explicit DeviceScalar(float value) { set(value); }
  void set(float value) const {
    cuda_ok(cudaMemcpy(buffer.ptr, &value, sizeof value, cudaMemcpyHostToDevice));
  }
  TensorView view() const { return device_scalar(buffer.ptr); }
};

TEST(GpuGemmScalar, AlphaTensorEqualsAlphaValue) {
  CODA_REQUIRE_SM90();
  // value * tensor[0] rounds once in fp32, as the host product below.
  const float value = 1.5f, factor = 0.3f, product = value * factor;
  const DeviceScalar factor_t(factor), product_t(product);
  for (GemmLayout layout : kLayouts)
    for (const auto& [out, with_c] : {std::pair{DType::bf16, false}, std::pair{DType::f32, true}}) {
      GemmProblem p(layout, out, with_c);
      ASSERT_TRUE(p.ready()) << "cudaMalloc failed";
      for (const Path& path : kPaths) {
        SCOPED_TRACE(std::string(layout_name(layout)) + " bf16->" + dtype_name(out) +
                     (with_c ? " +C beta=-0.5, " : ", ") + path.name);
        const std::vector<uint8_t> by_value = p.run(Scalar{product}, path);
        ASSERT_TRUE(p.all_written(by_value)) << "an element of D was not written";
        EXPECT_TRUE(p.run(Scalar{value, factor_t.view()}, path) == by_value)
            << "alpha = 1.5 * [0.3] differs from alpha = " << product;
        EXPECT_TRUE(p.run(Scalar{1.f, product_t.view()}, path) == by_value)
            << "alpha = 1 * [" << product << "] differs from alpha = " << product;
      }
    }
}

// The tensor is read by the kernel: a graph captured with it, replayed after it changed, uses the
// new value (stream-K with the workspace, and data-parallel).
TEST(GpuGemmScalar, AlphaTensorIsReadWhenTheKernelRuns) {
  CODA_REQUIRE_SM90();
  for (const Path& path : {kPaths[1], kPaths[2]}) {
    SCOPED_TRACE(path.name);
    GemmProblem p(GemmLayout::wgrad, DType::bf16, false);
    ASSERT_TRUE(p.ready()) << "cudaMalloc failed";
    const std::vector<uint8_t> expect_first = p.run(Scalar{0.75f}, path);
    const std::vector<uint8_t> expect_second = p.run(Scalar{-2.5f}, path);
    ASSERT_TRUE(expect_first != expect_second);

    const DeviceScalar alpha(0.75f);
    GemmArgs g = p.args(Scalar{1.f, alpha.view()});
    const size_t bytes = path.workspace ? gpu::gemm_workspace_size(g, *path.plan) : 0;
    DeviceBuffer workspace(bytes);
    ASSERT_TRUE(workspace.ptr) << "cudaMalloc failed";
    if (bytes > 0)
      g.workspace = make_view(workspace.ptr, DType::f32, int64_t(bytes / 4), Device::cuda);
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    EXPECT_NO_THROW(gpu::gemm_with_plan(g, *path.plan, stream));
    cuda_ok(cudaStreamEndCapture(stream, &graph));
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

    p.poison_d();
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    EXPECT_TRUE(p.read_d() == expect_first) << "replay with alpha = 1 * [0.75]";
    alpha.set(-2.5f);
    p.poison_d();
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    EXPECT_TRUE(p.read_d() == expect_second) << "replay after the tensor became -2.5";

    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// reduce_row_partials' scale as value * a device tensor: the bits of the product as a number,
// and of the CPU backend (same b-order sums, same fp32 factor).
TEST(GpuGemmScalar, RowReduceScaleTensorEqualsValue) {
  CODA_REQUIRE_SM90();
  constexpr int64_t M = 300, P = 37;
  const auto partials = test::random_vector<float>(size_t(M * P), test::test_seed() + 600);
  const float value = 0.0078125f * 3.f, factor = 0.7f, product = value * factor;
  const DeviceScalar factor_t(factor);
  DeviceBuffer dp(partials.size() * 4), dout(size_t(M) * 4);
  ASSERT_TRUE(dp.ptr && dout.ptr) << "cudaMalloc failed";
  cuda_ok(cudaMemcpy(dp.ptr, partials.data(), partials.size() * 4, cudaMemcpyHostToDevice));

  const auto run_gpu = [&](const Scalar& scale) {
    cuda_ok(cudaMemset(dout.ptr, 0xff, size_t(M) * 4));
    EXPECT_NO_THROW(reduce_row_partials({device_view(dp.ptr, DType::f32, M, P), scale,
                                         make_view(dout.ptr, DType::f32, M, Device::cuda)},
                                        nullptr));
    cuda_ok(cudaDeviceSynchronize());
    std::vector<float> out(static_cast<size_t>(M));
    cuda_ok(cudaMemcpy(out.data(), dout.ptr, out.size() * 4, cudaMemcpyDeviceToHost));
    return out;
  };
  const std::vector<float> by_value = run_gpu(Scalar{product});
  const std::vector<float> by_tensor = run_gpu(Scalar{value, factor_t.view()});

  std::vector<float> cpu(size_t(M), NAN);
  float host_factor = factor;
  reduce_row_partials({make_view(const_cast<float*>(partials.data()), DType::f32, M, P),
                       Scalar{value, make_view(&host_factor, DType::f32, 1)},
                       make_view(cpu.data(), DType::f32, M)});
  EXPECT_FALSE(std::isnan(by_value[0]) || std::isnan(by_value.back()));
  EXPECT_EQ(std::memcmp(by_value.data(), by_tensor.data(), size_t(M) * 4), 0);
  EXPECT_EQ(std::memcmp(cpu.data(), by_tensor.data(), size_t(M) * 4), 0);
}

} // namespace
} // namespace coda
