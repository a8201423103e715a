#include "reference/ops.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "coda/core/fp8.hpp"
#include "reference/fp8.hpp"

namespace coda::ref {

double Rounding::operator()(double x) const {
  switch (kind) {
  case Kind::none:
    return x;
  case Kind::bf16:
    return double(round_to<coda::bf16>(float(x)));
  case Kind::f16:
    return double(round_to<coda::f16>(float(x)));
  case Kind::f32:
    return double(float(x));
  }
  return x;
}

double Rounding::stat(double x) const { return kind == Kind::none ? x : double(float(x)); }

Rounding Rounding::for_dtype(DType dtype) {
  switch (dtype) {
  case DType::bf16:
    return Rounding{Kind::bf16};
  case DType::f16:
    return Rounding{Kind::f16};
  case DType::f32:
    return Rounding{Kind::f32};
  case DType::i32:
  case DType::e4m3: // FP8 values are block-scaled codes: a rounding of one value needs its block
  case DType::e8m0:
    break;
  }
  throw std::invalid_argument(std::string("Rounding::for_dtype: ") + dtype_name(dtype) +
                              " is not a floating-point type");
}

void round_all(Rounding r, int64_t n, double* data) {
  if (r.exact()) return;
  for (int64_t i = 0; i < n; ++i) data[i] = r(data[i]);
}

std::vector<double> rounded(Rounding r, std::vector<double> data) {
  round_all(r, int64_t(data.size()), data.data());
  return data;
}

void add(Rounding r, int64_t n, const double* a, const double* b, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = r(a[i] + b[i]);
}

void scale(Rounding r, int64_t n, double alpha, const double* a, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = r(alpha * a[i]);
}

void linear(Rounding r, Layout layout, int64_t M, int64_t N, int64_t K, const double* A,
            const double* B, double* D) {
  if (M <= 0 || N <= 0) return;
  if (r.fp8) {
    // What a quantizer reads: the operands as the policy stores them (fp32 when exact). `rows` x
    // `cols` row-major, blocks of block_rows x 128.
    const auto quantized = [&](const double* x, int64_t rows, int64_t cols, int64_t block_rows) {
      std::vector<float> v(size_t(rows * cols));
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(r(x[i]));
      return dequantize_fp8_blocks(quantize_fp8_blocks(v, rows, cols, block_rows), rows, cols,
                                   block_rows);
    };
    // A [rows, cols] matrix blocked along its rows (1 x 128 blocks of its transpose).
    const auto quantized_by_columns = [&](const double* x, int64_t rows, int64_t cols) {
      std::vector<double> t(size_t(rows * cols));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = x[i * cols + j];
      const std::vector<double> q = quantized(t.data(), cols, rows, 1);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[size_t(i * cols + j)] = q[size_t(j * rows + i)];
      return t;
    };
    std::vector<double> a, b;
    switch (layout) {
    case Layout::fwd: // A [M, K] by rows, the weight B [N, K] in 128 x 128 blocks
      a = quantized(A, M, K, 1), b = quantized(B, N, K, kFp8ScaleBlock);
      break;
    case Layout::dgrad: // dY [M, K] by rows, the weight [K, N] in the same 128 x 128 blocks
      a = quantized(A, M, K, 1), b = quantized(B, K, N, kFp8ScaleBlock);
      break;
    case Layout::wgrad: // dY [K, M] blocked along the tokens K, X [K, N] in 128 x 128 blocks
      a = quantized_by_columns(A, K, M), b = quantized(B, K, N, kFp8ScaleBlock);
      break;
    }
    Rounding product = r;
    product.fp8 = false;
    linear(product, layout, M, N, K, a.data(), b.data(), D);
    return;
  }
  if (r.exact()) {
    gemm(layout, M, N, K, A, B, D);
    return;
  }
  const int64_t a_size = std::max<int64_t>(K, 0) * M, b_size = std::max<int64_t>(K, 0) * N;
  std::vector<float> a32(static_cast<size_t>(a_size)), b32(static_cast<size_t>(b_size)),
      d32(size_t(M * N));
  for (int64_t i = 0; i < a_size; ++i) a32[size_t(i)] = float(r(A[i]));
  for (int64_t i = 0; i < b_size; ++i) b32[size_t(i)] = float(r(B[i]));
  gemm_fp32(layout, M, N, K, a32.data(), b32.data(), d32.data());
  for (int64_t i = 0; i < M * N; ++i) D[i] = r(double(d32[size_t(i)]));
}

// ---- RMSNorm

void rmsnorm_forward(Rounding r, int64_t M, int64_t N, const double* x, const double* gamma,
                     double eps, double* out, double* rstd) {
  if (N <= 0) return;
  for (int64_t m = 0; m < M; ++m) {
    const double* xr = x + m * N;
    double sumsq = 0;
    for (int64_t n = 0; n < N; ++n) sumsq += xr[n] * xr[n];
    const double s = 1.0 / std::sqrt(sumsq / double(N) + eps);
    for (int64_t n = 0; n < N; ++n) out[m * N + n] = r(xr[n] * s * gamma[n]);
    rstd[m] = r.stat(s);
  }
}

void rmsnorm_backward(Rounding r, int64_t M, int64_t N, const double* x, const double* gamma,
                      const double* rstd, const double* dout, double* dx, double* dgamma) {
  if (N <= 0) return;
  std::vector<double> dgamma_acc(size_t(N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double* xr = x + m * N;
    const double* dr = dout + m * N;
    double dot = 0; // sum_n g * xh
    for (int64_t n = 0; n < N; ++n) {
      const double xh = xr[n] * rstd[m];
      dot += dr[n] * gamma[n] * xh;
      dgamma_acc[size_t(n)] += dr[n] * xh;
    }
    const double mean_dot = dot / double(N);
    for (int64_t n = 0; n < N; ++n) {
      const double xh = xr[n] * rstd[m];
      dx[m * N + n] = r(rstd[m] * (dr[n] * gamma[n] - xh * mean_dot));
    }
  }
  for (int64_t n = 0; n < N; ++n) dgamma[n] = r(dgamma_acc[size_t(n)]);
}

// ---- RoPE

namespace {

// Rotates each (i, i + hd/2) pair of the Q and K heads by sign * theta; copies V.
void rope_rotate(Rounding r, int64_t M, RopeShape shape, const int32_t* positions,
                 const double* inv_freq, double sign, const double* in, double* out) {
  const int64_t hd = shape.head_dim, half = hd / 2, width = shape.width();
  if (M <= 0) return;
  if (hd <= 0 || hd % 2 != 0 || shape.n_q_heads < 0 || shape.n_kv_heads < 0)
    throw std::invalid_argument("rope: head_dim must be even and positive, head counts >= 0");
  const int64_t rotated_heads = shape.n_q_heads + shape.n_kv_heads;
  std::vector<double> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t i = 0; i < half; ++i) {
      const double t = double(positions[m]) * inv_freq[i];
      cos_t[size_t(i)] = std::cos(t);
      sin_t[size_t(i)] = sign * std::sin(t);
    }
    const double* xr = in + m * width;
    double* yr = out + m * width;
    for (int64_t h = 0; h < rotated_heads; ++h) {
      const double* xh = xr + h * hd;
      double* yh = yr + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const double lo = xh[i], hi = xh[i + half], c = cos_t[size_t(i)], s = sin_t[size_t(i)];
        yh[i] = r(lo * c - hi * s);
        yh[i + half] = r(hi * c + lo * s);
      }
    }
    for (int64_t n = rotated_heads * hd; n < width; ++n) yr[n] = r(xr[n]);
  }
}

} // namespace

void rope_forward(Rounding r, int64_t M, RopeShape shape, const int32_t* positions,
                  const double* inv_freq, const double* in, double* out) {
  rope_rotate(r, M, shape, positions, inv_freq, +1.0, in, out);
}

void rope_backward(Rounding r, int64_t M, RopeShape shape, const int32_t* positions,
                   const double* inv_freq, const double* dout, double* din) {
  rope_rotate(r, M, shape, positions, inv_freq, -1.0, dout, din);
}

std::vector<double> rope_inv_freq(int64_t head_dim, double theta) {
  std::vector<double> inv_freq(size_t(std::max<int64_t>(head_dim / 2, 0)));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(theta, -double(2 * i) / double(head_dim));
  return inv_freq;
}

std::vector<double> rope_inv_freq_llama3(int64_t head_dim, double theta,
                                         const Llama3RopeScaling& scaling) {
  std::vector<double> inv_freq = rope_inv_freq(head_dim, theta);
  const double old_len = scaling.original_max_position_embeddings;
  const double low_freq_wavelen = old_len / scaling.low_freq_factor;
  const double high_freq_wavelen = old_len / scaling.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= scaling.factor; // low frequencies: interpolate positions
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_len / wavelen - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      f = (1 - smooth) * f / scaling.factor + smooth * f;
    } // high frequencies are kept
  }
  return inv_freq;
}

// ---- SwiGLU

namespace {
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
} // namespace

void swiglu_forward(Rounding r, int64_t M, int64_t F, const double* gate, const double* up,
                    double* out) {
  for (int64_t i = 0; i < M * F; ++i) out[i] = r(gate[i] * sigmoid(gate[i]) * up[i]);
}

void swiglu_backward(Rounding r, int64_t M, int64_t F, const double* gate, const double* up,
                     const double* dout, double* dgate, double* dup) {
  for (int64_t i = 0; i < M * F; ++i) {
    const double g = gate[i], sig = sigmoid(g);
    dgate[i] = r(dout[i] * up[i] * sig * (1 + g * (1 - sig)));
    dup[i] = r(dout[i] * g * sig);
  }
}

// ---- Cross-entropy

CrossEntropyResult cross_entropy(Rounding r, int64_t M, int64_t V, const double* logits,
                                 const int32_t* targets, int32_t ignore_index, Reduction reduction,
                                 double* lse, double* dlogits) {
  CrossEntropyResult result;
  if (M <= 0) return result;
  if (V <= 0) throw std::invalid_argument("cross_entropy: V must be positive");
  for (int64_t m = 0; m < M; ++m) {
    if (targets[m] == ignore_index) continue;
    if (targets[m] < 0 || targets[m] >= V)
      throw std::invalid_argument("cross_entropy: target " + std::to_string(targets[m]) +
                                  " of row " + std::to_string(m) + " is outside [0, " +
                                  std::to_string(V) + ") and is not ignore_index");
    ++result.valid_rows;
  }
  if (reduction == Reduction::sum)
    result.grad_scale = 1.0;
  else
    result.grad_scale = result.valid_rows > 0 ? 1.0 / double(result.valid_rows) : 0.0;

  double total = 0;
  for (int64_t m = 0; m < M; ++m) {
    const double* row = logits + m * V;
    const double max = *std::max_element(row, row + V);
    double sum_exp = 0;
    for (int64_t n = 0; n < V; ++n) sum_exp += std::exp(row[n] - max);
    const double row_lse = max + std::log(sum_exp);
    if (lse) lse[m] = r.stat(row_lse);
    const bool valid = targets[m] != ignore_index;
    if (valid) total += row_lse - row[targets[m]];
    if (!dlogits) continue;
    for (int64_t n = 0; n < V; ++n) {
      const double p = std::exp(row[n] - row_lse) - (n == targets[m] ? 1.0 : 0.0);
      dlogits[m * V + n] = valid ? r(result.grad_scale * p) : 0.0;
    }
  }
  result.loss = r.stat(total * result.grad_scale);
  return result;
}

} // namespace coda::ref
