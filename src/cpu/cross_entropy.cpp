// Cross-entropy forward and backward from K5's outputs (coda/kernels/args.hpp), row by row:
// lse from the row's LSE partials (merged as the epilogue's quads merge), the row's loss, then
// dlogits and zeta from the row's logits read once (dlogits may alias logits).
#include <vector>

#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/reduction.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

using ep::load_float;
using ep::store_float;

namespace {

float row_log_sum_exp(const TensorView& lse_partials, int64_t i) {
  using Lse = ep::LogSumExp<float>;
  Lse::State state = Lse::identity();
  for (int64_t b = 0; b < lse_partials.shape[1]; ++b)
    state = Lse::merge(state, Lse::from_finished(load_float(lse_partials, i, b)));
  return Lse::finish(state);
}

// Checked before any output is written.
void require_valid_targets(const CrossEntropyArgs& args, int64_t m, int64_t v) {
  for (int64_t i = 0; i < m; ++i) {
    const int32_t t = ep::load_int(args.targets, i);
    require(t == args.ignore_index || (t >= 0 && t < v),
            "cpu::cross_entropy: targets[" + std::to_string(i) + "] = " + std::to_string(t) +
                " is outside [0, " + std::to_string(v) + ") and is not ignore_index (" +
                std::to_string(args.ignore_index) + ")");
  }
}

} // namespace

void cross_entropy(const CrossEntropyArgs& args) {
  const int64_t m = args.logits.shape[0], v = args.logits.shape[1];
  require_valid_targets(args, m, v);
  std::vector<float> logits(static_cast<size_t>(v)); // one row, fp32
  double loss_sum = 0; // the scalar total over rows only; fp64 so that it does not depend on M
  int64_t valid = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int32_t target = ep::load_int(args.targets, i);
    const bool ignored = target == args.ignore_index;
    float zeta = 0.f;
    if (ignored) {
      for (int64_t n = 0; n < v; ++n) store_float(args.dlogits, i, n, 0.f);
    } else {
      const float lse = row_log_sum_exp(args.lse_partials, i);
      loss_sum += double(lse - load_float(args.target_logit, i));
      ++valid;
      for (int64_t n = 0; n < v; ++n) logits[size_t(n)] = load_float(args.logits, i, n);
      for (int64_t n = 0; n < v; ++n) {
        const float l = logits[size_t(n)];
        const float dl = ep::math::exp(l - lse) - (n == target ? 1.f : 0.f);
        zeta += l * dl;
        store_float(args.dlogits, i, n, dl);
      }
    }
    store_float(args.zeta, i, zeta);
  }
  const bool mean = args.reduction == LossReduction::mean;
  // With no valid row (a micro-batch that is all padding) the mean is defined as 0 with a zero
  // gradient scale, unlike torch's NaN, so one padded batch cannot poison a training run.
  const bool none = valid == 0;
  store_float(args.loss, 0,
              mean ? (none ? 0.f : float(loss_sum / double(valid))) : float(loss_sum));
  store_float(args.grad_scale, 0, mean ? (none ? 0.f : 1.f / float(valid)) : 1.f);
}

} // namespace coda::cpu
