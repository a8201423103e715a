// One block-scaled FP8 GEMM problem (Fp8GemmArgs) for the CPU and the GPU suites: random values
// whose magnitude changes from scale block to scale block (a scale read from the wrong block
// then moves a result by powers of two), quantized the way docs/fp8.md's recipe does, and the
// two results every output is held to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coda/gemm/problem.hpp"
#include "reference/fp8.hpp"
#include "reference/kernels.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

// Independent statements of the E4M3 format (OCP), for tests of coda/core/fp8.hpp and of what is
// built on it: the value of a code from the definition, in fp64: (-1)^s 2^(e-7) (1 + m/8), or
// 2^-6 (m/8) when e = 0; and the code fp32 x converts to, by search: the nearest of the 127
// non-negative finite values (ties to the even code), the sign kept (so a negative value that
// rounds to 0 is -0, 0x80), magnitudes from 448 up (infinity included) saturated, NaN to 0x7F.
double e4m3_grid_value(int code);
int e4m3_nearest_code(float x);
// The scale exponent of a block of n values, by search: the smallest k with amax <= 448 2^k in
// fp64, at least -126; kNoScale for a block holding a NaN or an infinity.
int e4m3_block_exponent(const float* block, int64_t n);

// An FP8 GEMM call's variant: how b_scales scale b, d's dtype, and whether d accumulates (then d
// holds random old values, else NaN).
struct Fp8GemmOptions {
  Fp8BScaling b_scaling = Fp8BScaling::blocks;
  DType d = DType::bf16;
  bool accumulate = false;
  // Each scale block's values are normal samples times 2^e, e uniform in [-max_binade,
  // max_binade] per block (an f16 output wants a smaller range: products span 2^(4 max_binade)).
  int max_binade = 6;
};

struct Fp8GemmCase {
  using Options = Fp8GemmOptions;
  int64_t m, n, k;
  Options options;
  ref::Fp8Blocks qa, qb;                  // the operands as quantized: a [M, K], b [N, K]
  HostTensor a, a_scales, b, b_scales, d; // the call's tensors, d [M, N] guarded
  std::vector<double> d_before;           // accumulate: d's old values

  Fp8GemmCase(int64_t m, int64_t n, int64_t k, Seeds& seeds, Options options = {});
  // The views of the tensors (HostTensor::view: device copies under a DeviceMirror).
  Fp8GemmArgs args();
  // Rows of b per scale: 128 (blocks) or 1 (rows).
  int64_t b_block_rows() const;
  // The values the codes and scales stand for, in fp64: a [M, K], b [N, K].
  std::vector<double> a_values() const;
  std::vector<double> b_values() const;
  // b's values as [K, N]: the weight of an input-gradient kernel, whose E4M3 b is its transposed
  // copy.
  std::vector<double> b_values_transposed() const;
  // A normalized GEMM's inputs (K1, K2, K4: a and w = b) on those values.
  ref::NormedGemmInputs normed_inputs(const HostTensor& partials, float eps) const;
  // fp64 GEMM of the dequantized operands (the values the codes and scales stand for, exactly),
  // plus d's old values when it accumulates.
  std::vector<double> exact() const;
  // The ordinary unfused path: the dequantized operands in fp32, multiplied with fp32
  // accumulation in K order, d's old value added in fp32, rounded once to d's dtype.
  std::vector<double> unfused() const;
  // Per element, the sum over K of |A(m, k) B(n, k)| of the dequantized operands, in fp64: the
  // scale of the rounding errors of any order of summation.
  std::vector<double> magnitude() const;
};

// Which copies a weight's quantization writes: codes and scales (rows), codes_t and scales_t
// (transposed), or both.
enum class Fp8Copies { rows, transposed, both };
inline bool has_rows(Fp8Copies c) { return c != Fp8Copies::transposed; }
inline bool has_transposed(Fp8Copies c) { return c != Fp8Copies::rows; }
// An activation's codes are always written; `transposed` adds its transposed copy.
inline bool has_rows(bool) { return true; }
inline bool has_transposed(bool transposed) { return transposed; }
inline const char* copies_name(Fp8Copies c) {
  return c == Fp8Copies::rows ? "codes" : c == Fp8Copies::transposed ? "codes_t" : "both copies";
}

// One weight to quantize (QuantizeWeightFp8Args) for the CPU and GPU suites: values of one
// magnitude per 128 x 128 block (2^-max_binade .. 2^max_binade from block to block), optionally a
// NaN in one block and an infinity in another; the outputs poisoned (NaN codes and scales) with
// guard bytes.
struct Fp8WeightCase {
  int64_t n, k;
  HostTensor w, codes, scales, codes_t, scales_t;

  Fp8WeightCase(int64_t n, int64_t k, DType dtype, bool non_finite, Seeds& seeds,
                int max_binade = 20);
  QuantizeWeightFp8Args args(Fp8Copies copies);
  // Empty when the copies asked for are the format's definition applied to w block by block
  // (e4m3_block_exponent, e4m3_nearest_code) and the guard bytes are intact; else the first
  // differences.
  std::string check(Fp8Copies copies) const;
};

// One activation (or gradient) to quantize (QuantizeActivationFp8Args) for the CPU and GPU suites:
// x(r, c) = normal * 2^(a_r + b_c + e_(r/128, c/128)), a per row and b per column in
// [-max_shift, max_shift], e per 128 x 128 tile in [-max_binade, max_binade], so that a row's
// block and a column's block through one value see other magnitudes (a copy quantized with the
// other copy's blocks fails);
// optionally an infinity at (0, 0) and a NaN at (M-1, K-1); the outputs poisoned (NaN codes and
// scales) with guard bytes.
struct Fp8ActivationCase {
  int64_t m, k;
  HostTensor x, codes, scales, codes_t, scales_t;

  Fp8ActivationCase(int64_t m, int64_t k, DType dtype, bool non_finite, Seeds& seeds,
                    int max_binade = 20, int max_shift = 4);
  QuantizeActivationFp8Args args(bool transposed);
  // Empty when codes and scales (and, with `transposed`, codes_t and scales_t) are the format's
  // definition applied to x's row blocks (and to its column blocks) one by one
  // (e4m3_block_exponent, e4m3_nearest_code) and the guard bytes are intact; else the first
  // differences.
  std::string check(bool transposed) const;
  // The values the quantized copy stands for, exactly (code * scale in fp64): [M, K] from codes
  // and scales, or, `transposed`, [K, M] from codes_t and scales_t.
  std::vector<double> dequantized(bool transposed) const;
};

} // namespace coda::test
