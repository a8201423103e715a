#include "tests/common/fp8_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "coda/core/fp8.hpp"
#include "reference/gemm.hpp"

namespace coda::test {

double e4m3_grid_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

int e4m3_nearest_code(float x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  int best = 0x7e;
  if (a < 448.0) {
    double best_distance = std::numeric_limits<double>::infinity();
    for (int c = 0; c <= 0x7e; ++c) {
      const double d = std::fabs(e4m3_grid_value(c) - a);
      if (d < best_distance || (d == best_distance && (c & 1) == 0)) best_distance = d, best = c;
    }
  }
  return sign | best;
}

int e4m3_block_exponent(const float* block, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(block[i])) return kNoScale;
    amax = std::max(amax, std::fabs(double(block[i])));
  }
  int k = -126;
  while (amax > std::ldexp(448.0, k)) ++k;
  return k;
}

namespace {

// [rows, cols] normal values, each block of block_rows x 128 scaled by its own power of two in
// [2^-max_binade, 2^max_binade].
std::vector<float> block_varied(int64_t rows, int64_t cols, int64_t block_rows, uint64_t seed,
                                int max_binade) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> binade(-max_binade, max_binade);
  const int64_t blocks_c = num_fp8_scale_blocks(cols);
  std::vector<int> exponent(size_t((rows + block_rows - 1) / block_rows * blocks_c));
  for (int& e : exponent) e = binade(rng);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(r * cols + c)] =
          std::ldexp(normal(rng), exponent[size_t(r / block_rows * blocks_c + c / kFp8ScaleBlock)]);
  return x;
}

HostTensor bytes_tensor(DType dtype, int64_t rows, int64_t cols, const std::vector<uint8_t>& v) {
  HostTensor t(dtype, {rows, cols});
  std::memcpy(t.host_view().data, v.data(), v.size());
  return t;
}

std::vector<float> to_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end()); // exact: each is an e4m3 value times 2^k
}

} // namespace

Fp8GemmCase::Fp8GemmCase(int64_t m_, int64_t n_, int64_t k_, Seeds& seeds, Options options_)
    : m(m_), n(n_), k(k_), options(options_),
      qa(ref::quantize_fp8_blocks(block_varied(m, k, 1, seeds.next(), options.max_binade), m, k,
                                  1)),
      qb(ref::quantize_fp8_blocks(
          block_varied(n, k, b_block_rows(), seeds.next(), options.max_binade), n, k,
          b_block_rows())),
      a(bytes_tensor(DType::e4m3, m, k, qa.codes)),
      a_scales(bytes_tensor(DType::e8m0, m, num_fp8_scale_blocks(k), qa.scales)),
      b(bytes_tensor(DType::e4m3, n, k, qb.codes)),
      b_scales(bytes_tensor(DType::e8m0, (n + b_block_rows() - 1) / b_block_rows(),
                            num_fp8_scale_blocks(k), qb.scales)),
      d(options.d, {m, n}) {
  if (options.accumulate) {
    // Old values of the product's size, so that both terms of d + A Bᵀ matter.
    d = HostTensor::of(options.d, {m, n}, random_doubles(size_t(m * n), seeds.next(), -4, 4));
    d_before = d.values();
  }
}

int64_t Fp8GemmCase::b_block_rows() const {
  return options.b_scaling == Fp8BScaling::rows ? 1 : kFp8ScaleBlock;
}

Fp8GemmArgs Fp8GemmCase::args() {
  return {.a = a.view(),
          .a_scales = a_scales.view(),
          .b = b.view(),
          .b_scales = b_scales.view(),
          .d = d.view(),
          .b_scaling = options.b_scaling,
          .accumulate = options.accumulate};
}

std::vector<double> Fp8GemmCase::a_values() const {
  return ref::dequantize_fp8_blocks(qa, m, k, 1);
}
std::vector<double> Fp8GemmCase::b_values() const {
  return ref::dequantize_fp8_blocks(qb, n, k, b_block_rows());
}

std::vector<double> Fp8GemmCase::b_values_transposed() const {
  const std::vector<double> b_nk = b_values();
  std::vector<double> b_kn(b_nk.size());
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t nn = 0; nn < n; ++nn) b_kn[size_t(kk * n + nn)] = b_nk[size_t(nn * k + kk)];
  return b_kn;
}

ref::NormedGemmInputs Fp8GemmCase::normed_inputs(const HostTensor& partials, float eps) const {
  return {m, n, k, a_values(), b_values(), partials.values(), eps};
}

std::vector<double> Fp8GemmCase::exact() const {
  const std::vector<double> da = a_values(), db = b_values();
  std::vector<double> out(size_t(m * n));
  ref::gemm(ref::Layout::fwd, m, n, k, da.data(), db.data(), out.data());
  for (size_t i = 0; i < d_before.size(); ++i) out[i] += d_before[i];
  return out;
}

std::vector<double> Fp8GemmCase::unfused() const {
  const std::vector<float> fa = to_floats(a_values()), fb = to_floats(b_values());
  std::vector<float> acc(size_t(m * n));
  ref::gemm_fp32(ref::Layout::fwd, m, n, k, fa.data(), fb.data(), acc.data());
  std::vector<double> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    const float sum = d_before.empty() ? acc[i] : acc[i] + float(d_before[i]);
    out[i] = options.d == DType::f32 ? double(sum) : double(round_to<bf16>(sum));
  }
  return out;
}

std::vector<double> Fp8GemmCase::magnitude() const {
  std::vector<double> da = a_values(), db = b_values();
  for (double& v : da) v = std::fabs(v);
  for (double& v : db) v = std::fabs(v);
  std::vector<double> out(size_t(m * n));
  ref::gemm(ref::Layout::fwd, m, n, k, da.data(), db.data(), out.data());
  return out;
}

Fp8WeightCase::Fp8WeightCase(int64_t n_, int64_t k_, DType dtype, bool non_finite, Seeds& seeds,
                             int max_binade)
    : n(n_), k(k_), codes(DType::e4m3, {n_, k_}),
      scales(DType::e8m0, {num_fp8_scale_blocks(n_), num_fp8_scale_blocks(k_)}),
      codes_t(DType::e4m3, {k_, n_}),
      scales_t(DType::e8m0, {num_fp8_scale_blocks(k_), num_fp8_scale_blocks(n_)}) {
  const int64_t kbs = num_fp8_scale_blocks(k);
  std::mt19937_64 rng(seeds.next());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> binade(-max_binade, max_binade);
  std::vector<int> exponent(size_t(num_fp8_scale_blocks(n) * kbs));
  for (int& e : exponent) e = binade(rng);
  std::vector<double> x(size_t(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      x[size_t(r * k + c)] =
          std::ldexp(normal(rng), exponent[size_t(r / kFp8ScaleBlock * kbs + c / kFp8ScaleBlock)]);
  if (non_finite) {
    x[size_t((n - 1) * k + k - 1)] = std::nan("");   // the last block
    x[0] = -std::numeric_limits<double>::infinity(); // the first (the same one if only one)
  }
  w = HostTensor::of(dtype, {n, k}, x);
}

QuantizeWeightFp8Args Fp8WeightCase::args(Fp8Copies copies) {
  QuantizeWeightFp8Args a;
  a.w = w.view();
  if (has_rows(copies)) a.codes = codes.view(), a.scales = scales.view();
  if (has_transposed(copies)) a.codes_t = codes_t.view(), a.scales_t = scales_t.view();
  return a;
}

std::string Fp8WeightCase::check(Fp8Copies copies) const {
  const bool rows = has_rows(copies), transposed = has_transposed(copies);
  const std::vector<double> wv = w.values();
  const auto byte_at = [](const HostTensor& t, int64_t i) {
    return static_cast<const uint8_t*>(const_cast<HostTensor&>(t).host_view().data)[i];
  };
  const int64_t nbs = num_fp8_scale_blocks(n), kbs = num_fp8_scale_blocks(k);
  std::string errors;
  int reported = 0;
  const auto report = [&](const std::string& what) {
    if (++reported <= 8) errors += what + "\n";
  };
  for (int64_t nb = 0; nb < nbs; ++nb)
    for (int64_t kb = 0; kb < kbs; ++kb) {
      const int64_t n0 = nb * kFp8ScaleBlock, n1 = std::min<int64_t>(n, n0 + kFp8ScaleBlock);
      const int64_t k0 = kb * kFp8ScaleBlock, k1 = std::min<int64_t>(k, k0 + kFp8ScaleBlock);
      std::vector<float> block;
      for (int64_t r = n0; r < n1; ++r)
        for (int64_t c = k0; c < k1; ++c) block.push_back(float(wv[size_t(r * k + c)]));
      const int e = e4m3_block_exponent(block.data(), int64_t(block.size()));
      const int scale = e == kNoScale ? 0xFF : e + 127;
      const std::string at = "block (" + std::to_string(nb) + ", " + std::to_string(kb) + ")";
      if (rows && byte_at(scales, nb * kbs + kb) != scale)
        report("scale of " + at + ": " + std::to_string(byte_at(scales, nb * kbs + kb)) +
               ", want " + std::to_string(scale));
      if (transposed && byte_at(scales_t, kb * nbs + nb) != scale)
        report("scales_t of " + at + ": " + std::to_string(byte_at(scales_t, kb * nbs + nb)));
      for (int64_t r = n0; r < n1; ++r)
        for (int64_t c = k0; c < k1; ++c) {
          const int want =
              e == kNoScale
                  ? 0x7F
                  : e4m3_nearest_code(float(std::ldexp(double(float(wv[size_t(r * k + c)])), -e)));
          const std::string rc = "(" + std::to_string(r) + ", " + std::to_string(c) + ")";
          if (rows && byte_at(codes, r * k + c) != want)
            report("code " + rc + ": " + std::to_string(byte_at(codes, r * k + c)) + ", want " +
                   std::to_string(want));
          if (transposed && byte_at(codes_t, c * n + r) != want)
            report("codes_t at the transpose of " + rc + ": " +
                   std::to_string(byte_at(codes_t, c * n + r)) + ", want " + std::to_string(want));
        }
    }
  for (const HostTensor* t : {&codes, &scales, &codes_t, &scales_t})
    if (!t->guard_intact()) report("a guard byte after an output changed");
  if (reported > 8) errors += std::to_string(reported - 8) + " more\n";
  return errors;
}

Fp8ActivationCase::Fp8ActivationCase(int64_t m_, int64_t k_, DType dtype, bool non_finite,
                                     Seeds& seeds, int max_binade, int max_shift)
    : m(m_), k(k_), codes(DType::e4m3, {m_, k_}),
      scales(DType::e8m0, {m_, num_fp8_scale_blocks(k_)}), codes_t(DType::e4m3, {k_, m_}),
      scales_t(DType::e8m0, {k_, num_fp8_scale_blocks(m_)}) {
  const int64_t kbs = num_fp8_scale_blocks(k);
  std::mt19937_64 rng(seeds.next());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> binade(-max_binade, max_binade), shift(-max_shift, max_shift);
  std::vector<int> tile(static_cast<size_t>(num_fp8_scale_blocks(m) * kbs));
  std::vector<int> row(static_cast<size_t>(m)), col(static_cast<size_t>(k));
  for (int& e : tile) e = binade(rng);
  for (int& e : row) e = shift(rng);
  for (int& e : col) e = shift(rng);
  std::vector<double> v(size_t(m * k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c)
      v[size_t(r * k + c)] =
          std::ldexp(normal(rng), row[size_t(r)] + col[size_t(c)] +
                                      tile[size_t(r / kFp8ScaleBlock * kbs + c / kFp8ScaleBlock)]);
  if (non_finite) {
    v[0] = std::numeric_limits<double>::infinity(); // row 0's and column 0's first block
    v[size_t((m - 1) * k + k - 1)] = -std::nan(""); // the last row's and column's last
  }
  x = HostTensor::of(dtype, {m, k}, v);
}

QuantizeActivationFp8Args Fp8ActivationCase::args(bool transposed) {
  QuantizeActivationFp8Args a;
  a.x = x.view();
  a.codes = codes.view();
  a.scales = scales.view();
  if (transposed) a.codes_t = codes_t.view(), a.scales_t = scales_t.view();
  return a;
}

std::string Fp8ActivationCase::check(bool transposed) const {
  const std::vector<double> xv = x.values();
  const auto byte_at = [](const HostTensor& t, int64_t i) {
    return static_cast<const uint8_t*>(const_cast<HostTensor&>(t).host_view().data)[i];
  };
  std::string errors;
  int reported = 0;
  const auto report = [&](const std::string& what) {
    if (++reported <= 8) errors += what + "\n";
  };
  // One copy: `lines` lines of `length` values (x's rows, or its columns), value(l, i) the i-th
  // of line l, each line cut into blocks of 128; the copy's codes [lines, length] and scales
  // [lines, ceil(length/128)], row-major.
  const auto check_copy = [&](const char* copy, int64_t lines, int64_t length, auto value,
                              const HostTensor& q, const HostTensor& s) {
    const int64_t blocks = num_fp8_scale_blocks(length);
    for (int64_t l = 0; l < lines; ++l)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * kFp8ScaleBlock, i1 = std::min<int64_t>(length, i0 + kFp8ScaleBlock);
        std::vector<float> block;
        for (int64_t i = i0; i < i1; ++i) block.push_back(float(value(l, i)));
        const int e = e4m3_block_exponent(block.data(), int64_t(block.size()));
        const int scale = e == kNoScale ? 0xFF : e + 127;
        const std::string at =
            std::string(copy) + " line " + std::to_string(l) + " block " + std::to_string(b);
        if (byte_at(s, l * blocks + b) != scale)
          report("scale of " + at + ": " + std::to_string(byte_at(s, l * blocks + b)) + ", want " +
                 std::to_string(scale));
        for (int64_t i = i0; i < i1; ++i) {
          const int want =
              e == kNoScale
                  ? 0x7F
                  : e4m3_nearest_code(float(std::ldexp(double(block[size_t(i - i0)]), -e)));
          if (byte_at(q, l * length + i) != want)
            report("code " + std::to_string(i) + " of " + at + ": " +
                   std::to_string(byte_at(q, l * length + i)) + ", want " + std::to_string(want));
        }
      }
  };
  check_copy(
      "codes", m, k, [&](int64_t r, int64_t c) { return xv[size_t(r * k + c)]; }, codes, scales);
  if (transposed)
    check_copy(
        "codes_t", k, m, [&](int64_t c, int64_t r) { return xv[size_t(r * k + c)]; }, codes_t,
        scales_t);
  for (const HostTensor* t : {&codes, &scales, &codes_t, &scales_t})
    if (!t->guard_intact()) report("a guard byte after an output changed");
  if (reported > 8) errors += std::to_string(reported - 8) + " more\n";
  return errors;
}

std::vector<double> Fp8ActivationCase::dequantized(bool transposed) const {
  const int64_t rows = transposed ? k : m, cols = transposed ? m : k;
  const std::vector<double> q = (transposed ? codes_t : codes).values();
  const std::vector<double> s = (transposed ? scales_t : scales).values();
  std::vector<double> out(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] =
          q[size_t(r * cols + c)] * s[size_t(r * num_fp8_scale_blocks(cols) + c / kFp8ScaleBlock)];
  return out;
}

} // namespace coda::test
