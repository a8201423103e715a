// How a GPU kernel's output is held to the CPU backend's on the same inputs, beside the fp64 check
// of the tolerance rule (tests/common/check.hpp), for the GPU suites of the fused backward and
// the auxiliary kernels.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/check.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

// True when a 16-bit output is within one unit in the last place of the CPU backend's, measured
// at the tensor's largest magnitude: both round an fp32 result once, and the GPU's fused
// multiply-adds and hardware exp (epilogue/math.hpp) may land the fp32 value on the other side of
// a rounding boundary, or, for a result of cancelling terms (x cos - y sin), anywhere within the
// terms' rounding error. The unfused baseline rounds as the CPU does and is often exactly its
// value, so the rule alone would ask the GPU for the CPU's bits. (The fp64 check beside it holds
// the accuracy.)
// (`rounded`: the 16-bit type whose ulp is allowed; `f32_ulps`: fp32 ulps allowed on top.)
inline bool within_ulps(const HostTensor& gpu, const HostTensor& cpu, DType rounded,
                        double f32_ulps = 0) {
  const std::vector<double> x = gpu.values(), y = cpu.values();
  double largest = 0;
  for (double v : y) largest = std::fmax(largest, std::fabs(v));
  const double bound = ulp_of(rounded, largest) + f32_ulps * ulp_of(DType::f32, largest);
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::fabs(x[i] - y[i]) <= bound)) return false;
  return true;
}
inline bool within_one_ulp(const HostTensor& gpu, const HostTensor& cpu) {
  return gpu.dtype() != DType::f32 && within_ulps(gpu, cpu, gpu.dtype());
}

// An fp32 statistic the kernels compute from values they rounded to a 16-bit type (K5's lse
// partials and target logit, from the rounded logits): the backends' fp32 accumulators may round
// a logit to neighbouring values, which moves such a statistic by up to one ulp of that type at
// the logit (the lse: the flipped logits' softmax weights sum to at most 1), and the statistic's
// own fp32 rounding, a few ulps, comes on top. Without this the rule bound it: on
// Gpu/FusedRmsLse f16_M257_V2056_K64 (e3fc239, seeds 36, 47, 11) |GPU - CPU| was one f16 ulp
// at the value (0.0156, 0.0078), twice the baseline's half-ulp distance, at 1.000 of the bound.
inline bool within_one_ulp_of_rounded(const HostTensor& gpu, const HostTensor& cpu, DType rounded) {
  return within_ulps(gpu, cpu, rounded, /*f32_ulps=*/8);
}

// The order allowance of the cross-entropy's zeta[m] = sum_n l dl (V products) in the comparison
// with the CPU backend: the first-order bound of the CPU backend's sequential fp32 sum
// (src/cpu/cross_entropy.cpp adds the V terms in column order), u sum_n |S_n| with u = 2^-24 and
// S_n the partial sums (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., (4.4);
// from the fp64 terms, largest over the rows). Why: over V = 128256 that sum drifts. Its partial
// sums reach |S| ~ 3-7 (ulp 2.4e-7-4.8e-7) while most terms are below 1e-5, so the additions
// round with errors of one sign more often than not: the CPU's zeta errs by 1.9e-4 on average
// (mostly low) and up to 1.1e-3, a drift of order n u |S|, not the sqrt(n) u |S| of independent
// roundings (up to 9.4 times sqrt(V) u sum|l dl|). The GPU sums the same fp32 terms in short
// chains (256 threads, then trees): emulated, it errs by at most 1.3e-5. The unfused baseline
// sums in the CPU's order too, and its 16-bit roundings can cancel its drift, so twice its
// distance is no bound for |GPU - CPU|: Gpu/GpuCrossEntropy bf16_M4_V128256_sum used 0.928 of it
// at seed 112 on the H100, and the GPU's order emulated on the host up to 0.984 (seed 204) over
// seeds 1-2000 (docs/reliability.md). |GPU - CPU| is at most 5% of this allowance there (0.011
// to 0.041); a smaller mistake (a thread's 1/256 of the terms, ~0.01; a lost lse partial, ~1e-3)
// is the fp64 check's to catch, which holds the GPU's zeta to twice the unfused path's error and
// is unchanged (tests/cpu/test_cpu_parity.cpp plants both kinds). What the allowance leaves out,
// the two backends' fp32 exp and lse (a few ulps of the lse), stays within the rule as before.
inline double zeta_order_allowance(const ref::CrossEntropyInputs& in,
                                   const std::vector<double>& exact_dlogits) {
  double allowance = 0;
  for (int64_t m = 0; m < in.M; ++m) {
    double partial = 0, sum = 0;
    for (int64_t n = 0; n < in.V; ++n) {
      const size_t i = size_t(m * in.V + n);
      partial += in.logits[i] * exact_dlogits[i];
      sum += std::fabs(partial);
    }
    allowance = std::fmax(allowance, 0x1p-24 * sum);
  }
  return allowance;
}

// The GPU output against the CPU backend's: empty when within one ulp of a 16-bit output (or of
// from_rounded, below), or within the rule with the CPU as the reference, whose baseline error is
// the unfused path's distance from the CPU or from the fp64 result, whichever is larger, plus
// `allowance` (the CPU's fp32 order where the unfused path's distance cannot stand for it:
// zeta_order_allowance).
inline std::string check_matches_cpu(const std::string& name, const HostTensor& gpu,
                                     const HostTensor& cpu, const std::vector<double>& exact,
                                     const std::vector<double>& unfused,
                                     DType from_rounded = DType::f32, double allowance = 0) {
  if (within_one_ulp(gpu, cpu)) return {};
  if (from_rounded != DType::f32 && within_one_ulp_of_rounded(gpu, cpu, from_rounded)) return {};
  const std::vector<double> c = cpu.values();
  double from_cpu = 0, from_exact = 0;
  for (size_t i = 0; i < c.size() && i < unfused.size() && i < exact.size(); ++i) {
    from_cpu = std::fmax(from_cpu, std::fabs(unfused[i] - c[i]));
    from_exact = std::fmax(from_exact, std::fabs(unfused[i] - exact[i]));
  }
  std::vector<double> baseline = unfused; // as far from the CPU as the larger of the two
  if (from_exact > from_cpu)
    for (size_t i = 0; i < baseline.size() && i < c.size() && i < exact.size(); ++i)
      baseline[i] = c[i] + (unfused[i] - exact[i]);
  return check_against_baseline(name + " vs the CPU backend", gpu.values(), c, baseline,
                                1e-6 + allowance);
}

// The GPU output against the fp64 reference, and against the CPU backend's output
// (check_matches_cpu). The CPU backend is itself an fp32 computation: for a long sum (the
// cross-entropy's zeta over a 128k vocabulary, summed in another order on each backend) its
// distance from the unfused path understates how far two correct summation orders land, so
// such an output is given its order's allowance (zeta_order_allowance).
// FinalRounding::allowed: the output's final rounding allowed on top (check_rounded_output,
// kernel_fixtures.hpp).
// `from_rounded`: for an fp32 statistic of values rounded to that 16-bit type
// (within_one_ulp_of_rounded); f32 (the default) for none.
enum class FinalRounding { counted, allowed };
inline void expect_matches(const std::string& name, const HostTensor& gpu, const HostTensor& cpu,
                           const std::vector<double>& exact, const std::vector<double>& unfused,
                           FinalRounding rounding = FinalRounding::counted,
                           DType from_rounded = DType::f32, double order_allowance = 0) {
  CODA_EXPECT_PASSES(rounding == FinalRounding::allowed
                         ? check_rounded_output(name, gpu, exact, unfused)
                         : check_output(name, gpu, exact, unfused));
  CODA_EXPECT_PASSES(
      check_matches_cpu(name, gpu, cpu, exact, unfused, from_rounded, order_allowance));
}

} // namespace coda::test
