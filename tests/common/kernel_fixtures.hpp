// Shared helpers of the per-kernel tests: host tensors that own their memory (poisoned with NaN
// and fenced by guard bytes), per-test seeds, and the one comparison every output goes through.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "coda/core/tensor.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"
#include "reference/kernels.hpp"

namespace coda::test {

class HostTensor;

// Where HostTensor::view() points while one is installed (tests/common/device_mirror.hpp): a
// device copy of the tensor, so that a test written against host tensors runs on the GPU
// backend unchanged.
class ViewHook {
public:
  virtual ~ViewHook() = default;
  virtual TensorView view(HostTensor& tensor, const TensorView& host) = 0;
  // After a run of calls: bring the results back to the host tensors.
  virtual void sync() = 0;
};
// Installs `hook` for the calling thread (nullptr: views are host views again); returns the
// previous one.
ViewHook* set_view_hook(ViewHook* hook);
// The installed hook's sync(), if any: call it after a run of API calls, before the host-side
// checks read the results.
void sync_views();

// A contiguous host tensor for the public API. A default-constructed one is absent (its view
// has a null pointer, for optional arguments). Guard bytes after the last element catch any
// write past the end.
class HostTensor {
public:
  HostTensor() = default;
  // Every element NaN (i32: 0x7fffffff), so an output the call forgot to write fails its check.
  HostTensor(DType dtype, std::vector<int64_t> shape);

  // Uniform in [lo, hi), rounded to dtype (not i32).
  static HostTensor random(DType dtype, std::vector<int64_t> shape, uint64_t seed, double lo = -1,
                           double hi = 1);
  // The given values, rounded to dtype (i32: truncated).
  static HostTensor of(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values);
  static HostTensor of_ints(std::vector<int64_t> shape, const std::vector<int32_t>& values);

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  TensorView view();                  // empty TensorView when absent; see ViewHook
  TensorView host_view();             // always the host memory
  std::vector<double> values() const; // the stored elements as doubles
  std::vector<int32_t> ints() const;  // the stored elements of an i32 tensor
  void poison();                      // every element NaN again
  bool guard_intact() const;

private:
  struct alignas(16) Chunk {
    unsigned char bytes[16];
  };
  unsigned char* bytes() { return storage_.empty() ? nullptr : storage_.front().bytes; }
  const unsigned char* bytes() const { return storage_.empty() ? nullptr : storage_.front().bytes; }
  void set(int64_t i, double value);
  double get(int64_t i) const;

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<Chunk> storage_; // the elements, then guard bytes
};

// The unfused path's rounding for a 16-bit (or f32) dtype.
ref::Rounding lowp(DType dtype);

// One unit in the last place of `dtype` (bf16 8 significant bits, f16 11, f32 24) at |x|, the
// spacing of the binade |x| lies in (|x| below 1e-30 counts as 1e-30).
double ulp_of(DType dtype, double x);

// Seeds for one test: test_seed() mixed with the running test's full name, then a counter, so
// each tensor of each test gets its own fresh stream.
class Seeds {
public:
  Seeds();
  // The seeds the test named `test` ("Suite.Name" as gtest prints it) gets at CODA_TEST_SEED =
  // seed: another suite's inputs replayed (a GPU test's, on the host).
  Seeds(uint64_t seed, const std::string& test);
  uint64_t next();

private:
  uint64_t state_;
};

// Uniform doubles in [lo, hi) (not rounded).
std::vector<double> random_doubles(size_t n, uint64_t seed, double lo = -1, double hi = 1);

// The fp32 floor of row partials of squares that a kernel sums from unrounded fp32 values (K0's
// sumsq_partials): each term x computed with one fp32 add, squared and summed in fp32 in any
// order, a partial of `block` terms is within (block + 2) 2^-24 of its size (to first order,
// Higham's gamma_n). The largest over `partials`: the atol of such a statistic's check, where
// the unfused path's error (the rounding of its 16-bit terms) is a sum of signed terms that may
// cancel to below the kernel's fp32 error; with one partial (M 1, N 16) nothing else bounds it.
double sumsq_partials_floor(const std::vector<double>& partials,
                            int64_t block = ref::kPartialBlock);

// An output checked by the tolerance rule (check.hpp) after its guard bytes: empty on success.
std::string check_output(const std::string& name, const HostTensor& out,
                         const std::vector<double>& exact, const std::vector<double>& unfused,
                         double atol = 1e-6);
// An output rounded once from an fp32 value whose error is comparable to the baseline's (a
// gradient summed over tokens; K6's dx from the stored g), each element allowed half an ulp of
// its dtype more: its final rounding. Both sides round once, but the baseline's largest error
// need not sit where the rounding went against this one, and where the value's own error is of
// the baseline's size the half ulp is as large as it. (Seed 6614263307427 of
// Cpu/Block.MiddleLayer/bf16_gqa: `d attn_norm`[80], exact -16.1155, coda's fp32 sum -16.0551,
// error 0.060 within twice the baseline's 0.057, rounded across the midpoint to -16: error
// 0.1155, 1.016 of the bound. Seed 2 of K6's bf16 M1_N8_K16 accumulate: dx[7] exact 1.84537,
// out 1.85156, bound 0.00429: 0.0023 before its half ulp of 0.0039.)
std::string check_rounded_output(const std::string& name, const HostTensor& out,
                                 const std::vector<double>& exact,
                                 const std::vector<double>& unfused);
// A gated activation as the K2 kernels store it, act[i] = round(Gate(z[2i], z[2i + 1])) from the
// pre-activation z *as stored* (`preact`, the same call's output), against the fp64 gate of those
// stored values: per element, within half an ulp of act's dtype (its one rounding) plus the fp32
// evaluation's error, 2^-20 (1 + |g|) |g| |u|. (That covers the device's hardware exp, relative
// 2^-21 + |g| 2^-24 in silu, and erff's 2 ulp of a value near -1 in gelu's 1 + erf, times |g| / 2;
// math.hpp.) Why not the rule on act: z's rounding can land one ulp apart on two backends (their
// fp32 sums differ), and the gate carries that ulp to act as |dGate/du| ulp(u), up to two ulps
// of act; the rule's baseline, the unfused act, rounds its own z, so the two largest errors fall
// on different elements and their ratio has a tail (a GPU act used 0.978 of the bound against
// the CPU backend's, Gpu/FusedRmsGeglu f16_M33_N272_K4200 seed 183, H100 1b6c728). z itself is
// held to the rule, so act is as accurate as its stored z allows, which is the unfused
// semantics. `activation` is the fp64 one (ref::silu, ref::gelu).
std::string check_gate_of_stored(const std::string& name, const HostTensor& act,
                                 const HostTensor& preact, double (*activation)(double));
// [rows, cols] multiples of 1/16 in [-1, 1]: a GEMM of them (K up to a few thousand, times a
// scale with a short mantissa) is exact in fp32, so a gradient as a kernel stores it (rounded
// once from the fp32 accumulator) is the same on every backend and here.
HostTensor sixteenths(DType dtype, int64_t rows, int64_t cols, uint64_t seed);

// K6's dx from g as it stores it, g = round(alpha dz · w) (dz and w sixteenths()): exact fp64
// after that, and the unfused path after it (the result rounded, then the accumulation).
struct StoredGradientDx {
  std::vector<double> exact, unfused;
};
StoredGradientDx rms_backward_dx_from_stored_g(const ref::RmsBackwardInputs& in, DType dtype);
// A scalar output (the loss, a grad scale) as a [1] tensor.
std::string check_output(const std::string& name, const HostTensor& out, double exact,
                         double unfused);

// Realistic row partials of x² for a normalized GEMM: fp32 block sums of a random x [M, width].
HostTensor random_sumsq_partials(int64_t M, int64_t width, uint64_t seed);

// Packed sequences: positions restart at 0 every seq_len tokens, the first one starting at
// first_offset (a sequence continued from an earlier chunk).
std::vector<int32_t> packed_positions(int64_t M, int64_t seq_len, int32_t first_offset);

// inv_freq of RoPE (base 10000) rounded to fp32, as the kernels read it.
std::vector<double> rope_inv_freq_f32(int64_t head_dim);

// "bf16" / "f16" for parameterized test names.
std::string dtype_label(DType dtype);

// Row-major [rows, cols] -> [cols, rows].
std::vector<double> transposed(const std::vector<double>& x, int64_t rows, int64_t cols);

// One K6 call (gemm_rms_backward) on the caller's inputs, dz [M, K], w [K, N], with alpha = 1
// and dx overwritten: the outputs are made here, poisoned, in x's dtype.
struct RmsBackwardCall {
  HostTensor &dz, &w, &x, &rstd, &zeta, &gamma;
  HostTensor dx, h_hat, dgamma_partials;
  RmsBackwardCall(HostTensor& dz, HostTensor& w, HostTensor& x, HostTensor& rstd, HostTensor& zeta,
                  HostTensor& gamma);
  RmsBackwardArgs args();
  ref::RmsBackwardInputs inputs() const;
};

// One K7 call (gemm_swiglu_backward) on the caller's inputs, dx [M, K], w [K, F],
// preact [M, 2F]: the outputs are made here, poisoned, in preact's dtype.
struct SwigluBackwardCall {
  HostTensor &dx, &w, &preact;
  HostTensor act, dpreact, zeta_partials;
  SwigluBackwardCall(HostTensor& dx, HostTensor& w, HostTensor& preact);
  SwigluBackwardArgs args();
  ref::SwigluBackwardInputs inputs() const;
};

// cross_entropy from K5-style inputs: the logits are the rounded values of an fp64 L in
// [-4, 4), the partials and target logit the fp32 statistics of L, so the unfused path (which
// only has the rounded logits) computes the same loss. Every 4th row (from row 1) is ignored,
// row 2 targets the last class; `forced_targets`, when given, replaces the targets.
struct CrossEntropyCase {
  int64_t M, V;
};
inline void PrintTo(const CrossEntropyCase& c, std::ostream* os) {
  *os << "M " << c.M << ", V " << c.V;
}
struct CrossEntropyInputs {
  HostTensor logits, lse_partials, target_logit, targets;
  ref::CrossEntropyInputs ref;
};
CrossEntropyInputs make_cross_entropy_inputs(DType dtype, const CrossEntropyCase& c,
                                             int32_t ignore_index, LossReduction reduction,
                                             Seeds& seeds,
                                             const std::vector<int32_t>& forced_targets = {});
// Poisoned outputs of one cross_entropy call.
struct CrossEntropyOutputs {
  HostTensor loss, dlogits, grad_scale, zeta;
  CrossEntropyOutputs(DType dtype, const CrossEntropyCase& c);
};
// The call on in and out (views as HostTensor::view gives them; no workspace).
CrossEntropyArgs cross_entropy_args(CrossEntropyInputs& in, CrossEntropyOutputs& out,
                                    LossReduction reduction);

// What rounding dy to `dtype` (K7's Stage) can move each of K7's zeta partials [M, blocks]:
// half_ulp_moves = sum over the block of |d(g dg + u du) / d dy| ulp(dy) / 2 (dy in fp64, or
// in.product where given: a hardware GEMM's dy, which the kernel rounds), and magnitude = sum of
// |d term / d dy| |dy| (the scale of its fp32 evaluation); product_moves = sum of
// |d term / d dy| |product - fp64 dy|, what the product's own error moves the partial (zero
// without one).
struct ZetaDyRounding {
  int64_t blocks = 0;
  std::vector<double> half_ulp_moves, magnitude, product_moves;
};
ZetaDyRounding zeta_dy_rounding(const ref::SwigluBackwardInputs& in, DType dtype);

// K7's zeta partials against the fp64 ones (the exact epilogue of the product's dy where
// `rounding` was made from one): within what rounding dy can move them, plus the fp32
// evaluation.
void expect_zeta_within_dy_rounding(const HostTensor& partials, const std::vector<double>& exact,
                                    const ZetaDyRounding& rounding);

} // namespace coda::test

namespace coda {
// GoogleTest prints a test's parameter with --gtest_list_tests and in a failure's message; found
// by argument-dependent lookup, so it lives in DType's namespace: "bf16", not a byte dump.
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }
inline void PrintTo(LossReduction reduction, std::ostream* os) {
  *os << (reduction == LossReduction::mean ? "mean" : "sum");
}
inline void PrintTo(GemmLayout layout, std::ostream* os) {
  *os << (layout == GemmLayout::fwd ? "fwd" : layout == GemmLayout::dgrad ? "dgrad" : "wgrad");
}
} // namespace coda
