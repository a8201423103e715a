// Textbook building blocks of a Llama block, computed in fp64 with an explicit rounding policy.
// Plain C++: no CUDA.
//
// Every function serves two purposes (reference/README.md, ARCHITECTURE section 7):
//  * Rounding::Kind::none : the fp64 ground truth. Nothing is rounded.
//  * Rounding::Kind::bf16 / f16 : the ordinary unfused low-precision path, as PyTorch eager runs
//    it: each op computes from its (already low-precision) inputs and rounds every tensor output
//    to the 16-bit type; a GEMM accumulates in fp32 over its inputs, then rounds. Statistics
//    (rstd, logsumexp, the loss) are kept in fp32, as a GPU kernel would store them.
//  * Rounding::Kind::f32 : the same with fp32 outputs (an fp32 baseline).
// The math between the rounding points is fp64; only the listed outputs round.
//
// Conventions (ARCHITECTURE section 5; include/coda/kernels/args.hpp):
//  * Matrices are row-major; M is the number of tokens (rows). Weights are [out, in].
//  * Output pointers may equal input pointers of the same shape (elementwise ops work in place)
//    unless a function says otherwise. Outputs never overlap each other.
//  * Sizes <= 0 mean "nothing to do"; no function writes outside its outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "coda/core/types.hpp"
#include "reference/gemm.hpp"

namespace coda::ref {

// Where and how an op rounds its outputs.
struct Rounding {
  enum class Kind { none, bf16, f16, f32 } kind = Kind::none;
  // The FP8 recipe (docs/fp8.md): linear() quantizes its operands before the product, each
  // value first rounded as above: activations and gradients in 1 x 128 blocks along the GEMM's
  // reduction (K), weights in 128 x 128 blocks, except the weight gradient's activation X, in
  // 128 x 128 blocks too. The product and everything else round as `kind` says.
  bool fp8 = false;

  // A tensor output: rounded exactly like coda::round_to<T>(float(x)), i.e. first to fp32
  // (what a kernel holds in registers), then to T with round-to-nearest-even.
  double operator()(double x) const;
  // A statistic (rstd, logsumexp, loss): fp32 unless kind == none.
  double stat(double x) const;
  bool exact() const { return kind == Kind::none; }

  // bf16 -> bf16, f16 -> f16, f32 -> f32; i32 is not a floating type (std::invalid_argument).
  static Rounding for_dtype(DType dtype);
};

// data[i] = r(data[i]) for i < n.
void round_all(Rounding r, int64_t n, double* data);
std::vector<double> rounded(Rounding r, std::vector<double> data);

// out[i] = r(a[i] + b[i]) for i < n.
void add(Rounding r, int64_t n, const double* a, const double* b, double* out);

// out[i] = r(alpha * a[i]) for i < n.
void scale(Rounding r, int64_t n, double alpha, const double* a, double* out);

// D = op(A) op(B) in the given layout (reference/gemm.hpp). Exact: fp64 GEMM. Otherwise the
// inputs are rounded to the policy's type (a no-op when they are already representable), the
// product is accumulated in fp32, and D is rounded. With r.fp8 the operands are first replaced
// by the values their block-scaled E4M3 codes stand for (reference/fp8.hpp): fwd A by rows and
// the weight B [N, K] in 128 x 128 blocks; dgrad dY by rows and the weight [K, N] in the same
// blocks; wgrad both operands [K, .] by columns, 128 tokens a block. D must not overlap A or B.
void linear(Rounding r, Layout layout, int64_t M, int64_t N, int64_t K, const double* A,
            const double* B, double* D);

// ---- RMSNorm over the N columns of each row: out = x * rstd[m] * gamma[n],
//      rstd[m] = 1 / sqrt(mean_n x[m, n]^2 + eps).
// x, out [M, N]; gamma [N]; rstd [M] (a statistic).
void rmsnorm_forward(Rounding r, int64_t M, int64_t N, const double* x, const double* gamma,
                     double eps, double* out, double* rstd);

// Backward of rmsnorm_forward, given rstd from it and dout = dL/dout [M, N]:
//   xh = x * rstd,  g = dout * gamma,
//   dx = rstd * (g - xh * mean_n(g * xh))   [M, N]   (may alias dout)
//   dgamma[n] = sum_m dout[m, n] * xh[m, n]  [N]
void rmsnorm_backward(Rounding r, int64_t M, int64_t N, const double* x, const double* gamma,
                      const double* rstd, const double* dout, double* dx, double* dgamma);

// ---- RoPE, Hugging Face Llama convention: rotate-half within each head, by +theta.
// The fused projection qkv [M, (n_q_heads + 2 n_kv_heads) * head_dim] holds Q heads, then K
// heads, then V heads. For Q and K heads, with t = positions[m] * inv_freq[i], i < head_dim / 2:
//   out[i]          = x[i] cos t - x[i + hd/2] sin t
//   out[i + hd/2]   = x[i + hd/2] cos t + x[i] sin t
// V heads are copied unchanged (and rounded). head_dim must be even.
struct RopeShape {
  int64_t n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t width() const { return (n_q_heads + 2 * n_kv_heads) * head_dim; }
};

// in, out [M, shape.width()] (may alias); positions [M]; inv_freq [head_dim / 2].
void rope_forward(Rounding r, int64_t M, RopeShape shape, const int32_t* positions,
                  const double* inv_freq, const double* in, double* out);
// The transpose (= inverse) of rope_forward: rotation by -theta. dout -> din, may alias.
void rope_backward(Rounding r, int64_t M, RopeShape shape, const int32_t* positions,
                   const double* inv_freq, const double* dout, double* din);

// inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2 (computed in fp64; a GPU test feeds
// the same values rounded to fp32 to both sides).
std::vector<double> rope_inv_freq(int64_t head_dim, double theta);

// Llama-3 frequency scaling, as Hugging Face's rope_type "llama3": wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by factor, those shorter than
// original_max_position_embeddings / high_freq_factor are kept, and the band between is a
// linear blend in (original_max_position_embeddings / wavelength).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};
std::vector<double> rope_inv_freq_llama3(int64_t head_dim, double theta,
                                         const Llama3RopeScaling& scaling);

// ---- SwiGLU on separate gate and up matrices [M, F]: out = silu(gate) * up,
//      silu(g) = g * sigmoid(g).
void swiglu_forward(Rounding r, int64_t M, int64_t F, const double* gate, const double* up,
                    double* out);
// dgate = dout * up * sig * (1 + gate * (1 - sig)),  dup = dout * silu(gate).
// dgate, dup must not alias gate, up or dout.
void swiglu_backward(Rounding r, int64_t M, int64_t F, const double* gate, const double* up,
                     const double* dout, double* dgate, double* dup);

// ---- Cross-entropy over V classes, forward and backward in one call.
enum class Reduction { mean, sum };

struct CrossEntropyResult {
  double loss = 0; // a statistic: sum or mean of lse[m] - logits[m, target[m]] over valid rows
  int64_t valid_rows = 0; // rows whose target is not ignore_index
  double grad_scale = 0;  // 1 / valid_rows (mean; 0 when no row is valid) or 1 (sum)
};

// logits [M, V]; targets [M] in [0, V) or ignore_index (anything else: std::invalid_argument,
// before any output is written).
//   lse[m]     = log sum_n exp(logits[m, n])                     [M] statistic (optional: null)
//   dlogits    = grad_scale * (softmax(logits) - onehot(target)), zero rows where ignored
//                [M, V] rounded (optional: null; must not alias logits)
// A mean over zero valid rows is 0 with a zero gradient (PyTorch would return NaN).
CrossEntropyResult cross_entropy(Rounding r, int64_t M, int64_t V, const double* logits,
                                 const int32_t* targets, int32_t ignore_index, Reduction reduction,
                                 double* lse, double* dlogits);

} // namespace coda::ref
