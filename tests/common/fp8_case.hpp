// One block-scaled FP8 GEMM problem (Fp8GemmArgs) for the CPU and the GPU suites: random values
// whose magnitude changes from scale block to scale block (a scale read from the wrong block
// then moves a result by powers of two), quantized the way docs/fp8.md's recipe does, and the
// two results every output is held to.
#pragma once

#include <cstdint>
#include <vector>

#include "coda/gemm/problem.hpp"
#include "reference/fp8.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

struct Fp8GemmCase {
  int64_t m, n, k;
  ref::Fp8Blocks qa, qb;                  // the operands as quantized: a [M, K], b [N, K]
  HostTensor a, a_scales, b, b_scales, d; // the call's tensors; d bf16 [M, N], poisoned (NaN)

  Fp8GemmCase(int64_t m, int64_t n, int64_t k, Seeds& seeds);
  // The views of the tensors (HostTensor::view: device copies under a DeviceMirror).
  Fp8GemmArgs args();
  // fp64 GEMM of the dequantized operands (the values the codes and scales stand for, exactly).
  std::vector<double> exact() const;
  // The ordinary unfused path: the dequantized operands in fp32, multiplied with fp32
  // accumulation in K order, rounded once to bf16.
  std::vector<double> unfused() const;
};

} // namespace coda::test
