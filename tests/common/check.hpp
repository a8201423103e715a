// The one tolerance policy and the seeded random fills every test uses.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "coda/core/types.hpp"

namespace coda::test {

// Fresh inputs each run unless CODA_TEST_SEED is set; a failing test prints the seed that
// replays it (CODA_TEST_SEED=<seed>). Iteration i of --gtest_repeat runs seed base + i.
uint64_t test_seed();

// Uniform in [lo, hi), rounded to T's precision and returned as T.
template <class T>
std::vector<T> random_vector(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = store_from_float<T>(dist(rng));
  return v;
}

template <class T> std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = double(load_as_float(v[i]));
  return out;
}
template <class T> std::vector<float> to_float(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = load_as_float(v[i]);
  return out;
}

// ARCHITECTURE section 7: an output passes when
//   max|out - ref| <= 2 * max|baseline - ref| + atol    (atol = 1e-6)
// where ref is the high-precision result and baseline the ordinary unfused low-precision path.
// NaN anywhere in out fails. Returns an empty string on success, else a message naming the
// first worst element. A caller passes another atol only with the reason beside it (the rounding
// floor of an fp32 statistic, e.g.).
std::string check_against_baseline(const std::string& what, const std::vector<double>& out,
                                   const std::vector<double>& ref,
                                   const std::vector<double>& baseline, double atol = 1e-6);

// The same rule on root-mean-square errors, for outputs whose errors are quantization noise of
// the same size on both sides (FP8: coda and the baseline quantize independently rounded values,
// so each side's error is its own draw of that noise). The ratio of two maxima of such draws is
// heavy-tailed (the FP8 block's max rule failed 15 of 6000 seeds, docs/reliability.md); the
// ratio of their RMS concentrates at 1 within about 1/sqrt(2n). Passes when
//   rms(out - ref) <= 2 * rms(baseline - ref) + atol
// A bug that breaks a whole operand (a wrong scale, a stale or misplaced operand) moves the RMS
// by orders of magnitude; per-element errors are the per-kernel tests' (same operands, max rule).
std::string check_rms_against_baseline(const std::string& what, const std::vector<double>& out,
                                       const std::vector<double>& ref,
                                       const std::vector<double>& baseline, double atol = 1e-6);

// While one is alive, tolerance checks are not written to CODA_TEST_ERROR_LOG: for checks a test
// expects to fail (a planted mistake), whose shares would otherwise read as a sweep's worst.
class UnloggedChecks {
public:
  UnloggedChecks();
  ~UnloggedChecks();
  UnloggedChecks(const UnloggedChecks&) = delete;
  UnloggedChecks& operator=(const UnloggedChecks&) = delete;
};

// max |a - b| / max(max |b|, tiny): for fp64-vs-fp64 algebraic equivalence.
double max_rel_error(const std::vector<double>& a, const std::vector<double>& b);

} // namespace coda::test

// gtest helper: EXPECT_TRUE(msg.empty()) << msg, spelled once.
#define CODA_EXPECT_PASSES(msg_expr)                                                               \
  do {                                                                                             \
    const std::string coda_msg_ = (msg_expr);                                                      \
    EXPECT_TRUE(coda_msg_.empty()) << coda_msg_;                                                   \
  } while (0)
