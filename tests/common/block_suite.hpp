// The Llama block suite (coda::llama, forward and backward of the first, middle and last layer),
// shared by the CPU tests (tests/cpu/test_block_cpu.cpp) and the GPU tests
// (tests/gpu/test_block_gpu.cpp): every output, saved activation and gradient passes the tolerance
// rule of ARCHITECTURE section 7, with the fp64 textbook block (reference/llama.hpp) as the truth
// and the textbook block in the same 16-bit dtype (PyTorch-eager rounding) as the baseline; also
// gradient accumulation, the loss scale as a value or a tensor, and bitwise determinism.
//
// A case runs on the GPU backend when BlockCase::gpu is set: the fixture installs a DeviceMirror,
// so every HostTensor view the calls receive is a device copy, and each run_* ends with
// sync_views(), which brings the results back for the host-side checks.
//
// Weights start in Hugging Face's layout ([gate; up] separate) and reach the block through
// coda::interleave_gate_up, so the conversion is part of what is tested.
//
// Included by exactly one test file per test binary (it defines the Block tests).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "coda/block/llama.h"
#include "coda/block/llama.hpp"
#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "reference/llama.hpp"
#include "reference/llama_fused.hpp"
#include "tests/common/check.hpp"
#include "tests/common/device_mirror.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda_block_suite {

using coda::DType;
using coda::test::HostTensor;
using Values = std::vector<double>;
namespace llama = coda::llama;
namespace ref = coda::ref;

struct BlockCase {
  const char* name;
  llama::Config config;
  int64_t tokens;
  DType dtype;      // activations and weights
  DType grad_dtype; // weight and gamma gradients
  bool gpu = false; // run on the GPU backend (skipped without an sm_90 GPU)
};

// GoogleTest's printer for the parameter (--gtest_list_tests, failures): the case's words.
inline void PrintTo(const BlockCase& c, std::ostream* os) {
  *os << c.name << ": hidden " << c.config.hidden << ", intermediate " << c.config.intermediate
      << ", heads " << c.config.n_heads << "/" << c.config.n_kv_heads << " of " << c.config.head_dim
      << ", vocab " << c.config.vocab << ", " << c.tokens << " tokens, " << dtype_name(c.dtype)
      << " (gradients " << dtype_name(c.grad_dtype) << ")" << (c.gpu ? ", GPU" : "");
}

inline llama::Config make_config(int64_t hidden, int64_t intermediate, int32_t heads,
                                 int32_t kv_heads, int32_t head_dim, int64_t vocab) {
  llama::Config c;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab = vocab;
  return c;
}

inline ref::LlamaConfig ref_config(const llama::Config& c) {
  return {c.hidden, c.intermediate, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab, double(c.eps)};
}

inline Values plus(const Values& a, const Values& b) {
  Values out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// [M, F] gate and up -> [M, 2F] with interleaved columns (the layout of z1).
inline Values interleave_columns(const Values& gate, const Values& up, int64_t M, int64_t F) {
  Values out(size_t(2 * M * F));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < F; ++j) {
      out[size_t(m * 2 * F + 2 * j)] = gate[size_t(m * F + j)];
      out[size_t(m * 2 * F + 2 * j + 1)] = up[size_t(m * F + j)];
    }
  return out;
}

inline bool same_bits(HostTensor& a, HostTensor& b) {
  const size_t bytes = size_t(a.numel() * coda::dtype_size(a.dtype()));
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.host_view().data, b.host_view().data, bytes) == 0;
}

inline void check(const std::string& name, const HostTensor& out, const Values& exact,
                  const Values& unfused) {
  CODA_EXPECT_PASSES(coda::test::check_output(name, out, exact, unfused));
}

// A weight or gamma gradient: poisoned, or random when the call accumulates into it.
struct Grad {
  HostTensor tensor;
  Values initial; // empty unless accumulating
};

// A weight or gamma gradient (a sum over tokens, stored in a 16-bit dtype) against its textbook
// values by the rule, each element allowed half an ulp of its dtype more: the final rounding of
// the output (check_rounded_output, kernel_fixtures.hpp, says why). When accumulating, the
// unfused baseline is PyTorch's `grad += g` in the gradient's dtype: the sum rounds once more.
inline void check_grad(const std::string& name, const Grad& g, const Values& exact,
                       const Values& unfused) {
  using coda::test::check_rounded_output;
  if (g.initial.empty()) {
    CODA_EXPECT_PASSES(check_rounded_output(name, g.tensor, exact, unfused));
    return;
  }
  CODA_EXPECT_PASSES(check_rounded_output(
      name, g.tensor, plus(g.initial, exact),
      ref::rounded(coda::test::lowp(g.tensor.dtype()), plus(g.initial, unfused))));
}

// The outputs the middle and last layers share: the MLP's saved tensors (forward) and the
// gradients through the MLP and the attention output projection (backward). Result is a
// MiddleResult or LastResult, Backward the matching ref::MiddleBackward or ref::LastBackward.
// z1: saved.z1 as the forward left it (the backward overwrites it with its gradient).
template <class Result>
void check_mlp_saved(const Result& r, const HostTensor& z1, const ref::MlpForward& exact,
                     const ref::MlpForward& unfused, int64_t M, int64_t F) {
  check("saved.x1", r.x1, exact.x1, unfused.x1);
  check("saved.z1", z1, interleave_columns(exact.gate, exact.up, M, F),
        interleave_columns(unfused.gate, unfused.up, M, F));
  check("saved.r1", r.r1, exact.rstd1, unfused.rstd1);
}

template <class Result, class Backward>
void check_mlp_backward(const Result& r, const Backward& exact, const Backward& unfused, int64_t D,
                        int64_t F) {
  check("grads.dx (d x0)", r.dx, exact.dx0, unfused.dx0);
  check("grads.dy0", r.dy0, exact.dy0, unfused.dy0);
  check_grad("d w_out", r.d_out, exact.grads.w_o, unfused.grads.w_o);
  check_grad("d ffn_norm", r.d_ffn, exact.grads.ffn_norm, unfused.grads.ffn_norm);
  check_grad("d w_gate_up", r.d_gate_up,
             ref::fused::interleave_gate_up(F, D, exact.grads.w_gate, exact.grads.w_up),
             ref::fused::interleave_gate_up(F, D, unfused.grads.w_gate, unfused.grads.w_up));
  check_grad("d w_down", r.d_down, exact.grads.w_down, unfused.grads.w_down);
}

// The loss is one number: the tolerance rule on it alone compares two sums of nearly cancelling
// per-token errors, and their ratio is heavy-tailed. The bound is instead the rule applied to
// each token's loss and summed (with the reduction's scale): twice the baseline's summed
// per-token error, plus 1e-6.
inline void check_loss(const HostTensor& loss, const ref::LastForward& exact,
                       const ref::LastForward& unfused, const std::vector<int32_t>& targets,
                       int64_t V) {
  double baseline_error = 0;
  for (size_t m = 0; m < targets.size(); ++m) {
    if (targets[m] == -100) continue;
    const size_t target = m * size_t(V) + size_t(targets[m]);
    baseline_error += std::fabs((unfused.lse[m] - unfused.logits[target]) -
                                (exact.lse[m] - exact.logits[target]));
  }
  const double bound = 2 * exact.ce.grad_scale * baseline_error + 1e-6;
  const double out = loss.values()[0];
  EXPECT_LE(std::fabs(out - exact.ce.loss), bound)
      << "outputs.loss = " << out << ", textbook fp64 " << exact.ce.loss << " (seed "
      << coda::test::test_seed() << ")";
}

// Random tensors of one case, from the test's seeds.
class Maker {
public:
  Maker(const BlockCase& bc, coda::test::Seeds& seeds)
      : c(bc.config), M(bc.tokens), dt(bc.dtype), seeds_(seeds) {}

  HostTensor activation(int64_t cols) { return HostTensor::random(dt, {M, cols}, seeds_.next()); }
  HostTensor weight(int64_t out, int64_t in) {
    const double bound = 1.0 / std::sqrt(double(in));
    return HostTensor::random(dt, {out, in}, seeds_.next(), -bound, bound);
  }
  HostTensor norm() { return HostTensor::random(dt, {c.hidden}, seeds_.next(), 0.5, 1.5); }
  HostTensor output(int64_t cols) { return HostTensor(dt, {M, cols}); }
  HostTensor stat() { return HostTensor(DType::f32, {M}); }
  Grad grad(DType grad_dtype, std::vector<int64_t> shape, bool accumulate) {
    if (!accumulate) return {HostTensor(grad_dtype, shape), {}};
    HostTensor g = HostTensor::random(grad_dtype, shape, seeds_.next());
    Values initial = g.values();
    return {std::move(g), std::move(initial)};
  }
  // Hugging Face's [gate; up] -> the fused interleaved weight, by the public converter.
  HostTensor fused_gate_up(const HostTensor& gate, const HostTensor& up) {
    Values stacked = gate.values();
    const Values up_values = up.values();
    stacked.insert(stacked.end(), up_values.begin(), up_values.end());
    HostTensor from = HostTensor::of(dt, {2 * c.intermediate, c.hidden}, stacked);
    HostTensor fused(dt, {2 * c.intermediate, c.hidden});
    coda::interleave_gate_up(from.host_view(), fused.host_view()); // setup, on the host
    return fused;
  }
  // Exactly the bytes workspace_size asks for (a 1-byte dtype), the guard bytes right after
  // them: `copies` given, the smaller workspace of a call given the weights' FP8 copies.
  HostTensor workspace(llama::Layer layer, llama::Pass pass,
                       llama::Fp8WeightCopies copies = llama::Fp8WeightCopies::in_workspace) {
    return HostTensor(DType::e4m3, {int64_t(llama::workspace_size(layer, pass, c, M, copies))});
  }
  std::vector<int32_t> targets() { // about one in eight ignored
    const Values u = coda::test::random_doubles(size_t(M), seeds_.next(), 0, 1);
    std::vector<int32_t> t(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m)
      t[size_t(m)] = u[size_t(m)] < 0.125
                         ? -100
                         : std::min(int32_t(c.vocab - 1),
                                    int32_t((u[size_t(m)] - 0.125) / 0.875 * double(c.vocab)));
    return t;
  }

  llama::Config c; // tests may change the loss reduction
  const int64_t M;
  const DType dt;

private:
  coda::test::Seeds& seeds_;
};

// Packed-sequence positions and the fp32 frequency table, as tensors and as the textbook's spans.
struct RopeTensors {
  RopeTensors(int64_t M, int64_t head_dim)
      : positions_v(coda::test::packed_positions(M, 61, 1000)),
        inv_freq_v(coda::test::rope_inv_freq_f32(head_dim)),
        positions(HostTensor::of_ints({M}, positions_v)),
        inv_freq(HostTensor::of(DType::f32, {head_dim / 2}, inv_freq_v)) {}
  llama::Rope view() { return {positions.view(), inv_freq.view()}; }
  ref::RopeInputs textbook() const { return {positions_v, inv_freq_v}; }

  std::vector<int32_t> positions_v;
  Values inv_freq_v;
  HostTensor positions, inv_freq;
};

// A layer's FP8 weight copies (coda/block/llama.hpp, Fp8Weight): four tensors a weight [N, K],
// poisoned until quantize_weights writes them.
class WeightCopies {
public:
  // The weights with copies of each layer, [N, K] in the Fp8Weights structs' field order.
  static WeightCopies first(const llama::Config& c) { return {{{c.qkv_width(), c.hidden}}}; }
  static WeightCopies middle(const llama::Config& c) {
    return {{{c.hidden, c.attention_width()},
             {2 * c.intermediate, c.hidden},
             {c.hidden, c.intermediate},
             {c.qkv_width(), c.hidden}}};
  }
  static WeightCopies last(const llama::Config& c) {
    return {{{c.hidden, c.attention_width()},
             {2 * c.intermediate, c.hidden},
             {c.hidden, c.intermediate}}};
  }

  llama::Fp8Weight weight(size_t i) {
    return {tensors[4 * i].view(), tensors[4 * i + 1].view(), tensors[4 * i + 2].view(),
            tensors[4 * i + 3].view()};
  }
  llama::FirstFp8Weights first() { return {weight(0)}; }
  llama::MiddleFp8Weights middle() { return {weight(0), weight(1), weight(2), weight(3)}; }
  llama::LastFp8Weights last() { return {weight(0), weight(1), weight(2)}; }
  size_t weights() const { return tensors.size() / 4; }

  // The copies with weight i's scales doubled, those of its transposed copy or of its forward
  // one: the values that copy stands for, doubled exactly (the scales are powers of two).
  WeightCopies with_scales_doubled(size_t i, bool transposed) const {
    WeightCopies changed = *this;
    HostTensor& scales = changed.tensors[4 * i + (transposed ? 3 : 1)];
    Values doubled = scales.values();
    for (double& v : doubled) v *= 2;
    scales = HostTensor::of(DType::e8m0, scales.shape(), doubled);
    return changed;
  }

  std::vector<HostTensor> tensors; // codes, scales, codes_t, scales_t of each weight

private:
  WeightCopies(std::initializer_list<std::pair<int64_t, int64_t>> shapes) {
    for (const auto& [n, k] : shapes) {
      const int64_t nb = coda::num_fp8_scale_blocks(n), kb = coda::num_fp8_scale_blocks(k);
      tensors.emplace_back(DType::e4m3, std::vector<int64_t>{n, k});
      tensors.emplace_back(DType::e8m0, std::vector<int64_t>{nb, kb});
      tensors.emplace_back(DType::e4m3, std::vector<int64_t>{k, n});
      tensors.emplace_back(DType::e8m0, std::vector<int64_t>{kb, nb});
    }
  }
};

class Block : public ::testing::TestWithParam<BlockCase> {
protected:
  void SetUp() override {
    if (!GetParam().gpu) return;
    if (!coda::test::gpu_backend_available()) GTEST_SKIP() << "no sm_90 GPU";
    mirror = std::make_unique<coda::test::DeviceMirror>();
  }

  coda::test::Seeds seeds;
  Maker make{GetParam(), seeds};
  const llama::Config& c = make.c;
  const int64_t M = make.M;
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  std::unique_ptr<coda::test::DeviceMirror> mirror; // GPU cases: views are device copies
};

// ---------------------------------------------------------------------------------------------
// First layer.

TEST_P(Block, FirstLayer) {
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating weight gradients" : "writing weight gradients");
    const int64_t D = c.hidden, Nq = c.qkv_width();
    RopeTensors rope(M, c.head_dim);
    HostTensor attn_norm = make.norm(), w_qkv = make.weight(Nq, D), x = make.activation(D);
    HostTensor qkv = make.output(Nq), rstd = make.stat();
    HostTensor ws_f = make.workspace(llama::Layer::first, llama::Pass::forward);
    const llama::FirstWeights weights{attn_norm.view(), w_qkv.view()};
    const llama::FirstInputs inputs{x.view(), rope.view()};
    llama::first_forward(c, weights, inputs, {qkv.view()}, {rstd.view()}, ws_f.view());

    HostTensor dqkv = make.activation(Nq), dx_res = make.activation(D);
    HostTensor dx = HostTensor::of(make.dt, {M, D}, dx_res.values());
    Grad d_norm = make.grad(GetParam().grad_dtype, {D}, accumulate);
    Grad d_qkv = make.grad(GetParam().grad_dtype, {Nq, D}, accumulate);
    HostTensor ws_b = make.workspace(llama::Layer::first, llama::Pass::backward);
    llama::first_backward(c, weights, inputs, {qkv.view()}, {rstd.view()},
                          {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}},
                          accumulate, ws_b.view());
    coda::test::sync_views();

    const ref::LlamaConfig rc = ref_config(c);
    const ref::FirstWeights rw{attn_norm.values(), w_qkv.values()};
    const auto fwd = [&](ref::Rounding r) {
      return ref::first_forward(rc, rw, rope.textbook(), x.values(), r);
    };
    const ref::FirstForward tf = fwd({}), lf = fwd(lowp);
    check("outputs.qkv", qkv, tf.qkv, lf.qkv);
    check("saved.rstd", rstd, tf.rstd, lf.rstd);
    const auto bwd = [&](ref::Rounding r) {
      return ref::first_backward(rc, rw, rope.textbook(), x.values(), dqkv.values(),
                                 dx_res.values(), r);
    };
    const ref::FirstBackward tb = bwd({}), lb = bwd(lowp);
    check("grads.dx", dx, tb.dx0, lb.dx0);
    check_grad("d attn_norm", d_norm, tb.grads.attn_norm, lb.grads.attn_norm);
    check_grad("d w_qkv", d_qkv, tb.grads.w_qkv, lb.grads.w_qkv);
  }
}

// ---------------------------------------------------------------------------------------------
// Middle layer.

struct MiddleProblem {
  explicit MiddleProblem(Maker& make)
      : rope(make.M, make.c.head_dim), w_out(make.weight(make.c.hidden, make.c.attention_width())),
        ffn_norm(make.norm()), gate(make.weight(make.c.intermediate, make.c.hidden)),
        up(make.weight(make.c.intermediate, make.c.hidden)),
        w_gate_up(make.fused_gate_up(gate, up)),
        w_down(make.weight(make.c.hidden, make.c.intermediate)), attn_norm(make.norm()),
        w_qkv(make.weight(make.c.qkv_width(), make.c.hidden)), x0(make.activation(make.c.hidden)),
        y0(make.activation(make.c.attention_width())), dx2(make.activation(make.c.hidden)),
        dqkv(make.activation(make.c.qkv_width())) {}

  llama::MiddleWeights weights() {
    return {w_out.view(),  ffn_norm.view(),  w_gate_up.view(),
            w_down.view(), attn_norm.view(), w_qkv.view()};
  }
  ref::MiddleWeights textbook() const {
    return {w_out.values(),  ffn_norm.values(),  gate.values(), up.values(),
            w_down.values(), attn_norm.values(), w_qkv.values()};
  }

  RopeTensors rope;
  HostTensor w_out, ffn_norm, gate, up, w_gate_up, w_down, attn_norm, w_qkv;
  HostTensor x0, y0, dx2, dqkv;
};

struct MiddleResult {
  HostTensor x2, qkv, x1, z1, r1, r2, dx, dy0;
  Grad d_out, d_ffn, d_gate_up, d_down, d_attn, d_qkv;
  HostTensor z1_forward; // z1 as the forward saved it (the backward overwrites z1)
  HostTensor r2_forward; // r2 likewise (the two-part backward leaves zeta1 over it)

  // What the forward wrote (saved.z1 and .r2 as it left them), and what the backward wrote.
  std::vector<HostTensor*> forward() { return {&x2, &qkv, &x1, &z1_forward, &r1, &r2_forward}; }
  std::vector<HostTensor*> backward() {
    return {&z1,
            &dx,
            &dy0,
            &d_out.tensor,
            &d_ffn.tensor,
            &d_gate_up.tensor,
            &d_down.tensor,
            &d_attn.tensor,
            &d_qkv.tensor};
  }

  // Everything the block wrote but saved.r2 (one backward keeps it, the other does not).
  std::vector<HostTensor*> all() {
    return {&x2,
            &qkv,
            &x1,
            &z1,
            &r1,
            &r2_forward,
            &dx,
            &dy0,
            &d_out.tensor,
            &d_ffn.tensor,
            &d_gate_up.tensor,
            &d_down.tensor,
            &d_attn.tensor,
            &d_qkv.tensor};
  }
};

// Makes a block call; where it throws (a refusal under test), brings every viewed tensor back
// first, while the caller's tensors are still alive: under a device mirror each view is copied
// back to its host address at the next sync, which must not come after those tensors are freed
// (the FP8 refusals did, and corrupted the host heap: H100, ca27f2d).
template <class Call> void block_call(const Call& call) {
  try {
    call();
  } catch (...) {
    coda::test::sync_views();
    throw;
  }
}

// The middle backward as one call (middle_backward) or as its two parts (middle_backward_part),
// each part given only its own gradients. `fp8`: the weights' FP8 copies given to every call
// (inputs.fp8_weights), already written; each call then has exactly the smaller workspace
// (workspace_size with Fp8WeightCopies::given), unless `full_workspace`.
enum class BackwardCalls { one, two_parts };

// The workspace copies of a call given `fp8` (null: none given) and `full_workspace` ask for.
inline llama::Fp8WeightCopies workspace_copies(const WeightCopies* fp8, bool full_workspace) {
  return fp8 != nullptr && !full_workspace ? llama::Fp8WeightCopies::given
                                           : llama::Fp8WeightCopies::in_workspace;
}

// After a layer's calls: none wrote past the end of its workspace (into its guard bytes).
inline void expect_within(std::initializer_list<const HostTensor*> workspaces) {
  for (const HostTensor* ws : workspaces)
    if (ws->numel() > 0) {
      EXPECT_TRUE(ws->guard_intact()) << "a call wrote past its workspace";
    }
}

inline MiddleResult run_middle(Maker& make, MiddleProblem& p, DType grad_dtype, bool accumulate,
                               BackwardCalls calls = BackwardCalls::one,
                               WeightCopies* fp8 = nullptr, bool full_workspace = false) {
  const llama::Config& c = make.c;
  const llama::Fp8WeightCopies copies = workspace_copies(fp8, full_workspace);
  const int64_t D = c.hidden, F = c.intermediate;
  MiddleResult r{make.output(D),
                 make.output(c.qkv_width()),
                 make.output(D),
                 make.output(2 * F),
                 make.stat(),
                 make.stat(),
                 HostTensor::of(make.dt, {make.M, D}, p.dx2.values()),
                 make.output(c.attention_width()),
                 make.grad(grad_dtype, {D, c.attention_width()}, accumulate),
                 make.grad(grad_dtype, {D}, accumulate),
                 make.grad(grad_dtype, {2 * F, D}, accumulate),
                 make.grad(grad_dtype, {D, F}, accumulate),
                 make.grad(grad_dtype, {D}, accumulate),
                 make.grad(grad_dtype, {c.qkv_width(), D}, accumulate),
                 HostTensor(),
                 HostTensor()};
  const auto inputs = [&] {
    return llama::MiddleInputs{p.x0.view(), p.y0.view(), p.rope.view(),
                               fp8 != nullptr ? fp8->middle() : llama::MiddleFp8Weights{}};
  };
  const auto outputs = [&] { return llama::MiddleOutputs{r.x2.view(), r.qkv.view()}; };
  const auto saved = [&] {
    return llama::MiddleSaved{r.x1.view(), r.z1.view(), r.r1.view(), r.r2.view()};
  };
  HostTensor ws_f = make.workspace(llama::Layer::middle, llama::Pass::forward, copies);
  block_call(
      [&] { llama::middle_forward(c, p.weights(), inputs(), outputs(), saved(), ws_f.view()); });
  // The backward overwrites saved.z1 with its gradient: keep the forward's for its check (the
  // views below upload the forward's results again where a device mirror is installed).
  coda::test::sync_views();
  r.z1_forward = r.z1;
  r.r2_forward = r.r2;

  const llama::MiddleGrads grads{r.dx.view(),
                                 p.dqkv.view(),
                                 r.dy0.view(),
                                 {r.d_out.tensor.view(), r.d_ffn.tensor.view(),
                                  r.d_gate_up.tensor.view(), r.d_down.tensor.view(),
                                  r.d_attn.tensor.view(), r.d_qkv.tensor.view()}};
  // The workspaces outlive the sync below, which copies every viewed tensor back to its host
  // memory where a device mirror is installed (device_mirror.hpp).
  HostTensor ws_b, ws_parts[2];
  if (calls == BackwardCalls::one) {
    ws_b = make.workspace(llama::Layer::middle, llama::Pass::backward, copies);
    block_call([&] {
      llama::middle_backward(c, p.weights(), inputs(), outputs(), saved(), grads, accumulate,
                             ws_b.view());
    });
  } else {
    const coda::TensorView none{};
    llama::MiddleGrads part1{grads.dx, grads.dqkv, none, {}};
    part1.dweights.w_down = grads.dweights.w_down;
    part1.dweights.attn_norm = grads.dweights.attn_norm;
    part1.dweights.w_qkv = grads.dweights.w_qkv;
    llama::MiddleGrads part2{grads.dx, none, grads.dy0, {}};
    part2.dweights.w_out = grads.dweights.w_out;
    part2.dweights.ffn_norm = grads.dweights.ffn_norm;
    part2.dweights.w_gate_up = grads.dweights.w_gate_up;
    // Part 2 without outputs.qkv, which it does not read (a caller may free it after part 1).
    llama::MiddleOutputs without_qkv = outputs();
    without_qkv.qkv = none;
    int i = 0;
    for (const auto& call : {std::pair{llama::Pass::backward_part1, part1},
                             std::pair{llama::Pass::backward_part2, part2}}) {
      HostTensor& ws = ws_parts[i++];
      ws = make.workspace(llama::Layer::middle, call.first, copies);
      const bool first = call.first == llama::Pass::backward_part1;
      block_call([&] {
        llama::middle_backward_part(call.first, c, p.weights(), inputs(),
                                    first ? outputs() : without_qkv, saved(), call.second,
                                    accumulate, ws.view());
      });
    }
  }
  coda::test::sync_views();
  expect_within({&ws_f, &ws_b, &ws_parts[0], &ws_parts[1]});
  return r;
}

// One middle-layer run against the textbook block (both roundings).
inline void expect_middle_layer(Maker& make, DType grad_dtype, bool accumulate,
                                BackwardCalls calls = BackwardCalls::one) {
  const llama::Config& c = make.c;
  const int64_t M = make.M, D = c.hidden, F = c.intermediate;
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  MiddleProblem p(make);
  MiddleResult r = run_middle(make, p, grad_dtype, accumulate, calls);
  const ref::LlamaConfig rc = ref_config(c);
  const ref::MiddleWeights rw = p.textbook();

  const auto fwd = [&](ref::Rounding rr) {
    return ref::middle_forward(rc, rw, p.rope.textbook(), p.x0.values(), p.y0.values(), rr);
  };
  const ref::MiddleForward tf = fwd({}), lf = fwd(lowp);
  check("outputs.x2", r.x2, tf.mlp.x2, lf.mlp.x2);
  check("outputs.qkv", r.qkv, tf.qkv, lf.qkv);
  check_mlp_saved(r, r.z1_forward, tf.mlp, lf.mlp, M, F);
  check("saved.r2", r.r2_forward, tf.rstd2, lf.rstd2);

  const auto bwd = [&](ref::Rounding rr) {
    return ref::middle_backward(rc, rw, p.rope.textbook(), p.x0.values(), p.y0.values(),
                                p.dx2.values(), p.dqkv.values(), rr);
  };
  const ref::MiddleBackward tb = bwd({}), lb = bwd(lowp);
  check_mlp_backward(r, tb, lb, D, F);
  check_grad("d attn_norm", r.d_attn, tb.grads.next_attn_norm, lb.grads.next_attn_norm);
  check_grad("d w_qkv", r.d_qkv, tb.grads.w_qkv_next, lb.grads.w_qkv_next);
}

TEST_P(Block, MiddleLayer) {
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating weight gradients" : "writing weight gradients");
    expect_middle_layer(make, GetParam().grad_dtype, accumulate);
  }
}

TEST_P(Block, MiddleLayerIsBitwiseDeterministic) {
  MiddleProblem p(make);
  MiddleResult first = run_middle(make, p, GetParam().grad_dtype, false);
  MiddleResult second = run_middle(make, p, GetParam().grad_dtype, false);
  const std::vector<HostTensor*> a = first.all(), b = second.all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
}

// The two-part backward runs the one call's kernels in the same order on the same tensors: the
// same bits, but for saved.r2, where part 1 leaves zeta1 for part 2. Accumulating, against the
// textbook.
TEST_P(Block, MiddleLayerInTwoPartsIsTheOneCall) {
  MiddleProblem p(make);
  MiddleResult one = run_middle(make, p, GetParam().grad_dtype, false, BackwardCalls::one);
  MiddleResult two = run_middle(make, p, GetParam().grad_dtype, false, BackwardCalls::two_parts);
  const std::vector<HostTensor*> a = one.all(), b = two.all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
  EXPECT_TRUE(same_bits(one.r2, one.r2_forward)) << "the one-call backward keeps saved.r2";
  SCOPED_TRACE("two parts, accumulating weight gradients");
  expect_middle_layer(make, GetParam().grad_dtype, true, BackwardCalls::two_parts);
}

// ---------------------------------------------------------------------------------------------
// Last layer.

struct LastProblem {
  LastProblem(Maker& make, ref::Reduction reduction)
      : w_out(make.weight(make.c.hidden, make.c.attention_width())), ffn_norm(make.norm()),
        gate(make.weight(make.c.intermediate, make.c.hidden)),
        up(make.weight(make.c.intermediate, make.c.hidden)),
        w_gate_up(make.fused_gate_up(gate, up)),
        w_down(make.weight(make.c.hidden, make.c.intermediate)), final_norm(make.norm()),
        lm_head(make.weight(make.c.vocab, make.c.hidden)), x0(make.activation(make.c.hidden)),
        y0(make.activation(make.c.attention_width())), targets_v(make.targets()),
        targets(HostTensor::of_ints({make.M}, targets_v)), loss{targets_v, -100, reduction} {}

  llama::LastWeights weights() {
    return {w_out.view(),  ffn_norm.view(),   w_gate_up.view(),
            w_down.view(), final_norm.view(), lm_head.view()};
  }
  ref::LastWeights textbook() const {
    return {w_out.values(),  ffn_norm.values(),   gate.values(),   up.values(),
            w_down.values(), final_norm.values(), lm_head.values()};
  }

  HostTensor w_out, ffn_norm, gate, up, w_gate_up, w_down, final_norm, lm_head, x0, y0;
  std::vector<int32_t> targets_v;
  HostTensor targets;
  ref::LossSpec loss;
};

struct LastResult {
  HostTensor loss, logits, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta, dx, dy0;
  Grad d_out, d_ffn, d_gate_up, d_down, d_final, d_head;
  HostTensor z1_forward; // z1 as the forward saved it (the backward overwrites z1)

  std::vector<HostTensor*> forward() {
    return {&loss, &x1, &z1_forward, &r1, &x2, &r2, &dlogits, &grad_scale, &zeta};
  }
  std::vector<HostTensor*> backward() {
    return {&z1,
            &dx,
            &dy0,
            &d_out.tensor,
            &d_ffn.tensor,
            &d_gate_up.tensor,
            &d_down.tensor,
            &d_final.tensor,
            &d_head.tensor};
  }

  std::vector<HostTensor*> all() {
    return {&loss,
            &x1,
            &z1,
            &r1,
            &x2,
            &r2,
            &dlogits,
            &grad_scale,
            &zeta,
            &dx,
            &dy0,
            &d_out.tensor,
            &d_ffn.tensor,
            &d_gate_up.tensor,
            &d_down.tensor,
            &d_final.tensor,
            &d_head.tensor};
  }
};

// The loss gradient of a last-layer run: a value, times a [1] f32 tensor where one is given. The
// tensor's view is taken after the forward's sync_views(), which retires the device copies of the
// views taken before it (a view taken by the caller was freed memory by the backward, and its
// address the next copy's: "grads.dx overlaps grads.dloss.tensor", H100, 57f4a19; since then a
// retired copy is NaN-poisoned and kept, device_mirror.hpp).
struct Dloss {
  float value;
  HostTensor* tensor = nullptr;
};

// with_logits: also write the logits to outputs.logits (otherwise they only pass through
// saved.dlogits, which the cross-entropy overwrites in place). `fp8`, `full_workspace`: as
// run_middle's.
inline LastResult run_last(Maker& make, LastProblem& p, DType grad_dtype, bool accumulate,
                           Dloss dloss, bool with_logits, WeightCopies* fp8 = nullptr,
                           bool full_workspace = false) {
  const llama::Config& c = make.c;
  const llama::Fp8WeightCopies copies = workspace_copies(fp8, full_workspace);
  const int64_t D = c.hidden, F = c.intermediate, V = c.vocab;
  LastResult r{HostTensor(DType::f32, {1}),
               with_logits ? make.output(V) : HostTensor(),
               make.output(D),
               make.output(2 * F),
               make.stat(),
               make.output(D),
               make.stat(),
               make.output(V),
               HostTensor(DType::f32, {1}),
               make.stat(),
               make.output(D),
               make.output(c.attention_width()),
               make.grad(grad_dtype, {D, c.attention_width()}, accumulate),
               make.grad(grad_dtype, {D}, accumulate),
               make.grad(grad_dtype, {2 * F, D}, accumulate),
               make.grad(grad_dtype, {D, F}, accumulate),
               make.grad(grad_dtype, {D}, accumulate),
               make.grad(grad_dtype, {V, D}, accumulate),
               HostTensor()};
  const auto inputs = [&] {
    return llama::LastInputs{p.x0.view(), p.y0.view(), p.targets.view(),
                             fp8 != nullptr ? fp8->last() : llama::LastFp8Weights{}};
  };
  const auto saved = [&] {
    return llama::LastSaved{r.x1.view(), r.z1.view(),      r.r1.view(),         r.x2.view(),
                            r.r2.view(), r.dlogits.view(), r.grad_scale.view(), r.zeta.view()};
  };
  HostTensor ws_f = make.workspace(llama::Layer::last, llama::Pass::forward, copies);
  block_call([&] {
    llama::last_forward(c, p.weights(), inputs(), {r.loss.view(), r.logits.view()}, saved(),
                        ws_f.view());
  });
  // The backward overwrites saved.z1 (run_middle says why this syncs).
  coda::test::sync_views();
  r.z1_forward = r.z1;

  const coda::Scalar dloss_arg{dloss.value,
                               dloss.tensor != nullptr ? dloss.tensor->view() : coda::TensorView{}};
  const llama::LastGrads grads{dloss_arg,
                               r.dx.view(),
                               r.dy0.view(),
                               {r.d_out.tensor.view(), r.d_ffn.tensor.view(),
                                r.d_gate_up.tensor.view(), r.d_down.tensor.view(),
                                r.d_final.tensor.view(), r.d_head.tensor.view()}};
  HostTensor ws_b = make.workspace(llama::Layer::last, llama::Pass::backward, copies);
  block_call([&] {
    llama::last_backward(c, p.weights(), inputs(), saved(), grads, accumulate, ws_b.view());
  });
  coda::test::sync_views();
  expect_within({&ws_f, &ws_b});
  return r;
}

// The unscaled loss gradient softmax - onehot and zeta = sum_n logits * dlogits, from logits.
struct LossGradient {
  Values dlogits, zeta;
};
inline LossGradient loss_gradient(ref::Rounding r, const Values& logits, const LastProblem& p,
                                  int64_t M, int64_t V) {
  LossGradient g{Values(logits.size()), Values(size_t(M), 0.0)};
  ref::cross_entropy(r, M, V, logits.data(), p.targets_v.data(), -100, ref::Reduction::sum, nullptr,
                     g.dlogits.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < V; ++n)
      g.zeta[size_t(m)] += logits[size_t(m * V + n)] * g.dlogits[size_t(m * V + n)];
  return g;
}

// saved.zeta[m] = sum_n l * (softmax(l) - onehot) is an fp32 statistic of the logits as stored
// (coda/kernels/args.hpp, cross_entropy): it is held to that function of coda's own stored logits,
// evaluated in fp64, within a rigorous bound of its fp32 evaluation, (V + 8) u sum_n |l| (p + 1)
// (the V-term sum, the exponentials and the LSE; u = 2^-24). The logits themselves are held to
// the 2x rule (outputs.logits). Holding zeta end to end to the 2x rule compared the propagated
// errors of two different roundings of the logits, a ratio of two noisy maxima over few rows:
// it failed a correct result at CODA_TEST_SEED=672 (LastLayer/bf16_one_block, M = 61: coda's
// error 9.15e-3 against 2 x 4.5e-3), 1 of 1000 seeds (tools/seed_sweep.sh, docs/reliability.md).
inline void check_zeta_of_stored_logits(const HostTensor& zeta, const Values& logits,
                                        const std::vector<int32_t>& targets, int64_t M, int64_t V) {
  ASSERT_TRUE(zeta.guard_intact()) << "saved.zeta: written past its end";
  const Values got = zeta.values();
  for (int64_t m = 0; m < M; ++m) {
    const double* l = logits.data() + m * V;
    double max = l[0], sum = 0, zeta_exact = 0, scale = 0;
    for (int64_t n = 0; n < V; ++n) max = std::max(max, l[n]);
    for (int64_t n = 0; n < V; ++n) sum += std::exp(l[n] - max);
    const int32_t t = targets[size_t(m)];
    for (int64_t n = 0; n < V && t != -100; ++n) {
      const double p = std::exp(l[n] - max) / sum;
      zeta_exact += l[n] * (p - (n == t ? 1.0 : 0.0));
      scale += std::fabs(l[n]) * (p + 1.0);
    }
    const double bound = double(V + 8) * 0x1p-24 * scale + 1e-6;
    EXPECT_LE(std::fabs(got[size_t(m)] - zeta_exact), bound)
        << "saved.zeta[" << m << "] = " << got[size_t(m)] << ", from the stored logits "
        << zeta_exact << " (seed " << coda::test::test_seed() << ")";
  }
}

// How a last-layer run scales and stores its loss gradient.
struct LastLayerCase {
  bool mean, dloss_tensor, accumulate;
  const char* name;
};

// One last-layer run against the textbook block (both roundings). dloss = 0.75 as a value or as
// 3 * a [1] tensor holding 0.25 (the block then multiplies two tensors, grad_scale and dloss's).
inline void expect_last_layer(Maker& make, DType grad_dtype, const LastLayerCase& k) {
  SCOPED_TRACE(k.name);
  const bool mean = k.mean, accumulate = k.accumulate;
  make.c.loss_reduction = mean ? coda::LossReduction::mean : coda::LossReduction::sum;
  const llama::Config& c = make.c;
  const int64_t M = make.M, D = c.hidden, F = c.intermediate, V = c.vocab;
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  LastProblem p(make, mean ? ref::Reduction::mean : ref::Reduction::sum);
  const float dloss = 0.75f;
  HostTensor quarter = HostTensor::of(DType::f32, {1}, {0.25});
  const Dloss dloss_arg = k.dloss_tensor ? Dloss{3.f, &quarter} : Dloss{dloss};
  LastResult r = run_last(make, p, grad_dtype, accumulate, dloss_arg, true);

  const ref::LlamaConfig rc = ref_config(c);
  const ref::LastWeights rw = p.textbook();
  const auto fwd = [&](ref::Rounding rr) {
    return ref::last_forward(rc, rw, p.x0.values(), p.y0.values(), p.loss, rr);
  };
  const ref::LastForward tf = fwd({}), lf = fwd(lowp);
  check_loss(r.loss, tf, lf, p.targets_v, V);
  check("outputs.logits", r.logits, tf.logits, lf.logits);
  check_mlp_saved(r, r.z1_forward, tf.mlp, lf.mlp, M, F);
  check("saved.x2", r.x2, tf.mlp.x2, lf.mlp.x2);
  check("saved.r2", r.r2, tf.rstd2, lf.rstd2);
  const LossGradient tg = loss_gradient({}, tf.logits, p, M, V);
  const LossGradient lg = loss_gradient(lowp, lf.logits, p, M, V);
  check("saved.dlogits", r.dlogits, tg.dlogits, lg.dlogits);
  check_zeta_of_stored_logits(r.zeta, r.logits.values(), p.targets_v, M, V);
  check("saved.grad_scale", r.grad_scale, {tf.ce.grad_scale}, {lf.ce.grad_scale});

  const auto bwd = [&](ref::Rounding rr) {
    return ref::last_backward(rc, rw, p.x0.values(), p.y0.values(), p.loss, dloss, rr);
  };
  const ref::LastBackward tb = bwd({}), lb = bwd(lowp);
  check_mlp_backward(r, tb, lb, D, F);
  check_grad("d final_norm", r.d_final, tb.grads.final_norm, lb.grads.final_norm);
  check_grad("d lm_head", r.d_head, tb.grads.w_lm, lb.grads.w_lm);
}

// A mean and a sum loss, dloss as a value or a tensor, writing or accumulating the weight
// gradients.
TEST_P(Block, LastLayer) {
  for (const LastLayerCase& k :
       {LastLayerCase{true, false, false, "mean loss, dloss value, writing gradients"},
        LastLayerCase{true, true, true, "mean loss, dloss tensor, accumulating gradients"},
        LastLayerCase{false, true, false, "sum loss, dloss tensor, writing gradients"},
        LastLayerCase{false, false, true, "sum loss, dloss value, accumulating gradients"}})
    expect_last_layer(make, GetParam().grad_dtype, k);
}

// dloss as a [1] tensor (times a value) is the same scale as the product given as a value, bit
// for bit, with a mean loss (alpha = dloss * 1/#valid from two tensors) and with a sum.
TEST_P(Block, LastLayerDlossTensor) {
  for (bool mean : {true, false}) {
    SCOPED_TRACE(mean ? "mean loss" : "sum loss");
    make.c.loss_reduction = mean ? coda::LossReduction::mean : coda::LossReduction::sum;
    LastProblem p(make, mean ? ref::Reduction::mean : ref::Reduction::sum);
    const DType g = GetParam().grad_dtype;
    LastResult by_value = run_last(make, p, g, false, {0.7f, {}}, false);
    HostTensor dloss = HostTensor::of(DType::f32, {1}, {double(0.7f)});
    HostTensor half = HostTensor::of(DType::f32, {1}, {0.5});
    LastResult by_tensor = run_last(make, p, g, false, {1.f, &dloss}, false);
    LastResult by_both = run_last(make, p, g, false, {1.4f, &half}, false);
    const std::vector<HostTensor*> a = by_value.all(), b = by_tensor.all(), d = by_both.all();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i << ", dloss = 1 * [0.7]";
      EXPECT_TRUE(same_bits(*a[i], *d[i])) << "result " << i << ", dloss = 1.4 * [0.5]";
    }
  }
}

// Bitwise determinism, and the logits output changes nothing: the run without it (logits
// computed in place in saved.dlogits) gives the same bits as the runs with it.
TEST_P(Block, LastLayerIsBitwiseDeterministic) {
  LastProblem p(make, ref::Reduction::mean);
  LastResult first = run_last(make, p, GetParam().grad_dtype, false, {1.f, {}}, true);
  LastResult second = run_last(make, p, GetParam().grad_dtype, false, {1.f, {}}, true);
  LastResult in_place = run_last(make, p, GetParam().grad_dtype, false, {1.f, {}}, false);
  EXPECT_TRUE(same_bits(first.logits, second.logits));
  const std::vector<HostTensor*> a = first.all(), b = second.all(), d = in_place.all();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
    EXPECT_TRUE(same_bits(*a[i], *d[i])) << "result " << i << " without outputs.logits";
  }
}

// ---------------------------------------------------------------------------------------------
// The forwards with Precision::fp8 (docs/fp8.md, "The FP8 block"): every GEMM of the layer but
// the LM head on block-scaled E4M3 operands. The truth is the textbook block in fp64,
// unquantized; the baseline the textbook block in the 16-bit dtype with each linear but the LM
// head on the FP8 recipe's operands (ref::Rounding::fp8: the unfused FP8 path, the same block
// scales, quantizing what the textbook multiplies: the normalized h and the separate gate and up
// weights, where CODA quantizes the un-normalized h and the interleaved gate/up weight). Every
// output and saved tensor passes the rule against that baseline on RMS errors
// (check_rms_against_baseline: both sides' errors are independent draws of the same
// quantization noise), the loss by check_loss. A config whose GEMM widths gemm_fp8 cannot take
// (not multiples of 16) is refused, naming the width, with nothing written.

inline bool fp8_widths_fit(const llama::Config& c, llama::Layer layer) {
  const bool qkv = layer != llama::Layer::last, mlp = layer != llama::Layer::first;
  return c.hidden % 16 == 0 && (!qkv || c.qkv_width() % 16 == 0) &&
         (!mlp || (c.intermediate % 16 == 0 && c.attention_width() % 16 == 0));
}

inline ref::Rounding fp8_rounding(DType dtype) {
  ref::Rounding r = coda::test::lowp(dtype);
  r.fp8 = true;
  return r;
}

inline void expect_rms(const std::string& name, const HostTensor& out, const Values& truth,
                       const Values& baseline) {
  EXPECT_TRUE(out.guard_intact()) << name << ": written past its end";
  CODA_EXPECT_PASSES(
      coda::test::check_rms_against_baseline("fp8: " + name, out.values(), truth, baseline));
}

// That `out` carries FP8 quantization noise at all: its RMS error is at least half the unfused
// FP8 path's (a call that silently ran 16-bit GEMMs would be far more accurate and pass every
// upper bound). The two errors are draws of the same noise, their ratio within a few percent of 1
// on thousands of values (the sweeps' shares: 0.49-0.53), so half is far from either side.
inline void expect_fp8_noise(const std::string& name, const HostTensor& out, const Values& truth,
                             const Values& baseline) {
  const Values got = out.values();
  ASSERT_EQ(got.size(), truth.size());
  ASSERT_GE(got.size(), size_t(1000)) << name << ": too few values for the ratio to settle";
  double sq = 0, base_sq = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    sq += (got[i] - truth[i]) * (got[i] - truth[i]);
    base_sq += (baseline[i] - truth[i]) * (baseline[i] - truth[i]);
  }
  EXPECT_GE(std::sqrt(sq), 0.5 * std::sqrt(base_sq))
      << name << ": far more accurate than FP8 GEMMs can be (did the call run 16-bit GEMMs?)";
}

// A weight or gamma gradient by expect_rms: accumulated into its initial values when it has
// them, the baseline's sum rounded once more in the gradient's dtype (PyTorch's grad += g).
inline void expect_rms_grad(const std::string& name, const Grad& g, const Values& truth,
                            const Values& baseline) {
  if (g.initial.empty()) return expect_rms(name, g.tensor, truth, baseline);
  expect_rms(name, g.tensor, plus(g.initial, truth),
             ref::rounded(coda::test::lowp(g.tensor.dtype()), plus(g.initial, baseline)));
}

// The MLP's FP8 backward outputs a middle or last layer share (check_mlp_backward's twin on RMS
// errors): dx, dy0 (with its FP8 noise) and the gradients of w_out, ffn_norm, w_gate_up, w_down.
template <class Result, class Backward>
void expect_fp8_mlp_backward(const Result& r, const Backward& exact, const Backward& unfused,
                             int64_t D, int64_t F) {
  expect_rms("grads.dx (d x0)", r.dx, exact.dx0, unfused.dx0);
  expect_rms("grads.dy0", r.dy0, exact.dy0, unfused.dy0);
  expect_fp8_noise("grads.dy0", r.dy0, exact.dy0, unfused.dy0);
  expect_rms_grad("d w_out", r.d_out, exact.grads.w_o, unfused.grads.w_o);
  expect_rms_grad("d ffn_norm", r.d_ffn, exact.grads.ffn_norm, unfused.grads.ffn_norm);
  expect_rms_grad("d w_gate_up", r.d_gate_up,
                  ref::fused::interleave_gate_up(F, D, exact.grads.w_gate, exact.grads.w_up),
                  ref::fused::interleave_gate_up(F, D, unfused.grads.w_gate, unfused.grads.w_up));
  expect_rms_grad("d w_down", r.d_down, exact.grads.w_down, unfused.grads.w_down);
}

// `run` (a forward and an FP8 backward) refused: for M not a multiple of 16 when the widths fit
// (the message names the rule), else for the widths or the activations' dtype (it names fp8).
template <class Run> void expect_fp8_backward_refused(bool fits, const Run& run) {
  try {
    run();
    ADD_FAILURE() << "an FP8 backward that should be refused was accepted";
  } catch (const coda::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fits ? "multiple of 16" : "fp8"), std::string::npos)
        << e.what();
  }
}

// `forward` (taking a workspace) with widths that do not fit: invalid_argument naming the
// rule, and every output still poisoned.
template <class Forward>
void expect_fp8_refused(Maker& make, llama::Layer layer, const Forward& forward,
                        std::initializer_list<HostTensor*> outputs) {
  llama::Config native = make.c;
  native.precision = llama::Precision::native;
  const size_t bytes = llama::workspace_size(layer, llama::Pass::forward, native, make.M);
  HostTensor workspace(DType::f32, {int64_t(bytes / 4 + 1)});
  try {
    forward(workspace);
    ADD_FAILURE() << "an FP8 forward with a GEMM width not a multiple of 16 was accepted";
  } catch (const coda::Error& e) {
    EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument)) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
  coda::test::sync_views();
  for (HostTensor* t : outputs) {
    if (t->numel() == 0) continue;
    for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
  }
}

TEST_P(Block, FirstLayerFp8Forward) {
  make.c.precision = llama::Precision::fp8;
  const int64_t D = c.hidden, Nq = c.qkv_width();
  RopeTensors rope(M, c.head_dim);
  HostTensor attn_norm = make.norm(), w_qkv = make.weight(Nq, D), x = make.activation(D);
  HostTensor qkv = make.output(Nq), rstd = make.stat();
  const auto forward = [&](HostTensor& workspace) {
    llama::first_forward(c, {attn_norm.view(), w_qkv.view()}, {x.view(), rope.view()}, {qkv.view()},
                         {rstd.view()}, workspace.view());
    coda::test::sync_views();
  };
  if (!fp8_widths_fit(c, llama::Layer::first))
    return expect_fp8_refused(make, llama::Layer::first, forward, {&qkv, &rstd});
  HostTensor workspace = make.workspace(llama::Layer::first, llama::Pass::forward);
  forward(workspace);
  const auto fwd = [&](ref::Rounding rr) {
    return ref::first_forward(ref_config(c), {attn_norm.values(), w_qkv.values()}, rope.textbook(),
                              x.values(), rr);
  };
  const ref::FirstForward exact = fwd({}), unfused_fp8 = fwd(fp8_rounding(make.dt));
  expect_rms("outputs.qkv", qkv, exact.qkv, unfused_fp8.qkv);
  expect_fp8_noise("outputs.qkv", qkv, exact.qkv, unfused_fp8.qkv);
  expect_rms("saved.rstd", rstd, exact.rstd, unfused_fp8.rstd);
}

// The first layer's backward with Precision::fp8: K6 on dz quantized by rows and W_qkv's
// transposed codes, dW_qkv on dz quantized along the tokens and h_hat in 128 x 128 blocks,
// after an FP8 forward; against the textbook layer with the FP8 recipe in every linear of the
// backward too (ref::Rounding::fp8: dgrad by rows and 128 x 128 weight blocks, wgrad dz by
// columns and h_hat in blocks), on RMS errors, writing and accumulating the weight gradients. It
// needs M a multiple of 16 and the widths the forward needs: the case's own M (none is a multiple)
// is refused first, naming the rule, with nothing written; then, where the widths fit, the check
// runs on M rounded up to 16.
TEST_P(Block, FirstLayerFp8Backward) {
  make.c.precision = llama::Precision::fp8;
  const int64_t D = c.hidden, Nq = c.qkv_width();
  const DType grad_dtype = GetParam().grad_dtype;
  const bool fits = fp8_widths_fit(c, llama::Layer::first);
  if (M % 16 != 0 || !fits) { // refused: M, or a width (check_precision), by name
    RopeTensors rope(M, c.head_dim);
    HostTensor attn_norm = make.norm(), w_qkv = make.weight(Nq, D), x = make.activation(D);
    HostTensor qkv = make.output(Nq), rstd = make.stat(), dqkv = make.activation(Nq);
    HostTensor dx = make.activation(D);
    const Values dx_before = dx.values();
    Grad d_norm = make.grad(grad_dtype, {D}, false), d_qkv = make.grad(grad_dtype, {Nq, D}, false);
    llama::Config native = c;
    native.precision = llama::Precision::native;
    HostTensor ws(
        DType::f32,
        {int64_t(llama::workspace_size(llama::Layer::first, llama::Pass::backward, native, M) / 4 +
                 1)});
    try {
      llama::first_backward(
          c, {attn_norm.view(), w_qkv.view()}, {x.view(), rope.view()}, {qkv.view()}, {rstd.view()},
          {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}}, false, ws.view());
      ADD_FAILURE() << "an FP8 backward with M = " << M << " was accepted";
    } catch (const coda::Error& e) {
      EXPECT_EQ(int(e.status()), int(coda::Status::invalid_argument)) << e.what();
      EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
    }
    coda::test::sync_views();
    EXPECT_EQ(dx.values(), dx_before) << "grads.dx was written";
    for (double v : d_qkv.tensor.values()) ASSERT_TRUE(std::isnan(v)) << "d w_qkv was written";
    if (!fits) return;
  }
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, grad_dtype}, seeds);
  const int64_t M16 = m16.M;
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating weight gradients" : "writing weight gradients");
    RopeTensors rope(M16, c.head_dim);
    HostTensor attn_norm = m16.norm(), w_qkv = m16.weight(Nq, D), x = m16.activation(D);
    HostTensor qkv = m16.output(Nq), rstd = m16.stat();
    const llama::FirstWeights weights{attn_norm.view(), w_qkv.view()};
    const llama::FirstInputs inputs{x.view(), rope.view()};
    HostTensor ws_f = m16.workspace(llama::Layer::first, llama::Pass::forward);
    llama::first_forward(c, weights, inputs, {qkv.view()}, {rstd.view()}, ws_f.view());
    HostTensor dqkv = m16.activation(Nq), dx_res = m16.activation(D);
    HostTensor dx = HostTensor::of(m16.dt, {M16, D}, dx_res.values());
    Grad d_norm = m16.grad(grad_dtype, {D}, accumulate);
    Grad d_qkv = m16.grad(grad_dtype, {Nq, D}, accumulate);
    HostTensor ws_b = m16.workspace(llama::Layer::first, llama::Pass::backward);
    llama::first_backward(c, weights, inputs, {qkv.view()}, {rstd.view()},
                          {dx.view(), dqkv.view(), {d_norm.tensor.view(), d_qkv.tensor.view()}},
                          accumulate, ws_b.view());
    coda::test::sync_views();

    const ref::FirstWeights rw{attn_norm.values(), w_qkv.values()};
    const auto bwd = [&](ref::Rounding r) {
      return ref::first_backward(ref_config(c), rw, rope.textbook(), x.values(), dqkv.values(),
                                 dx_res.values(), r);
    };
    const ref::FirstBackward exact = bwd({}), unfused_fp8 = bwd(fp8_rounding(m16.dt));
    expect_rms("grads.dx", dx, exact.dx0, unfused_fp8.dx0);
    expect_fp8_noise("grads.dx", dx, exact.dx0, unfused_fp8.dx0);
    expect_rms_grad("d attn_norm", d_norm, exact.grads.attn_norm, unfused_fp8.grads.attn_norm);
    expect_rms_grad("d w_qkv", d_qkv, exact.grads.w_qkv, unfused_fp8.grads.w_qkv);
  }
}

// The FP8 MLP backward's refusals (middle or last `layer`), by `run` (a forward and a backward on
// make's own M): the case's M where it is not a multiple of 16 (naming the rule), and a config
// whose widths or activations do not fit (naming fp8). True where the config fits, and the
// caller's check then runs on M rounded up to 16.
template <class Run> bool fp8_mlp_backward_fits(Maker& make, llama::Layer layer, const Run& run) {
  const bool fits = fp8_widths_fit(make.c, layer) && make.dt == DType::bf16;
  if (make.M % 16 != 0 || !fits) expect_fp8_backward_refused(fits, run);
  return fits;
}

// The middle layer's: fp8_mlp_backward_fits through `calls`.
inline bool fp8_middle_backward_fits(Maker& make, DType grad_dtype, BackwardCalls calls) {
  return fp8_mlp_backward_fits(make, llama::Layer::middle, [&] {
    MiddleProblem p(make);
    run_middle(make, p, grad_dtype, false, calls);
  });
}

// The middle layer's backward with Precision::fp8 (B1, B5 K6 and B3 K7 on E4M3 operands, the
// four weight gradients with their activations in 128 x 128 blocks, dy0 in its forward form)
// after an FP8 forward, against the textbook layer's FP8 path, on RMS errors: one call writing
// and accumulating, and the two parts accumulating.
// As the first layer's: the case's M is refused first (and a config whose widths do not fit),
// then the check runs on M rounded up to 16.
TEST_P(Block, MiddleLayerFp8Backward) {
  make.c.precision = llama::Precision::fp8;
  const DType grad_dtype = GetParam().grad_dtype;
  if (!fp8_middle_backward_fits(make, grad_dtype, BackwardCalls::one)) return;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, grad_dtype}, seeds);
  const int64_t D = c.hidden, F = c.intermediate;
  const std::pair<BackwardCalls, bool> runs[] = {
      {BackwardCalls::one, false}, {BackwardCalls::one, true}, {BackwardCalls::two_parts, true}};
  for (const auto& [calls, accumulate] : runs) {
    SCOPED_TRACE(std::string(calls == BackwardCalls::one ? "one call, " : "two parts, ") +
                 (accumulate ? "accumulating weight gradients" : "writing weight gradients"));
    MiddleProblem p(m16);
    MiddleResult r = run_middle(m16, p, grad_dtype, accumulate, calls);
    const auto bwd = [&](ref::Rounding rr) {
      return ref::middle_backward(ref_config(c), p.textbook(), p.rope.textbook(), p.x0.values(),
                                  p.y0.values(), p.dx2.values(), p.dqkv.values(), rr);
    };
    const ref::MiddleBackward exact = bwd({}), unfused_fp8 = bwd(fp8_rounding(m16.dt));
    expect_fp8_mlp_backward(r, exact, unfused_fp8, D, F);
    expect_rms_grad("d attn_norm", r.d_attn, exact.grads.next_attn_norm,
                    unfused_fp8.grads.next_attn_norm);
    expect_rms_grad("d w_qkv", r.d_qkv, exact.grads.w_qkv_next, unfused_fp8.grads.w_qkv_next);
  }
}

// The FP8 middle backward in two parts runs the one call's kernels and quantizations in the same
// order on the same tensors: the same bits (saved.r2 aside, as in the 16-bit test); refused as
// the one call is where it would be (M, widths, activations). MiddleLayerFp8Backward checks it
// accumulating against the textbook.
TEST_P(Block, MiddleLayerFp8InTwoPartsIsTheOneCall) {
  make.c.precision = llama::Precision::fp8;
  const DType grad_dtype = GetParam().grad_dtype;
  if (!fp8_middle_backward_fits(make, grad_dtype, BackwardCalls::two_parts)) return;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, grad_dtype}, seeds);
  MiddleProblem p(m16);
  MiddleResult one = run_middle(m16, p, grad_dtype, false, BackwardCalls::one);
  MiddleResult two = run_middle(m16, p, grad_dtype, false, BackwardCalls::two_parts);
  const std::vector<HostTensor*> a = one.all(), b = two.all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
}

// The last layer's backward with Precision::fp8: the final norm's K6 through the LM head stays
// 16-bit, B3..B8 run the MLP's FP8 backward; as the middle layer's test otherwise.
TEST_P(Block, LastLayerFp8Backward) {
  make.c.precision = llama::Precision::fp8;
  const DType grad_dtype = GetParam().grad_dtype;
  const float dloss = 0.75f;
  if (!fp8_mlp_backward_fits(make, llama::Layer::last, [&] {
        LastProblem p(make, ref::Reduction::mean);
        run_last(make, p, grad_dtype, false, Dloss{dloss}, false);
      }))
    return;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, grad_dtype}, seeds);
  const int64_t D = c.hidden, F = c.intermediate;
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating weight gradients" : "writing weight gradients");
    LastProblem p(m16, ref::Reduction::mean);
    LastResult r = run_last(m16, p, grad_dtype, accumulate, Dloss{dloss}, false);
    const auto bwd = [&](ref::Rounding rr) {
      return ref::last_backward(ref_config(c), p.textbook(), p.x0.values(), p.y0.values(), p.loss,
                                dloss, rr);
    };
    const ref::LastBackward exact = bwd({}), unfused_fp8 = bwd(fp8_rounding(m16.dt));
    expect_fp8_mlp_backward(r, exact, unfused_fp8, D, F);
    expect_rms_grad("d final_norm", r.d_final, exact.grads.final_norm,
                    unfused_fp8.grads.final_norm);
    expect_rms_grad("d lm_head", r.d_head, exact.grads.w_lm, unfused_fp8.grads.w_lm);
  }
}

TEST_P(Block, MiddleLayerFp8Forward) {
  make.c.precision = llama::Precision::fp8;
  MiddleProblem p(make);
  const int64_t D = c.hidden, F = c.intermediate;
  HostTensor x2 = make.output(D), qkv = make.output(c.qkv_width()), x1 = make.output(D);
  HostTensor z1 = make.output(2 * F), r1 = make.stat(), r2 = make.stat();
  const auto forward = [&](HostTensor& workspace) {
    llama::middle_forward(c, p.weights(), {p.x0.view(), p.y0.view(), p.rope.view()},
                          {x2.view(), qkv.view()}, {x1.view(), z1.view(), r1.view(), r2.view()},
                          workspace.view());
    coda::test::sync_views();
  };
  if (!fp8_widths_fit(c, llama::Layer::middle))
    return expect_fp8_refused(make, llama::Layer::middle, forward, {&x2, &qkv, &x1, &z1, &r1, &r2});
  HostTensor workspace = make.workspace(llama::Layer::middle, llama::Pass::forward);
  forward(workspace);
  const auto fwd = [&](ref::Rounding rr) {
    return ref::middle_forward(ref_config(c), p.textbook(), p.rope.textbook(), p.x0.values(),
                               p.y0.values(), rr);
  };
  const ref::MiddleForward exact = fwd({}), unfused_fp8 = fwd(fp8_rounding(make.dt));
  expect_rms("outputs.x2", x2, exact.mlp.x2, unfused_fp8.mlp.x2);
  expect_rms("outputs.qkv", qkv, exact.qkv, unfused_fp8.qkv);
  expect_fp8_noise("outputs.qkv", qkv, exact.qkv, unfused_fp8.qkv);
  expect_rms("saved.x1", x1, exact.mlp.x1, unfused_fp8.mlp.x1);
  expect_rms("saved.z1", z1, interleave_columns(exact.mlp.gate, exact.mlp.up, M, F),
             interleave_columns(unfused_fp8.mlp.gate, unfused_fp8.mlp.up, M, F));
  expect_rms("saved.r1", r1, exact.mlp.rstd1, unfused_fp8.mlp.rstd1);
  expect_rms("saved.r2", r2, exact.rstd2, unfused_fp8.rstd2);
}

// The LM head stays 16-bit: the logits' error is the layers' FP8 error carried through it.
TEST_P(Block, LastLayerFp8Forward) {
  make.c.precision = llama::Precision::fp8;
  LastProblem p(make, ref::Reduction::mean);
  const int64_t D = c.hidden, F = c.intermediate, V = c.vocab;
  HostTensor loss(DType::f32, {1}), logits = make.output(V), x1 = make.output(D);
  HostTensor z1 = make.output(2 * F), r1 = make.stat(), x2 = make.output(D), r2 = make.stat();
  HostTensor dlogits = make.output(V), grad_scale(DType::f32, {1}), zeta = make.stat();
  const auto forward = [&](HostTensor& workspace) {
    llama::last_forward(c, p.weights(), {p.x0.view(), p.y0.view(), p.targets.view()},
                        {loss.view(), logits.view()},
                        {x1.view(), z1.view(), r1.view(), x2.view(), r2.view(), dlogits.view(),
                         grad_scale.view(), zeta.view()},
                        workspace.view());
    coda::test::sync_views();
  };
  if (!fp8_widths_fit(c, llama::Layer::last))
    return expect_fp8_refused(make, llama::Layer::last, forward,
                              {&loss, &logits, &x1, &z1, &r1, &x2, &r2});
  HostTensor workspace = make.workspace(llama::Layer::last, llama::Pass::forward);
  forward(workspace);
  const auto fwd = [&](ref::Rounding rr) {
    return ref::last_forward(ref_config(c), p.textbook(), p.x0.values(), p.y0.values(), p.loss, rr);
  };
  const ref::Rounding fp8 = fp8_rounding(make.dt);
  const ref::LastForward exact = fwd({}), unfused_fp8 = fwd(fp8);
  check_loss(loss, exact, unfused_fp8, p.targets_v, V);
  expect_rms("outputs.logits", logits, exact.logits, unfused_fp8.logits);
  expect_fp8_noise("saved.z1", z1, interleave_columns(exact.mlp.gate, exact.mlp.up, M, F),
                   interleave_columns(unfused_fp8.mlp.gate, unfused_fp8.mlp.up, M, F));
  expect_rms("saved.x1", x1, exact.mlp.x1, unfused_fp8.mlp.x1);
  expect_rms("saved.z1", z1, interleave_columns(exact.mlp.gate, exact.mlp.up, M, F),
             interleave_columns(unfused_fp8.mlp.gate, unfused_fp8.mlp.up, M, F));
  expect_rms("saved.r1", r1, exact.mlp.rstd1, unfused_fp8.mlp.rstd1);
  expect_rms("saved.x2", x2, exact.mlp.x2, unfused_fp8.mlp.x2);
  expect_rms("saved.r2", r2, exact.rstd2, unfused_fp8.rstd2);
  const LossGradient tg = loss_gradient({}, exact.logits, p, M, V);
  const LossGradient lg = loss_gradient(fp8, unfused_fp8.logits, p, M, V);
  expect_rms("saved.dlogits", dlogits, tg.dlogits, lg.dlogits);
}

// ---------------------------------------------------------------------------------------------
// The weights' FP8 copies given (coda/block/llama.hpp, Fp8Weight): quantize_weights writes both
// copies of each weight, and an FP8 call given them in its inputs reads them in place of its own
// weight quantizations. One quantizer makes both, so the results are the self-quantizing calls'
// bit for bit, in exactly the smaller workspace such a call asks for (workspace_size with
// Fp8WeightCopies::given; nothing written past it) as in the full one; and each copy is read by
// the GEMMs it is for: a copy whose scales are doubled changes the results of its pass (the
// forward's copy the forward's, the transposed one the backward's, in either backward form) and
// leaves the forward alone where it is the backward's. A call that quantized its weights anyway,
// or read one copy for the other, fails. The configs whose FP8 backward is refused
// (MiddleLayerFp8Backward says which) have nothing to compare.

// The copies of `make`'s layer written by quantize_weights from `weights`; `view` makes the
// layer's Fp8Weights of them.
template <class Weights, class View>
WeightCopies quantized(Maker& make, WeightCopies copies, const Weights& weights, const View& view) {
  llama::quantize_weights(make.c, weights, view(copies));
  coda::test::sync_views();
  return copies;
}

// `changed`'s results against `base`'s: where the change was to a transposed copy, the forward's
// bits are base's and some backward result differs; where to a forward copy, some forward
// result differs.
template <class Result>
void expect_changed_by(Result& changed, Result& base, bool transposed, const std::string& what) {
  const auto differs = [](const std::vector<HostTensor*>& a, const std::vector<HostTensor*>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_bits(*a[i], *b[i])) return true;
    return false;
  };
  const std::vector<HostTensor*> fa = changed.forward(), fb = base.forward();
  if (!transposed) {
    EXPECT_TRUE(differs(fa, fb)) << what << ": the forward did not read its given copy";
    return;
  }
  for (size_t i = 0; i < fa.size(); ++i)
    EXPECT_TRUE(same_bits(*fa[i], *fb[i])) << what << ": the forward read the transposed copy ("
                                           << "forward result " << i << ")";
  EXPECT_TRUE(differs(changed.backward(), base.backward()))
      << what << ": the backward did not read its given transposed copy";
}

// The first layer's forward and backward (dx accumulated into, gradients written), with the
// copies given where `fp8` is (`full_workspace`: as run_middle's).
struct FirstResult {
  HostTensor qkv, rstd, dx, d_norm, d_qkv;
  std::vector<HostTensor*> forward() { return {&qkv, &rstd}; }
  std::vector<HostTensor*> backward() { return {&dx, &d_norm, &d_qkv}; }
};
struct FirstProblem {
  explicit FirstProblem(Maker& make)
      : rope(make.M, make.c.head_dim), attn_norm(make.norm()),
        w_qkv(make.weight(make.c.qkv_width(), make.c.hidden)), x(make.activation(make.c.hidden)),
        dqkv(make.activation(make.c.qkv_width())), dx(make.activation(make.c.hidden)) {}
  llama::FirstWeights weights() { return {attn_norm.view(), w_qkv.view()}; }
  RopeTensors rope;
  HostTensor attn_norm, w_qkv, x, dqkv, dx;
};
inline FirstResult run_first(Maker& make, FirstProblem& p, DType grad_dtype,
                             WeightCopies* fp8 = nullptr, bool full_workspace = false) {
  const llama::Config& c = make.c;
  const llama::Fp8WeightCopies copies = workspace_copies(fp8, full_workspace);
  FirstResult r{make.output(c.qkv_width()), make.stat(), p.dx, HostTensor(grad_dtype, {c.hidden}),
                HostTensor(grad_dtype, {c.qkv_width(), c.hidden})};
  const auto inputs = [&] {
    return llama::FirstInputs{p.x.view(), p.rope.view(),
                              fp8 != nullptr ? fp8->first() : llama::FirstFp8Weights{}};
  };
  HostTensor ws_f = make.workspace(llama::Layer::first, llama::Pass::forward, copies);
  HostTensor ws_b = make.workspace(llama::Layer::first, llama::Pass::backward, copies);
  block_call([&] {
    llama::first_forward(c, p.weights(), inputs(), {r.qkv.view()}, {r.rstd.view()}, ws_f.view());
    llama::first_backward(c, p.weights(), inputs(), {r.qkv.view()}, {r.rstd.view()},
                          {r.dx.view(), p.dqkv.view(), {r.d_norm.view(), r.d_qkv.view()}}, false,
                          ws_b.view());
  });
  coda::test::sync_views();
  expect_within({&ws_f, &ws_b});
  return r;
}

TEST_P(Block, FirstLayerFp8GivenWeights) {
  make.c.precision = llama::Precision::fp8;
  if (!fp8_widths_fit(c, llama::Layer::first)) return;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, GetParam().grad_dtype}, seeds);
  const DType g = GetParam().grad_dtype == DType::f16 ? DType::f32 : GetParam().grad_dtype;
  FirstProblem p(m16);
  WeightCopies q = quantized(m16, WeightCopies::first(c), p.weights(),
                             [](WeightCopies& w) { return w.first(); });
  // Given the copies: in the smaller workspace, and in the full one.
  FirstResult own = run_first(m16, p, g), given = run_first(m16, p, g, &q);
  FirstResult given_full = run_first(m16, p, g, &q, /*full_workspace=*/true);
  for (FirstResult* other : {&own, &given_full}) {
    const std::vector<HostTensor*> fa = other->forward(), fb = given.forward();
    const std::vector<HostTensor*> ba = other->backward(), bb = given.backward();
    for (size_t i = 0; i < fa.size(); ++i)
      EXPECT_TRUE(same_bits(*fa[i], *fb[i])) << "forward " << i;
    for (size_t i = 0; i < ba.size(); ++i)
      EXPECT_TRUE(same_bits(*ba[i], *bb[i])) << "backward " << i;
  }
  for (bool transposed : {false, true}) {
    WeightCopies changed = q.with_scales_doubled(0, transposed);
    FirstResult r = run_first(m16, p, g, &changed);
    expect_changed_by(r, given, transposed, transposed ? "w_qkv's codes_t" : "w_qkv's codes");
  }
}

TEST_P(Block, MiddleLayerFp8GivenWeights) {
  make.c.precision = llama::Precision::fp8;
  if (!fp8_widths_fit(c, llama::Layer::middle) || make.dt != DType::bf16) return;
  const DType g = GetParam().grad_dtype;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, g}, seeds);
  MiddleProblem p(m16);
  WeightCopies q = quantized(m16, WeightCopies::middle(c), p.weights(),
                             [](WeightCopies& w) { return w.middle(); });
  for (BackwardCalls calls : {BackwardCalls::one, BackwardCalls::two_parts}) {
    SCOPED_TRACE(calls == BackwardCalls::one ? "one backward call" : "the backward in two parts");
    MiddleResult own = run_middle(m16, p, g, false, calls);
    MiddleResult given = run_middle(m16, p, g, false, calls, &q);
    MiddleResult given_full = run_middle(m16, p, g, false, calls, &q, /*full_workspace=*/true);
    for (MiddleResult* other : {&own, &given_full}) {
      const std::vector<HostTensor*> a = other->all(), b = given.all();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
      EXPECT_TRUE(same_bits(other->r2, given.r2));
    }
  }
  MiddleResult base = run_middle(m16, p, g, false, BackwardCalls::one, &q);
  const char* names[] = {"w_out", "w_gate_up", "w_down", "w_qkv"};
  for (size_t w = 0; w < q.weights(); ++w)
    for (bool transposed : {false, true}) {
      WeightCopies changed = q.with_scales_doubled(w, transposed);
      const std::string what = std::string(names[w]) + (transposed ? "'s codes_t" : "'s codes");
      MiddleResult one = run_middle(m16, p, g, false, BackwardCalls::one, &changed);
      expect_changed_by(one, base, transposed, what);
      if (!transposed) continue;
      MiddleResult two = run_middle(m16, p, g, false, BackwardCalls::two_parts, &changed);
      expect_changed_by(two, base, transposed, what + ", two parts");
    }
}

TEST_P(Block, LastLayerFp8GivenWeights) {
  make.c.precision = llama::Precision::fp8;
  if (!fp8_widths_fit(c, llama::Layer::last) || make.dt != DType::bf16) return;
  const DType g = GetParam().grad_dtype;
  Maker m16(BlockCase{"fp8", c, (M + 15) / 16 * 16, make.dt, g}, seeds);
  LastProblem p(m16, ref::Reduction::mean);
  WeightCopies q =
      quantized(m16, WeightCopies::last(c), p.weights(), [](WeightCopies& w) { return w.last(); });
  LastResult own = run_last(m16, p, g, false, Dloss{0.75f}, false);
  LastResult given = run_last(m16, p, g, false, Dloss{0.75f}, false, &q);
  LastResult given_full = run_last(m16, p, g, false, Dloss{0.75f}, false, &q, true);
  for (LastResult* other : {&own, &given_full}) {
    const std::vector<HostTensor*> a = other->all(), b = given.all();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(*a[i], *b[i])) << "result " << i;
  }
  const char* names[] = {"w_out", "w_gate_up", "w_down"};
  for (size_t w = 0; w < q.weights(); ++w)
    for (bool transposed : {false, true}) {
      WeightCopies changed = q.with_scales_doubled(w, transposed);
      LastResult r = run_last(m16, p, g, false, Dloss{0.75f}, false, &changed);
      expect_changed_by(r, given, transposed,
                        std::string(names[w]) + (transposed ? "'s codes_t" : "'s codes"));
    }
}

} // namespace coda_block_suite
