// Bad input through the public C++ API and the C ABI: every case starts from a valid call (the
// ValidFixturesPass test checks that each fixture is accepted), breaks one thing, and asserts
//  * the status,
//  * that the message names the offending argument and what is wrong,
//  * that the C ABI returns the same status with the same message in coda_last_error(),
//  * that no byte of any buffer (outputs filled with a sentinel, inputs, and guard bytes around
//    every allocation) changed.
// None of these cases reaches a backend, so they do not depend on the CPU kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/abi_cast.hpp"
#include "api/checks.hpp"
#include "coda/coda.h"
#include "coda/coda.hpp"
#include "tests/common/check.hpp"

#if CODA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/backend.hpp"
#endif

namespace {

using namespace coda;

// Host memory for one test. Each tensor is its own allocation with guard bytes on both sides;
// outputs start as a sentinel pattern, inputs as zeros. unchanged() compares every byte of
// every allocation with what it held at creation.
class Arena {
public:
  TensorView matrix(DType t, int64_t rows, int64_t cols, bool output = false,
                    int64_t row_stride = 0) {
    const int64_t stride = row_stride ? row_stride : cols;
    TensorView v = make_view(alloc(size_t(rows * stride * dtype_size(t)), output), t, rows, cols);
    v.stride[0] = stride;
    return v;
  }
  TensorView vector(DType t, int64_t n, bool output = false) {
    return make_view(alloc(size_t(n * dtype_size(t)), output), t, n);
  }
  TensorView out_matrix(DType t, int64_t rows, int64_t cols) { return matrix(t, rows, cols, true); }
  TensorView out_vector(DType t, int64_t n) { return vector(t, n, true); }

  // Writes an input element and makes it part of the expected contents.
  void set_i32(const TensorView& v, int64_t i, int32_t value) {
    std::memcpy(v.ptr<int32_t>() + i, &value, sizeof value);
    for (auto& b : blocks_) b->initial = b->bytes;
  }

  bool unchanged() const {
    for (const auto& b : blocks_)
      if (b->bytes != b->initial) return false;
    return true;
  }

private:
  static constexpr size_t kGuard = 64;
  struct Block {
    std::vector<uint8_t> bytes, initial;
  };

  void* alloc(size_t bytes, bool output) {
    auto b = std::make_unique<Block>();
    b->bytes.assign(bytes + 3 * kGuard, output ? 0xA5 : 0x00);
    for (size_t i = 0; i < kGuard; ++i) b->bytes[i] = b->bytes[b->bytes.size() - 1 - i] = 0x5A;
    uint8_t* p = b->bytes.data() + kGuard;
    p += (kGuard - reinterpret_cast<uintptr_t>(p) % kGuard) % kGuard; // 64-byte aligned
    b->initial = b->bytes;
    blocks_.push_back(std::move(b));
    return p;
  }

  std::vector<std::unique_ptr<Block>> blocks_;
};

constexpr DType bf16 = DType::bf16, f16 = DType::f16, f32 = DType::f32, i32 = DType::i32;
constexpr DType e4m3 = DType::e4m3, e8m0 = DType::e8m0;

// ---------------------------------------------------------------------------------------------
// Valid calls. Ragged M; N, K multiples of 8 as the GEMM requires.
constexpr int64_t M = 5, N = 16, K = 24;

GemmArgs valid_gemm(Arena& ar) {
  GemmArgs g;
  g.a = ar.matrix(bf16, M, K);
  g.b = ar.matrix(bf16, N, K);
  g.d = ar.out_matrix(bf16, M, N);
  return g;
}

// The FP8 GEMM: K = 144, a multiple of 16 (16-byte rows of 1-byte codes), so two K blocks of
// scales, the second short.
Fp8GemmArgs valid_fp8(Arena& ar) {
  constexpr int64_t K8 = 144;
  return {.a = ar.matrix(e4m3, M, K8),
          .a_scales = ar.matrix(e8m0, M, 2),
          .b = ar.matrix(e4m3, N, K8),
          .b_scales = ar.matrix(e8m0, 1, 2),
          .d = ar.out_matrix(bf16, M, N)};
}

// The weight quantizer: w [N, K] with K = 144 (N and K multiples of 16), so one row and two
// columns of block scales, the second block short; with the transposed copy.
QuantizeWeightFp8Args valid_quantize_fp8(Arena& ar) {
  constexpr int64_t K8 = 144;
  return {.w = ar.matrix(bf16, N, K8),
          .codes = ar.out_matrix(e4m3, N, K8),
          .scales = ar.out_matrix(e8m0, 1, 2),
          .codes_t = ar.out_matrix(e4m3, K8, N),
          .scales_t = ar.out_matrix(e8m0, 2, 1)};
}

// The activation quantizer: x [16, 144] (M and K multiples of 16), so two column blocks of row
// scales, the second short, and one row block of column scales; with the transposed copy.
QuantizeActivationFp8Args valid_quantize_activation_fp8(Arena& ar) {
  constexpr int64_t M16 = 16, K8 = 144;
  return {.x = ar.matrix(bf16, M16, K8),
          .codes = ar.out_matrix(e4m3, M16, K8),
          .scales = ar.out_matrix(e8m0, M16, 2),
          .codes_t = ar.out_matrix(e4m3, K8, M16),
          .scales_t = ar.out_matrix(e8m0, K8, 1)};
}

ResidualRmsArgs valid_k0(Arena& ar) {
  return {ar.matrix(bf16, M, K),
          ar.matrix(bf16, N, K),
          ar.matrix(bf16, M, N),
          ar.vector(bf16, N),
          ar.out_matrix(bf16, M, N),
          ar.out_matrix(bf16, M, N),
          ar.out_matrix(f32, M, num_reduce_blocks(N))};
}

RmsScaleArgs valid_k1(Arena& ar) {
  return {ar.matrix(bf16, M, K),     ar.matrix(bf16, N, K), ar.matrix(f32, M, 1), 1e-6f,
          ar.out_matrix(bf16, M, N), ar.out_vector(f32, M)};
}

RmsSwigluArgs valid_k2(Arena& ar) {
  constexpr int64_t F = 8;
  return {ar.matrix(f16, M, K),         ar.matrix(f16, 2 * F, K), ar.matrix(f32, M, 2), 1e-6f,
          ar.out_matrix(f16, M, 2 * F), ar.out_matrix(f16, M, F), ar.out_vector(f32, M)};
}

RmsGegluArgs valid_k2g(Arena& ar) {
  constexpr int64_t F = 8;
  return {ar.matrix(bf16, M, K),
          ar.matrix(bf16, 2 * F, K),
          ar.matrix(f32, M, 1),
          1e-5f,
          ar.out_matrix(bf16, M, 2 * F),
          ar.out_matrix(bf16, M, F),
          {}};
}

// The shape of the message in the brief: (4 + 2*1) * 64 = 384 rows.
RmsRopeArgs valid_k4(Arena& ar) {
  constexpr int64_t m = 3, k = 256, hq = 4, hkv = 1, hd = 64, n = (hq + 2 * hkv) * hd;
  RmsRopeArgs r{ar.matrix(bf16, m, k),
                ar.matrix(bf16, n, k),
                ar.matrix(f32, m, 1),
                1e-5f,
                {ar.vector(i32, m), ar.vector(f32, hd / 2), hq, hkv, hd},
                ar.out_matrix(bf16, m, n),
                {}};
  return r;
}

RmsLseArgs valid_k5(Arena& ar) {
  constexpr int64_t V = 24;
  return {ar.matrix(bf16, M, K),    ar.matrix(bf16, V, K),
          ar.matrix(f32, M, 1),     1e-6f,
          ar.vector(i32, M),        ar.out_matrix(bf16, M, V),
          ar.out_matrix(f32, M, 1), ar.out_vector(f32, M),
          ar.out_vector(f32, M)};
}

RmsBackwardArgs valid_k6(Arena& ar) {
  RmsBackwardArgs r;
  r.dz = ar.matrix(bf16, M, K);
  r.w = ar.matrix(bf16, K, N);
  r.x = ar.matrix(bf16, M, N);
  r.rstd = ar.vector(f32, M);
  r.zeta = ar.vector(f32, M);
  r.gamma = ar.vector(bf16, N);
  r.alpha = {0.5f, ar.vector(f32, 1)};
  r.dx = ar.out_matrix(bf16, M, N);
  r.h_hat = ar.out_matrix(bf16, M, N);
  r.dgamma_partials = ar.out_matrix(f32, N, num_reduce_blocks(M));
  return r;
}

SwigluBackwardArgs valid_k7(Arena& ar) {
  constexpr int64_t F = 16;
  return {ar.matrix(bf16, M, K),         ar.matrix(bf16, K, F),
          ar.matrix(bf16, M, 2 * F),     ar.out_matrix(bf16, M, F),
          ar.out_matrix(bf16, M, 2 * F), ar.out_matrix(f32, M, num_staged_reduce_blocks(F))};
}

// K7 on E4M3 operands writing act's transposed FP8 copy in place of act: M = 144 (a multiple
// of 16, two 128-token blocks, the second short), F = 16, K = 32.
SwigluBackwardArgs valid_k7_fp8_copy(Arena& ar) {
  constexpr int64_t M16 = 144, F = 16, K8 = 32;
  return {.dx = ar.matrix(e4m3, M16, K8),
          .w = ar.matrix(e4m3, F, K8),
          .preact = ar.matrix(bf16, M16, 2 * F),
          .act = {},
          .dpreact = ar.out_matrix(bf16, M16, 2 * F),
          .zeta_partials = ar.out_matrix(f32, M16, num_staged_reduce_blocks(F)),
          .dx_scales = ar.matrix(e8m0, M16, 1),
          .w_scales = ar.matrix(e8m0, 1, 1),
          .act_codes_t = ar.out_matrix(e4m3, F, M16),
          .act_scales_t = ar.out_matrix(e8m0, 1, 2)};
}

RmsStatsArgs valid_stats(Arena& ar) {
  return {ar.matrix(bf16, M, N), ar.vector(bf16, N), ar.out_matrix(bf16, M, N),
          ar.out_matrix(f32, M, 1)};
}

RstdArgs valid_rstd(Arena& ar) { return {ar.matrix(f32, M, 3), N, 1e-6f, ar.out_vector(f32, M)}; }
RowReduceArgs valid_row_reduce(Arena& ar) {
  return {ar.matrix(f32, M, 3), 1.f / N, ar.out_vector(f32, M)};
}
ColReduceArgs valid_col_reduce(Arena& ar) {
  return {ar.matrix(f32, N, 2), false, ar.out_vector(bf16, N)};
}

RopeBackwardArgs valid_rope_backward(Arena& ar) {
  constexpr int64_t hq = 2, hkv = 1, hd = 8, n = (hq + 2 * hkv) * hd;
  return {ar.matrix(bf16, M, n),
          ar.matrix(bf16, M, n),
          {ar.vector(i32, M), ar.vector(f32, hd / 2), hq, hkv, hd},
          1.f / n,
          ar.out_matrix(bf16, M, n),
          ar.out_vector(f32, M)};
}

CrossEntropyArgs valid_ce(Arena& ar) {
  constexpr int64_t V = 32;
  CrossEntropyArgs c;
  c.logits = ar.matrix(bf16, M, V);
  c.lse_partials = ar.matrix(f32, M, 1);
  c.target_logit = ar.vector(f32, M);
  c.targets = ar.vector(i32, M); // zeros: valid targets
  ar.set_i32(c.targets, 1, c.ignore_index);
  c.loss = ar.out_vector(f32, 1);
  c.dlogits = ar.out_matrix(bf16, M, V);
  c.grad_scale = ar.out_vector(f32, 1);
  c.zeta = ar.out_vector(f32, M);
  return c;
}

// The converters, as one call.
struct GateUp {
  bool interleave;
  TensorView src, dst;
};
GateUp valid_gate_up(Arena& ar) { return {true, ar.matrix(f32, 8, 12), ar.out_matrix(f32, 8, 12)}; }

// ---------------------------------------------------------------------------------------------
// The same call through both interfaces: the C ABI gets the C twin of the C++ Args (the same
// layout, src/api/abi_cast.hpp).
using api::to_c;

// The GEMMs, the two quantizers and every kernel of the tables in coda/kernels/args.hpp.
#define CODA_BOTH_INTERFACES(fn, Args)                                                             \
  void call_cpp(const Args& a) { fn(a); }                                                          \
  coda_status call_c(const Args& a) {                                                              \
    const auto c = to_c(a);                                                                        \
    return coda_##fn(&c, nullptr);                                                                 \
  }
CODA_BOTH_INTERFACES(gemm, GemmArgs)
CODA_BOTH_INTERFACES(gemm_fp8, Fp8GemmArgs)
CODA_BOTH_INTERFACES(quantize_weight_fp8, QuantizeWeightFp8Args)
CODA_BOTH_INTERFACES(quantize_activation_fp8, QuantizeActivationFp8Args)
CODA_FUSED_KERNELS(CODA_BOTH_INTERFACES)
CODA_AUX_KERNELS(CODA_BOTH_INTERFACES)
#undef CODA_BOTH_INTERFACES

coda_status call_c(const GateUp& g) {
  const coda_tensor src = to_c(g.src), dst = to_c(g.dst);
  return g.interleave ? coda_interleave_gate_up(&src, &dst, nullptr)
                      : coda_deinterleave_gate_up(&src, &dst, nullptr);
}

void call_cpp(const GateUp& g) {
  if (g.interleave)
    interleave_gate_up(g.src, g.dst);
  else
    deinterleave_gate_up(g.src, g.dst);
}

Device validate_only(const GateUp& g) {
  return g.interleave
             ? api::validate_gate_up("interleave_gate_up", "stacked", g.src, "fused", g.dst)
             : api::validate_gate_up("deinterleave_gate_up", "fused", g.src, "stacked", g.dst);
}
template <class Args> Device validate_only(const Args& a) { return api::validate(a); }

// The assertion of every case: rejected with `status` through both interfaces, the message
// contains each of `mentions` (the first names the argument), and memory is untouched.
template <class Args>
void expect_rejected(const Arena& arena, const Args& args, Status status,
                     const std::vector<const char*>& mentions) {
  std::string message;
  try {
    call_cpp(args);
    ADD_FAILURE() << "the C++ API accepted the call";
  } catch (const Error& e) {
    message = e.what();
    EXPECT_EQ(int(e.status()), int(status)) << message;
  }
  for (const char* m : mentions)
    EXPECT_NE(message.find(m), std::string::npos) << "message lacks \"" << m << "\": " << message;
  EXPECT_TRUE(arena.unchanged()) << "the C++ API touched memory before rejecting: " << message;

  EXPECT_EQ(int(call_c(args)), int(status));
  EXPECT_EQ(std::string(coda_last_error()), message);
  EXPECT_TRUE(arena.unchanged()) << "the C ABI touched memory before rejecting: " << message;
}

// ---------------------------------------------------------------------------------------------
TEST(ApiValidation, ValidFixturesPass) {
  Arena ar;
  EXPECT_EQ(validate_only(valid_gemm(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_fp8(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_quantize_fp8(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_quantize_activation_fp8(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k0(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k1(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k2(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k2g(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k4(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k5(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k6(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k7(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_k7_fp8_copy(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_stats(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_rstd(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_row_reduce(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_col_reduce(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_rope_backward(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_ce(ar)), Device::cpu);
  EXPECT_EQ(validate_only(valid_gate_up(ar)), Device::cpu);
  EXPECT_TRUE(ar.unchanged());
}

// Each row: a valid fixture, one thing broken, the status both interfaces return and what the
// message says (the first mention names the argument); expect_rejected also holds every byte of
// memory unchanged.
struct Rejection {
  const char* name;
  std::function<void(Arena&)> check;
};
void PrintTo(const Rejection& r, std::ostream* os) { *os << r.name; }

template <class Args>
Rejection reject(const char* name, Args (*valid)(Arena&),
                 std::type_identity_t<std::function<void(Arena&, Args&)>> breaks, Status status,
                 std::vector<const char*> mentions) {
  return {name, [=](Arena& ar) {
            Args args = valid(ar);
            breaks(ar, args);
            expect_rejected(ar, args, status, mentions);
          }};
}

const Rejection kRejections[] = {
    // --- dtypes
    reject("WrongDtype", valid_gemm, [](Arena&, GemmArgs& g) { g.a.dtype = f32; },
           Status::type_error, {"gemm: a must be bf16 or f16; got f32"}),
    reject("MismatchedHalfDtypes", valid_gemm, [](Arena&, GemmArgs& g) { g.b.dtype = f16; },
           Status::type_error, {"b and a must have the same dtype", "b f16, a bf16"}),
    reject("OutputDtypeDiffersFromInputs", valid_k0,
           [](Arena&, ResidualRmsArgs& k0) { k0.out_scaled.dtype = f16; }, Status::type_error,
           {"out_scaled and a must have the same dtype"}),
    reject("StatisticsMustBeF32", valid_k1,
           [](Arena&, RmsScaleArgs& k1) { k1.sumsq_partials.dtype = bf16; }, Status::type_error,
           {"sumsq_partials must be f32; got bf16"}),
    reject("PositionsMustBeI32", valid_k4,
           [](Arena&, RmsRopeArgs& k4) { k4.rope.positions.dtype = f32; }, Status::type_error,
           {"rope.positions must be i32; got f32"}),
    reject("Fp8ScalesOnlyWithE4m3Operands", valid_k4,
           [](Arena& ar, RmsRopeArgs& k4) { k4.a_scales = ar.matrix(e8m0, 3, 2); },
           Status::invalid_argument,
           {"gemm_rms_rope: a_scales and w_scales go with E4M3 operands; a is bf16"}),
    reject("Fp8OperandsNeedTheirScales", valid_k4,
           [](Arena& ar, RmsRopeArgs& k4) {
             k4.a = ar.matrix(e4m3, 3, 256);
             k4.w = ar.matrix(e4m3, 384, 256);
           },
           Status::invalid_argument, {"gemm_rms_rope: a_scales is required"}),
    reject("Fp8OperandsBothE4m3", valid_k4,
           [](Arena& ar, RmsRopeArgs& k4) {
             k4.a = ar.matrix(e4m3, 3, 256);
             k4.a_scales = ar.matrix(e8m0, 3, 2);
             k4.w_scales = ar.matrix(e8m0, 3, 2);
           },
           Status::type_error, {"gemm_rms_rope: w must be e4m3; got bf16"}),
    reject("Fp8ScalesOnlyWithE4m3OperandsK1", valid_k1,
           [](Arena& ar, RmsScaleArgs& k1) {
             k1.a_scales = ar.matrix(e8m0, M, 1);
             k1.w_scales = ar.matrix(e8m0, 1, 1);
           },
           Status::invalid_argument,
           {"gemm_rms_scale: a_scales and w_scales go with E4M3 operands; a is bf16"}),
    reject("Fp8OperandsNeedTheirScalesK0", valid_k0,
           [](Arena& ar, ResidualRmsArgs& k0) {
             k0.a = ar.matrix(e4m3, M, 32);
             k0.w = ar.matrix(e4m3, N, 32);
             k0.a_scales = ar.matrix(e8m0, M, 1);
           },
           Status::invalid_argument, {"gemm_residual_rms: w_scales is required"}),
    reject("Fp8ScalesOnlyWithE4m3OperandsK6", valid_k6,
           [](Arena& ar, RmsBackwardArgs& k6) { k6.dz_scales = ar.matrix(e8m0, M, 1); },
           Status::invalid_argument,
           {"gemm_rms_backward: dz_scales and w_scales go with E4M3 operands; dz is bf16"}),
    reject("Fp8WeightOfK6IsTheTransposedCopy", valid_k6,
           [](Arena& ar, RmsBackwardArgs& k6) {
             k6.dz = ar.matrix(e4m3, M, 32);
             k6.dz_scales = ar.matrix(e8m0, M, 1);
             k6.w = ar.matrix(e4m3, 32, N); // as the 16-bit form stores it: [K, N]
             k6.w_scales = ar.matrix(e8m0, 1, 1);
           },
           Status::invalid_argument, {"gemm_rms_backward: w must have shape [N, K]"}),
    reject("Fp8ScalesOnlyWithE4m3OperandsK7", valid_k7,
           [](Arena& ar, SwigluBackwardArgs& k7) { k7.w_scales = ar.matrix(e8m0, 1, 1); },
           Status::invalid_argument,
           {"gemm_swiglu_backward: dx_scales and w_scales go with E4M3 operands; dx is bf16"}),
    reject("Fp8OperandsNeedTheirScalesK7", valid_k7,
           [](Arena& ar, SwigluBackwardArgs& k7) {
             k7.dx = ar.matrix(e4m3, M, 32);
             k7.w = ar.matrix(e4m3, 16, 32); // [F, K]
             k7.w_scales = ar.matrix(e8m0, 1, 1);
           },
           Status::invalid_argument, {"gemm_swiglu_backward: dx_scales is required"}),
    reject("Fp8WeightOfK7IsTheTransposedCopy", valid_k7,
           [](Arena& ar, SwigluBackwardArgs& k7) {
             k7.dx = ar.matrix(e4m3, M, 32);
             k7.dx_scales = ar.matrix(e8m0, M, 1);
             k7.w = ar.matrix(e4m3, 32, 16); // as the 16-bit form stores it: [K, F]
             k7.w_scales = ar.matrix(e8m0, 1, 1);
           },
           Status::invalid_argument, {"gemm_swiglu_backward: w must have shape [F, K]"}),
    reject("Fp8ActCopyOnlyOnE4m3OperandsK7", valid_k7,
           [](Arena& ar, SwigluBackwardArgs& k7) {
             k7.act = {};
             k7.act_codes_t = ar.out_matrix(e4m3, 16, M);
             k7.act_scales_t = ar.out_matrix(e8m0, 1, 1);
           },
           Status::invalid_argument,
           {"gemm_swiglu_backward: act_codes_t is given but dx and w are 16-bit"}),
    reject("ActAndItsFp8CopyNotBothK7", valid_k7_fp8_copy,
           [](Arena& ar, SwigluBackwardArgs& k7) { k7.act = ar.out_matrix(bf16, 144, 16); },
           Status::invalid_argument, {"gemm_swiglu_backward: act and act_codes_t are both given"}),
    reject("Fp8ActCopyNeedsMMultipleOf16K7", valid_k7_fp8_copy,
           [](Arena& ar, SwigluBackwardArgs& k7) { // M = 136: every M-long tensor remade
             k7.dx = ar.matrix(e4m3, 136, 32);
             k7.dx_scales = ar.matrix(e8m0, 136, 1);
             k7.preact = ar.matrix(bf16, 136, 32);
             k7.dpreact = ar.out_matrix(bf16, 136, 32);
             k7.zeta_partials = ar.out_matrix(f32, 136, 1);
             k7.act_codes_t = ar.out_matrix(e4m3, 16, 136);
           },
           Status::not_supported, {"gemm_swiglu_backward: M must be a multiple of 16", "pad it to 144"}),
    reject("Fp8ActCopyNeedsItsScalesK7", valid_k7_fp8_copy,
           [](Arena&, SwigluBackwardArgs& k7) { k7.act_scales_t = {}; }, Status::invalid_argument,
           {"gemm_swiglu_backward: act_scales_t is required"}),
    reject("Fp8ActCopyScalesShapeK7", valid_k7_fp8_copy,
           [](Arena& ar, SwigluBackwardArgs& k7) { k7.act_scales_t = ar.out_matrix(e8m0, 1, 1); },
           Status::invalid_argument,
           {"gemm_swiglu_backward: act_scales_t must have shape [ceil(F/128), ceil(M/128)]"}),
    reject("GammaMustBe16Bit", valid_k0, [](Arena&, ResidualRmsArgs& k0) { k0.gamma.dtype = f32; },
           Status::type_error, {"gamma must be bf16 or f16; got f32"}),
    reject("ColumnReduceOutputCannotBeI32", valid_col_reduce,
           [](Arena&, ColReduceArgs& r) { r.out.dtype = i32; }, Status::type_error,
           {"out must be bf16, f16 or f32; got i32"}),
    reject("Fp8ScalesMustBeE8m0", valid_fp8, [](Arena&, Fp8GemmArgs& g) { g.b_scales.dtype = f32; },
           Status::type_error, {"gemm_fp8: b_scales must be e8m0; got f32"}),
    reject("Fp8CodesMustBeE4m3", valid_fp8, [](Arena&, Fp8GemmArgs& g) { g.a.dtype = bf16; },
           Status::type_error, {"gemm_fp8: a must be e4m3; got bf16"}),
    reject("QuantizeFp8WeightMustBeFloat", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) { q.w.dtype = i32; }, Status::type_error,
           {"quantize_weight_fp8: w must be bf16, f16 or f32; got i32"}),
    reject("QuantizeFp8TransposedScalesMustBeE8m0", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) { q.scales_t.dtype = e4m3; }, Status::type_error,
           {"quantize_weight_fp8: scales_t must be e8m0; got e4m3"}),
    reject("QuantizeActivationFp8XMustBeFloat", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.x.dtype = i32; }, Status::type_error,
           {"quantize_activation_fp8: x must be bf16, f16 or f32; got i32"}),
    reject("QuantizeActivationFp8TransposedCodesMustBeE4m3", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.codes_t.dtype = e8m0; }, Status::type_error,
           {"quantize_activation_fp8: codes_t must be e4m3; got e8m0"}),
    reject("UnknownDtypeValue", valid_gemm, [](Arena&, GemmArgs& g) { g.d.dtype = DType(9); },
           Status::type_error, {"d has an unknown dtype 9"}),
    reject("ConverterDtypesMustMatch", valid_gate_up,
           [](Arena&, GateUp& c) {
             c.dst.dtype = i32; // same size, other dtype
           },
           Status::type_error, {"fused and stacked must have the same dtype"}),
    // --- shapes: one mismatch in each kernel
    reject("GemmShapeMismatch", valid_gemm, [](Arena&, GemmArgs& g) { g.b.shape[1] = K - 8; },
           Status::invalid_argument, {"gemm: b must have shape [N, K] = [N, 24]; got [16, 16]"}),
    reject("GemmDgradLayoutShapes", valid_gemm,
           [](Arena&, GemmArgs& g) {
             g.layout = GemmLayout::dgrad; // b is now read as [K, N] = [24, 16]; it is [16, 24]
           },
           Status::invalid_argument, {"b must have shape [K, N] = [24, N]; got [16, 24]"}),
    reject("Fp8ScaleBlocksAreCeilOfK", valid_fp8,
           [](Arena&, Fp8GemmArgs& g) { g.a_scales.shape[1] = 1; }, Status::invalid_argument,
           {"gemm_fp8: a_scales must have shape [M, ceil(K/128)] = [5, 2]; got [5, 1]"}),
    reject("Fp8RowScalesOfBHaveARowPerRow", valid_fp8,
           [](Arena&, Fp8GemmArgs& g) { g.b_scaling = Fp8BScaling::rows; },
           Status::invalid_argument,
           {"gemm_fp8: b_scales must have shape [N, ceil(K/128)] = [16, 2]; got [1, 2]"}),
    reject("Fp8UnknownBScaling", valid_fp8,
           [](Arena&, Fp8GemmArgs& g) { g.b_scaling = static_cast<Fp8BScaling>(-1); },
           Status::invalid_argument,
           {"gemm_fp8: b_scaling must be blocks (0) or rows (1); got -1"}),
    reject("Fp8OutputIsBf16OrF32", valid_fp8,
           [](Arena& ar, Fp8GemmArgs& g) { g.d = ar.out_matrix(f16, M, N); }, Status::type_error,
           {"gemm_fp8: d must be bf16 or f32; got f16"}),
    reject("QuantizeFp8TransposedScalesAreTransposed", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) {
             std::swap(q.scales_t.shape[0], q.scales_t.shape[1]);
           },
           Status::invalid_argument,
           {"quantize_weight_fp8: scales_t must have shape [ceil(K/128), ceil(N/128)] = [2, 1]; "
            "got [1, 2]"}),
    reject("QuantizeFp8TransposedScalesNeedTheCodes", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) { q.codes_t = {}; }, Status::invalid_argument,
           {"quantize_weight_fp8: scales_t is given but codes_t is absent; pass both or neither"}),
    reject("QuantizeActivationFp8TransposedScalesPerColumn", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) {
             std::swap(q.scales_t.shape[0], q.scales_t.shape[1]);
           },
           Status::invalid_argument,
           {"quantize_activation_fp8: scales_t must have shape [K, ceil(M/128)] = [144, 1]; "
            "got [1, 144]"}),
    reject("QuantizeActivationFp8ScalesPerRow", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.scales.shape[0] = 1; },
           Status::invalid_argument,
           {"quantize_activation_fp8: scales must have shape [M, ceil(K/128)] = [16, 2]; "
            "got [1, 2]"}),
    reject("QuantizeActivationFp8TransposedCodesAreTransposed", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) {
             q.codes_t.shape[0] = 16, q.codes_t.shape[1] = 144, q.codes_t.stride[0] = 144;
           },
           Status::invalid_argument,
           {"quantize_activation_fp8: codes_t must have shape [K, M] = [144, 16]; got [16, 144]"}),
    reject("QuantizeActivationFp8TransposedScalesNeedTheCodes", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.codes_t = {}; }, Status::invalid_argument,
           {"quantize_activation_fp8: scales_t is given but codes_t is absent; pass both or "
            "neither"}),
    reject("QuantizeActivationFp8TransposedCodesNeedTheScales", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.scales_t = {}; }, Status::invalid_argument,
           {"quantize_activation_fp8: scales_t is required; got a null data pointer"}),
    reject("ResidualRmsShapeMismatch", valid_k0,
           [](Arena&, ResidualRmsArgs& k0) { k0.residual.shape[0] = M - 1; },
           Status::invalid_argument,
           {"gemm_residual_rms: residual must have shape [M, N] = [5, 16]; got [4, 16]"}),
    reject("RmsScaleShapeMismatch", valid_k1,
           [](Arena&, RmsScaleArgs& k1) { k1.rstd_out.shape[0] = M + 1; }, Status::invalid_argument,
           {"rstd_out must have shape [M] = [5]; got [6]"}),
    reject("RmsSwigluShapeMismatch", valid_k2,
           [](Arena&, RmsSwigluArgs& k2) {
             k2.act.shape[1] = 16; // act is [M, F], not [M, 2F]
             k2.act.stride[0] = 16;
           },
           Status::invalid_argument, {"act must have shape [M, F] = [5, 8]; got [5, 16]"}),
    reject("RmsGegluShapeMismatchNamesTheKernel", valid_k2g,
           [](Arena&, RmsGegluArgs& k2g) { k2g.preact.shape[1] = 8; }, Status::invalid_argument,
           {"gemm_rms_geglu: preact must have shape [M, 2F] = [5, 16]; got [5, 8]"}),
    reject("RmsRopeWeightShapeNamesTheFormula", valid_k4,
           [](Arena&, RmsRopeArgs& k4) { k4.w.shape[0] = 380; }, Status::invalid_argument,
           {"gemm_rms_rope: w must have shape [(n_q_heads + 2*n_kv_heads)*head_dim, K] = "
            "[384, 256]; got [380, 256]"}),
    reject("RmsLseShapeMismatch", valid_k5, [](Arena&, RmsLseArgs& k5) { k5.logits.shape[1] = 16; },
           Status::invalid_argument, {"logits must have shape [M, V] = [5, 24]; got [5, 16]"}),
    reject("RmsBackwardShapeMismatch", valid_k6,
           [](Arena&, RmsBackwardArgs& k6) { k6.zeta.shape[0] = 3; }, Status::invalid_argument,
           {"zeta must have shape [M] = [5]; got [3]"}),
    reject("SwigluBackwardShapeMismatch", valid_k7,
           [](Arena&, SwigluBackwardArgs& k7) { k7.preact.shape[1] = 16; },
           Status::invalid_argument, {"preact must have shape [M, 2F] = [5, 32]; got [5, 16]"}),
    reject("RmsStatsShapeMismatch", valid_stats,
           [](Arena&, RmsStatsArgs& s) { s.gamma.shape[0] = 8; }, Status::invalid_argument,
           {"rms_stats: gamma must have shape [N] = [16]; got [8]"}),
    reject("RowReduceShapeMismatch", valid_row_reduce,
           [](Arena&, RowReduceArgs& r) { r.out.shape[0] = 4; }, Status::invalid_argument,
           {"out must have shape [M] = [5]; got [4]"}),
    reject("RopeBackwardShapeMismatch", valid_rope_backward,
           [](Arena&, RopeBackwardArgs& r) {
             r.rope.inv_freq.shape[0] = 8; // head_dim, not head_dim / 2
           },
           Status::invalid_argument, {"rope.inv_freq must have shape [head_dim/2] = [4]; got [8]"}),
    reject("CrossEntropyShapeMismatch", valid_ce,
           [](Arena&, CrossEntropyArgs& c) { c.loss.shape[0] = 2; }, Status::invalid_argument,
           {"loss must have shape [1] = [1]; got [2]"}),
    reject("WrongRank", valid_gemm,
           [](Arena&, GemmArgs& g) {
             g.a.rank = 3;
             g.a.shape[2] = 1;
             g.a.stride[2] = 1;
           },
           Status::invalid_argument, {"a must be a 2-D tensor [M, K]; got rank 3"}),
    // --- GEMM dimensions
    reject("MZeroIsAnError", valid_gemm,
           [](Arena&, GemmArgs& g) {
             g.a.shape[0] = 0;
             g.d.shape[0] = 0;
           },
           Status::invalid_argument, {"M must be >= 1; got 0 (from a"}),
    reject("NNotMultipleOf8", valid_gemm,
           [](Arena& ar, GemmArgs& g) {
             g.b.shape[0] = 12;
             g.d = ar.out_matrix(bf16, M, 16);
             g.d.shape[1] = 12;
           },
           Status::not_supported,
           {"N must be a multiple of 8", "got 12 (from b, shape [12, 24])", "pad it to 16"}),
    reject("WgradMIsARowWidth", valid_gemm,
           [](Arena& ar, GemmArgs& g) {
             g.layout = GemmLayout::wgrad; // a [K, M]: its rows hold M elements
             g.a = ar.matrix(bf16, K, M, false, 8);
             g.b = ar.matrix(bf16, K, N);
           },
           Status::not_supported, {"M must be a multiple of 8", "from a, shape [24, 5]"}),
    reject("KNotMultipleOf8", valid_k0,
           [](Arena&, ResidualRmsArgs& k0) {
             k0.a.shape[1] = 20;
             k0.w.shape[1] = 20;
           },
           Status::not_supported, {"K must be a multiple of 8", "from a"}),
    reject("Fp8KNotMultipleOf16", valid_fp8,
           [](Arena&, Fp8GemmArgs& g) {
             g.a.shape[1] = g.b.shape[1] = 136; // rows still 144 bytes apart
           },
           Status::not_supported, {"gemm_fp8: K must be a multiple of 16", "got 136"}),
    reject("QuantizeFp8NNotMultipleOf16", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) { q.w.shape[0] = 8; }, Status::not_supported,
           {"quantize_weight_fp8: N must be a multiple of 16", "got 8"}),
    reject("QuantizeActivationFp8KNotMultipleOf16", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) {
             q.x.shape[1] = q.codes.shape[1] = q.codes_t.shape[0] = 136; // rows still 144 apart
           },
           Status::not_supported,
           {"quantize_activation_fp8: K must be a multiple of 16", "got 136"}),
    reject("QuantizeActivationFp8MNotMultipleOf16WithTheTranspose", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) {
             q.x.shape[0] = q.codes.shape[0] = q.scales.shape[0] = q.codes_t.shape[1] = 8;
           },
           Status::not_supported,
           {"quantize_activation_fp8: M must be a multiple of 16 when codes_t is given", "got 8",
            "leave codes_t and scales_t absent"}),
    reject("SwigluWeightRowsMustBeEven", valid_k2,
           [](Arena&, RmsSwigluArgs& k2) { k2.w.shape[0] = 15; }, Status::invalid_argument,
           {"w must have an even number of rows", "got 15"}),
    reject("GegluWeightRowsMustBeEven", valid_k2g,
           [](Arena&, RmsGegluArgs& k2g) { k2g.w.shape[0] = 17; }, Status::invalid_argument,
           {"gemm_rms_geglu: w must have an even number of rows", "got 17"}),
    reject("SwigluHalfWidthMultipleOf8", valid_k2,
           [](Arena&, RmsSwigluArgs& k2) {
             k2.w.shape[0] = 12; // F = 6
           },
           Status::not_supported, {"F must be a multiple of 8", "from w"}),
    reject("OddHeadDim", valid_k4, [](Arena&, RmsRopeArgs& k4) { k4.rope.head_dim = 63; },
           Status::invalid_argument, {"rope.head_dim must be even", "got 63"}),
    reject("ZeroKvHeads", valid_rope_backward,
           [](Arena&, RopeBackwardArgs& r) { r.rope.n_kv_heads = 0; }, Status::invalid_argument,
           {"rope.n_kv_heads must be >= 1; got 0"}),
    // --- partial widths
    reject("ProducerPartialWidthIsExact", valid_k0,
           [](Arena& ar, ResidualRmsArgs& k0) { k0.sumsq_partials = ar.out_matrix(f32, M, 2); },
           Status::invalid_argument,
           {"sumsq_partials must have shape [M, ceil(N/128)] = [5, 1]; got [5, 2]"}),
    reject("ConsumerPartialWidthAtLeastOne", valid_k1,
           [](Arena&, RmsScaleArgs& k1) { k1.sumsq_partials.shape[1] = 0; },
           Status::invalid_argument,
           {"sumsq_partials must have shape [M, P] = [5, P >= 1]; got [5, 0]"}),
    reject("ColumnPartialWidth", valid_k6,
           [](Arena& ar, RmsBackwardArgs& k6) {
             k6.dgamma_partials = ar.out_matrix(f32, M, 1); // [M, .] instead of [N, ceil(M/128)]
           },
           Status::invalid_argument,
           {"dgamma_partials must have shape [N, ceil(M/128)] = [16, 1]; got [5, 1]"}),
    reject("SwigluBackwardPartialWidth", valid_k7,
           [](Arena& ar, SwigluBackwardArgs& k7) { k7.zeta_partials = ar.out_matrix(f32, M, 2); },
           Status::invalid_argument, {"zeta_partials must have shape [M, ceil(F/64)]"}),
    // --- strides, alignment, pointers
    reject("NonContiguousStrides", valid_gemm,
           [](Arena&, GemmArgs& g) {
             g.d.stride[0] = 1;
             g.d.stride[1] = M; // column-major
           },
           Status::invalid_argument,
           {"d must be row-contiguous (stride[1] == 1, stride[0] >= shape[1]); got strides [1, "
            "5]"}),
    reject(
        "RowStrideNot16Bytes", valid_k0,
        [](Arena& ar, ResidualRmsArgs& k0) { k0.residual = ar.matrix(bf16, M, N, false, N + 4); },
        Status::invalid_argument,
        {"residual must have a row stride", "multiple of 8 elements (16 bytes", "got 20"}),
    reject("StridedVector", valid_k6, [](Arena&, RmsBackwardArgs& k6) { k6.rstd.stride[0] = 2; },
           Status::invalid_argument, {"rstd must be contiguous (stride[0] == 1)"}),
    reject("MisalignedPointer", valid_gemm,
           [](Arena&, GemmArgs& g) { g.b.data = static_cast<char*>(g.b.data) + 1; },
           Status::invalid_argument, {"b must be aligned to its 2-byte elements; got pointer 0x"}),
    reject("NullRequiredPointer", valid_k5,
           [](Arena&, RmsLseArgs& k5) { k5.target_logit.data = nullptr; }, Status::invalid_argument,
           {"target_logit is required; got a null data pointer"}),
    reject("StridesThatOverflow", valid_row_reduce,
           [](Arena&, RowReduceArgs& r) { r.partials.stride[0] = int64_t(1) << 62; },
           Status::invalid_argument, {"partials is too large to address"}),
    // --- scalars and combinations
    reject("BetaWithoutC", valid_gemm, [](Arena&, GemmArgs& g) { g.beta = 1.f; },
           Status::invalid_argument, {"beta is 1", "c is absent"}),
    reject("NegativeEps", valid_k1, [](Arena&, RmsScaleArgs& k1) { k1.eps = -1e-6f; },
           Status::invalid_argument, {"eps must be >= 0"}),
    reject("NonFiniteAlpha", valid_k6, [](Arena&, RmsBackwardArgs& k6) { k6.alpha.value = NAN; },
           Status::invalid_argument, {"alpha must be finite"}),
    reject("ScalarTensorShape", valid_k6,
           [](Arena& ar, RmsBackwardArgs& k6) { k6.alpha.tensor = ar.vector(f32, 2); },
           Status::invalid_argument, {"alpha.tensor must have shape [1] = [1]; got [2]"}),
    reject("RstdNeedsWidth", valid_rstd, [](Arena&, RstdArgs& r) { r.n = 0; },
           Status::invalid_argument, {"n (the RMSNorm width) must be >= 1; got 0"}),
    reject("CrossEntropyTargetOutOfRange", valid_ce,
           [](Arena& ar, CrossEntropyArgs& c) { ar.set_i32(c.targets, 3, 32); },
           Status::invalid_argument,
           {"targets[3] = 32 is outside [0, V) = [0, 32) and is not ignore_index (-100)"}),
    reject("CrossEntropyWorkspaceTooSmall", valid_ce,
           [](Arena& ar, CrossEntropyArgs& c) { c.workspace = ar.out_vector(i32, 4); },
           Status::invalid_argument,
           {"workspace must hold cross_entropy_workspace_size(M) = 512 bytes; got 16"}),
    reject("ConverterNeedsEvenRows", valid_gate_up,
           [](Arena&, GateUp& c) { c.src.shape[0] = c.dst.shape[0] = 7; }, Status::invalid_argument,
           {"stacked must have an even number of rows", "got 7"}),
    // --- devices
    reject("MixedHostAndDeviceLabels", valid_gemm,
           [](Arena&, GemmArgs& g) { g.b.device = Device::cuda; }, Status::invalid_argument,
           {"b is on cuda:0 but a is on cpu; all tensors of one call must be on one device"}),
    reject("GemmWorkspaceOnAnotherDevice", valid_gemm,
           [](Arena& ar, GemmArgs& g) {
             g.workspace = ar.out_vector(f32, 64);
             g.workspace.device = Device::cuda;
           },
           Status::invalid_argument,
           {"workspace is on cuda:0 but a is on cpu; all tensors of one call must be on one "
            "device"}),
    reject("UnknownDeviceLabel", valid_stats,
           [](Arena&, RmsStatsArgs& s) { s.out_scaled.device = Device(5); },
           Status::invalid_argument, {"out_scaled has an unknown device label 5"}),
    // --- overlap and aliases
    reject("OutputOverlapsInput", valid_k0,
           [](Arena&, ResidualRmsArgs& k0) {
             k0.out_scaled.data = k0.a.data; // [5, 16] over a's [5, 24]
             k0.out_scaled.stride[0] = K;
           },
           Status::invalid_argument, {"out_scaled overlaps a in memory"}),
    reject("OutputsOverlapEachOther", valid_k7,
           [](Arena&, SwigluBackwardArgs& k7) {
             k7.act.data =
                 static_cast<char*>(k7.dpreact.data) + 2 * 8; // inside dpreact's first row
             k7.act.stride[0] = 32;
           },
           Status::invalid_argument, {"overlaps", "act", "dpreact"}),
    reject("AliasMustBeExact", valid_rope_backward,
           [](Arena&, RopeBackwardArgs& r) {
             r.dz = r.dqkv;
             r.dz.data = static_cast<char*>(r.dqkv.data) + 16; // 8 elements further
           },
           Status::invalid_argument, {"dz may alias dqkv only exactly"}),
    reject("Fp8OutputOverlapsScales", valid_fp8,
           [](Arena&, Fp8GemmArgs& g) { g.a_scales.data = g.d.data; }, Status::invalid_argument,
           {"d overlaps a_scales in memory"}),
    reject("QuantizeFp8CopiesOverlap", valid_quantize_fp8,
           [](Arena&, QuantizeWeightFp8Args& q) { q.codes_t.data = q.codes.data; },
           Status::invalid_argument, {"quantize_weight_fp8: codes overlaps codes_t in memory"}),
    reject("QuantizeActivationFp8CopiesOverlap", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.codes_t.data = q.codes.data; },
           Status::invalid_argument, {"quantize_activation_fp8: codes overlaps codes_t in memory"}),
    reject("QuantizeActivationFp8OutputOverlapsTheInput", valid_quantize_activation_fp8,
           [](Arena&, QuantizeActivationFp8Args& q) { q.scales_t.data = q.x.data; },
           Status::invalid_argument, {"quantize_activation_fp8: scales_t overlaps x in memory"}),
    reject("UndocumentedAlias", valid_k6,
           [](Arena&, RmsBackwardArgs& k6) {
             k6.dx = k6.x; // x is an input; dx may not alias it
           },
           Status::invalid_argument, {"dx overlaps x in memory"}),
    reject("ConverterOverlap", valid_gate_up,
           [](Arena&, GateUp& c) {
             c.interleave = false;
             c.dst = c.src;
           },
           Status::invalid_argument, {"stacked overlaps fused in memory"}),
};

class Rejects : public ::testing::TestWithParam<Rejection> {};

TEST_P(Rejects, WithTheStatusAMessageAndUntouchedMemory) {
  Arena ar;
  GetParam().check(ar);
}

INSTANTIATE_TEST_SUITE_P(ApiValidation, Rejects, ::testing::ValuesIn(kRejections),
                         [](const auto& info) { return std::string(info.param.name); });

// A [1] tensor's stride is irrelevant (PyTorch reports 0 for an expanded scalar, e.g. a loss
// gradient): accepted, and read as its one element.
TEST(ApiValidation, SizeOneVectorTakesAnyStride) {
  Arena ar;
  RmsBackwardArgs k6 = valid_k6(ar);
  k6.alpha.tensor.stride[0] = 0;
  EXPECT_NO_THROW(gemm_rms_backward(k6));
}

// The GEMM's alpha and the row reduce's scale are Scalars like K6's alpha: a finite value and
// an optional [1] f32 tensor on the call's device, which no output may overlap.
TEST(ApiValidation, GemmAlphaScalar) {
  Arena ar;
  GemmArgs g = valid_gemm(ar);
  g.alpha = {0.5f, ar.vector(f32, 1)};
  EXPECT_EQ(validate_only(g), Device::cpu);
  g.alpha.value = INFINITY;
  expect_rejected(ar, g, Status::invalid_argument, {"gemm: alpha must be finite"});
  g.alpha = {0.5f, ar.vector(bf16, 1)};
  expect_rejected(ar, g, Status::type_error, {"gemm: alpha.tensor must be f32; got bf16"});
  g.alpha = {0.5f, ar.vector(f32, 2)};
  expect_rejected(ar, g, Status::invalid_argument,
                  {"gemm: alpha.tensor must have shape [1] = [1]; got [2]"});
  g.alpha = {0.5f, ar.matrix(f32, 1, 1)};
  expect_rejected(ar, g, Status::invalid_argument,
                  {"gemm: alpha.tensor must be a 1-D tensor [1]; got rank 2"});
  g.alpha = {0.5f, ar.vector(f32, 1)};
  g.alpha.tensor.device = Device::cuda;
  expect_rejected(ar, g, Status::invalid_argument,
                  {"alpha.tensor is on cuda:0 but a is on cpu; all tensors of one call must be on "
                   "one device"});
  g.alpha = {0.5f, make_view(g.d.data, f32, 1)}; // inside d
  expect_rejected(ar, g, Status::invalid_argument, {"d overlaps alpha.tensor in memory"});
}

TEST(ApiValidation, RowReduceScaleScalar) {
  Arena ar;
  RowReduceArgs r = valid_row_reduce(ar);
  r.scale = {0.25f, ar.vector(f32, 1)};
  EXPECT_EQ(validate_only(r), Device::cpu);
  r.scale.value = NAN;
  expect_rejected(ar, r, Status::invalid_argument, {"reduce_row_partials: scale must be finite"});
  r.scale = {0.25f, ar.vector(i32, 1)};
  expect_rejected(ar, r, Status::type_error,
                  {"reduce_row_partials: scale.tensor must be f32; got i32"});
  r.scale = {0.25f, ar.vector(f32, 3)};
  expect_rejected(ar, r, Status::invalid_argument,
                  {"scale.tensor must have shape [1] = [1]; got [3]"});
  r.scale = {0.25f, ar.vector(f32, 1)};
  r.scale.tensor.device = Device::cuda;
  expect_rejected(ar, r, Status::invalid_argument,
                  {"scale.tensor is on cuda:0 but partials is on cpu"});
  r.scale = {0.25f, make_view(r.out.data, f32, 1)}; // the first element of out
  expect_rejected(ar, r, Status::invalid_argument, {"out overlaps scale.tensor in memory"});
}

TEST(ApiValidation, UnknownLayoutAndReduction) {
  Arena ar;
  GemmArgs g = valid_gemm(ar);
  g.layout = GemmLayout(7);
  expect_rejected(ar, g, Status::invalid_argument,
                  {"layout must be fwd (0), dgrad (1) or wgrad (2); got 7"});
  CrossEntropyArgs c = valid_ce(ar);
  c.reduction = LossReduction(2);
  expect_rejected(ar, c, Status::invalid_argument,
                  {"reduction must be mean (0) or sum (1); got 2"});
}

TEST(ApiValidation, GemmWorkspaceMustBeContiguousAndApart) {
  Arena ar;
  GemmArgs g = valid_gemm(ar);
  g.workspace = ar.out_vector(f32, 64);
  g.workspace.stride[0] = 2;
  expect_rejected(ar, g, Status::invalid_argument,
                  {"workspace must be contiguous (stride[0] == 1); got strides [2]"});
  g.workspace = make_view(g.d.data, f32, 8); // over d
  expect_rejected(ar, g, Status::invalid_argument, {"d overlaps workspace in memory"});
}

// Host memory labelled cuda: without the CUDA backend that is not_supported; with it, the CUDA
// runtime sees host memory (or no usable device at all).
TEST(ApiValidation, DeviceLabelOnHostMemory) {
  Arena ar;
  GemmArgs g = valid_gemm(ar);
  for (TensorView* t : {&g.a, &g.b, &g.d}) t->device = Device::cuda;
  std::string message;
  try {
    gemm(g);
  } catch (const Error& e) {
    message = e.what();
#if CODA_WITH_CUDA
    if (e.status() == Status::invalid_argument)
      EXPECT_NE(message.find("a is labelled cuda but points to host memory"), std::string::npos)
          << message;
    else
      EXPECT_EQ(int(e.status()), int(Status::not_supported)) << message;
#else
    EXPECT_EQ(int(e.status()), int(Status::not_supported)) << message;
    EXPECT_NE(message.find("a is labelled cuda, but this build of coda has no CUDA backend"),
              std::string::npos)
        << message;
#endif
  }
  EXPECT_FALSE(message.empty()) << "host memory labelled cuda was accepted";
  EXPECT_TRUE(ar.unchanged());
}

// The documented aliases, interleaved views of one buffer, and absent optional tensors pass.
TEST(ApiValidation, DocumentedAliasesAndDisjointViewsPass) {
  Arena ar;
  ResidualRmsArgs k0 = valid_k0(ar);
  k0.out = k0.residual;
  // The two column halves of one [M, 2N] buffer are disjoint although their byte ranges
  // interleave: one may be an input and the other an output.
  TensorView wide = ar.out_matrix(bf16, M, 2 * N);
  k0.out_scaled = wide;
  k0.out_scaled.shape[1] = N;
  TensorView other_half = k0.out_scaled;
  other_half.data = static_cast<char*>(wide.data) + N * 2;
  EXPECT_EQ(api::validate(k0), Device::cpu);
  RmsStatsArgs s = valid_stats(ar);
  s.out_scaled = other_half;
  s.x = k0.out_scaled; // reads one half, writes the other
  EXPECT_EQ(api::validate(s), Device::cpu);

  GemmArgs g = valid_gemm(ar);
  g.c = g.d;
  g.beta = 1.f;
  EXPECT_EQ(api::validate(g), Device::cpu);
  RopeBackwardArgs r = valid_rope_backward(ar);
  r.dz = r.dqkv;
  EXPECT_EQ(api::validate(r), Device::cpu);
  CrossEntropyArgs c = valid_ce(ar);
  c.dlogits = c.logits;
  EXPECT_EQ(api::validate(c), Device::cpu);
  RmsScaleArgs k1 = valid_k1(ar);
  k1.rstd_out = {};
  EXPECT_EQ(api::validate(k1), Device::cpu);
  QuantizeWeightFp8Args q = valid_quantize_fp8(ar);
  q.codes_t = q.scales_t = {}; // no transposed copy
  EXPECT_EQ(api::validate(q), Device::cpu);
  QuantizeActivationFp8Args qa = valid_quantize_activation_fp8(ar);
  qa.codes_t = qa.scales_t = {}; // no transposed copy: M need not be a multiple of 16
  qa.x.shape[0] = qa.codes.shape[0] = qa.scales.shape[0] = 5;
  EXPECT_EQ(api::validate(qa), Device::cpu);
  EXPECT_TRUE(ar.unchanged());
}

// Two row-strided views of one buffer, as converter source and destination: rejected exactly
// when they share a byte, whenever the exact test applies (equal row pitches or a single row);
// with different pitches the test may be conservative but never misses an overlap.
TEST(ApiValidation, OverlapAgreesWithBruteForce) {
  std::mt19937_64 rng(coda::test::test_seed());
  std::vector<float> buffer(4096);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int exact_cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    TensorView x[2];
    std::vector<bool> covered[2];
    const int64_t k = pick(1, 9);
    const bool same_pitch = trial % 2 == 0;
    const int64_t shared_pitch = pick(k, 24);
    for (int i = 0; i < 2; ++i) {
      const int64_t rows = 2 * pick(1, i == 0 && trial % 5 == 0 ? 1 : 6);
      const int64_t pitch = same_pitch ? shared_pitch : pick(k, 24);
      const int64_t offset = pick(0, 400);
      x[i] = make_view(buffer.data() + offset, DType::f32, rows, k);
      x[i].stride[0] = pitch;
      covered[i].assign(buffer.size(), false);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) covered[i][size_t(offset + r * pitch + c)] = true;
    }
    x[1].shape[0] = x[0].shape[0]; // the converter wants equal shapes
    covered[1].assign(buffer.size(), false);
    const auto off1 = x[1].ptr<float>() - buffer.data();
    for (int64_t r = 0; r < x[1].shape[0]; ++r)
      for (int64_t c = 0; c < k; ++c) covered[1][size_t(off1 + r * x[1].stride[0] + c)] = true;
    bool shared = false;
    for (size_t b = 0; b < buffer.size(); ++b) shared |= covered[0][b] && covered[1][b];

    bool rejected = false;
    try {
      api::validate_gate_up("interleave_gate_up", "stacked", x[0], "fused", x[1]);
    } catch (const Error& e) {
      rejected = true;
      EXPECT_NE(std::string(e.what()).find("fused overlaps stacked"), std::string::npos)
          << e.what();
    }
    const bool exact = x[0].stride[0] == x[1].stride[0];
    exact_cases += exact;
    if (exact || shared) {
      EXPECT_EQ(rejected, shared) << "trial " << trial;
    }
  }
  EXPECT_GT(exact_cases, 1000);
}

TEST(ApiValidation, NullArgsThroughTheCAbi) {
  EXPECT_EQ(coda_gemm(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_gemm: args is NULL");
  EXPECT_EQ(coda_gemm_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_gemm_fp8: args is NULL");
  EXPECT_EQ(coda_quantize_weight_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_quantize_weight_fp8: args is NULL");
  EXPECT_EQ(coda_quantize_activation_fp8(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_quantize_activation_fp8: args is NULL");
  EXPECT_EQ(coda_cross_entropy(nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_cross_entropy: args is NULL");
  coda_tensor t{};
  EXPECT_EQ(coda_interleave_gate_up(&t, nullptr, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_STREQ(coda_last_error(), "coda_interleave_gate_up: fused is NULL");
  EXPECT_EQ(coda_cross_entropy_workspace_size(4, nullptr), CODA_INVALID_ARGUMENT);
  size_t bytes = 1;
  EXPECT_EQ(coda_cross_entropy_workspace_size(-1, &bytes), CODA_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, 1u);
  EXPECT_NE(std::string(coda_last_error()).find("m must be >= 0; got -1"), std::string::npos);
}

// --- with the CUDA backend and a device: what the runtime says about each pointer ----------------
#if CODA_WITH_CUDA

bool gemm_gpu_supported() {
  const bool supported = gpu::device_supported();
  cudaGetLastError();
  return supported;
}

bool cuda_device_present() {
  int n = 0;
  const bool present = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return present;
}

// Device memory for one test, every byte a sentinel; unchanged() copies it back and checks.
class DeviceArena {
public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (const Block& b : blocks_) cudaFree(b.ptr);
  }
  TensorView matrix(DType t, int64_t rows, int64_t cols) {
    return make_view(alloc(size_t(rows * cols * dtype_size(t))), t, rows, cols, Device::cuda);
  }
  TensorView vector(DType t, int64_t n) {
    return make_view(alloc(size_t(n * dtype_size(t))), t, n, Device::cuda);
  }
  bool unchanged() const {
    for (const Block& b : blocks_) {
      std::vector<uint8_t> host(b.bytes);
      if (cudaMemcpy(host.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return false;
      for (uint8_t x : host)
        if (x != kSentinel) return false;
    }
    return true;
  }

private:
  static constexpr uint8_t kSentinel = 0xA5;
  struct Block {
    void* ptr;
    size_t bytes;
  };
  void* alloc(size_t bytes) {
    bytes += 64; // room for the misaligned views below
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, kSentinel, bytes), cudaSuccess);
    blocks_.push_back({p, bytes});
    return p;
  }
  std::vector<Block> blocks_;
};

GemmArgs device_gemm(DeviceArena& dev) {
  GemmArgs g;
  g.a = dev.matrix(bf16, M, K);
  g.b = dev.matrix(bf16, N, K);
  g.d = dev.matrix(bf16, M, N);
  return g;
}

// Runs `call`, expecting rejection with `status` and a message containing `mention`.
template <class Call> void expect_error(Call call, Status status, const std::string& mention) {
  try {
    call();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.status()), int(status)) << e.what();
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(ApiValidationCuda, DeviceMemoryLabelledCpu) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  Arena ar;
  DeviceArena dev;
  GemmArgs g = valid_gemm(ar);
  g.d = dev.matrix(bf16, M, N);
  g.d.device = Device::cpu;
  expect_rejected(ar, g, Status::invalid_argument,
                  {"d is labelled cpu but points to memory of cuda:"});
  EXPECT_TRUE(dev.unchanged());
}

TEST(ApiValidationCuda, HostMemoryLabelledCuda) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  Arena ar;
  DeviceArena dev;
  GemmArgs g = device_gemm(dev);
  g.a = ar.matrix(bf16, M, K);
  g.a.device = Device::cuda;
  expect_rejected(ar, g, Status::invalid_argument,
                  {"a is labelled cuda but points to host memory"});
  EXPECT_TRUE(dev.unchanged());
}

TEST(ApiValidationCuda, WrongDeviceIndex) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  DeviceArena dev;
  RmsStatsArgs s{dev.matrix(bf16, M, N), dev.vector(bf16, N), dev.matrix(bf16, M, N),
                 dev.matrix(f32, M, 1)};
  for (TensorView* t : {&s.x, &s.gamma, &s.out_scaled, &s.sumsq_partials}) t->device_index = 7;
  expect_error([&] { rms_stats(s); }, Status::invalid_argument,
               "x is labelled cuda:7 but points to memory of cuda:");
  EXPECT_TRUE(dev.unchanged());
}

TEST(ApiValidationCuda, GpuPathNeeds16ByteAlignment) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  DeviceArena dev;
  GemmArgs g = device_gemm(dev);
  g.b.data = static_cast<char*>(g.b.data) + 8; // element-aligned, not 16-byte aligned
  expect_error([&] { gemm(g); }, Status::invalid_argument,
               "gemm: b must be 16-byte aligned for the GPU path; got pointer 0x");
  EXPECT_TRUE(dev.unchanged());
}

// A device GEMM whose alpha tensor is host memory (labelled cuda, or labelled cpu) is rejected
// before any launch: the kernel could not read it.
TEST(ApiValidationCuda, GemmAlphaTensorOnTheHost) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  Arena ar;
  DeviceArena dev;
  GemmArgs g = device_gemm(dev);
  g.alpha = {2.f, ar.vector(f32, 1)};
  expect_rejected(ar, g, Status::invalid_argument, {"alpha.tensor is on cpu but a is on cuda:0"});
  g.alpha.tensor.device = Device::cuda;
  expect_rejected(ar, g, Status::invalid_argument,
                  {"alpha.tensor is labelled cuda but points to host memory"});
  EXPECT_TRUE(dev.unchanged());
}

// A stream-K-eligible shape: fewer units than the GPU has clusters, long K (the cost model
// splits them on any Hopper GPU). A workspace 4 bytes short is rejected before any launch,
// with the size it needs; the size query agrees through both interfaces.
TEST(ApiValidationCuda, GemmWorkspaceTooSmall) {
  if (!cuda_device_present() || !gemm_gpu_supported()) GTEST_SKIP() << "no sm_90 device";
  DeviceArena dev;
  GemmArgs g;
  g.a = dev.matrix(bf16, 512, 4096);
  g.b = dev.matrix(bf16, 1024, 4096);
  g.d = dev.matrix(bf16, 512, 1024);
  const size_t needed = gemm_workspace_size(g);
  ASSERT_GT(needed, 0u);
  ASSERT_EQ(needed % 4, 0u);
  // The query from shapes alone (what the Llama block sizes its workspace with) agrees.
  EXPECT_EQ(gemm_workspace_size(GemmLayout::fwd, 512, 1024, 4096, bf16), needed);
  coda_gemm_args c{};
  c.layout = CODA_GEMM_FWD;
  c.a = to_c(g.a), c.b = to_c(g.b), c.d = to_c(g.d);
  c.alpha = coda_scalar_value(1.f);
  size_t bytes = 0;
  ASSERT_EQ(coda_gemm_workspace_size(&c, &bytes), CODA_OK) << coda_last_error();
  EXPECT_EQ(bytes, needed);

  g.workspace = dev.vector(f32, int64_t(needed / 4) - 1);
  expect_error([&] { gemm(g); }, Status::invalid_argument,
               "gemm: workspace holds " + std::to_string(needed - 4) +
                   " bytes but this call needs " + std::to_string(needed));
  c.workspace = to_c(g.workspace);
  EXPECT_EQ(coda_gemm(&c, nullptr), CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find(std::to_string(needed)), std::string::npos);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(dev.unchanged());
}

// The device converters (strided row copies on a stream) give the host converters' bytes.
TEST(ApiValidationCuda, DeviceConvertersMatchHost) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t F = 6, Kc = 10, pitch = 16;
  const auto stacked =
      coda::test::random_vector<coda::bf16>(2 * F * pitch, coda::test::test_seed() + 30);
  std::vector<coda::bf16> fused_host(2 * F * Kc);
  TensorView s = make_view(const_cast<coda::bf16*>(stacked.data()), bf16, 2 * F, Kc);
  s.stride[0] = pitch;
  interleave_gate_up(s, make_view(fused_host.data(), bf16, 2 * F, Kc));

  DeviceArena dev;
  TensorView s_dev = dev.matrix(bf16, 2 * F, pitch), f_dev = dev.matrix(bf16, 2 * F, Kc);
  TensorView back_dev = dev.matrix(bf16, 2 * F, pitch);
  ASSERT_EQ(cudaMemcpy(s_dev.data, stacked.data(), stacked.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  s_dev.shape[1] = back_dev.shape[1] = Kc;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  interleave_gate_up(s_dev, f_dev, stream);
  deinterleave_gate_up(f_dev, back_dev, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);

  std::vector<coda::bf16> fused_dev(fused_host.size()), back(stacked.size());
  ASSERT_EQ(cudaMemcpy(fused_dev.data(), f_dev.data, fused_dev.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), back_dev.data, back.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(fused_dev.data(), fused_host.data(), fused_host.size() * 2), 0);
  for (int64_t r = 0; r < 2 * F; ++r) {
    EXPECT_EQ(std::memcmp(&back[r * pitch], &stacked[r * pitch], Kc * 2), 0) << r;
    for (int64_t k = Kc; k < pitch; ++k)
      EXPECT_EQ(back[r * pitch + k].bits, 0xA5A5) << "padding written";
  }
}

#endif // CODA_WITH_CUDA

} // namespace
