#include "tests/common/check.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>

namespace coda::test {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("CODA_TEST_SEED"))
      return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  return seed;
}

std::string check_against_baseline(const std::string& what, const std::vector<double>& out,
                                   const std::vector<double>& ref,
                                   const std::vector<double>& baseline) {
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
  const double bound = 2 * base_err + 1e-6;
  if (err <= bound) return {};
  msg << what << ": max|out-ref| = " << err << " at index " << worst << " (out " << out[worst]
      << ", ref " << ref[worst] << ") exceeds 2*max|baseline-ref| + 1e-6 = " << bound << " (seed "
      << test_seed() << ")";
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
