// The C ABI against the C++ API: same layout of the tensor descriptor, same results bit for
// bit, the gate/up converters as documented, and coda_last_error()'s per-thread contract.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coda/block/llama.h"
#include "coda/block/llama.hpp"
#include "coda/coda.h"
#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "reference/gemm.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"

namespace {

using namespace coda;

// ctypes and C callers rely on coda_tensor having TensorView's layout.
static_assert(sizeof(coda_tensor) == sizeof(TensorView));
static_assert(offsetof(coda_tensor, data) == offsetof(TensorView, data));
static_assert(offsetof(coda_tensor, dtype) == offsetof(TensorView, dtype));
static_assert(offsetof(coda_tensor, rank) == offsetof(TensorView, rank));
static_assert(offsetof(coda_tensor, shape) == offsetof(TensorView, shape));
static_assert(offsetof(coda_tensor, stride) == offsetof(TensorView, stride));
static_assert(offsetof(coda_tensor, device) == offsetof(TensorView, device));
static_assert(offsetof(coda_tensor, device_index) == offsetof(TensorView, device_index));
static_assert(sizeof(coda_scalar) == sizeof(Scalar));
static_assert(offsetof(coda_scalar, value) == offsetof(Scalar, value));
static_assert(offsetof(coda_scalar, tensor) == offsetof(Scalar, tensor));

template <class T> bool same_bits(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

// Whether this thread's coda_last_error() names `needle`; on failure the message says what it
// holds instead.
::testing::AssertionResult last_error_contains(const std::string& needle) {
  const std::string message = coda_last_error();
  if (message.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "coda_last_error() is \"" << message
                                       << "\"; expected it to contain \"" << needle << "\"";
}

bool any_nan(const std::vector<bf16>& v) {
  for (bf16 x : v)
    if (std::isnan(x.to_float())) return true;
  return false;
}

TEST(CAbi, GemmMatchesCppApiAndReference) {
  constexpr int64_t M = 37, N = 24, K = 40;
  constexpr float alpha = 0.75f, beta = -0.5f;
  uint64_t seed = test::test_seed();
  const auto a = test::random_vector<bf16>(M * K, seed++);
  const auto b = test::random_vector<bf16>(N * K, seed++);
  const auto c = test::random_vector<bf16>(M * N, seed++);
  std::vector<bf16> d_cpp(M * N, bf16::from(NAN)), d_c = d_cpp;

  GemmArgs g;
  g.a = make_view(const_cast<bf16*>(a.data()), DType::bf16, M, K);
  g.b = make_view(const_cast<bf16*>(b.data()), DType::bf16, N, K);
  g.c = make_view(const_cast<bf16*>(c.data()), DType::bf16, M, N);
  g.d = make_view(d_cpp.data(), DType::bf16, M, N);
  g.alpha = alpha, g.beta = beta;
  gemm(g);

  coda_gemm_args cg{}; // no workspace
  cg.layout = CODA_GEMM_FWD;
  cg.a = coda_matrix(const_cast<bf16*>(a.data()), CODA_BF16, M, K, CODA_DEVICE_CPU);
  cg.b = coda_matrix(const_cast<bf16*>(b.data()), CODA_BF16, N, K, CODA_DEVICE_CPU);
  cg.c = coda_matrix(const_cast<bf16*>(c.data()), CODA_BF16, M, N, CODA_DEVICE_CPU);
  cg.d = coda_matrix(d_c.data(), CODA_BF16, M, N, CODA_DEVICE_CPU);
  cg.alpha = coda_scalar_value(alpha), cg.beta = beta;
  ASSERT_EQ(coda_gemm(&cg, nullptr), CODA_OK) << coda_last_error();

  EXPECT_TRUE(same_bits(d_cpp, d_c));
  // And both are a correct GEMM: the house tolerance against fp64, relative to the error of
  // an unfused fp32-accumulate-then-round path.
  const auto af = test::to_float(a), bfl = test::to_float(b), cf = test::to_float(c);
  std::vector<double> ref(M * N), base(M * N), out = test::to_double(d_c);
  std::vector<float> acc32(M * N);
  ref::gemm(ref::Layout::fwd, M, N, K, test::to_double(a).data(), test::to_double(b).data(),
            ref.data());
  ref::gemm_fp32(ref::Layout::fwd, M, N, K, af.data(), bfl.data(), acc32.data());
  for (int64_t i = 0; i < M * N; ++i) {
    ref[i] = alpha * ref[i] + beta * double(cf[i]);
    base[i] = round_to<bf16>(alpha * acc32[i] + beta * cf[i]);
  }
  CODA_EXPECT_PASSES(test::check_against_baseline("gemm d", out, ref, base));
}

// The CPU backend needs no GEMM workspace: the size query says 0 through both interfaces, and a
// workspace that is given is neither read nor written (same bits of D, its bytes unchanged).
TEST(CAbi, GemmWorkspaceIsIgnoredOnTheCpu) {
  constexpr int64_t M = 300, N = 264, K = 520; // many tiles, several k-blocks
  uint64_t seed = test::test_seed() + 11;
  const auto a = test::random_vector<bf16>(M * K, seed++);
  const auto b = test::random_vector<bf16>(K * N, seed++);
  std::vector<float> without(M * N, NAN), with = without;
  std::vector<float> workspace(4096, NAN);
  const std::vector<float> workspace_before = workspace;

  GemmArgs g;
  g.layout = GemmLayout::dgrad;
  g.a = make_view(const_cast<bf16*>(a.data()), DType::bf16, M, K);
  g.b = make_view(const_cast<bf16*>(b.data()), DType::bf16, K, N);
  g.d = make_view(without.data(), DType::f32, M, N);
  EXPECT_EQ(gemm_workspace_size(g), 0u);
  gemm(g);

  coda_gemm_args cg{};
  cg.layout = CODA_GEMM_DGRAD;
  cg.a = coda_matrix(const_cast<bf16*>(a.data()), CODA_BF16, M, K, CODA_DEVICE_CPU);
  cg.b = coda_matrix(const_cast<bf16*>(b.data()), CODA_BF16, K, N, CODA_DEVICE_CPU);
  cg.d = coda_matrix(with.data(), CODA_F32, M, N, CODA_DEVICE_CPU);
  cg.alpha = coda_scalar_value(1.f);
  cg.workspace =
      coda_vector(workspace.data(), CODA_F32, int64_t(workspace.size()), CODA_DEVICE_CPU);
  size_t bytes = 1;
  ASSERT_EQ(coda_gemm_workspace_size(&cg, &bytes), CODA_OK) << coda_last_error();
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(coda_gemm(&cg, nullptr), CODA_OK) << coda_last_error();
  EXPECT_TRUE(same_bits(without, with));
  EXPECT_TRUE(same_bits(workspace, workspace_before));
  EXPECT_FALSE(std::isnan(with[0]) || std::isnan(with.back()));

  EXPECT_EQ(coda_gemm_workspace_size(&cg, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_EQ(coda_gemm_workspace_size(nullptr, &bytes), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_gemm_workspace_size: args is NULL");
}

// The shape-only query: a size for each valid problem (0 unless an sm_90 device is current) and
// an invalid_argument naming the dimensions for an empty one.
TEST(CAbi, GemmWorkspaceSizeFromShapes) {
  for (GemmLayout layout : {GemmLayout::fwd, GemmLayout::dgrad, GemmLayout::wgrad})
    EXPECT_NO_THROW(gemm_workspace_size(layout, 300, 1024, 4096, DType::f32));
#if !CODA_WITH_CUDA
  EXPECT_EQ(gemm_workspace_size(GemmLayout::wgrad, 3072, 2048, 8192, DType::bf16), 0u);
#endif
  try {
    gemm_workspace_size(GemmLayout::fwd, 0, 8, 8, DType::bf16);
    ADD_FAILURE() << "m = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("m, n and k must be >= 1; got 0, 8 and 8"),
              std::string::npos)
        << e.what();
  }
}

// alpha and the row reduce's scale as value * a [1] f32 tensor: the same bits as the product
// given as a number (the CPU backend reads the host tensor); a bad tensor is rejected with its
// name and nothing is written.
TEST(CAbi, ScalarTensorsEqualTheirValue) {
  constexpr int64_t M = 21, N = 16, K = 24;
  uint64_t seed = test::test_seed() + 30;
  const auto a = test::random_vector<bf16>(M * K, seed++);
  const auto b = test::random_vector<bf16>(K * N, seed++);
  float factor[1] = {0.3125f};
  constexpr float value = 1.5f, product = value * 0.3125f;
  void* pa = const_cast<bf16*>(a.data());
  void* pb = const_cast<bf16*>(b.data());
  const coda_device host = CODA_DEVICE_CPU;
  const coda_tensor factor_t = coda_vector(factor, CODA_F32, 1, host);

  std::vector<float> by_value(M * N, NAN), by_tensor = by_value;
  coda_gemm_args cg{};
  cg.layout = CODA_GEMM_DGRAD;
  cg.a = coda_matrix(pa, CODA_BF16, M, K, host);
  cg.b = coda_matrix(pb, CODA_BF16, K, N, host);
  cg.d = coda_matrix(by_value.data(), CODA_F32, M, N, host);
  cg.alpha = coda_scalar_value(product);
  ASSERT_EQ(coda_gemm(&cg, nullptr), CODA_OK) << coda_last_error();
  cg.d = coda_matrix(by_tensor.data(), CODA_F32, M, N, host);
  cg.alpha = coda_scalar_tensor(value, factor_t);
  ASSERT_EQ(coda_gemm(&cg, nullptr), CODA_OK) << coda_last_error();
  EXPECT_FALSE(std::isnan(by_tensor[0]) || std::isnan(by_tensor.back()));
  EXPECT_TRUE(same_bits(by_value, by_tensor));

  const std::vector<float> before = by_tensor;
  cg.alpha.tensor = coda_vector(factor, CODA_BF16, 1, host);
  EXPECT_EQ(coda_gemm(&cg, nullptr), CODA_TYPE_ERROR);
  EXPECT_TRUE(last_error_contains("alpha.tensor"));
  EXPECT_TRUE(same_bits(before, by_tensor));

  const std::vector<float> partials = test::random_vector<float>(M * 3, seed++);
  std::vector<float> out_value(M, NAN), out_tensor = out_value;
  coda_row_reduce_args cr{};
  cr.partials = coda_matrix(const_cast<float*>(partials.data()), CODA_F32, M, 3, host);
  cr.scale = coda_scalar_value(product);
  cr.out = coda_vector(out_value.data(), CODA_F32, M, host);
  ASSERT_EQ(coda_reduce_row_partials(&cr, nullptr), CODA_OK) << coda_last_error();
  cr.scale = coda_scalar_tensor(value, factor_t);
  cr.out = coda_vector(out_tensor.data(), CODA_F32, M, host);
  ASSERT_EQ(coda_reduce_row_partials(&cr, nullptr), CODA_OK) << coda_last_error();
  EXPECT_FALSE(std::isnan(out_tensor[0]));
  EXPECT_TRUE(same_bits(out_value, out_tensor));

  const std::vector<float> out_before = out_tensor;
  float two[2] = {1.f, 2.f};
  cr.scale.tensor = coda_vector(two, CODA_F32, 2, host);
  EXPECT_EQ(coda_reduce_row_partials(&cr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains("scale.tensor must have shape [1]"));
  EXPECT_TRUE(same_bits(out_before, out_tensor));
}

TEST(CAbi, ResidualRmsMatchesCppApi) {
  constexpr int64_t M = 19, N = 136, K = 48; // two partial blocks, the second ragged
  const int64_t P = num_reduce_blocks(N);
  uint64_t seed = test::test_seed() + 10;
  const auto a = test::random_vector<bf16>(M * K, seed++);
  const auto w = test::random_vector<bf16>(N * K, seed++);
  const auto residual = test::random_vector<bf16>(M * N, seed++);
  const auto gamma = test::random_vector<bf16>(N, seed++, 0.5f, 1.5f);
  struct Outputs {
    std::vector<bf16> out, scaled;
    std::vector<float> partials;
  };
  Outputs cpp{std::vector<bf16>(M * N, bf16::from(NAN)), std::vector<bf16>(M * N, bf16::from(NAN)),
              std::vector<float>(M * P, NAN)};
  Outputs c = cpp;
  const auto in = [](const auto& v) {
    return const_cast<void*>(static_cast<const void*>(v.data()));
  };

  gemm_residual_rms({make_view(in(a), DType::bf16, M, K), make_view(in(w), DType::bf16, N, K),
                     make_view(in(residual), DType::bf16, M, N),
                     make_view(in(gamma), DType::bf16, N),
                     make_view(cpp.out.data(), DType::bf16, M, N),
                     make_view(cpp.scaled.data(), DType::bf16, M, N),
                     make_view(cpp.partials.data(), DType::f32, M, P)});

  const coda_device host = CODA_DEVICE_CPU;
  coda_residual_rms_args ca{coda_matrix(in(a), CODA_BF16, M, K, host),
                            coda_matrix(in(w), CODA_BF16, N, K, host),
                            coda_matrix(in(residual), CODA_BF16, M, N, host),
                            coda_vector(in(gamma), CODA_BF16, N, host),
                            coda_matrix(c.out.data(), CODA_BF16, M, N, host),
                            coda_matrix(c.scaled.data(), CODA_BF16, M, N, host),
                            coda_matrix(c.partials.data(), CODA_F32, M, P, host),
                            {}, // a_scales, w_scales: 16-bit operands
                            {}};
  ASSERT_EQ(coda_gemm_residual_rms(&ca, nullptr), CODA_OK) << coda_last_error();

  EXPECT_FALSE(any_nan(cpp.out) || any_nan(cpp.scaled)) << "an output element was not written";
  EXPECT_TRUE(same_bits(cpp.out, c.out));
  EXPECT_TRUE(same_bits(cpp.scaled, c.scaled));
  EXPECT_TRUE(same_bits(cpp.partials, c.partials));
}

// K2g through the C ABI (coda_gemm_rms_geglu on coda_rms_geglu_args) gives the C++ entry point's
// bits, and act differs from K2's: the C function runs GeGLU, not SwiGLU.
TEST(CAbi, RmsGegluMatchesCppApiAndIsNotSwiglu) {
  constexpr int64_t M = 19, F = 72, K = 40;
  uint64_t seed = test::test_seed() + 30;
  const auto a = test::random_vector<bf16>(M * K, seed++);
  const auto w = test::random_vector<bf16>(2 * F * K, seed++);
  const auto partials = test::random_vector<float>(M, seed++, 5.f, 15.f);
  struct Outputs {
    std::vector<bf16> preact, act;
    std::vector<float> rstd;
  };
  Outputs cpp{std::vector<bf16>(M * 2 * F, bf16::from(NAN)),
              std::vector<bf16>(M * F, bf16::from(NAN)), std::vector<float>(M, NAN)};
  Outputs c = cpp, swiglu = cpp;
  const auto in = [](const auto& v) {
    return const_cast<void*>(static_cast<const void*>(v.data()));
  };
  const auto cpp_args = [&](Outputs& o) {
    return RmsGegluArgs{make_view(in(a), DType::bf16, M, K),
                        make_view(in(w), DType::bf16, 2 * F, K),
                        make_view(in(partials), DType::f32, M, 1),
                        1e-5f,
                        make_view(o.preact.data(), DType::bf16, M, 2 * F),
                        make_view(o.act.data(), DType::bf16, M, F),
                        make_view(o.rstd.data(), DType::f32, M)};
  };
  gemm_rms_geglu(cpp_args(cpp));
  const RmsGegluArgs k2 = cpp_args(swiglu); // the same call as K2, into the swiglu outputs
  gemm_rms_swiglu({k2.a, k2.w, k2.sumsq_partials, k2.eps, k2.preact, k2.act, k2.rstd_out});

  const coda_device host = CODA_DEVICE_CPU;
  coda_rms_geglu_args ca{coda_matrix(in(a), CODA_BF16, M, K, host),
                         coda_matrix(in(w), CODA_BF16, 2 * F, K, host),
                         coda_matrix(in(partials), CODA_F32, M, 1, host),
                         1e-5f,
                         coda_matrix(c.preact.data(), CODA_BF16, M, 2 * F, host),
                         coda_matrix(c.act.data(), CODA_BF16, M, F, host),
                         coda_vector(c.rstd.data(), CODA_F32, M, host),
                         {}, // a_scales, w_scales: 16-bit operands
                         {}};
  ASSERT_EQ(coda_gemm_rms_geglu(&ca, nullptr), CODA_OK) << coda_last_error();

  EXPECT_FALSE(any_nan(cpp.preact) || any_nan(cpp.act)) << "an output element was not written";
  EXPECT_TRUE(same_bits(cpp.preact, c.preact));
  EXPECT_TRUE(same_bits(cpp.act, c.act));
  EXPECT_TRUE(same_bits(cpp.rstd, c.rstd));
  EXPECT_TRUE(same_bits(cpp.preact, swiglu.preact)) << "the same GEMM and row scale as K2";
  EXPECT_FALSE(same_bits(cpp.act, swiglu.act)) << "the activation is GeGLU's";
}

// The block-scaled FP8 GEMM through the C ABI (coda_gemm_fp8 on coda_fp8_gemm_args, built here
// field by field as a C caller would) gives the C++ entry point's bits on a ragged shape with a
// short last K block; a bad call returns its status and the validator's message, and leaves every
// byte of every tensor as it was.
TEST(CAbi, GemmFp8MatchesCppApiAndRejectsBadInput) {
  constexpr int64_t M = 37, N = 136, K = 272; // two N-blocks of b_scales; K blocks 128, 128, 16
  test::Seeds seeds;
  test::Fp8GemmCase cpp(M, N, K, seeds);
  gemm_fp8(cpp.args());

  test::HostTensor d_c(DType::bf16, {M, N}); // NaN
  const coda_device host = CODA_DEVICE_CPU;
  const auto ptr = [](test::HostTensor& t) { return t.host_view().data; };
  coda_fp8_gemm_args ca{};
  ca.a = coda_matrix(ptr(cpp.a), CODA_E4M3, M, K, host);
  ca.a_scales = coda_matrix(ptr(cpp.a_scales), CODA_E8M0, M, num_fp8_scale_blocks(K), host);
  ca.b = coda_matrix(ptr(cpp.b), CODA_E4M3, N, K, host);
  ca.b_scales = coda_matrix(ptr(cpp.b_scales), CODA_E8M0, num_fp8_scale_blocks(N),
                            num_fp8_scale_blocks(K), host);
  ca.d = coda_matrix(ptr(d_c), CODA_BF16, M, N, host);
  ASSERT_EQ(coda_gemm_fp8(&ca, nullptr), CODA_OK) << coda_last_error();

  const auto bits = [](test::HostTensor& t) {
    const auto* p = static_cast<const uint16_t*>(t.host_view().data);
    return std::vector<uint16_t>(p, p + t.numel());
  };
  for (double v : d_c.values()) ASSERT_FALSE(std::isnan(v)) << "an element of d was not written";
  EXPECT_TRUE(same_bits(bits(cpp.d), bits(d_c)));
  CODA_EXPECT_PASSES(test::check_output("d", d_c, cpp.exact(), cpp.unfused()));

  d_c.poison();
  const std::vector<uint16_t> before = bits(d_c);
  coda_fp8_gemm_args bad = ca;
  bad.a_scales.dtype = CODA_F32; // fp32 scales: the C ABI takes E8M0 bytes
  EXPECT_EQ(coda_gemm_fp8(&bad, nullptr), CODA_TYPE_ERROR);
  EXPECT_TRUE(last_error_contains("gemm_fp8: a_scales must be e8m0; got f32"));
  bad = ca;
  bad.b_scales.shape[1] = 2; // floor(K/128) blocks, not ceil
  EXPECT_EQ(coda_gemm_fp8(&bad, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains(
      "b_scales must have shape [ceil(N/128), ceil(K/128)] = [2, 3]; got [2, 2]"));
  EXPECT_TRUE(same_bits(bits(d_c), before)) << "a rejected call wrote d";
  EXPECT_TRUE(d_c.guard_intact());
  EXPECT_EQ(coda_gemm_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_gemm_fp8: args is NULL");
}

// The weight gradient's form of the FP8 GEMM through the C ABI: b scaled per row
// (CODA_FP8_B_ROWS) and an f32 d accumulated into, set field by field, gives the C++ entry
// point's bits.
TEST(CAbi, GemmFp8ByRowsAccumulatingMatchesCppApi) {
  constexpr int64_t M = 37, N = 136, K = 272;
  test::Seeds seeds;
  test::Fp8GemmCase cpp(M, N, K, seeds, {Fp8BScaling::rows, DType::f32, /*accumulate=*/true});
  test::HostTensor d_c = cpp.d; // the same old values
  gemm_fp8(cpp.args());

  const coda_device host = CODA_DEVICE_CPU;
  const auto ptr = [](test::HostTensor& t) { return t.host_view().data; };
  coda_fp8_gemm_args ca{};
  ca.a = coda_matrix(ptr(cpp.a), CODA_E4M3, M, K, host);
  ca.a_scales = coda_matrix(ptr(cpp.a_scales), CODA_E8M0, M, num_fp8_scale_blocks(K), host);
  ca.b = coda_matrix(ptr(cpp.b), CODA_E4M3, N, K, host);
  ca.b_scales = coda_matrix(ptr(cpp.b_scales), CODA_E8M0, N, num_fp8_scale_blocks(K), host);
  ca.d = coda_matrix(ptr(d_c), CODA_F32, M, N, host);
  ca.b_scaling = CODA_FP8_B_ROWS;
  ca.accumulate = 1;
  ASSERT_EQ(coda_gemm_fp8(&ca, nullptr), CODA_OK) << coda_last_error();
  const auto bits = [](test::HostTensor& t) {
    const auto* p = static_cast<const uint32_t*>(t.host_view().data);
    return std::vector<uint32_t>(p, p + t.numel());
  };
  EXPECT_TRUE(same_bits(bits(cpp.d), bits(d_c))); // (its accuracy: test_gemm_fp8.cpp)

  coda_fp8_gemm_args bad = ca;
  bad.b_scaling = 7;
  EXPECT_EQ(coda_gemm_fp8(&bad, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains("b_scaling must be blocks (0) or rows (1); got 7"));
  EXPECT_TRUE(same_bits(bits(cpp.d), bits(d_c))) << "a rejected call wrote d";
}

// The four outputs of a quantizer's C call (codes, scales and the transposed copies), filled
// before each call with bytes the quantizer never writes (0xFF: a negative NaN code, which it
// writes as 0x7F; 0xFE: the scale 2^127, above any finite block's), so that a byte the call left
// alone differs from the C++ call's and a rejected call's untouched outputs show.
struct QuantizerOutputs {
  test::HostTensor codes, scales, codes_t, scales_t;

  void fill() {
    for (test::HostTensor* t : {&codes, &codes_t}) std::memset(t->host_view().data, 0xFF, size(*t));
    for (test::HostTensor* t : {&scales, &scales_t})
      std::memset(t->host_view().data, 0xFE, size(*t));
  }
  static std::vector<uint8_t> bytes(test::HostTensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.host_view().data);
    return std::vector<uint8_t>(p, p + t.numel());
  }
  static bool untouched(test::HostTensor& t, uint8_t byte) {
    return bytes(t) == std::vector<uint8_t>(size(t), byte);
  }
  bool transposed_untouched() { return untouched(codes_t, 0xFF) && untouched(scales_t, 0xFE); }
  bool all_untouched() {
    return untouched(codes, 0xFF) && untouched(scales, 0xFE) && transposed_untouched();
  }
  bool guards_intact() {
    return codes.guard_intact() && scales.guard_intact() && codes_t.guard_intact() &&
           scales_t.guard_intact();
  }

  // A C quantizer (`call(args)` returns its status) writes the C++ entry point's bytes (`want`:
  // codes, scales, codes_t, scales_t) over these outputs with `both` (every copy given) and the
  // row copy's alone with `rows_only` (codes_t and scales_t absent), the transposed copy then
  // untouched.
  template <class Args, class Call>
  void expect_written_as(Call call, const Args& both, const Args& rows_only,
                         const std::array<test::HostTensor*, 4>& want) {
    fill();
    ASSERT_EQ(call(&both), CODA_OK) << coda_last_error();
    EXPECT_EQ(bytes(codes), bytes(*want[0]));
    EXPECT_EQ(bytes(scales), bytes(*want[1]));
    EXPECT_EQ(bytes(codes_t), bytes(*want[2]));
    EXPECT_EQ(bytes(scales_t), bytes(*want[3]));
    fill();
    ASSERT_EQ(call(&rows_only), CODA_OK) << coda_last_error();
    EXPECT_EQ(bytes(codes), bytes(*want[0]));
    EXPECT_EQ(bytes(scales), bytes(*want[1]));
    EXPECT_TRUE(transposed_untouched()) << "an absent copy was written";
  }
  // A bad call returns `status` with `message` among the last error's words and writes nothing.
  template <class Args, class Call>
  void expect_rejected(Call call, const Args& bad, coda_status status, const char* message) {
    fill();
    EXPECT_EQ(call(&bad), status);
    EXPECT_TRUE(last_error_contains(message));
    EXPECT_TRUE(all_untouched()) << "a rejected call wrote an output: " << message;
  }

private:
  static size_t size(test::HostTensor& t) { return size_t(t.numel()); }
};

// The weight quantizer through the C ABI (coda_quantize_weight_fp8 on
// coda_quantize_weight_fp8_args, built here field by field as a C caller would) gives the C++
// entry point's bytes, with the transposed copy and without it (codes_t and scales_t left zero:
// absent), on a weight ragged against the blocks with a NaN block and an infinity block; a bad
// call returns its status and the validator's message, and leaves every output byte as it was.
TEST(CAbi, QuantizeWeightFp8MatchesCppApiAndRejectsBadInput) {
  constexpr int64_t N = 208, K = 304; // blocks of 128 and 80 rows, of 128, 128 and 48 columns
  const int64_t nb = num_fp8_scale_blocks(N), kb = num_fp8_scale_blocks(K);
  test::Seeds seeds;
  test::Fp8WeightCase cpp(N, K, DType::bf16, /*non_finite=*/true, seeds);
  quantize_weight_fp8(cpp.args(test::Fp8Copies::both));
  ASSERT_EQ(cpp.check(test::Fp8Copies::both), ""); // the format's definition, block by block

  QuantizerOutputs out{
      test::HostTensor(DType::e4m3, {N, K}), test::HostTensor(DType::e8m0, {nb, kb}),
      test::HostTensor(DType::e4m3, {K, N}), test::HostTensor(DType::e8m0, {kb, nb})};
  auto &codes = out.codes, &scales = out.scales, &codes_t = out.codes_t, &scales_t = out.scales_t;

  const coda_device host = CODA_DEVICE_CPU;
  const auto ptr = [](test::HostTensor& t) { return t.host_view().data; };
  coda_quantize_weight_fp8_args ca{};
  ca.w = coda_matrix(ptr(cpp.w), CODA_BF16, N, K, host);
  ca.codes = coda_matrix(ptr(codes), CODA_E4M3, N, K, host);
  ca.scales = coda_matrix(ptr(scales), CODA_E8M0, nb, kb, host);
  coda_quantize_weight_fp8_args without_t = ca; // codes_t and scales_t zero: absent
  ca.codes_t = coda_matrix(ptr(codes_t), CODA_E4M3, K, N, host);
  ca.scales_t = coda_matrix(ptr(scales_t), CODA_E8M0, kb, nb, host);

  const auto call = [](const coda_quantize_weight_fp8_args* args) {
    return coda_quantize_weight_fp8(args, nullptr);
  };
  out.expect_written_as(call, ca, without_t,
                        {&cpp.codes, &cpp.scales, &cpp.codes_t, &cpp.scales_t});

  coda_quantize_weight_fp8_args bad = ca;
  bad.scales.dtype = CODA_F32; // fp32 scales: the C ABI writes E8M0 bytes
  out.expect_rejected(call, bad, CODA_TYPE_ERROR,
                      "quantize_weight_fp8: scales must be e8m0; got f32");
  bad = ca;
  bad.scales_t.shape[0] = nb, bad.scales_t.shape[1] = kb; // the shape of scales, not transposed
  out.expect_rejected(call, bad, CODA_INVALID_ARGUMENT,
                      "scales_t must have shape [ceil(K/128), ceil(N/128)] = [3, 2]; got [2, 3]");
  bad = without_t;
  bad.scales_t = ca.scales_t;
  out.expect_rejected(call, bad, CODA_INVALID_ARGUMENT,
                      "quantize_weight_fp8: scales_t is given but codes_t is absent; pass both or "
                      "neither");
  bad = ca;
  bad.w.shape[1] = bad.codes.shape[1] = K - 8; // rows still K elements apart
  out.expect_rejected(call, bad, CODA_NOT_SUPPORTED,
                      "quantize_weight_fp8: K must be a multiple of 16");
  EXPECT_TRUE(out.guards_intact());
  EXPECT_EQ(coda_quantize_weight_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_quantize_weight_fp8: args is NULL");
}

// The block's FP8 weight copies through the C ABI, built field by field as a C caller would:
// coda_llama_fp8_weights_size and coda_llama_first_quantize_weights give the C++ entry points'
// number and bytes; a first-layer forward given the copies in its inputs' appended fp8_weights,
// in the smaller workspace coda_llama_fp8_workspace_size gives for it, gives the
// self-quantizing forward's bits, and other bits where a given scale is doubled (the field is
// read); the self-quantizing forward in that workspace, and any bad call, returns its status
// and message and writes nothing.
TEST(CAbi, LlamaFp8WeightsMatchCppAndAreRead) {
  constexpr int64_t M = 48, D = 64, Nq = 128; // 2 query heads and 1 key/value head of 32
  llama::Config cpp_config;
  cpp_config.hidden = D;
  cpp_config.n_heads = 2;
  cpp_config.n_kv_heads = 1;
  cpp_config.head_dim = 32;
  cpp_config.precision = llama::Precision::fp8;
  const coda_llama_config config{D, 0, 2, 1, 32, 0, 1e-6f, -100, CODA_LOSS_MEAN, CODA_LLAMA_FP8};
  size_t bytes = 0;
  ASSERT_EQ(coda_llama_fp8_weights_size(CODA_LLAMA_FIRST, &config, &bytes), CODA_OK)
      << coda_last_error();
  EXPECT_EQ(bytes, llama::fp8_weights_size(llama::Layer::first, cpp_config));
  EXPECT_EQ(bytes, size_t(2 * Nq * D + 2)); // both copies' codes, one 128 x 128 block's scales

  test::Seeds seeds;
  test::HostTensor w_qkv =
      test::HostTensor::random(DType::bf16, {Nq, D}, seeds.next(), -0.125, 0.125);
  test::HostTensor attn_norm = test::HostTensor::random(DType::bf16, {D}, seeds.next(), 0.5, 1.5);
  test::HostTensor x = test::HostTensor::random(DType::bf16, {M, D}, seeds.next());
  test::HostTensor codes(DType::e4m3, {Nq, D}), scales(DType::e8m0, {1, 1});
  test::HostTensor codes_t(DType::e4m3, {D, Nq}), scales_t(DType::e8m0, {1, 1});
  test::HostTensor cpp_copies[] = {
      test::HostTensor(DType::e4m3, {Nq, D}), test::HostTensor(DType::e8m0, {1, 1}),
      test::HostTensor(DType::e4m3, {D, Nq}), test::HostTensor(DType::e8m0, {1, 1})};
  const auto bytes_of = [](test::HostTensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.host_view().data);
    return std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype()));
  };
  const coda_device host = CODA_DEVICE_CPU;
  const auto ptr = [](test::HostTensor& t) { return t.host_view().data; };
  const coda_llama_first_weights weights{coda_vector(ptr(attn_norm), CODA_BF16, D, host),
                                         coda_matrix(ptr(w_qkv), CODA_BF16, Nq, D, host)};
  const coda_llama_first_fp8_weights copies{{coda_matrix(ptr(codes), CODA_E4M3, Nq, D, host),
                                             coda_matrix(ptr(scales), CODA_E8M0, 1, 1, host),
                                             coda_matrix(ptr(codes_t), CODA_E4M3, D, Nq, host),
                                             coda_matrix(ptr(scales_t), CODA_E8M0, 1, 1, host)}};

  // A bad call first, on poisoned copies: nothing written.
  coda_llama_first_fp8_weights bad = copies;
  bad.w_qkv.codes_t = coda_matrix(ptr(codes_t), CODA_E4M3, Nq, D, host); // the forward's shape
  EXPECT_EQ(coda_llama_first_quantize_weights(&config, &weights, &bad, nullptr),
            CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains(
      "coda::llama::quantize_weights: fp8_weights.w_qkv.codes_t must have shape "
      "[hidden, qkv_width] = [64, 128]; got [128, 64]"));
  for (test::HostTensor* t : {&codes, &scales, &codes_t, &scales_t})
    for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "a rejected call wrote a copy";
  EXPECT_EQ(coda_llama_first_quantize_weights(&config, &weights, nullptr, nullptr),
            CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_llama_first_quantize_weights: fp8_weights is NULL");

  ASSERT_EQ(coda_llama_first_quantize_weights(&config, &weights, &copies, nullptr), CODA_OK)
      << coda_last_error();
  const llama::FirstFp8Weights cpp_fp8{
      {cpp_copies[0].view(), cpp_copies[1].view(), cpp_copies[2].view(), cpp_copies[3].view()}};
  llama::quantize_weights(cpp_config, llama::FirstWeights{attn_norm.view(), w_qkv.view()}, cpp_fp8);
  EXPECT_EQ(bytes_of(codes), bytes_of(cpp_copies[0]));
  EXPECT_EQ(bytes_of(scales), bytes_of(cpp_copies[1]));
  EXPECT_EQ(bytes_of(codes_t), bytes_of(cpp_copies[2]));
  EXPECT_EQ(bytes_of(scales_t), bytes_of(cpp_copies[3]));

  // The forward without the copies, with them, and with their scale doubled.
  test::HostTensor positions = test::HostTensor::of_ints({M}, test::packed_positions(M, 61, 0));
  test::HostTensor inv_freq = test::HostTensor::of(DType::f32, {16}, test::rope_inv_freq_f32(32));
  ASSERT_EQ(coda_llama_workspace_size(CODA_LLAMA_FIRST, CODA_LLAMA_FORWARD, &config, M, &bytes),
            CODA_OK);
  test::HostTensor workspace(DType::e4m3, {int64_t(bytes)}); // one byte an element
  ASSERT_EQ(coda_llama_fp8_workspace_size(CODA_LLAMA_FIRST, CODA_LLAMA_FORWARD, &config, M,
                                          CODA_LLAMA_FP8_WEIGHTS_GIVEN, &bytes),
            CODA_OK)
      << coda_last_error();
  test::HostTensor given_workspace(DType::e4m3, {int64_t(bytes)});
  ASSERT_LT(given_workspace.numel(), workspace.numel());
  // qkv's bytes, poisoned (NaN) where the call was refused.
  const auto forward = [&](const coda_llama_first_fp8_weights& fp8, test::HostTensor& ws_tensor,
                           coda_status expected = CODA_OK) {
    test::HostTensor qkv(DType::bf16, {M, Nq}), rstd(DType::f32, {M});
    const coda_llama_first_inputs inputs{coda_matrix(ptr(x), CODA_BF16, M, D, host),
                                         {coda_vector(ptr(positions), CODA_I32, M, host),
                                          coda_vector(ptr(inv_freq), CODA_F32, 16, host)},
                                         fp8};
    const coda_llama_first_outputs outputs{coda_matrix(ptr(qkv), CODA_BF16, M, Nq, host)};
    const coda_llama_first_saved saved{coda_vector(ptr(rstd), CODA_F32, M, host)};
    const coda_tensor ws = coda_vector(ptr(ws_tensor), CODA_E4M3, ws_tensor.numel(), host);
    EXPECT_EQ(coda_llama_first_forward(&config, &weights, &inputs, &outputs, &saved, &ws, nullptr),
              expected)
        << coda_last_error();
    EXPECT_TRUE(ws_tensor.guard_intact()) << "the forward wrote past its workspace";
    bool poisoned = true;
    for (test::HostTensor* t : {&qkv, &rstd})
      for (double v : t->values()) poisoned = poisoned && std::isnan(v);
    EXPECT_TRUE(expected == CODA_OK || poisoned) << "a refused call wrote an output";
    return bytes_of(qkv);
  };
  const std::vector<uint8_t> own = forward({}, workspace);
  const std::vector<uint8_t> given = forward(copies, given_workspace);
  EXPECT_EQ(own, given) << "the given copies' forward is not the self-quantizing one";
  const std::vector<uint8_t> ws_before = bytes_of(given_workspace);
  forward({}, given_workspace, CODA_INVALID_ARGUMENT); // quantizing its own: too little room
  EXPECT_TRUE(last_error_contains("inputs.fp8_weights are absent"));
  EXPECT_EQ(bytes_of(given_workspace), ws_before) << "a refused call wrote its workspace";
  *static_cast<uint8_t*>(ptr(scales)) += 1; // 2^(k + 1): the codes stand for twice the weight
  EXPECT_NE(forward(copies, given_workspace), given)
      << "the forward did not read inputs.fp8_weights";
}

// coda_llama_fp8_workspace_size is workspace_size(..., Fp8WeightCopies) for every layer and pass
// and both sources of the copies; the given size of a native config, a source that is neither,
// and a NULL bytes are each refused with the C++ message.
TEST(CAbi, LlamaFp8WorkspaceSizeMatchesCpp) {
  llama::Config cpp;
  cpp.hidden = 128, cpp.intermediate = 352, cpp.vocab = 100;
  cpp.n_heads = 4, cpp.n_kv_heads = 2, cpp.head_dim = 32;
  cpp.precision = llama::Precision::fp8;
  coda_llama_config config{128, 352, 4, 2, 32, 100, 1e-6f, -100, CODA_LOSS_MEAN, CODA_LLAMA_FP8};
  const std::pair<int32_t, int32_t> calls[] = {{CODA_LLAMA_FIRST, CODA_LLAMA_FORWARD},
                                               {CODA_LLAMA_FIRST, CODA_LLAMA_BACKWARD},
                                               {CODA_LLAMA_MIDDLE, CODA_LLAMA_FORWARD},
                                               {CODA_LLAMA_MIDDLE, CODA_LLAMA_BACKWARD},
                                               {CODA_LLAMA_MIDDLE, CODA_LLAMA_BACKWARD_PART1},
                                               {CODA_LLAMA_MIDDLE, CODA_LLAMA_BACKWARD_PART2},
                                               {CODA_LLAMA_LAST, CODA_LLAMA_FORWARD},
                                               {CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD}};
  for (const auto& [layer, pass] : calls) {
    size_t in_workspace = 0, given = 0, plain = 0;
    ASSERT_EQ(coda_llama_fp8_workspace_size(layer, pass, &config, 80,
                                            CODA_LLAMA_FP8_WEIGHTS_IN_WORKSPACE, &in_workspace),
              CODA_OK)
        << coda_last_error();
    ASSERT_EQ(coda_llama_fp8_workspace_size(layer, pass, &config, 80, CODA_LLAMA_FP8_WEIGHTS_GIVEN,
                                            &given),
              CODA_OK)
        << coda_last_error();
    ASSERT_EQ(coda_llama_workspace_size(layer, pass, &config, 80, &plain), CODA_OK);
    EXPECT_EQ(in_workspace, plain);
    EXPECT_EQ(given, llama::workspace_size(llama::Layer(layer), llama::Pass(pass), cpp, 80,
                                           llama::Fp8WeightCopies::given))
        << layer << " " << pass;
    EXPECT_LT(given, in_workspace) << layer << " " << pass;
  }
  size_t bytes = 7;
  config.precision = CODA_LLAMA_NATIVE;
  EXPECT_EQ(coda_llama_fp8_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, 80,
                                          CODA_LLAMA_FP8_WEIGHTS_GIVEN, &bytes),
            CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains("coda::llama::workspace_size: Fp8WeightCopies::given needs "
                                  "config.precision = Precision::fp8"));
  config.precision = CODA_LLAMA_FP8;
  EXPECT_EQ(
      coda_llama_fp8_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, 80, 2, &bytes),
      CODA_INVALID_ARGUMENT);
  EXPECT_TRUE(last_error_contains("copies must be Fp8WeightCopies::in_workspace or given; got 2"));
  EXPECT_EQ(bytes, 7u) << "a refused query wrote its answer";
  EXPECT_EQ(coda_llama_fp8_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, 80,
                                          CODA_LLAMA_FP8_WEIGHTS_GIVEN, nullptr),
            CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_llama_fp8_workspace_size: bytes is NULL");
}

// The activation quantizer through the C ABI (coda_quantize_activation_fp8 on
// coda_quantize_activation_fp8_args, built here field by field as a C caller would) gives the
// C++ entry point's bytes, with the transposed copy and without it (codes_t and scales_t left
// zero: absent), on an activation ragged against the blocks both ways with an infinity and a NaN
// poisoning their blocks of each copy; a bad call returns its status and the validator's message,
// and leaves every output byte as it was.
TEST(CAbi, QuantizeActivationFp8MatchesCppApiAndRejectsBadInput) {
  constexpr int64_t M = 208, K = 304; // row blocks of 128, 128 and 48 columns; 128 and 80 rows
  const int64_t mb = num_fp8_scale_blocks(M), kb = num_fp8_scale_blocks(K);
  test::Seeds seeds;
  test::Fp8ActivationCase cpp(M, K, DType::f16, /*non_finite=*/true, seeds, 4);
  quantize_activation_fp8(cpp.args(true));
  ASSERT_EQ(cpp.check(true), ""); // the format's definition, block by block

  QuantizerOutputs out{
      test::HostTensor(DType::e4m3, {M, K}), test::HostTensor(DType::e8m0, {M, kb}),
      test::HostTensor(DType::e4m3, {K, M}), test::HostTensor(DType::e8m0, {K, mb})};
  auto &codes = out.codes, &scales = out.scales, &codes_t = out.codes_t, &scales_t = out.scales_t;

  const coda_device host = CODA_DEVICE_CPU;
  const auto ptr = [](test::HostTensor& t) { return t.host_view().data; };
  coda_quantize_activation_fp8_args ca{};
  ca.x = coda_matrix(ptr(cpp.x), CODA_F16, M, K, host);
  ca.codes = coda_matrix(ptr(codes), CODA_E4M3, M, K, host);
  ca.scales = coda_matrix(ptr(scales), CODA_E8M0, M, kb, host);
  coda_quantize_activation_fp8_args without_t = ca; // codes_t and scales_t zero: absent
  ca.codes_t = coda_matrix(ptr(codes_t), CODA_E4M3, K, M, host);
  ca.scales_t = coda_matrix(ptr(scales_t), CODA_E8M0, K, mb, host);

  const auto call = [](const coda_quantize_activation_fp8_args* args) {
    return coda_quantize_activation_fp8(args, nullptr);
  };
  out.expect_written_as(call, ca, without_t,
                        {&cpp.codes, &cpp.scales, &cpp.codes_t, &cpp.scales_t});

  coda_quantize_activation_fp8_args bad = ca;
  bad.scales.dtype = CODA_F32; // fp32 scales: the C ABI writes E8M0 bytes
  out.expect_rejected(call, bad, CODA_TYPE_ERROR,
                      "quantize_activation_fp8: scales must be e8m0; got f32");
  bad = ca;
  bad.scales_t.shape[0] = kb, bad.scales_t.shape[1] = mb; // a weight's layout, one per block
  out.expect_rejected(call, bad, CODA_INVALID_ARGUMENT,
                      "scales_t must have shape [K, ceil(M/128)] = [304, 2]; got [3, 2]");
  bad = without_t;
  bad.scales_t = ca.scales_t;
  out.expect_rejected(call, bad, CODA_INVALID_ARGUMENT,
                      "quantize_activation_fp8: scales_t is given but codes_t is absent; pass both "
                      "or neither");
  bad = ca;
  bad.x.shape[1] = bad.codes.shape[1] = bad.codes_t.shape[0] = K - 8; // rows still K apart
  out.expect_rejected(call, bad, CODA_NOT_SUPPORTED,
                      "quantize_activation_fp8: K must be a multiple of 16");
  bad = ca; // the first 200 rows, with the transposed copy's rows still M codes apart
  bad.x.shape[0] = bad.codes.shape[0] = bad.scales.shape[0] = bad.codes_t.shape[1] = M - 8;
  out.expect_rejected(call, bad, CODA_NOT_SUPPORTED,
                      "quantize_activation_fp8: M must be a multiple of 16 when codes_t is given");
  EXPECT_TRUE(out.guards_intact());
  EXPECT_EQ(coda_quantize_activation_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_quantize_activation_fp8: args is NULL");
}

// Interleave and deinterleave on padded rows, through both interfaces: fused row 2j is gate row
// j, fused row 2j + 1 is up row j, padding is never written, and the round trip is exact.
template <class T> void check_gate_up(DType dtype, coda_dtype c_dtype) {
  constexpr int64_t F = 5, K = 12, stacked_pitch = 16, fused_pitch = 13;
  uint64_t seed = test::test_seed() + 20;
  const auto stacked = test::random_vector<T>(2 * F * stacked_pitch, seed);
  const T poison = store_from_float<T>(NAN);
  std::vector<T> fused_cpp(2 * F * fused_pitch, poison), fused_c = fused_cpp;

  TensorView s = make_view(const_cast<T*>(stacked.data()), dtype, 2 * F, K);
  s.stride[0] = stacked_pitch;
  TensorView f = make_view(fused_cpp.data(), dtype, 2 * F, K);
  f.stride[0] = fused_pitch;
  interleave_gate_up(s, f);

  coda_tensor cs = coda_matrix(const_cast<T*>(stacked.data()), c_dtype, 2 * F, K, CODA_DEVICE_CPU);
  cs.stride[0] = stacked_pitch;
  coda_tensor cf = coda_matrix(fused_c.data(), c_dtype, 2 * F, K, CODA_DEVICE_CPU);
  cf.stride[0] = fused_pitch;
  ASSERT_EQ(coda_interleave_gate_up(&cs, &cf, nullptr), CODA_OK) << coda_last_error();
  EXPECT_TRUE(same_bits(fused_cpp, fused_c));

  for (int64_t j = 0; j < F; ++j) {
    for (int64_t k = 0; k < fused_pitch; ++k) {
      const bool pad = k >= K;
      const T gate = pad ? poison : stacked[j * stacked_pitch + k];
      const T up = pad ? poison : stacked[(F + j) * stacked_pitch + k];
      EXPECT_EQ(std::memcmp(&fused_cpp[2 * j * fused_pitch + k], &gate, sizeof(T)), 0)
          << j << "," << k;
      EXPECT_EQ(std::memcmp(&fused_cpp[(2 * j + 1) * fused_pitch + k], &up, sizeof(T)), 0)
          << j << "," << k;
    }
  }

  std::vector<T> back(stacked.size(), poison), back_c = back;
  TensorView b = make_view(back.data(), dtype, 2 * F, K);
  b.stride[0] = stacked_pitch;
  deinterleave_gate_up(f, b);
  coda_tensor cb = coda_matrix(back_c.data(), c_dtype, 2 * F, K, CODA_DEVICE_CPU);
  cb.stride[0] = stacked_pitch;
  ASSERT_EQ(coda_deinterleave_gate_up(&cf, &cb, nullptr), CODA_OK) << coda_last_error();
  EXPECT_TRUE(same_bits(back, back_c));
  for (int64_t r = 0; r < 2 * F; ++r)
    EXPECT_EQ(std::memcmp(&back[r * stacked_pitch], &stacked[r * stacked_pitch], K * sizeof(T)), 0)
        << r;
}

TEST(CAbi, GateUpConvertersInterleaveAsDocumentedAndRoundTrip) {
  check_gate_up<bf16>(DType::bf16, CODA_BF16);
  check_gate_up<float>(DType::f32, CODA_F32);
}

// Fails on purpose: interleave with an odd number of rows.
coda_status failing_call() {
  float x[6] = {};
  const coda_tensor a = coda_matrix(x, CODA_F32, 3, 1, CODA_DEVICE_CPU);
  const coda_tensor b = coda_matrix(x + 3, CODA_F32, 3, 1, CODA_DEVICE_CPU);
  return coda_interleave_gate_up(&a, &b, nullptr);
}

coda_status succeeding_call() {
  size_t bytes = 0;
  return coda_cross_entropy_workspace_size(100, &bytes);
}

TEST(CAbi, LastErrorIsPerThreadAndKeptUntilTheNextFailure) {
  std::string fresh, after_failure, after_success;
  std::thread([&] {
    fresh = coda_last_error();
    EXPECT_EQ(failing_call(), CODA_INVALID_ARGUMENT);
    after_failure = coda_last_error();
    EXPECT_EQ(succeeding_call(), CODA_OK);
    after_success = coda_last_error();
  }).join();
  EXPECT_EQ(fresh, "");
  EXPECT_NE(after_failure.find("interleave_gate_up: stacked must have an even number of rows"),
            std::string::npos)
      << after_failure;
  EXPECT_EQ(after_success, after_failure); // successful calls leave it unchanged

  // Another thread's failure is not visible here.
  std::string here;
  std::thread([&] {
    EXPECT_EQ(succeeding_call(), CODA_OK);
    here = coda_last_error();
  }).join();
  EXPECT_EQ(here, "");
}

TEST(CAbi, WorkspaceSizeMatchesCppAndGrowsWithM) {
  size_t previous = 0;
  for (int64_t m : {0, 1, 63, 64, 65, 1000, 100000}) {
    size_t bytes = 0;
    ASSERT_EQ(coda_cross_entropy_workspace_size(m, &bytes), CODA_OK);
    EXPECT_EQ(bytes, cross_entropy_workspace_size(m));
    EXPECT_GE(bytes, size_t(m) * 8) << m; // one f32 and one i32 per row at least
    EXPECT_GE(bytes, previous);
    EXPECT_EQ(bytes % 256, 0u);
    previous = bytes;
  }
}

TEST(CAbi, VersionMatchesHeader) {
  const std::string expected = std::to_string(CODA_VERSION_MAJOR) + "." +
                               std::to_string(CODA_VERSION_MINOR) + "." +
                               std::to_string(CODA_VERSION_PATCH);
  EXPECT_EQ(expected, CODA_VERSION_STRING);
  EXPECT_EQ(std::string(coda_version()), expected);
}

} // namespace
