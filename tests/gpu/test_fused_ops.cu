// Device epilogue primitives that the forward kernels do not use, composed here into test
// kernels through the public device epilogue API, and the GeGLU example kernel:
//  * ScaleByScalar from a device pointer, TileStore by TMA reduce-add into an existing output,
//    ReduceOverM column partials (shuffles + shared memory across both warpgroups of a tile);
//  * examples/fused_geglu.cuh;
//  * QuantizeRowBlocks (E4M3 codes and a power-of-two scale per row and 128 columns) after a
//    Stage, on the cooperative and ping-pong tiles: its codes and scales bit for bit against the
//    format's definition applied to the output the kernel stored;
//  * the FP8 mainloop under the fused driver (Fp8Shape), with the same QuantizeRowBlocks: its D
//    gemm_fp8's bit for bit;
//  * RoPE's rotation as the device computes it (hardware sin/cos after the extra-precise angle
//    reduction), against fp64 at large positions.
// Each output is held to an fp64 host computation by the tolerance rule (check.hpp), with the
// unfused path spelled out here: a rounded GEMM output, then each op rounding its own output.
// Skipped (not passed) where there is no sm_90 device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "coda/coda.hpp"
#include "coda/epilogue/device/epilogue.cuh"
#include "coda/epilogue/device/ops/quantize_row_blocks.cuh"
#include "coda/epilogue/ops/rope.hpp"
#include "examples/fused_geglu.cuh"
#include "gpu/backend.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/common/kernel_fixtures.hpp"
#include "tests/gpu/gpu_fixtures.hpp"

namespace coda::test {
namespace {

namespace ep = coda::epilogue::device;

// The op contract (ep::EpilogueOp, driver.cuh) at compile time: what it accepts and what it
// rejects (FusedEpilogue asserts it for every op of every list the library builds).
struct NotAnOp { // not derived from OpBase
  struct Params {};
  struct SharedStorage {};
};
struct ParamsNotCopyable : ep::OpBase { // Params could not live in the kernel's parameter block
  struct Params {
    std::string name;
  };
};
struct VisitWithoutTheFragment : ep::OpBase { // hides OpBase's visit with another signature
  struct Params {};
  template <class C> __device__ void visit(const C&, int) {}
};
struct MinimalOp : ep::OpBase {
  struct Params {
    float scale = 1.f;
  };
};
static_assert(!ep::EpilogueOp<NotAnOp> && !ep::EpilogueOp<ParamsNotCopyable> &&
              !ep::EpilogueOp<VisitWithoutTheFragment>);
static_assert(ep::EpilogueOp<MinimalOp> &&
              ep::EpilogueOp<ep::AuxReduce<ep::RmsNormBackward<ep::FusedShape, bf16>,
                                           ep::ReduceOverM<ep::FusedShape, epilogue::Sum>>>);
using ep::FusedShape;

// A device buffer holding a copy of a host tensor's elements.
struct DeviceCopy {
  void* data = nullptr;
  size_t bytes = 0;
  explicit DeviceCopy(HostTensor& host) : bytes(size_t(host.numel() * dtype_size(host.dtype()))) {
    EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.view().data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(data); }
  TensorView view(const HostTensor& host) const {
    TensorView v = const_cast<HostTensor&>(host).view();
    v.data = data;
    v.device = Device::cuda;
    return v;
  }
  void copy_to(HostTensor& host) const {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.view().data, data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

double round_as(DType t, double x) {
  return t == DType::bf16 ? round_to<bf16>(float(x)) : round_to<f16>(float(x));
}

// acc[m, n] = sum_k a[m, k] w[n, k] in fp64.
std::vector<double> gemm_nt(const std::vector<double>& a, const std::vector<double>& w, int64_t M,
                            int64_t N, int64_t K) {
  std::vector<double> acc(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[size_t(m * K + k)] * w[size_t(n * K + k)];
      acc[size_t(m * N + n)] = s;
    }
  return acc;
}

// ---- out += s * acc (TMA reduce-add), s = value * (*tensor), and the column partials of s * acc.

template <class T>
using AccumulateEpilogue =
    ep::FusedEpilogue<FusedShape, ep::ScaleByScalar, ep::TileStore<FusedShape, T, true>,
                      ep::ReduceOverM<FusedShape, epilogue::Sum>>;

template <class T> void check_accumulate(int64_t M, int64_t N, int64_t K) {
  constexpr DType kType = dtype_of<T>::value;
  Seeds seeds;
  auto a = HostTensor::random(kType, {M, K}, seeds.next());
  auto w = HostTensor::random(kType, {N, K}, seeds.next());
  auto out = HostTensor::random(kType, {M, N}, seeds.next());
  auto factor = HostTensor::of(DType::f32, {1}, {-1.5});
  const int64_t blocks = ceil_div<int64_t>(M, 128);
  HostTensor partials(DType::f32, {N, blocks});
  const std::vector<double> before = out.values();
  DeviceCopy da(a), dw(w), dout(out), dfactor(factor), dpartials(partials);

  using Epi = AccumulateEpilogue<T>;
  typename Epi::Params p{};
  ep::get<0>(p) = {0.75f, static_cast<const float*>(dfactor.data)};
  ep::get<1>(p) = ep::TileStore<FusedShape, T, true>::params("out", dout.view(out));
  ep::get<2>(p) = {static_cast<float*>(dpartials.data), blocks, int32_t(M), int32_t(N),
                   int32_t(blocks)};
  ep::FusedGemm<Epi, T>::run(da.view(a), dw.view(w), p, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  dout.copy_to(out);
  dpartials.copy_to(partials);

  const std::vector<double> acc = gemm_nt(a.values(), w.values(), M, N, K);
  std::vector<double> exact(acc.size()), unfused(acc.size());
  std::vector<double> exact_p(size_t(N * blocks), 0.0), unfused_p(size_t(N * blocks), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n), b = size_t(n * blocks + m / 128);
      const double y = 0.75 * -1.5 * acc[i], y_rounded = round_as(kType, y);
      exact[i] = before[i] + y;
      unfused[i] = round_as(kType, before[i] + y_rounded); // GEMM output, then an add kernel
      exact_p[b] += y;
      unfused_p[b] = double(float(unfused_p[b]) + float(y_rounded)); // fp32 sums of the output
    }
  CODA_EXPECT_PASSES(check_against_baseline("out", out.values(), exact, unfused));
  CODA_EXPECT_PASSES(
      check_against_baseline("column partials", partials.values(), exact_p, unfused_p));
}

struct Shape {
  int64_t M, N, K;
};
// Ragged M and N; the last shape takes several waves of tiles.
const Shape kShapes[] = {{1, 8, 16}, {200, 264, 64}, {300, 520, 200}, {2176, 2048, 64}};

TEST(FusedOps, ScalarReduceAddStoreAndColumnPartials) {
  CODA_REQUIRE_SM90();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                 " K=" + std::to_string(s.K));
    check_accumulate<bf16>(s.M, s.N, s.K);
    check_accumulate<f16>(s.M, s.N, s.K);
  }
}

// ---- z = round(acc) stored, and z quantized to E4M3 in 1 x 128 blocks (QuantizeRowBlocks). The
// Stage rounds in the prepass (Stage<T, true>), so that the op's prepass takes the amax of z as
// stored: with the rounding in the subtile visit, after the prepass, a block whose fp32 amax
// rounds up past 448 * 2^k would be scaled for the smaller value and its largest code saturate.

// codes [M + 1, N] and scales [M + 1, ceil(N/128)] (a guard row of 0x55 bytes after each) hold
// z's row copy (QuantizeRowBlocks): the format's definition (tests/common/fp8_case.hpp: the
// exponent and the nearest code by search) applied to z as stored, bit for bit, and the guard
// rows untouched.
void expect_row_copy_of(const std::vector<double>& zv, int64_t M, int64_t N,
                        const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales) {
  const int64_t blocks = num_fp8_scale_blocks(N);
  int mismatches = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * 128, n1 = std::min<int64_t>(N, n0 + 128);
      std::vector<float> block;
      for (int64_t n = n0; n < n1; ++n) block.push_back(float(zv[size_t(m * N + n)]));
      const int k = e4m3_block_exponent(block.data(), int64_t(block.size()));
      const int want_scale = k == kNoScale ? 0xFF : k + 127;
      if (scales[size_t(m * blocks + b)] != want_scale && ++mismatches <= 10)
        ADD_FAILURE() << "scale of row " << m << " block " << b << ": "
                      << int(scales[size_t(m * blocks + b)]) << ", want " << want_scale;
      for (int64_t n = n0; n < n1; ++n) {
        const int want =
            k == kNoScale ? 0x7F
                          : e4m3_nearest_code(float(std::ldexp(double(block[size_t(n - n0)]), -k)));
        if (codes[size_t(m * N + n)] != want && ++mismatches <= 10)
          ADD_FAILURE() << "code (" << m << ", " << n << "): " << int(codes[size_t(m * N + n)])
                        << ", want " << want << " (z = " << zv[size_t(m * N + n)] << ", k = " << k
                        << ")";
      }
    }
  EXPECT_EQ(mismatches, 0);
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(codes[size_t(M * N + n)], 0x55) << "row M written";
  for (int64_t b = 0; b < blocks; ++b) EXPECT_EQ(scales[size_t(M * blocks + b)], 0x55);
}

template <class S, class T>
using QuantizeEpilogue = ep::FusedEpilogue<S, ep::Stage<T, /*kPrepass=*/true>,
                                           ep::QuantizeRowBlocks<S>, ep::TileStore<S, T>>;

// The codes and scales against the format's definition (tests/common/fp8_case.hpp: the exponent
// and the nearest code by search) applied to z as the kernel stored it, bit for bit: the op
// quantizes the rounded value, so nothing about the GEMM's order of accumulation enters; z
// itself against the fp64 GEMM by the tolerance rule. Values are scaled per row by powers of two
// from 2^-10 to 2^10 (inside f16's range), so the rows' scales differ; one row holds a NaN in its
// second block (through a NaN in A it poisons that row's every block: acc = a . w), rows past M and
// columns past N are not written.
template <class S, class T> void check_quantize(int64_t M, int64_t N, int64_t K) {
  constexpr DType kType = dtype_of<T>::value;
  Seeds seeds;
  std::vector<double> a_values = random_doubles(size_t(M * K), seeds.next());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      a_values[size_t(m * K + k)] *= std::ldexp(1.0, int(m % 21) - 10);
  if (M > 3) a_values[size_t(3 * K)] = NAN;
  auto a = HostTensor::of(kType, {M, K}, a_values);
  auto w = HostTensor::random(kType, {N, K}, seeds.next());
  const int64_t blocks = num_fp8_scale_blocks(N);
  HostTensor z(kType, {M, N});
  std::vector<uint8_t> codes(size_t((M + 1) * N), 0x55), scales(size_t((M + 1) * blocks), 0x55);
  uint8_t *dcodes = nullptr, *dscales = nullptr;
  ASSERT_EQ(cudaMalloc(&dcodes, codes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dscales, scales.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dcodes, codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dscales, scales.data(), scales.size(), cudaMemcpyHostToDevice), cudaSuccess);
  DeviceCopy da(a), dw(w), dz(z);

  using Epi = QuantizeEpilogue<S, T>;
  typename Epi::Params p{};
  ep::get<1>(p) =
      ep::QuantizeRowBlocks<S>::params(make_view(dcodes, DType::e4m3, M, N, Device::cuda),
                                       make_view(dscales, DType::e8m0, M, blocks, Device::cuda));
  ep::get<2>(p) = ep::TileStore<S, T>::params("z", dz.view(z));
  ep::FusedGemm<Epi, T>::run(da.view(a), dw.view(w), p, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  dz.copy_to(z);
  ASSERT_EQ(cudaMemcpy(codes.data(), dcodes, codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scales.data(), dscales, scales.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dcodes);
  cudaFree(dscales);

  const std::vector<double> zv = z.values();
  expect_row_copy_of(zv, M, N, codes, scales);

  // z against the fp64 GEMM, the NaN row (checked above through its NaN codes) left out.
  const std::vector<double> acc = gemm_nt(a.values(), w.values(), M, N, K);
  std::vector<double> got, exact, unfused;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N && m != 3; ++n) {
      got.push_back(zv[size_t(m * N + n)]);
      exact.push_back(acc[size_t(m * N + n)]);
      unfused.push_back(round_as(kType, acc[size_t(m * N + n)]));
    }
  CODA_EXPECT_PASSES(check_against_baseline("z", got, exact, unfused));
}

TEST(FusedOps, QuantizeRowBlocksMatchesTheFormatOnTheStoredOutput) {
  CODA_REQUIRE_SM90();
  for (const Shape& s :
       {Shape{1, 8, 16}, Shape{200, 264, 64}, Shape{300, 520, 200}, Shape{1100, 1024, 64}}) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                 " K=" + std::to_string(s.K));
    check_quantize<ep::CooperativeShape, bf16>(s.M, s.N, s.K);
    check_quantize<ep::PingpongShape, f16>(s.M, s.N, s.K);
  }
}

// ---- The FP8 mainloop under the fused driver (Fp8Shape, FusedGemm::run_fp8): E4M3 operands with
// gemm_fp8's block scales, z = round(acc) stored through the driver and quantized again (FP8 in,
// FP8 out: the form of an FP8 block's kernels, docs/fp8.md). z is gemm_fp8's own D bit for bit
// (the same mainloop, and one rounding to bf16 in either epilogue); the codes and scales are the
// format applied to z as stored. The inputs are Fp8GemmCase's (ragged M, N and K, scales that
// change from block to block).

using Fp8QuantizeEpilogue =
    ep::FusedEpilogue<ep::Fp8Shape, ep::Stage<bf16, /*kPrepass=*/true>,
                      ep::QuantizeRowBlocks<ep::Fp8Shape>, ep::TileStore<ep::Fp8Shape, bf16>>;

void check_fp8_under_the_driver(int64_t M, int64_t N, int64_t K) {
  Seeds seeds;
  Fp8GemmCase c(M, N, K, seeds);
  DeviceCopy da(c.a), das(c.a_scales), db(c.b), dbs(c.b_scales);
  HostTensor d(DType::bf16, {M, N}), z(DType::bf16, {M, N});
  DeviceCopy dd(d), dz(z);
  gemm_fp8({.a = da.view(c.a),
            .a_scales = das.view(c.a_scales),
            .b = db.view(c.b),
            .b_scales = dbs.view(c.b_scales),
            .d = dd.view(d)});

  const int64_t blocks = num_fp8_scale_blocks(N);
  std::vector<uint8_t> codes(size_t((M + 1) * N), 0x55), scales(size_t((M + 1) * blocks), 0x55);
  uint8_t *dcodes = nullptr, *dscales = nullptr;
  ASSERT_EQ(cudaMalloc(&dcodes, codes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dscales, scales.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dcodes, codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dscales, scales.data(), scales.size(), cudaMemcpyHostToDevice), cudaSuccess);
  Fp8QuantizeEpilogue::Params p{};
  ep::get<1>(p) = ep::QuantizeRowBlocks<ep::Fp8Shape>::params(
      make_view(dcodes, DType::e4m3, M, N, Device::cuda),
      make_view(dscales, DType::e8m0, M, blocks, Device::cuda));
  ep::get<2>(p) = ep::TileStore<ep::Fp8Shape, bf16>::params("z", dz.view(z));
  ep::FusedGemm<Fp8QuantizeEpilogue, e4m3>::run_fp8(da.view(c.a), das.view(c.a_scales),
                                                    db.view(c.b), dbs.view(c.b_scales), p, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  dd.copy_to(d);
  dz.copy_to(z);
  ASSERT_EQ(cudaMemcpy(codes.data(), dcodes, codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scales.data(), dscales, scales.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dcodes);
  cudaFree(dscales);

  EXPECT_EQ(std::memcmp(z.view().data, d.view().data, size_t(M * N) * 2), 0)
      << "z is not gemm_fp8's D bit for bit";
  expect_row_copy_of(z.values(), M, N, codes, scales);
}

TEST(FusedOps, Fp8MainloopUnderTheDriverGivesGemmFp8AndItsRowCopy) {
  CODA_REQUIRE_SM90();
  for (const Shape& s : {Shape{1, 8, 16}, Shape{300, 264, 528}, Shape{1000, 1032, 2064}}) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                 " K=" + std::to_string(s.K));
    check_fp8_under_the_driver(s.M, s.N, s.K);
  }
}

// ---- examples/fused_geglu.cuh

TEST(FusedExample, GegluMatchesReference) {
  CODA_REQUIRE_SM90();
  for (const Shape& s : {Shape{37, 272, 64}, Shape{300, 1040, 96}}) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " 2F=" + std::to_string(s.N));
    Seeds seeds;
    auto a = HostTensor::random(DType::bf16, {s.M, s.K}, seeds.next());
    auto w = HostTensor::random(DType::bf16, {s.N, s.K}, seeds.next());
    HostTensor act(DType::bf16, {s.M, s.N / 2});
    DeviceCopy da(a), dw(w), dact(act);
    examples::gemm_geglu<bf16>(da.view(a), dw.view(w), dact.view(act), nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    dact.copy_to(act);

    const std::vector<double> z = gemm_nt(a.values(), w.values(), s.M, s.N, s.K);
    std::vector<double> exact(size_t(s.M * s.N / 2)), unfused(exact.size());
    for (size_t i = 0; i < exact.size(); ++i) {
      exact[i] = examples::GegluGate{}(z[2 * i], z[2 * i + 1]);
      const float g = float(round_as(DType::bf16, z[2 * i])),
                  u = float(round_as(DType::bf16, z[2 * i + 1]));
      unfused[i] = round_as(DType::bf16, examples::GegluGate{}(g, u));
    }
    CODA_EXPECT_PASSES(check_against_baseline("act", act.values(), exact, unfused));
  }
}

// ---- RoPE's rotation on the device

__global__ void rope_rotations(const int32_t* positions, const float* inv_freq, int n,
                               coda::epilogue::RopeRotation* out) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = coda::epilogue::rope_rotation(positions[i], inv_freq[i]);
}

// The host test (EpilogueOps.RopeAngleIsAccurateAtLargePositions) holds the host's rotation to
// 2e-6; the device's, with the hardware sin/cos (2^-21.4 on the reduced angle), must meet the same.
TEST(FusedOps, RopeRotationIsAccurateOnTheDevice) {
  CODA_REQUIRE_SM90();
  std::vector<int32_t> positions;
  std::vector<float> inv_freq;
  for (int i = 0; i < 64; ++i)
    for (int32_t p : {0, 1, 7, 4095, 8191, 131071, 100000, 999983, 8388607, 16777215}) {
      positions.push_back(p);
      inv_freq.push_back(float(std::pow(500000.0, -double(i) / 64))); // a Llama-3 base table
    }
  Seeds seeds;
  auto random = HostTensor::random(DType::f32, {2, 4096}, seeds.next(), 0, 1);
  for (int64_t i = 0; i < 4096; ++i) {
    positions.push_back(int32_t(random.values()[size_t(i)] * 1.6e7));
    inv_freq.push_back(float(random.values()[size_t(4096 + i)]));
  }
  const int n = int(positions.size());
  int32_t* d_pos = nullptr;
  float* d_freq = nullptr;
  coda::epilogue::RopeRotation* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_pos, n * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_freq, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, n * sizeof(coda::epilogue::RopeRotation)), cudaSuccess);
  cudaMemcpy(d_pos, positions.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d_freq, inv_freq.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  rope_rotations<<<(n + 255) / 256, 256>>>(d_pos, d_freq, n, d_out);
  std::vector<coda::epilogue::RopeRotation> out(static_cast<size_t>(n));
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, n * sizeof(out[0]), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_pos);
  cudaFree(d_freq);
  cudaFree(d_out);
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const double theta = double(positions[size_t(i)]) * double(inv_freq[size_t(i)]);
    worst = std::max({worst, std::abs(out[size_t(i)].cos - std::cos(theta)),
                      std::abs(out[size_t(i)].sin - std::sin(theta))});
    ASSERT_NEAR(out[size_t(i)].cos, std::cos(theta), 2e-6) << "position " << positions[size_t(i)];
    ASSERT_NEAR(out[size_t(i)].sin, std::sin(theta), 2e-6) << "position " << positions[size_t(i)];
  }
  RecordProperty("worst_abs_error", std::to_string(worst));
}

} // namespace
} // namespace coda::test
