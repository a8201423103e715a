// The main job: one Llama block, forward and backward, through coda's fused schedule
// (coda::llama), checked against the textbook block in fp64 (reference/llama.hpp).
//
//   llama_block [--cpu] [--tokens M]
//
// It runs a middle layer (hidden 256, MLP 704, 4 query / 2 key-value heads of 64, M = 300
// tokens of packed sequences) and the last layer (vocab 512, mean cross-entropy with ignored
// targets) in bf16 from a fixed seed, then prints one row per output and gradient: the max absolute
// and relative error against fp64, the same error of the ordinary unfused bf16 path (the textbook
// block rounded as PyTorch eager rounds), and pass / fail by the project's tolerance rule
//   max|out - fp64| <= 2 * max|unfused bf16 - fp64| + 1e-6
// (the loss, a single number, by the same rule applied per token). Exits 1 if any row fails.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(CODA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include "coda/block/llama.hpp"
#include "coda/coda.hpp"
#include "reference/llama.hpp"
#include "reference/llama_fused.hpp"

namespace {

using coda::DType;
using coda::TensorView;
using Values = std::vector<double>;
namespace llama = coda::llama;
namespace ref = coda::ref;

constexpr int kIgnore = -100;

// A host tensor that owns its bytes: bf16, f32 or i32 (written, never read back), row-major,
// NaN-filled until written.
class Tensor {
public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    bytes_.assign(size_t(n * coda::dtype_size(dtype)), 0xff); // NaN in bf16 and f32
  }
  static Tensor of(DType dtype, std::vector<int64_t> shape, const Values& values) {
    Tensor t(dtype, std::move(shape));
    for (size_t i = 0; i < values.size(); ++i) t.set(i, values[i]);
    return t;
  }
  int64_t numel() const { return int64_t(bytes_.size()) / coda::dtype_size(dtype_); }
  TensorView view() {
    TensorView v;
    v.data = bytes_.data();
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
  Values values() const {
    Values out(static_cast<size_t>(numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = get(i);
    return out;
  }

private:
  void set(size_t i, double x) {
    if (dtype_ == DType::bf16) {
      const uint16_t bits = coda::float_to_bf16_bits(float(x));
      std::memcpy(&bytes_[2 * i], &bits, 2);
    } else if (dtype_ == DType::f32) {
      const float f = float(x);
      std::memcpy(&bytes_[4 * i], &f, 4);
    } else {
      const int32_t k = int32_t(x);
      std::memcpy(&bytes_[4 * i], &k, 4);
    }
  }
  double get(size_t i) const {
    if (dtype_ == DType::bf16) {
      uint16_t bits;
      std::memcpy(&bits, &bytes_[2 * i], 2);
      return coda::bf16_bits_to_float(bits);
    }
    float f;
    std::memcpy(&f, &bytes_[4 * i], 4);
    return f;
  }

  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  std::vector<unsigned char> bytes_;
};

// Random model and data, rounded to bf16 where the block reads bf16.
class Random {
public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  Values uniform(int64_t n, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Values v(static_cast<size_t>(n));
    for (double& x : v) x = double(coda::round_to<coda::bf16>(float(dist(engine_))));
    return v;
  }
  Tensor activation(int64_t rows, int64_t cols) {
    return Tensor::of(DType::bf16, {rows, cols}, uniform(rows * cols, -1, 1));
  }
  Tensor weight(int64_t out, int64_t in) { // entries of size 1/sqrt(in): activations stay O(1)
    const double b = 1 / std::sqrt(double(in));
    return Tensor::of(DType::bf16, {out, in}, uniform(out * in, -b, b));
  }
  Tensor norm(int64_t n) { return Tensor::of(DType::bf16, {n}, uniform(n, 0.5, 1.5)); }

private:
  std::mt19937_64 engine_;
};

// ---- The report.

struct Row {
  std::string tensor;
  double abs_err, rel_err, baseline_err, bound;
  bool pass;
};

Row compare(const std::string& name, const Tensor& out, const Values& exact,
            const Values& unfused) {
  const Values got = out.values();
  double err = 0, base = 0, scale = 1e-300;
  bool nan = false;
  for (size_t i = 0; i < exact.size(); ++i) {
    nan = nan || std::isnan(got[i]);
    err = std::max(err, std::fabs(got[i] - exact[i]));
    base = std::max(base, std::fabs(unfused[i] - exact[i]));
    scale = std::max(scale, std::fabs(exact[i]));
  }
  const double bound = 2 * base + 1e-6;
  return {name, err, err / scale, base, bound, !nan && err <= bound};
}

// The loss: the rule applied to each token's loss, summed with the reduction's scale.
Row compare_loss(const Tensor& loss, const ref::LastForward& exact, const ref::LastForward& unfused,
                 const std::vector<int32_t>& targets, int64_t vocab) {
  double base = 0;
  for (size_t m = 0; m < targets.size(); ++m) {
    if (targets[m] == kIgnore) continue;
    const size_t t = m * size_t(vocab) + size_t(targets[m]);
    base += std::fabs((unfused.lse[m] - unfused.logits[t]) - (exact.lse[m] - exact.logits[t]));
  }
  base *= exact.ce.grad_scale;
  const double got = loss.values()[0], err = std::fabs(got - exact.ce.loss);
  const double bound = 2 * base + 1e-6;
  return {"loss", err,   err / std::fabs(exact.ce.loss),
          base,   bound, !std::isnan(got) && err <= bound};
}

void print_table(const char* title, const std::vector<Row>& rows) {
  std::printf("\n%s\n", title);
  std::printf("  %-22s %13s %13s %16s  %s\n", "tensor", "max abs err", "max rel err",
              "unfused bf16 err", "result");
  for (const Row& r : rows)
    std::printf("  %-22s %13.3e %13.3e %16.3e  %s\n", r.tensor.c_str(), r.abs_err, r.rel_err,
                r.baseline_err, r.pass ? "pass" : "FAIL");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Tensor workspace(llama::Layer layer, llama::Pass pass, const llama::Config& c, int64_t m) {
  return Tensor(DType::f32, {int64_t(llama::workspace_size(layer, pass, c, m) + 3) / 4});
}

ref::LlamaConfig textbook_config(const llama::Config& c) {
  return {c.hidden, c.intermediate, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab, double(c.eps)};
}

// Hugging Face's [gate; up] -> CODA's interleaved rows, by the library's converter.
Tensor fused_gate_up(const Tensor& gate, const Tensor& up, int64_t F, int64_t D) {
  Values stacked = gate.values();
  const Values u = up.values();
  stacked.insert(stacked.end(), u.begin(), u.end());
  Tensor from = Tensor::of(DType::bf16, {2 * F, D}, stacked), fused(DType::bf16, {2 * F, D});
  coda::interleave_gate_up(from.view(), fused.view());
  return fused;
}

struct Timing {
  double forward = 0, backward = 0;
};

// The weights shared by the middle and last layers' F1..F3 and B3..B8, in both layouts.
struct MlpWeights {
  MlpWeights(Random& rnd, const llama::Config& c)
      : w_out(rnd.weight(c.hidden, c.attention_width())), ffn_norm(rnd.norm(c.hidden)),
        gate(rnd.weight(c.intermediate, c.hidden)), up(rnd.weight(c.intermediate, c.hidden)),
        w_gate_up(fused_gate_up(gate, up, c.intermediate, c.hidden)),
        w_down(rnd.weight(c.hidden, c.intermediate)) {}
  Tensor w_out, ffn_norm, gate, up, w_gate_up, w_down;
};

// Gradients of the MLP weights, compared with the textbook's (gate and up interleaved back).
template <class Grads>
void compare_mlp_grads(std::vector<Row>& rows, const llama::Config& c, Tensor& d_out, Tensor& d_ffn,
                       Tensor& d_gate_up, Tensor& d_down, const Grads& exact,
                       const Grads& unfused) {
  const int64_t F = c.intermediate, D = c.hidden;
  rows.push_back(compare("d w_out", d_out, exact.w_o, unfused.w_o));
  rows.push_back(compare("d ffn_norm", d_ffn, exact.ffn_norm, unfused.ffn_norm));
  rows.push_back(compare("d w_gate_up", d_gate_up,
                         ref::fused::interleave_gate_up(F, D, exact.w_gate, exact.w_up),
                         ref::fused::interleave_gate_up(F, D, unfused.w_gate, unfused.w_up)));
  rows.push_back(compare("d w_down", d_down, exact.w_down, unfused.w_down));
}

// ---- The middle layer: attention output of layer l -> x2 and the QKV of layer l+1.
std::vector<Row> run_middle(const llama::Config& c, int64_t M, Random& rnd, Timing& time) {
  const int64_t D = c.hidden, F = c.intermediate, A = c.attention_width(), Nq = c.qkv_width();
  MlpWeights mlp(rnd, c);
  Tensor attn_norm = rnd.norm(D), w_qkv = rnd.weight(Nq, D);
  Tensor x0 = rnd.activation(M, D), y0 = rnd.activation(M, A);
  std::vector<int32_t> positions(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) positions[size_t(m)] = int32_t(m % 128); // sequences of 128
  Values inv_freq = ref::rope_inv_freq(c.head_dim, 500000.0);
  for (double& f : inv_freq) f = double(float(f));
  Tensor pos = Tensor::of(DType::i32, {M}, Values(positions.begin(), positions.end()));
  Tensor freq = Tensor::of(DType::f32, {c.head_dim / 2}, inv_freq);

  Tensor x2(DType::bf16, {M, D}), qkv(DType::bf16, {M, Nq}), x1(DType::bf16, {M, D});
  Tensor z1(DType::bf16, {M, 2 * F}), r1(DType::f32, {M}), r2(DType::f32, {M});
  const llama::MiddleWeights w{mlp.w_out.view(),  mlp.ffn_norm.view(), mlp.w_gate_up.view(),
                               mlp.w_down.view(), attn_norm.view(),    w_qkv.view()};
  const llama::MiddleInputs in{x0.view(), y0.view(), {pos.view(), freq.view()}};
  const llama::MiddleOutputs out{x2.view(), qkv.view()};
  const llama::MiddleSaved saved{x1.view(), z1.view(), r1.view(), r2.view()};
  Tensor ws_f = workspace(llama::Layer::middle, llama::Pass::forward, c, M);
  auto start = std::chrono::steady_clock::now();
  llama::middle_forward(c, w, in, out, saved, ws_f.view());
  time.forward += seconds_since(start);

  Tensor dx2 = rnd.activation(M, D), dqkv = rnd.activation(M, Nq);
  Tensor dx = Tensor::of(DType::bf16, {M, D}, dx2.values()), dy0(DType::bf16, {M, A});
  Tensor d_out(DType::f32, {D, A}), d_ffn(DType::f32, {D}), d_gate_up(DType::f32, {2 * F, D});
  Tensor d_down(DType::f32, {D, F}), d_attn(DType::f32, {D}), d_qkv(DType::f32, {Nq, D});
  const llama::MiddleGrads grads{
      dx.view(),
      dqkv.view(),
      dy0.view(),
      {d_out.view(), d_ffn.view(), d_gate_up.view(), d_down.view(), d_attn.view(), d_qkv.view()}};
  Tensor ws_b = workspace(llama::Layer::middle, llama::Pass::backward, c, M);
  start = std::chrono::steady_clock::now();
  llama::middle_backward(c, w, in, out, saved, grads, false, ws_b.view());
  time.backward += seconds_since(start);

  const ref::LlamaConfig rc = textbook_config(c);
  const ref::MiddleWeights rw{mlp.w_out.values(), mlp.ffn_norm.values(), mlp.gate.values(),
                              mlp.up.values(),    mlp.w_down.values(),   attn_norm.values(),
                              w_qkv.values()};
  const ref::RopeInputs rope{positions, inv_freq};
  const ref::Rounding bf16 = ref::Rounding::for_dtype(DType::bf16);
  const ref::MiddleForward tf = ref::middle_forward(rc, rw, rope, x0.values(), y0.values());
  const ref::MiddleForward lf = ref::middle_forward(rc, rw, rope, x0.values(), y0.values(), bf16);
  const auto backward = [&](ref::Rounding r) {
    return ref::middle_backward(rc, rw, rope, x0.values(), y0.values(), dx2.values(), dqkv.values(),
                                r);
  };
  const ref::MiddleBackward tb = backward({}), lb = backward(bf16);

  std::vector<Row> rows;
  rows.push_back(compare("x2 (residual out)", x2, tf.mlp.x2, lf.mlp.x2));
  rows.push_back(compare("qkv (post-RoPE)", qkv, tf.qkv, lf.qkv));
  rows.push_back(compare("dx0 (residual in)", dx, tb.dx0, lb.dx0));
  rows.push_back(compare("dy0 (attention out)", dy0, tb.dy0, lb.dy0));
  compare_mlp_grads(rows, c, d_out, d_ffn, d_gate_up, d_down, tb.grads, lb.grads);
  rows.push_back(compare("d attn_norm", d_attn, tb.grads.next_attn_norm, lb.grads.next_attn_norm));
  rows.push_back(compare("d w_qkv", d_qkv, tb.grads.w_qkv_next, lb.grads.w_qkv_next));
  return rows;
}

// ---- The last layer: attention output of the last layer -> loss.
std::vector<Row> run_last(const llama::Config& c, int64_t M, Random& rnd, Timing& time) {
  const int64_t D = c.hidden, F = c.intermediate, A = c.attention_width(), V = c.vocab;
  MlpWeights mlp(rnd, c);
  Tensor final_norm = rnd.norm(D), lm_head = rnd.weight(V, D);
  Tensor x0 = rnd.activation(M, D), y0 = rnd.activation(M, A);
  std::vector<int32_t> targets(static_cast<size_t>(M));
  const Values pick = rnd.uniform(M, 0, 1);
  for (int64_t m = 0; m < M; ++m) // one token in ten is padding
    targets[size_t(m)] =
        pick[size_t(m)] < 0.1 ? kIgnore : int32_t(pick[size_t(m)] * 1e6) % int32_t(V);
  Tensor target = Tensor::of(DType::i32, {M}, Values(targets.begin(), targets.end()));

  Tensor loss(DType::f32, {1}), logits(DType::bf16, {M, V}), x1(DType::bf16, {M, D});
  Tensor z1(DType::bf16, {M, 2 * F}), r1(DType::f32, {M}), x2(DType::bf16, {M, D});
  Tensor r2(DType::f32, {M}), dlogits(DType::bf16, {M, V}), grad_scale(DType::f32, {1});
  Tensor zeta(DType::f32, {M});
  const llama::LastWeights w{mlp.w_out.view(),  mlp.ffn_norm.view(), mlp.w_gate_up.view(),
                             mlp.w_down.view(), final_norm.view(),   lm_head.view()};
  const llama::LastInputs in{x0.view(), y0.view(), target.view()};
  const llama::LastSaved saved{x1.view(), z1.view(),      r1.view(),         x2.view(),
                               r2.view(), dlogits.view(), grad_scale.view(), zeta.view()};
  Tensor ws_f = workspace(llama::Layer::last, llama::Pass::forward, c, M);
  auto start = std::chrono::steady_clock::now();
  llama::last_forward(c, w, in, {loss.view(), logits.view()}, saved, ws_f.view());
  time.forward += seconds_since(start);

  Tensor dx(DType::bf16, {M, D}), dy0(DType::bf16, {M, A});
  Tensor d_out(DType::f32, {D, A}), d_ffn(DType::f32, {D}), d_gate_up(DType::f32, {2 * F, D});
  Tensor d_down(DType::f32, {D, F}), d_final(DType::f32, {D}), d_head(DType::f32, {V, D});
  const llama::LastGrads grads{
      {1.f, {}},
      dx.view(),
      dy0.view(),
      {d_out.view(), d_ffn.view(), d_gate_up.view(), d_down.view(), d_final.view(), d_head.view()}};
  Tensor ws_b = workspace(llama::Layer::last, llama::Pass::backward, c, M);
  start = std::chrono::steady_clock::now();
  llama::last_backward(c, w, in, saved, grads, false, ws_b.view());
  time.backward += seconds_since(start);

  const ref::LlamaConfig rc = textbook_config(c);
  const ref::LastWeights rw{mlp.w_out.values(), mlp.ffn_norm.values(), mlp.gate.values(),
                            mlp.up.values(),    mlp.w_down.values(),   final_norm.values(),
                            lm_head.values()};
  const ref::LossSpec spec{targets, kIgnore, ref::Reduction::mean};
  const ref::Rounding bf16 = ref::Rounding::for_dtype(DType::bf16);
  const ref::LastForward tf = ref::last_forward(rc, rw, x0.values(), y0.values(), spec);
  const ref::LastForward lf = ref::last_forward(rc, rw, x0.values(), y0.values(), spec, bf16);
  const ref::LastBackward tb = ref::last_backward(rc, rw, x0.values(), y0.values(), spec, 1.0);
  const ref::LastBackward lb =
      ref::last_backward(rc, rw, x0.values(), y0.values(), spec, 1.0, bf16);

  std::vector<Row> rows;
  rows.push_back(compare_loss(loss, tf, lf, targets, V));
  rows.push_back(compare("logits", logits, tf.logits, lf.logits));
  rows.push_back(compare("dx0 (residual in)", dx, tb.dx0, lb.dx0));
  rows.push_back(compare("dy0 (attention out)", dy0, tb.dy0, lb.dy0));
  compare_mlp_grads(rows, c, d_out, d_ffn, d_gate_up, d_down, tb.grads, lb.grads);
  rows.push_back(compare("d final_norm", d_final, tb.grads.final_norm, lb.grads.final_norm));
  rows.push_back(compare("d lm_head", d_head, tb.grads.w_lm, lb.grads.w_lm));
  return rows;
}

int cuda_devices() {
#if defined(CODA_WITH_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

int run_cpu(int64_t tokens) {
  llama::Config c;
  c.hidden = 256;
  c.intermediate = 704;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab = 512;
  c.eps = 1e-5f;
  std::printf("Llama block, bf16: hidden %lld, MLP %lld, %d query / %d key-value heads of %d, "
              "vocab %lld, M = %lld tokens\n",
              (long long)c.hidden, (long long)c.intermediate, c.n_heads, c.n_kv_heads, c.head_dim,
              (long long)c.vocab, (long long)tokens);

  Random rnd(20260519);
  Timing middle_time, last_time;
  const std::vector<Row> middle = run_middle(c, tokens, rnd, middle_time);
  const std::vector<Row> last = run_last(c, tokens, rnd, last_time);
  print_table("middle layer (out-proj + residual, RMSNorm, SwiGLU MLP + residual, RMSNorm, QKV + "
              "RoPE), forward + backward:",
              middle);
  print_table("last layer (out-proj + residual, RMSNorm, SwiGLU MLP + residual, final RMSNorm, "
              "LM head, cross-entropy), forward + backward:",
              last);
  std::printf("\n(max rel err: relative to the largest |fp64| entry; unfused bf16 err: the "
              "max abs error of the textbook block run in bf16)\n");
  std::printf("CPU backend time: middle layer %.3f s forward, %.3f s backward; last layer %.3f s "
              "forward, %.3f s backward\n",
              middle_time.forward, middle_time.backward, last_time.forward, last_time.backward);

  int failed = 0;
  for (const std::vector<Row>* rows : {&middle, &last})
    for (const Row& r : *rows) failed += r.pass ? 0 : 1;
  if (failed == 0) {
    std::printf("PASS: every output and gradient is within 2x the unfused bf16 error of fp64\n");
    return 0;
  }
  std::printf("FAIL: %d tensors exceed 2x the unfused bf16 error of fp64\n", failed);
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  bool cpu_only = false;
  int64_t tokens = 300;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu") {
      cpu_only = true;
    } else if (arg == "--tokens" && i + 1 < argc) {
      tokens = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--cpu] [--tokens M]\n", argv[0]);
      return 2;
    }
  }
  if (tokens < 1) {
    std::fprintf(stderr, "--tokens must be >= 1\n");
    return 2;
  }

  // --cpu (as tools/demo.sh passes it, having said why): no message of its own.
  if (!cpu_only && cuda_devices() == 0) {
    std::printf("no GPU found: running the CPU backend\n");
  } else if (!cpu_only) {
    // On a GPU the block is timed and checked by bench/bench_block (tools/demo.sh runs it);
    // this example is the CPU backend's block against the textbook block.
    std::printf("GPU found: this example runs the CPU backend (the GPU block: bench/bench_block, "
                "run by tools/demo.sh)\n");
  }
  try {
    return run_cpu(tokens);
  } catch (const coda::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
