#include "tests/common/kernel_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>

#include "coda/core/fp8.hpp"
#include "reference/gemm.hpp"
#include "tests/common/check.hpp"

namespace coda::test {
namespace {

constexpr size_t kGuardBytes = 64;
thread_local ViewHook* g_view_hook = nullptr;
constexpr unsigned char kGuardByte = 0xA5;

// splitmix64: a well-mixed 64-bit step, so neighbouring seeds give unrelated streams.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

} // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t s : shape_) numel_ *= s;
  const size_t bytes = size_t(numel_ * dtype_size(dtype_)) + kGuardBytes;
  storage_.resize((bytes + sizeof(Chunk) - 1) / sizeof(Chunk));
  std::memset(this->bytes(), kGuardByte, storage_.size() * sizeof(Chunk));
  poison();
}

HostTensor HostTensor::random(DType dtype, std::vector<int64_t> shape, uint64_t seed, double lo,
                              double hi) {
  HostTensor t(dtype, std::move(shape));
  const std::vector<double> v = random_doubles(size_t(t.numel_), seed, lo, hi);
  for (int64_t i = 0; i < t.numel_; ++i) t.set(i, v[size_t(i)]);
  return t;
}

HostTensor HostTensor::of(DType dtype, std::vector<int64_t> shape,
                          const std::vector<double>& values) {
  HostTensor t(dtype, std::move(shape));
  if (int64_t(values.size()) != t.numel_) throw std::invalid_argument("HostTensor::of: size");
  for (int64_t i = 0; i < t.numel_; ++i) t.set(i, values[size_t(i)]);
  return t;
}

HostTensor HostTensor::of_ints(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, std::move(shape));
  if (int64_t(values.size()) != t.numel_) throw std::invalid_argument("HostTensor::of_ints: size");
  std::memcpy(t.bytes(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

ViewHook* set_view_hook(ViewHook* hook) {
  ViewHook* previous = g_view_hook;
  g_view_hook = hook;
  return previous;
}

void sync_views() {
  if (g_view_hook != nullptr) g_view_hook->sync();
}

TensorView HostTensor::view() {
  const TensorView host = host_view();
  if (g_view_hook == nullptr || host.data == nullptr) return host;
  return g_view_hook->view(*this, host);
}

TensorView HostTensor::host_view() {
  TensorView v;
  if (storage_.empty()) return v;
  v.data = bytes();
  v.dtype = dtype_;
  v.rank = int32_t(shape_.size());
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = shape_[size_t(i)];
    v.stride[i] = stride;
    stride *= shape_[size_t(i)];
  }
  return v;
}

void HostTensor::set(int64_t i, double value) {
  unsigned char* p = bytes() + i * dtype_size(dtype_);
  switch (dtype_) {
  case DType::bf16: {
    const uint16_t bits = float_to_bf16_bits(float(value));
    std::memcpy(p, &bits, 2);
    break;
  }
  case DType::f16: {
    const uint16_t bits = float_to_f16_bits(float(value));
    std::memcpy(p, &bits, 2);
    break;
  }
  case DType::f32: {
    const float f = float(value);
    std::memcpy(p, &f, 4);
    break;
  }
  case DType::i32: {
    const int32_t k = std::isnan(value) ? INT32_MAX : int32_t(value);
    std::memcpy(p, &k, 4);
    break;
  }
  case DType::e4m3:
    *p = float_to_e4m3_bits(float(value));
    break;
  case DType::e8m0: { // 2^floor(log2 |value|); NaN (the poison), 0 and infinities: NaN's byte
    const int k = std::isfinite(value) && value != 0 ? std::ilogb(value) : kNoScale;
    *p = k >= -127 && k <= 127 ? e8m0_bits_of_exponent(k) : kE8m0NanBits;
    break;
  }
  }
}

double HostTensor::get(int64_t i) const {
  const unsigned char* p = bytes() + i * dtype_size(dtype_);
  uint16_t bits = 0;
  float f = 0;
  int32_t k = 0;
  switch (dtype_) {
  case DType::bf16:
    std::memcpy(&bits, p, 2);
    return bf16_bits_to_float(bits);
  case DType::f16:
    std::memcpy(&bits, p, 2);
    return f16_bits_to_float(bits);
  case DType::f32:
    std::memcpy(&f, p, 4);
    return f;
  case DType::i32:
    std::memcpy(&k, p, 4);
    return k;
  case DType::e4m3:
    return e4m3_bits_to_float(*p);
  case DType::e8m0:
    return e8m0_bits_to_float(*p);
  }
  return NAN;
}

std::vector<double> HostTensor::values() const {
  std::vector<double> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[size_t(i)] = get(i);
  return v;
}

std::vector<int32_t> HostTensor::ints() const {
  std::vector<int32_t> v(static_cast<size_t>(numel_));
  if (numel_ > 0) std::memcpy(v.data(), bytes(), v.size() * sizeof(int32_t));
  return v;
}

void HostTensor::poison() {
  for (int64_t i = 0; i < numel_; ++i) set(i, NAN);
}

bool HostTensor::guard_intact() const {
  const size_t begin = size_t(numel_ * dtype_size(dtype_));
  const size_t end = storage_.size() * sizeof(Chunk);
  for (size_t i = begin; i < end; ++i)
    if (bytes()[i] != kGuardByte) return false;
  return true;
}

ref::Rounding lowp(DType dtype) { return ref::Rounding::for_dtype(dtype); }

double ulp_of(DType dtype, double x) {
  const int bits = dtype == DType::bf16 ? 8 : dtype == DType::f16 ? 11 : 24;
  return std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(x), 1e-30)) - (bits - 1));
}

namespace {
std::string running_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : "";
}
} // namespace

Seeds::Seeds() : Seeds(test_seed(), running_test_name()) {}

Seeds::Seeds(uint64_t seed, const std::string& test)
    : state_(mix(seed ^ std::hash<std::string>{}(test))) {}

uint64_t Seeds::next() { return state_ = mix(state_); }

std::vector<double> random_doubles(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::string check_output(const std::string& name, const HostTensor& out,
                         const std::vector<double>& exact, const std::vector<double>& unfused,
                         double atol) {
  if (!out.guard_intact()) return name + ": the call wrote past the end of the output";
  return check_against_baseline(name, out.values(), exact, unfused, atol);
}

double sumsq_partials_floor(const std::vector<double>& partials, int64_t block) {
  double largest = 0;
  for (double p : partials) largest = std::fmax(largest, std::fabs(p));
  return double(block + 2) * 0x1p-24 * largest;
}

std::string check_rounded_output(const std::string& name, const HostTensor& out,
                                 const std::vector<double>& exact,
                                 const std::vector<double>& unfused) {
  if (!out.guard_intact()) return name + ": the call wrote past the end of the output";
  // Each element moved toward the exact value by up to its half ulp, then the one rule (and its
  // log line for tools/seed_sweep.sh): |out - ref| <= 2 max|baseline - ref| + atol + half ulp.
  std::vector<double> got = out.values();
  for (size_t i = 0; i < got.size() && i < exact.size(); ++i) {
    const double h = ulp_of(out.dtype(), std::max(std::abs(exact[i]), std::abs(got[i]))) / 2;
    const double d = got[i] - exact[i];
    got[i] = std::abs(d) <= h ? exact[i] : got[i] - std::copysign(h, d); // NaN stays NaN
  }
  return check_against_baseline(name + " (less half an ulp of its dtype)", got, exact, unfused);
}

std::string check_gate_of_stored(const std::string& name, const HostTensor& act,
                                 const HostTensor& preact, double (*activation)(double)) {
  if (!act.guard_intact()) return name + ": the call wrote past the end of the output";
  const std::vector<double> got = act.values(), z = preact.values();
  if (z.size() != 2 * got.size()) return name + ": preact is not twice act's size";
  // The smallest step of the 16-bit type (its subnormals'): ulp_of follows the exponent below.
  const bool f16 = act.dtype() == DType::f16;
  const double smallest = f16 ? 0x1p-24 : 0x1p-133;
  const double largest = f16 ? 65504.0 : 0x1.fep127; // the largest finite value
  // Each element's error beyond its half ulp as a share of the fp32 allowance, held to 1 by the
  // one rule, whose log line (tools/seed_sweep.sh) so reports how much of the allowance the
  // evaluation used; the rounding's half ulp is reached by some element of most tensors.
  std::vector<double> share(got.size()), zero(got.size(), 0.0), half(got.size(), 0.5);
  size_t worst = 0;
  double expected_at_worst = 0, bound_at_worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = z[2 * i], u = z[2 * i + 1], expected = activation(g) * u;
    const double rounding =
        std::max(ulp_of(act.dtype(), std::max(std::abs(expected), std::abs(got[i]))), smallest) / 2;
    const double evaluation = 0x1p-20 * (1 + std::abs(g)) * std::abs(g) * std::abs(u) + 1e-300;
    // A value past the type's range is stored as an infinity of its sign.
    const bool overflowed = std::isinf(got[i]) && std::isfinite(expected) &&
                            std::signbit(got[i]) == std::signbit(expected) &&
                            std::abs(expected) >= largest;
    const double beyond = std::abs(got[i] - expected) - rounding; // NaN stays NaN
    share[i] = overflowed || beyond <= 0 ? 0 : beyond / evaluation;
    if (i == 0 || !(share[i] <= share[worst]))
      worst = i, expected_at_worst = expected, bound_at_worst = rounding + evaluation;
  }
  std::string failed = check_against_baseline(
      name + " vs the gate of the stored preact (less half an ulp of its dtype)", share, zero, half,
      0);
  if (!failed.empty())
    failed += "; act[" + std::to_string(worst) + "] = " + std::to_string(got[worst]) +
              ", the gate of its stored (gate, up) = (" + std::to_string(z[2 * worst]) + ", " +
              std::to_string(z[2 * worst + 1]) + ") " + std::to_string(expected_at_worst) +
              ", allowed " + std::to_string(bound_at_worst);
  return failed;
}

HostTensor sixteenths(DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<double> v = random_doubles(size_t(rows * cols), seed, -1, 1);
  for (double& x : v) x = std::round(x * 16) / 16;
  return HostTensor::of(dtype, {rows, cols}, v);
}

StoredGradientDx rms_backward_dx_from_stored_g(const ref::RmsBackwardInputs& in, DType dtype) {
  const ref::Rounding r = lowp(dtype);
  std::vector<double> g(size_t(in.M * in.N));
  ref::gemm(ref::Layout::dgrad, in.M, in.N, in.K, in.dz.data(), in.w.data(), g.data());
  StoredGradientDx out;
  out.exact.resize(size_t(in.M * in.N));
  out.unfused.resize(size_t(in.M * in.N));
  for (int64_t m = 0; m < in.M; ++m)
    for (int64_t n = 0; n < in.N; ++n) {
      const size_t i = size_t(m * in.N + n);
      const double rstd = in.rstd[size_t(m)], xh = in.x[i] * rstd;
      const double stored = r(in.alpha * g[i]); // exact in fp32 before it (sixteenths)
      const double result = rstd * (stored * in.gamma[size_t(n)] - xh * in.zeta[size_t(m)]);
      const double before = in.accumulate ? in.dx_in[i] : 0.0;
      out.exact[i] = before + result;
      out.unfused[i] = in.accumulate ? r(before + r(result)) : r(result);
    }
  return out;
}

std::string check_output(const std::string& name, const HostTensor& out, double exact,
                         double unfused) {
  return check_output(name, out, std::vector<double>{exact}, std::vector<double>{unfused});
}

HostTensor random_sumsq_partials(int64_t M, int64_t width, uint64_t seed) {
  const std::vector<double> x = random_doubles(size_t(M * width), seed);
  return HostTensor::of(
      DType::f32, {M, ref::partial_blocks(width)},
      ref::rms_stats(ref::Rounding{}, M, width, x, std::vector<double>(size_t(width), 1.0))
          .sumsq_partials);
}

std::vector<int32_t> packed_positions(int64_t M, int64_t seq_len, int32_t first_offset) {
  std::vector<int32_t> positions(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    positions[size_t(m)] = int32_t(m % seq_len) + (m < seq_len ? first_offset : 0);
  return positions;
}

std::vector<double> rope_inv_freq_f32(int64_t head_dim) {
  std::vector<double> inv_freq = ref::rope_inv_freq(head_dim, 10000.0);
  for (double& f : inv_freq) f = double(float(f));
  return inv_freq;
}

std::string dtype_label(DType dtype) { return dtype_name(dtype); }

std::vector<double> transposed(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

RmsBackwardCall::RmsBackwardCall(HostTensor& dz, HostTensor& w, HostTensor& x, HostTensor& rstd,
                                 HostTensor& zeta, HostTensor& gamma)
    : dz(dz), w(w), x(x), rstd(rstd), zeta(zeta), gamma(gamma), dx(x.dtype(), x.shape()),
      h_hat(x.dtype(), x.shape()),
      dgamma_partials(DType::f32, {x.shape()[1], ref::partial_blocks(x.shape()[0])}) {}

RmsBackwardArgs RmsBackwardCall::args() {
  return {.dz = dz.view(),
          .w = w.view(),
          .x = x.view(),
          .rstd = rstd.view(),
          .zeta = zeta.view(),
          .gamma = gamma.view(),
          .alpha = {},
          .accumulate = false,
          .dx = dx.view(),
          .h_hat = h_hat.view(),
          .dgamma_partials = dgamma_partials.view()};
}

ref::RmsBackwardInputs RmsBackwardCall::inputs() const {
  return {x.shape()[0],  x.shape()[1],  dz.shape()[1],  dz.values(), w.values(), x.values(),
          rstd.values(), zeta.values(), gamma.values(), 1.0,         false,      {}};
}

SwigluBackwardCall::SwigluBackwardCall(HostTensor& dx, HostTensor& w, HostTensor& preact)
    : dx(dx), w(w), preact(preact), act(preact.dtype(), {dx.shape()[0], w.shape()[1]}),
      dpreact(preact.dtype(), preact.shape()),
      zeta_partials(DType::f32,
                    {dx.shape()[0], ref::partial_blocks(w.shape()[1], ref::kStagedPartialBlock)}) {}

SwigluBackwardArgs SwigluBackwardCall::args() {
  return {.dx = dx.view(),
          .w = w.view(),
          .preact = preact.view(),
          .act = act.view(),
          .dpreact = dpreact.view(),
          .zeta_partials = zeta_partials.view()};
}

ref::SwigluBackwardInputs SwigluBackwardCall::inputs() const {
  return {dx.shape()[0], w.shape()[1], dx.shape()[1], dx.values(), w.values(), preact.values()};
}

CrossEntropyInputs make_cross_entropy_inputs(DType dtype, const CrossEntropyCase& c,
                                             int32_t ignore_index, LossReduction reduction,
                                             Seeds& seeds,
                                             const std::vector<int32_t>& forced_targets) {
  const std::vector<double> L = random_doubles(size_t(c.M * c.V), seeds.next(), -4, 4);
  const std::vector<double> u = random_doubles(size_t(c.M), seeds.next(), 0, 1);
  std::vector<int32_t> targets(size_t(c.M));
  for (int64_t m = 0; m < c.M; ++m) {
    const int32_t t = m == 2 ? int32_t(c.V - 1) : int32_t(u[size_t(m)] * double(c.V));
    targets[size_t(m)] = m % 4 == 1 ? ignore_index : t;
  }
  if (!forced_targets.empty()) targets = forced_targets;
  std::vector<double> target_logit(size_t(c.M), 0.0);
  for (int64_t m = 0; m < c.M; ++m) {
    const int32_t t = targets[size_t(m)];
    if (t >= 0 && t < c.V) target_logit[size_t(m)] = L[size_t(m * c.V + t)];
  }
  CrossEntropyInputs in{HostTensor::of(dtype, {c.M, c.V}, L),
                        HostTensor::of(DType::f32,
                                       {c.M, ref::partial_blocks(c.V, ref::kStagedPartialBlock)},
                                       ref::lse_row_partials({}, c.M, c.V, L)),
                        HostTensor::of(DType::f32, {c.M}, target_logit),
                        HostTensor::of_ints({c.M}, targets),
                        {}};
  in.ref = {c.M,
            c.V,
            in.logits.values(),
            in.lse_partials.values(),
            in.target_logit.values(),
            targets,
            ignore_index,
            reduction == LossReduction::mean ? ref::Reduction::mean : ref::Reduction::sum};
  return in;
}

CrossEntropyOutputs::CrossEntropyOutputs(DType dtype, const CrossEntropyCase& c)
    : loss(DType::f32, {1}), dlogits(dtype, {c.M, c.V}), grad_scale(DType::f32, {1}),
      zeta(DType::f32, {c.M}) {}

CrossEntropyArgs cross_entropy_args(CrossEntropyInputs& in, CrossEntropyOutputs& out,
                                    LossReduction reduction) {
  return {.logits = in.logits.view(),
          .lse_partials = in.lse_partials.view(),
          .target_logit = in.target_logit.view(),
          .targets = in.targets.view(),
          .ignore_index = in.ref.ignore_index,
          .reduction = reduction,
          .loss = out.loss.view(),
          .dlogits = out.dlogits.view(),
          .grad_scale = out.grad_scale.view(),
          .zeta = out.zeta.view(),
          .workspace = {}};
}

// K7 rounds dy to the 16-bit type before the SwiGLU backward, so a zeta partial, the sum over
// its block of g dg + u du = dy (g u sig (1 + g (1 - sig)) + u s), differs from the fp64 one by
// at most sum |d term / d dy| ulp(dy) / 2 (plus the fp32 evaluation). Over a few terms (F = 8)
// the unfused path's own roundings can cancel, so twice its error is no bound there; this is.
// A term is linear in dy, so a product's own error moves it by exactly |d term / d dy| times
// that error.
ZetaDyRounding zeta_dy_rounding(const ref::SwigluBackwardInputs& in, DType dtype) {
  const int64_t B = ref::kStagedPartialBlock, blocks = ref::partial_blocks(in.F, B);
  const bool on_product = !in.product.empty();
  ZetaDyRounding r;
  r.blocks = blocks;
  r.half_ulp_moves.assign(size_t(in.M * blocks), 0.0);
  r.magnitude.assign(size_t(in.M * blocks), 0.0);
  r.product_moves.assign(size_t(in.M * blocks), 0.0);
  for (int64_t m = 0; m < in.M; ++m)
    for (int64_t j = 0; j < in.F; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < in.K; ++k)
        sum += in.dx[size_t(m * in.K + k)] * in.w[size_t(k * in.F + j)];
      const double dy = on_product ? in.product[size_t(m * in.F + j)] : sum;
      const double g = in.preact[size_t(m * 2 * in.F + 2 * j)];
      const double u = in.preact[size_t(m * 2 * in.F + 2 * j + 1)];
      const double sig = 1 / (1 + std::exp(-g)), sw = g * sig;
      const double sensitivity = std::fabs(g * u * sig * (1 + g * (1 - sig)) + u * sw);
      const double ulp = ulp_of(dtype, dy);
      const size_t i = size_t(m * blocks + j / B);
      r.half_ulp_moves[i] += sensitivity * ulp / 2;
      r.magnitude[i] += sensitivity * std::fabs(dy);
      r.product_moves[i] += sensitivity * std::fabs(dy - sum);
    }
  return r;
}

void expect_zeta_within_dy_rounding(const HostTensor& partials, const std::vector<double>& exact,
                                    const ZetaDyRounding& rounding) {
  const std::vector<double> out = partials.values();
  ASSERT_EQ(partials.shape()[1], rounding.blocks);
  for (size_t i = 0; i < out.size(); ++i) {
    const double bound = 1.02 * rounding.half_ulp_moves[i] + 1e-5 * rounding.magnitude[i] + 1e-6;
    ASSERT_LE(std::fabs(out[i] - exact[i]), bound)
        << "zeta_partials at (" << int64_t(i) / rounding.blocks << ", "
        << int64_t(i) % rounding.blocks << "): " << out[i] << " vs fp64 " << exact[i] << " (seed "
        << test_seed() << ")";
  }
}

} // namespace coda::test
