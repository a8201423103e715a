#include "tests/common/check.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace coda::test {
namespace {

// CODA_TEST_SEED, else the clock. With --gtest_repeat=N, iteration i runs seed base + i, so one
// process sweeps N seeds (tools/seed_sweep.sh) and each failure names the seed that replays it.
const uint64_t kBaseSeed = [] {
  if (const char* s = std::getenv("CODA_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}();
uint64_t g_seed = kBaseSeed;

// CODA_TEST_ERROR_LOG=<file>: every tolerance check and every test result appended as a
// tab-separated line, for tools/seed_sweep.sh.
std::FILE* error_log() {
  static std::FILE* const log = [] {
    const char* path = std::getenv("CODA_TEST_ERROR_LOG");
    return path ? std::fopen(path, "a") : nullptr;
  }();
  return log;
}

int g_unlogged = 0; // live UnloggedChecks

std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : "";
}

class SeedPerIteration : public ::testing::EmptyTestEventListener {
  void OnTestIterationStart(const ::testing::UnitTest&, int iteration) override {
    g_seed = kBaseSeed + uint64_t(iteration);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    const auto seed = static_cast<unsigned long long>(g_seed);
    if (info.result()->Failed())
      std::printf("replay: CODA_TEST_SEED=%llu <test binary> --gtest_filter='%s'\n", seed,
                  name.c_str());
    if (std::FILE* log = error_log()) {
      const char* result = info.result()->Failed()    ? "fail"
                           : info.result()->Skipped() ? "skip"
                                                      : "pass";
      std::fprintf(log, "result\t%s\t%llu\t%s\n", name.c_str(), seed, result);
      std::fflush(log);
    }
  }
};

[[maybe_unused]] const bool kListening = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedPerIteration);
  return true;
}();

} // namespace

uint64_t test_seed() { return g_seed; }

UnloggedChecks::UnloggedChecks() { ++g_unlogged; }
UnloggedChecks::~UnloggedChecks() { --g_unlogged; }

std::string check_against_baseline(const std::string& what, const std::vector<double>& out,
                                   const std::vector<double>& ref,
                                   const std::vector<double>& baseline, double atol) {
  std::ostringstream msg;
  if (out.size() != ref.size() || baseline.size() != ref.size()) {
    msg << what << ": size mismatch (out " << out.size() << ", ref " << ref.size() << ", baseline "
        << baseline.size() << ")";
    return msg.str();
  }
  double err = 0, base_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) {
      msg << what << ": NaN at index " << i << " (seed " << test_seed() << ")";
      return msg.str();
    }
    double e = std::fabs(out[i] - ref[i]);
    if (e > err) err = e, worst = i;
    base_err = std::max(base_err, std::fabs(baseline[i] - ref[i]));
  }
  const double bound = 2 * base_err + atol;
  if (std::FILE* log = g_unlogged > 0 ? nullptr : error_log())
    std::fprintf(log, "check\t%s\t%s\t%llu\t%.9g\t%.9g\t%.9g\n", current_test_name().c_str(),
                 what.c_str(), static_cast<unsigned long long>(test_seed()), err, base_err, atol);
  if (err <= bound) return {};
  msg << what << ": max|out-ref| = " << err << " at index " << worst << " (out " << out[worst]
      << ", ref " << ref[worst] << ") exceeds 2*max|baseline-ref| + " << atol << " = " << bound
      << " (seed " << test_seed() << ")";
  return msg.str();
}

std::string check_rms_against_baseline(const std::string& what, const std::vector<double>& out,
                                       const std::vector<double>& ref,
                                       const std::vector<double>& baseline, double atol) {
  std::ostringstream msg;
  if (out.size() != ref.size() || baseline.size() != ref.size() || ref.empty()) {
    msg << what << ": size mismatch or empty (out " << out.size() << ", ref " << ref.size()
        << ", baseline " << baseline.size() << ")";
    return msg.str();
  }
  double sq = 0, base_sq = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) {
      msg << what << ": NaN at index " << i << " (seed " << test_seed() << ")";
      return msg.str();
    }
    sq += (out[i] - ref[i]) * (out[i] - ref[i]);
    base_sq += (baseline[i] - ref[i]) * (baseline[i] - ref[i]);
  }
  const double n = double(ref.size()), err = std::sqrt(sq / n), base_err = std::sqrt(base_sq / n);
  const double bound = 2 * base_err + atol;
  if (std::FILE* log = g_unlogged > 0 ? nullptr : error_log())
    std::fprintf(log, "check\t%s\t%s\t%llu\t%.9g\t%.9g\t%.9g\n", current_test_name().c_str(),
                 (what + " (rms)").c_str(), static_cast<unsigned long long>(test_seed()), err,
                 base_err, atol);
  if (err <= bound) return {};
  msg << what << ": rms(out-ref) = " << err << " exceeds 2*rms(baseline-ref) + " << atol << " = "
      << bound << " (seed " << test_seed() << ")";
  return msg.str();
}

double max_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 1e-300;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  if (a.size() != b.size()) return INFINITY;
  return num / den;
}

} // namespace coda::test
