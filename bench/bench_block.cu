// The non-attention part of one middle Llama block (coda::llama::middle_forward and
// middle_backward: attention output of layer l -> post-RoPE QKV of layer l+1, coda-paper 4.2 and
// 4.5) at the Llama-3.2-1B and Llama-3.1-8B shapes, 8192 and 16384 tokens, bf16, forward,
// backward and forward+backward. Four sides, in this process, on the same random inputs:
//   coda:      the block calls (4 fused GEMMs forward; 3 fused + 5 plain GEMMs and the small
//              auxiliary kernels backward), with their workspace allocated once;
//   gemm_only: the same 4 + 8 GEMMs (same layouts and dtypes) run by cuBLASLt, nothing else;
//   coda_fp8:  the block calls with Config::precision = fp8 (docs/fp8.md, "The FP8 block"): the
//              GEMMs on block-scaled E4M3 operands, each input and weight quantized before it;
//   coda_fp8_once: the same FP8 calls given the weights' FP8 copies (MiddleInputs::fp8_weights),
//              made by llama::quantize_weights at the start of each forward, both copies in one
//              pass (docs/fp8.md, "The weights quantized once per step"): fwd+bwd is one
//              training step of one micro-batch, quantizing each weight once where coda_fp8
//              quantizes it twice; bwd alone reads the copies and quantizes nothing;
//   unfused:   those cuBLASLt GEMMs plus the simplest correct separate CUDA kernels for the rest
//              (bench/unfused_block.cuh), one per operation, in PyTorch eager's order (eager
//              launches more: its RMSNorm alone is several kernels): residual add, RMSNorm (saving
//              rstd), SwiGLU, RoPE forward; RoPE backward, RMSNorm backward, dgamma reduction (two
//              passes), residual-gradient add, SwiGLU backward. The forward saves what eager
//              autograd saves (the normalized GEMM inputs h1, h2 and the SwiGLU output y1 among
//              them), so its backward recomputes nothing.
// Weight and gamma gradients are written (no accumulation) in --grad-dtype (bf16 or f32) on
// every side. The backward starts from the same incoming residual gradient each run (a copy
// before the L2 flush, outside the timed region); it accumulates into it in place, as the block
// API does.
//
// Each timed run follows a 256 MB write that flushes L2; CUDA events; the sides and passes are
// interleaved run by run; the median of --runs runs after two warm-up runs is reported.
//
// Before timing, a check runs a small middle layer (hidden 256, head_dim 64 and 128, 200 tokens)
// through every side that computes the block (coda on the GPU, the unfused path, and coda's CPU
// backend) and compares each output and gradient with the fp64 textbook block
// (reference/llama.hpp): max|side - fp64| must stay within 2 * max|bf16 textbook - fp64| + 0.1%
// of max|fp64|. After timing, each case also prints the largest relative difference between the
// coda and unfused outputs. Sides coda cannot run yet (not_supported) print n/a and are null in
// the JSON.
//
//   bench_block [--models 1b,8b] [--tokens 8192,16384] [--runs 30] [--grad-dtype bf16|f32]
//               [--out bench/results/block.json] [--commit HASH] [--check 1] [--only-check 0]
//               [--profile 0] [--backward-parts 0]
//
// --commit defaults to $CODA_COMMIT. --only-check 1 runs the check alone (on a machine without an
// sm_90 GPU, only its CPU-backend side). --profile 1 adds, per case, one forward and backward of
// each side inside a cudaProfilerStart / Stop range (tools/ncu_block.sh times each kernel in it).
// --backward-parts 1 runs coda's middle backward (both precisions, the timed runs and the check)
// as its two parts, middle_backward_part 1 then 2, as coda.ops calls it from PyTorch, instead of
// the one call. (Part 1 leaves zeta1 over saved.r2; a timed backward-only run then reads it as
// rstd, which changes values, not the work.)
// Exit status 1 when a check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include "coda/block/llama.hpp"
#include "coda/coda.hpp"
#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "gpu/backend.hpp"
#include "harness.cuh"
#include "reference/llama.hpp"
#include "reference/llama_fused.hpp"
#include "unfused_block.cuh"

namespace {

using bench::bf16;
using bench::bf16_bytes;
using bench::Buffer;
using bench::check;
using bench::view;
using coda::Device;
using coda::DType;
using coda::GemmLayout;
using coda::TensorView;
namespace llama = coda::llama;

struct Model {
  const char* name;
  const char* tag; // for --models
  int64_t hidden, mlp;
  int32_t q_heads, kv_heads, head_dim;
};
const Model kModels[] = {{"llama-1b", "1b", 2048, 8192, 32, 8, 64},
                         {"llama-8b", "8b", 4096, 14336, 32, 8, 128}};
constexpr float kEps = 1e-5f;
constexpr int32_t kSequence = 4096; // positions restart every kSequence tokens (packed sequences)

llama::Config config_of(const Model& md) {
  llama::Config c;
  c.hidden = md.hidden;
  c.intermediate = md.mlp;
  c.n_heads = md.q_heads;
  c.n_kv_heads = md.kv_heads;
  c.head_dim = md.head_dim;
  c.eps = kEps;
  return c;
}

// ---------------------------------------------------------------------------------------------
// A case's shape, and its inputs: element i of input k is bench::uniform(i, seed k, lo, hi)
// rounded to bf16; weights of size 1 / sqrt(fan-in), so activations stay O(1).

struct Shape {
  Model md;
  llama::Config cfg;
  int64_t M, D, F, A, Nq;
  DType grad_dtype;

  llama::Config cfg_fp8; // cfg with Precision::fp8

  Shape(const Model& model, int64_t tokens, DType grads)
      : md(model), cfg(config_of(model)), M(tokens), D(model.hidden), F(model.mlp),
        A(int64_t(model.q_heads) * model.head_dim), Nq(cfg.qkv_width()), grad_dtype(grads),
        cfg_fp8(cfg) {
    cfg_fp8.precision = llama::Precision::fp8;
  }
  // Bytes of the four weights' FP8 copies (coda_fp8_once), their 16 tensors 256 bytes apart.
  size_t fp8_copies_bytes() const {
    return llama::fp8_weights_size(llama::Layer::middle, cfg_fp8) + 16 * 256;
  }
  size_t workspace_bytes() const {
    return std::max(
        {llama::workspace_size(llama::Layer::middle, llama::Pass::forward, cfg, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward, cfg, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::forward, cfg_fp8, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward, cfg_fp8, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part1, cfg, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part2, cfg, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part1, cfg_fp8, M),
         llama::workspace_size(llama::Layer::middle, llama::Pass::backward_part2, cfg_fp8, M)});
  }
};

struct InputSpec {
  const char* name;
  int64_t numel;
  float lo, hi;
  uint64_t seed;
};

// In the order of Block::input_buffers.
std::vector<InputSpec> input_specs(const Shape& b) {
  const auto w = [](int64_t fan_in) { return float(1.0 / std::sqrt(double(fan_in))); };
  std::vector<InputSpec> specs = {
      {"x0", b.M * b.D, -1.f, 1.f, 0},
      {"y0", b.M * b.A, -1.f, 1.f, 0},
      {"dx", b.M * b.D, -1.f, 1.f, 0},
      {"dqkv", b.M * b.Nq, -1.f, 1.f, 0},
      {"w_out", b.D * b.A, -w(b.A), w(b.A), 0},
      {"ffn_norm", b.D, 0.5f, 1.5f, 0},
      {"w_gate_up", 2 * b.F * b.D, -w(b.D), w(b.D), 0},
      {"w_down", b.D * b.F, -w(b.F), w(b.F), 0},
      {"attn_norm", b.D, 0.5f, 1.5f, 0},
      {"w_qkv", b.Nq * b.D, -w(b.D), w(b.D), 0},
  };
  for (size_t k = 0; k < specs.size(); ++k) specs[k].seed = uint64_t(k + 1) << 40;
  return specs;
}

// ---------------------------------------------------------------------------------------------
// One case's device tensors: the inputs, the coda block's tensors, and the unfused path
// (bench/unfused_block.cuh: its tensors and cuBLASLt GEMMs, which the GEMM-only side reuses).

// How coda's middle backward is called (--backward-parts): the one call, or its two parts.
bool backward_in_parts = false;
void coda_middle_backward(const llama::Config& cfg, const llama::MiddleWeights& w,
                          const llama::MiddleInputs& inputs, const llama::MiddleOutputs& outputs,
                          const llama::MiddleSaved& saved, const llama::MiddleGrads& grads,
                          const TensorView& workspace, cudaStream_t s = nullptr) {
  if (!backward_in_parts)
    return llama::middle_backward(cfg, w, inputs, outputs, saved, grads, false, workspace, s);
  for (const llama::Pass part : {llama::Pass::backward_part1, llama::Pass::backward_part2})
    llama::middle_backward_part(part, cfg, w, inputs, outputs, saved, grads, false, workspace, s);
}

struct Block : Shape {
  const size_t gsize = size_t(coda::dtype_size(grad_dtype)); // bytes per weight-gradient element

  // Inputs: the residual stream and attention output entering the block, the incoming gradients
  // (dx_init is copied into dx / unfused.dx before each backward), RoPE tables, weights.
  Buffer x0{bf16_bytes(M * D)}, y0{bf16_bytes(M * A)}, dx_init{bf16_bytes(M * D)},
      dqkv{bf16_bytes(M * Nq)}, positions{size_t(M) * 4}, inv_freq{size_t(md.head_dim / 2) * 4};
  Buffer w_out{bf16_bytes(D * A)}, ffn_norm{bf16_bytes(D)}, w_gate_up{bf16_bytes(2 * F * D)},
      w_down{bf16_bytes(D * F)}, attn_norm{bf16_bytes(D)}, w_qkv{bf16_bytes(Nq * D)};

  // coda: outputs, saved tensors, gradients, one workspace for both passes.
  Buffer x1{bf16_bytes(M * D)}, z1{bf16_bytes(M * 2 * F)}, r1{size_t(M) * 4}, r2{size_t(M) * 4},
      x2{bf16_bytes(M * D)}, qkv{bf16_bytes(M * Nq)}, dx{bf16_bytes(M * D)}, dy0{bf16_bytes(M * A)};
  Buffer d_w_out{gsize * size_t(D * A)}, d_ffn_norm{gsize * size_t(D)},
      d_w_gate_up{gsize * size_t(2 * F * D)}, d_w_down{gsize * size_t(D * F)},
      d_attn_norm{gsize * size_t(D)}, d_w_qkv{gsize * size_t(Nq * D)};
  Buffer workspace{workspace_bytes()};
  Buffer fp8_copies{fp8_copies_bytes()}; // coda_fp8_once: MiddleFp8Weights, fp8_weights()

  // The unfused path (which the GEMM-only side shares), on the same inputs.
  const bench::UnfusedBlock unfused;

  Block(const Model& model, int64_t tokens, DType grads, const bench::Context& context)
      : Shape(model, tokens, grads),
        unfused({M, D, F, A, Nq, md.q_heads, md.kv_heads, md.head_dim, kEps, grad_dtype},
                {x0, y0, dqkv, positions, inv_freq, w_out, ffn_norm, w_gate_up, w_down, attn_norm,
                 w_qkv},
                context) {
    std::vector<int32_t> pos(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) pos[size_t(m)] = int32_t(m % kSequence);
    std::vector<float> freq(static_cast<size_t>(md.head_dim / 2));
    for (int32_t i = 0; i < md.head_dim / 2; ++i)
      freq[size_t(i)] = bench::rope_inv_freq(i, md.head_dim);
    check(cudaMemcpy(positions.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice), "positions");
    check(cudaMemcpy(inv_freq.p, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice), "freq");
  }

  std::vector<const Buffer*> input_buffers() const {
    return {&x0, &y0, &dx_init, &dqkv, &w_out, &ffn_norm, &w_gate_up, &w_down, &attn_norm, &w_qkv};
  }
  void fill_inputs(cudaStream_t s) const {
    const std::vector<InputSpec> specs = input_specs(*this);
    const std::vector<const Buffer*> buffers = input_buffers();
    for (size_t k = 0; k < specs.size(); ++k)
      bench::fill_uniform<<<1024, 256, 0, s>>>(buffers[k]->as<bf16>(), specs[k].numel,
                                               specs[k].seed, specs[k].lo, specs[k].hi);
    check(cudaGetLastError(), "fill");
    check(cudaStreamSynchronize(s), "fill");
  }

  // ---- coda
  llama::MiddleWeights weights() const {
    return {view(w_out, DType::bf16, D, A),         view(ffn_norm, DType::bf16, D),
            view(w_gate_up, DType::bf16, 2 * F, D), view(w_down, DType::bf16, D, F),
            view(attn_norm, DType::bf16, D),        view(w_qkv, DType::bf16, Nq, D)};
  }
  llama::MiddleInputs inputs() const {
    return {view(x0, DType::bf16, M, D),
            view(y0, DType::bf16, M, A),
            {view(positions, DType::i32, M), view(inv_freq, DType::f32, md.head_dim / 2)}};
  }
  llama::MiddleOutputs outputs() const {
    return {view(x2, DType::bf16, M, D), view(qkv, DType::bf16, M, Nq)};
  }
  llama::MiddleSaved saved() const {
    return {view(x1, DType::bf16, M, D), view(z1, DType::bf16, M, 2 * F), view(r1, DType::f32, M),
            view(r2, DType::f32, M)};
  }
  llama::MiddleGrads grads() const {
    return {view(dx, DType::bf16, M, D),
            view(dqkv, DType::bf16, M, Nq),
            view(dy0, DType::bf16, M, A),
            {view(d_w_out, grad_dtype, D, A), view(d_ffn_norm, grad_dtype, D),
             view(d_w_gate_up, grad_dtype, 2 * F, D), view(d_w_down, grad_dtype, D, F),
             view(d_attn_norm, grad_dtype, D), view(d_w_qkv, grad_dtype, Nq, D)}};
  }
  TensorView workspace_view() const {
    return view(workspace, DType::f32, int64_t(workspace.bytes / 4));
  }
  void coda_forward(cudaStream_t s) const {
    llama::middle_forward(cfg, weights(), inputs(), outputs(), saved(), workspace_view(), s);
  }
  void coda_backward(cudaStream_t s) const {
    coda_middle_backward(cfg, weights(), inputs(), outputs(), saved(), grads(), workspace_view(),
                         s);
  }
  // The FP8 side writes coda's outputs and saved tensors (timing only; the comparison below
  // reruns coda's forward first).
  void coda_fp8_forward(cudaStream_t s) const {
    llama::middle_forward(cfg_fp8, weights(), inputs(), outputs(), saved(), workspace_view(), s);
  }
  void coda_fp8_backward(cudaStream_t s) const {
    coda_middle_backward(cfg_fp8, weights(), inputs(), outputs(), saved(), grads(),
                         workspace_view(), s);
  }

  // The FP8 copies of W_out, W_gate_up, W_down and W_qkv in fp8_copies: codes, scales, codes_t
  // and scales_t of each (llama.hpp, Fp8Weight), each tensor 256-byte aligned.
  llama::MiddleFp8Weights fp8_weights() const {
    size_t at = 0;
    const auto take = [&](DType t, int64_t rows, int64_t cols) {
      TensorView v =
          coda::make_view(static_cast<char*>(fp8_copies.p) + at, t, rows, cols, Device::cuda);
      at += (size_t(rows * cols) + 255) / 256 * 256; // 1-byte elements
      return v;
    };
    const auto weight = [&](int64_t n, int64_t k) {
      const int64_t nb = coda::num_fp8_scale_blocks(n), kb = coda::num_fp8_scale_blocks(k);
      return llama::Fp8Weight{take(DType::e4m3, n, k), take(DType::e8m0, nb, kb),
                              take(DType::e4m3, k, n), take(DType::e8m0, kb, nb)};
    };
    return {weight(D, A), weight(2 * F, D), weight(D, F), weight(Nq, D)};
  }
  llama::MiddleInputs inputs_with_fp8_weights() const {
    llama::MiddleInputs in = inputs();
    in.fp8_weights = fp8_weights();
    return in;
  }
  // The step's one weight quantization (the copies of a training step come after its optimizer
  // step, so before its first forward), then the forward reading them.
  void coda_fp8_once_forward(cudaStream_t s) const {
    llama::quantize_weights(cfg_fp8, weights(), fp8_weights(), s);
    llama::middle_forward(cfg_fp8, weights(), inputs_with_fp8_weights(), outputs(), saved(),
                          workspace_view(), s);
  }
  void coda_fp8_once_backward(cudaStream_t s) const {
    coda_middle_backward(cfg_fp8, weights(), inputs_with_fp8_weights(), outputs(), saved(), grads(),
                         workspace_view(), s);
  }
};

// ---------------------------------------------------------------------------------------------
// The check: a small middle layer through each side against the fp64 textbook block.

// A host tensor of bf16 / f32 / i32 bytes, rank 1 (cols = 0) or 2.
struct HostTensor {
  DType dtype = DType::bf16;
  int64_t rows = 0, cols = 0;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType t, int64_t r, int64_t c = 0)
      : dtype(t), rows(r), cols(c),
        bytes(size_t(r * std::max<int64_t>(c, 1) * coda::dtype_size(t)), 0xff) {}
  int64_t numel() const { return rows * std::max<int64_t>(cols, 1); }
  HostTensor reshaped(int64_t r, int64_t c) const {
    HostTensor h = *this;
    h.rows = r, h.cols = c;
    return h;
  }
  TensorView view() {
    return cols ? coda::make_view(bytes.data(), dtype, rows, cols, Device::cpu)
                : coda::make_view(bytes.data(), dtype, rows, Device::cpu);
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::bf16) {
        uint16_t bits;
        std::memcpy(&bits, &bytes[2 * i], 2);
        v[i] = coda::bf16_bits_to_float(bits);
      } else {
        float f;
        std::memcpy(&f, &bytes[4 * i], 4);
        v[i] = f;
      }
    }
    return v;
  }
  void set_bf16(size_t i, float x) {
    const uint16_t bits = coda::float_to_bf16_bits(x);
    std::memcpy(&bytes[2 * i], &bits, 2);
  }
};

// What a side computed, in the order of kOutputNames.
constexpr const char* kOutputNames[] = {"x2",          "qkv",        "dx0",         "dy0",
                                        "d w_out",     "d ffn_norm", "d w_gate_up", "d w_down",
                                        "d attn_norm", "d w_qkv"};
using Outputs = std::vector<std::vector<double>>;

std::vector<double> download(const Buffer& b, DType t, int64_t rows, int64_t cols = 0) {
  HostTensor h(t, rows, cols);
  check(cudaMemcpy(h.bytes.data(), b.p, h.bytes.size(), cudaMemcpyDeviceToHost), "download");
  return h.values();
}

Outputs gpu_outputs(const Block& b, bool unfused) {
  const DType g = b.grad_dtype;
  const auto pick = [&](const Buffer& coda_side, const Buffer& unfused_side) -> const Buffer& {
    return unfused ? unfused_side : coda_side;
  };
  return {download(pick(b.x2, b.unfused.x2), DType::bf16, b.M, b.D),
          download(pick(b.qkv, b.unfused.qkv), DType::bf16, b.M, b.Nq),
          download(pick(b.dx, b.unfused.dx), DType::bf16, b.M, b.D),
          download(pick(b.dy0, b.unfused.dy0), DType::bf16, b.M, b.A),
          download(pick(b.d_w_out, b.unfused.d_w_out), g, b.D, b.A),
          download(pick(b.d_ffn_norm, b.unfused.d_ffn_norm), g, b.D),
          download(pick(b.d_w_gate_up, b.unfused.d_w_gate_up), g, 2 * b.F, b.D),
          download(pick(b.d_w_down, b.unfused.d_w_down), g, b.D, b.F),
          download(pick(b.d_attn_norm, b.unfused.d_attn_norm), g, b.D),
          download(pick(b.d_w_qkv, b.unfused.d_w_qkv), g, b.Nq, b.D)};
}

struct CheckInputs {
  std::vector<HostTensor> tensors; // input_specs order, rank 1
  std::vector<int32_t> positions;
  std::vector<float> inv_freq;
};

// The inputs of input_specs, generated on the host (and uploaded as they are to the GPU sides).
CheckInputs check_inputs(const Shape& b) {
  CheckInputs in;
  for (const InputSpec& spec : input_specs(b)) {
    HostTensor t(DType::bf16, spec.numel);
    for (int64_t i = 0; i < spec.numel; ++i)
      t.set_bf16(size_t(i), bench::uniform(uint64_t(i), spec.seed, spec.lo, spec.hi));
    in.tensors.push_back(std::move(t));
  }
  for (int64_t m = 0; m < b.M; ++m) in.positions.push_back(int32_t(m % kSequence));
  for (int32_t i = 0; i < b.md.head_dim / 2; ++i)
    in.inv_freq.push_back(bench::rope_inv_freq(i, b.md.head_dim));
  return in;
}

// coda's CPU backend (host tensors) on the same inputs.
Outputs cpu_outputs(const Shape& b, const CheckInputs& in) {
  const int64_t M = b.M, D = b.D, F = b.F, A = b.A, Nq = b.Nq;
  const std::vector<HostTensor>& t = in.tensors;
  HostTensor x0 = t[0].reshaped(M, D), y0 = t[1].reshaped(M, A), dx = t[2].reshaped(M, D),
             dqkv = t[3].reshaped(M, Nq), w_out = t[4].reshaped(D, A), ffn_norm = t[5],
             w_gate_up = t[6].reshaped(2 * F, D), w_down = t[7].reshaped(D, F), attn_norm = t[8],
             w_qkv = t[9].reshaped(Nq, D);
  HostTensor pos(DType::i32, M), freq(DType::f32, b.md.head_dim / 2);
  std::memcpy(pos.bytes.data(), in.positions.data(), pos.bytes.size());
  std::memcpy(freq.bytes.data(), in.inv_freq.data(), freq.bytes.size());
  HostTensor x1(DType::bf16, M, D), z1(DType::bf16, M, 2 * F), r1(DType::f32, M), r2(DType::f32, M),
      x2(DType::bf16, M, D), qkv(DType::bf16, M, Nq), dy0(DType::bf16, M, A);
  const DType g = b.grad_dtype;
  HostTensor d_w_out(g, D, A), d_ffn(g, D), d_gate_up(g, 2 * F, D), d_down(g, D, F), d_attn(g, D),
      d_qkv(g, Nq, D);
  HostTensor ws(DType::f32, int64_t(b.workspace_bytes() / 4) + 1);

  const llama::MiddleWeights w{w_out.view(),  ffn_norm.view(),  w_gate_up.view(),
                               w_down.view(), attn_norm.view(), w_qkv.view()};
  const llama::MiddleInputs inputs{x0.view(), y0.view(), {pos.view(), freq.view()}};
  const llama::MiddleOutputs outputs{x2.view(), qkv.view()};
  const llama::MiddleSaved saved{x1.view(), z1.view(), r1.view(), r2.view()};
  const llama::MiddleGrads grads{
      dx.view(),
      dqkv.view(),
      dy0.view(),
      {d_w_out.view(), d_ffn.view(), d_gate_up.view(), d_down.view(), d_attn.view(), d_qkv.view()}};
  llama::middle_forward(b.cfg, w, inputs, outputs, saved, ws.view());
  coda_middle_backward(b.cfg, w, inputs, outputs, saved, grads, ws.view());
  return {x2.values(),    qkv.values(),       dx.values(),     dy0.values(),    d_w_out.values(),
          d_ffn.values(), d_gate_up.values(), d_down.values(), d_attn.values(), d_qkv.values()};
}

// The textbook block in fp64 (Rounding none) or rounded as PyTorch eager rounds in bf16.
Outputs textbook_outputs(const Shape& b, const CheckInputs& in, coda::ref::Rounding rounding) {
  namespace ref = coda::ref;
  std::vector<std::vector<double>> v;
  for (const HostTensor& t : in.tensors) v.push_back(t.values());
  const int64_t F = b.F, D = b.D;
  ref::MiddleWeights w;
  w.w_o = v[4], w.ffn_norm = v[5], w.w_down = v[7], w.next_attn_norm = v[8], w.w_qkv_next = v[9];
  ref::fused::deinterleave_gate_up(F, D, v[6], w.w_gate, w.w_up);
  const ref::LlamaConfig rc{b.D, b.F, b.md.q_heads, b.md.kv_heads, b.md.head_dim, 0, double(kEps)};
  const std::vector<double> freq(in.inv_freq.begin(), in.inv_freq.end());
  const ref::RopeInputs rope{in.positions, freq};
  const ref::MiddleForward f = ref::middle_forward(rc, w, rope, v[0], v[1], rounding);
  const ref::MiddleBackward g = ref::middle_backward(rc, w, rope, v[0], v[1], v[2], v[3], rounding);
  return {f.mlp.x2,
          f.qkv,
          g.dx0,
          g.dy0,
          g.grads.w_o,
          g.grads.ffn_norm,
          ref::fused::interleave_gate_up(F, D, g.grads.w_gate, g.grads.w_up),
          g.grads.w_down,
          g.grads.next_attn_norm,
          g.grads.w_qkv_next};
}

// One row per output: pass when max|got - fp64| <= 2 max|bf16 textbook - fp64| + 0.1% of
// max|fp64| (and no NaN / inf). Returns whether all pass.
bool report(const char* side, const Outputs& got, const Outputs& exact, const Outputs& eager) {
  bool all = true;
  std::printf("  %s\n", side);
  for (size_t k = 0; k < exact.size(); ++k) {
    double err = 0, base = 0, scale = 1e-300;
    bool finite = true;
    for (size_t i = 0; i < exact[k].size(); ++i) {
      finite = finite && std::isfinite(got[k][i]);
      err = std::max(err, std::fabs(got[k][i] - exact[k][i]));
      base = std::max(base, std::fabs(eager[k][i] - exact[k][i]));
      scale = std::max(scale, std::fabs(exact[k][i]));
    }
    const bool pass = finite && err <= 2 * base + 1e-3 * scale;
    all = all && pass;
    std::printf("    %-12s max|err| %.3e (%.2e of max)  bf16 textbook %.3e  %s\n", kOutputNames[k],
                err, err / scale, base, pass ? "pass" : "FAIL");
  }
  return all;
}

// Runs fn; false (after a note) where coda says the request is not supported yet.
bool supported(const char* what, const std::function<void()>& fn) {
  try {
    fn();
    return true;
  } catch (const coda::Error& e) {
    if (e.status() != coda::Status::not_supported) throw;
    std::printf("  coda %s: not supported yet (%s)\n", what, e.what());
    return false;
  }
}

// ctx == nullptr (no sm_90 GPU): coda's CPU backend alone.
bool run_check(const bench::Context* ctx, DType grad_dtype) {
  const Model small[] = {{"check-hd64", "", 256, 512, 4, 2, 64},
                         {"check-hd128", "", 256, 512, 2, 1, 128}};
  constexpr int64_t kCheckTokens = 200;
  bool ok = true;
  for (const Model& md : small) {
    std::printf("check %s: hidden %lld, MLP %lld, %d / %d heads of %d, %lld tokens, against fp64\n",
                md.name, (long long)md.hidden, (long long)md.mlp, md.q_heads, md.kv_heads,
                md.head_dim, (long long)kCheckTokens);
    const Shape shape(md, kCheckTokens, grad_dtype);
    const CheckInputs in = check_inputs(shape);
    const Outputs exact = textbook_outputs(shape, in, {});
    const Outputs eager = textbook_outputs(shape, in, coda::ref::Rounding::for_dtype(DType::bf16));
    if (ctx) {
      const Block b(md, kCheckTokens, grad_dtype, *ctx);
      const std::vector<const Buffer*> buffers = b.input_buffers();
      for (size_t k = 0; k < buffers.size(); ++k)
        check(cudaMemcpy(buffers[k]->p, in.tensors[k].bytes.data(), in.tensors[k].bytes.size(),
                         cudaMemcpyHostToDevice),
              "upload");
      const cudaStream_t s = ctx->stream;
      check(cudaMemcpy(b.unfused.dx.p, b.dx_init.p, b.dx_init.bytes, cudaMemcpyDeviceToDevice),
            "dx");
      b.unfused.forward(s);
      b.unfused.backward(s);
      check(cudaStreamSynchronize(s), "unfused check");
      ok = report("unfused (GPU)", gpu_outputs(b, true), exact, eager) && ok;
      check(cudaMemcpy(b.dx.p, b.dx_init.p, b.dx_init.bytes, cudaMemcpyDeviceToDevice), "dx");
      try { // a coda error here fails the check, not the benchmark
        if (supported("forward", [&] { b.coda_forward(s); }) &&
            supported("backward", [&] { b.coda_backward(s); })) {
          check(cudaStreamSynchronize(s), "coda check");
          ok = report("coda (GPU)", gpu_outputs(b, false), exact, eager) && ok;
        }
      } catch (const coda::Error& e) {
        std::printf("  coda (GPU): FAIL: %s\n", e.what());
        ok = false;
      }
      check(cudaDeviceSynchronize(), "check");
    }
    ok = report("coda (CPU backend)", cpu_outputs(shape, in), exact, eager) && ok;
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Timing one case.

enum Pass { kFwd, kBwd, kFwdBwd, kPasses };
enum Side { kCoda, kGemm, kUnfused, kCodaFp8, kCodaFp8Once, kSides };
constexpr const char* kPassNames[] = {"fwd", "bwd", "fwd+bwd"};

struct Result {
  const Model* md;
  int64_t tokens;
  Pass pass;
  double ms[kSides]; // median; NaN where the side cannot run
};

std::vector<Result> bench_case(const Model& md, int64_t tokens, DType grad_dtype,
                               const bench::Context& ctx, int runs, bool profile) {
  const Block b(md, tokens, grad_dtype, ctx);
  b.fill_inputs(ctx.stream);
  const cudaStream_t s = ctx.stream;
  const auto reset_dx = [&](Side side) { // the incoming residual gradient, which bwd overwrites
    if (side == kGemm) return;
    const Buffer& dx =
        side == kCoda || side == kCodaFp8 || side == kCodaFp8Once ? b.dx : b.unfused.dx;
    check(cudaMemcpyAsync(dx.p, b.dx_init.p, b.dx_init.bytes, cudaMemcpyDeviceToDevice, s), "dx");
  };
  const auto forward = [&](Side side) {
    side == kCoda          ? b.coda_forward(s)
    : side == kCodaFp8     ? b.coda_fp8_forward(s)
    : side == kCodaFp8Once ? b.coda_fp8_once_forward(s)
    : side == kGemm        ? b.unfused.gemm_forward(s)
                           : b.unfused.forward(s);
  };
  const auto backward = [&](Side side) {
    side == kCoda          ? b.coda_backward(s)
    : side == kCodaFp8     ? b.coda_fp8_backward(s)
    : side == kCodaFp8Once ? b.coda_fp8_once_backward(s)
    : side == kGemm        ? b.unfused.gemm_backward(s)
                           : b.unfused.backward(s);
  };

  bool runs_on[kPasses][kSides];
  for (auto& row : runs_on) std::fill(std::begin(row), std::end(row), true);
  reset_dx(kCoda);
  const bool coda_fwd = supported("forward", [&] { b.coda_forward(s); });
  const bool coda_bwd = coda_fwd && supported("backward", [&] { b.coda_backward(s); });
  reset_dx(kCodaFp8);
  const bool fp8_fwd = supported("FP8 forward", [&] { b.coda_fp8_forward(s); });
  const bool fp8_bwd = fp8_fwd && supported("FP8 backward", [&] { b.coda_fp8_backward(s); });
  reset_dx(kCodaFp8Once);
  const bool once_fwd =
      supported("FP8 forward, weights given", [&] { b.coda_fp8_once_forward(s); });
  const bool once_bwd =
      once_fwd && supported("FP8 backward, weights given", [&] { b.coda_fp8_once_backward(s); });
  check(cudaStreamSynchronize(s), "coda probe");
  runs_on[kFwd][kCoda] = coda_fwd;
  runs_on[kBwd][kCoda] = runs_on[kFwdBwd][kCoda] = coda_bwd;
  runs_on[kFwd][kCodaFp8] = fp8_fwd;
  runs_on[kBwd][kCodaFp8] = runs_on[kFwdBwd][kCodaFp8] = fp8_bwd;
  runs_on[kFwd][kCodaFp8Once] = once_fwd;
  runs_on[kBwd][kCodaFp8Once] = runs_on[kFwdBwd][kCodaFp8Once] = once_bwd;

  bench::Timer timer = ctx.timer();
  std::vector<float> times[kPasses][kSides];
  const auto once = [&](Pass pass, Side side, bool timed) {
    if (!runs_on[pass][side]) return;
    if (pass != kFwd) reset_dx(side); // before the flush, outside the timed region
    const auto fn = [&] {
      if (pass != kBwd) forward(side);
      if (pass != kFwd) backward(side);
    };
    if (timed)
      timer.timed(fn, times[pass][side]);
    else
      fn();
  };
  for (int i = 0; i < 2; ++i) // warm-up; the forwards run first, so each backward has its inputs
    for (int p = 0; p < kPasses; ++p)
      for (int side = 0; side < kSides; ++side) once(Pass(p), Side(side), false);
  check(cudaStreamSynchronize(s), "warm-up");
  for (int i = 0; i < runs; ++i)
    for (int p = 0; p < kPasses; ++p)
      for (int j = 0; j < kSides; ++j) // rotated, so no side always runs first
        once(Pass(p), Side((i + j) % kSides), true);
  check(cudaGetLastError(), "timed runs");
  // --profile: one forward and backward of each side (coda, GEMM-only, unfused, coda FP8, coda
  // FP8 with its weights quantized once, in that order; a pass a side cannot run is skipped)
  // inside the profiler's range, for `ncu --profile-from-start off` (tools/ncu_block.sh).
  if (profile) {
    check(cudaStreamSynchronize(s), "before the profiled range");
    check(cudaProfilerStart(), "cudaProfilerStart");
    for (int side = 0; side < kSides; ++side) once(kFwdBwd, Side(side), false);
    check(cudaStreamSynchronize(s), "profiled range");
    check(cudaProfilerStop(), "cudaProfilerStop");
  }

  // The same outputs from the same inputs: coda against the unfused path.
  double fwd_diff = NAN, bwd_diff = NAN;
  if (coda_fwd) {
    b.coda_forward(s), b.unfused.forward(s);
    check(cudaStreamSynchronize(s), "compare");
    fwd_diff = std::max(bench::max_rel_diff(b.qkv.p, b.unfused.qkv.p, b.M * b.Nq),
                        bench::max_rel_diff(b.x2.p, b.unfused.x2.p, b.M * b.D));
  }
  if (coda_bwd) {
    reset_dx(kCoda), reset_dx(kUnfused);
    b.coda_backward(s), b.unfused.backward(s);
    check(cudaStreamSynchronize(s), "compare");
    bwd_diff = std::max(bench::max_rel_diff(b.dx.p, b.unfused.dx.p, b.M * b.D),
                        bench::max_rel_diff(b.dy0.p, b.unfused.dy0.p, b.M * b.A));
  }
  std::printf("%-9s %6lld  coda vs unfused, max relative difference: fwd (qkv, x2) %.2e, bwd "
              "(dx0, dy0) %.2e\n",
              md.name, (long long)tokens, fwd_diff, bwd_diff);
  // The FP8 step with its weights given is the self-quantizing one, bit for bit (one quantizer
  // makes both copies): its outputs and input gradients compared byte by byte.
  if (fp8_bwd && once_bwd) {
    const Buffer* compared[] = {&b.x2, &b.qkv, &b.dx, &b.dy0};
    std::vector<std::vector<unsigned char>> own;
    for (bool given : {false, true}) {
      reset_dx(kCodaFp8);
      given ? (b.coda_fp8_once_forward(s), b.coda_fp8_once_backward(s))
            : (b.coda_fp8_forward(s), b.coda_fp8_backward(s));
      check(cudaStreamSynchronize(s), "compare FP8");
      for (size_t i = 0; i < 4; ++i) {
        std::vector<unsigned char> bytes(compared[i]->bytes);
        check(cudaMemcpy(bytes.data(), compared[i]->p, bytes.size(), cudaMemcpyDeviceToHost),
              "compare FP8");
        if (!given)
          own.push_back(std::move(bytes));
        else if (bytes != own[i])
          std::printf("%-9s %6lld  FP8 with its weights given differs from the self-quantizing "
                      "FP8 call in output %zu (x2, qkv, dx0, dy0): a defect\n",
                      md.name, (long long)tokens, i);
      }
    }
  }

  std::vector<Result> results;
  for (int p = 0; p < kPasses; ++p) {
    Result r{&md, tokens, Pass(p), {}};
    for (int side = 0; side < kSides; ++side) r.ms[side] = bench::median(times[p][side]);
    results.push_back(r);
  }
  return results;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

// "%.3f" for the table, "%.5f" for the JSON; NaN (a side that did not run): n/a, null.
std::string number(double x, const char* format = "%.3f", const char* missing = "n/a") {
  if (std::isnan(x)) return missing;
  char text[32];
  std::snprintf(text, sizeof(text), format, x);
  return text;
}
std::string json_ms(double ms) { return number(ms, "%.5f", "null"); }

} // namespace

int main(int argc, char** argv) {
  std::vector<const Model*> models;
  std::vector<int64_t> tokens;
  std::string out_path, commit;
  int runs = 30;
  DType grad_dtype = DType::bf16;
  bool run_checks = true, only_check = false, profile = false;
  try {
    const bench::Flags flags(argc, argv,
                             {"--models", "--tokens", "--runs", "--grad-dtype", "--out", "--commit",
                              "--check", "--only-check", "--profile", "--backward-parts"});
    for (const std::string& tag : split(flags.get("--models", "1b,8b"))) {
      const Model* found = nullptr;
      for (const Model& md : kModels)
        if (tag == md.tag || tag == md.name) found = &md;
      if (!found) throw std::invalid_argument("--models: unknown model " + tag + " (1b, 8b)");
      models.push_back(found);
    }
    for (const std::string& t : split(flags.get("--tokens", "8192,16384"))) {
      const long long m = std::atoll(t.c_str());
      if (m <= 0) throw std::invalid_argument("--tokens: not a token count: " + t);
      tokens.push_back(m);
    }
    runs = std::max(1, flags.get_int("--runs", runs));
    const std::string g = flags.get("--grad-dtype", "bf16");
    if (g != "bf16" && g != "f32") throw std::invalid_argument("--grad-dtype: bf16 or f32");
    grad_dtype = g == "f32" ? DType::f32 : DType::bf16;
    out_path = flags.get("--out", "bench/results/block.json");
    commit = flags.commit();
    run_checks = flags.get_int("--check", 1) != 0;
    only_check = flags.get_int("--only-check", 0) != 0;
    profile = flags.get_int("--profile", 0) != 0;
    backward_in_parts = flags.get_int("--backward-parts", 0) != 0;
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "bench_block: %s\n", e.what()), 2;
  }
  try {
    const bool gpu = coda::gpu::device_supported();
    if (only_check && !gpu) {
      std::printf("no sm_90 GPU: checking coda's CPU backend only\n");
      return run_check(nullptr, grad_dtype) ? 0 : 1;
    }
    if (!gpu) return std::fprintf(stderr, "bench_block needs an sm_90 GPU\n"), 1;
    const bench::Context ctx;
    const bool ok = !run_checks || run_check(&ctx, grad_dtype);
    if (only_check) return ok ? 0 : 1;

    std::printf("\nmiddle block, %s weight gradients, coda's backward %s, median of %d runs (L2 "
                "flushed before each)\n",
                grad_dtype == DType::f32 ? "f32" : "bf16",
                backward_in_parts ? "in two parts" : "in one call", runs);
    std::vector<Result> results;
    for (const Model* md : models)
      for (int64_t m : tokens) {
        const std::vector<Result> r = bench_case(*md, m, grad_dtype, ctx, runs, profile);
        results.insert(results.end(), r.begin(), r.end());
        std::fflush(stdout);
      }

    std::printf("\n%-9s %6s %-8s %9s %9s %9s  %9s %12s %9s %10s %9s %9s\n", "model", "tokens",
                "pass", "coda ms", "gemm ms", "unfused", "coda/gemm", "unfused/coda", "fp8 ms",
                "coda/fp8", "once ms", "fp8/once");
    for (const Result& r : results)
      std::printf("%-9s %6lld %-8s %9s %9s %9s  %9s %12s %9s %10s %9s %9s\n", r.md->name,
                  (long long)r.tokens, kPassNames[r.pass], number(r.ms[kCoda]).c_str(),
                  number(r.ms[kGemm]).c_str(), number(r.ms[kUnfused]).c_str(),
                  number(r.ms[kCoda] / r.ms[kGemm]).c_str(),
                  number(r.ms[kUnfused] / r.ms[kCoda]).c_str(), number(r.ms[kCodaFp8]).c_str(),
                  number(r.ms[kCoda] / r.ms[kCodaFp8]).c_str(), number(r.ms[kCodaFp8Once]).c_str(),
                  number(r.ms[kCodaFp8] / r.ms[kCodaFp8Once]).c_str());

    FILE* f = bench::open_json(
        out_path, ctx.prop, commit, runs,
        std::string("  \"grad_dtype\": \"") + (grad_dtype == DType::f32 ? "f32" : "bf16") +
            "\",\n" + "  \"backward_parts\": " + (backward_in_parts ? "true" : "false") + ",\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"model\": \"%s\", \"tokens\": %lld, \"pass\": \"%s\", \"coda_ms\": %s, "
                   "\"gemm_only_ms\": %s, \"unfused_ms\": %s, \"coda_fp8_ms\": %s, "
                   "\"coda_fp8_once_ms\": %s}%s\n",
                   r.md->name, (long long)r.tokens, kPassNames[r.pass],
                   json_ms(r.ms[kCoda]).c_str(), json_ms(r.ms[kGemm]).c_str(),
                   json_ms(r.ms[kUnfused]).c_str(), json_ms(r.ms[kCodaFp8]).c_str(),
                   json_ms(r.ms[kCodaFp8Once]).c_str(), i + 1 < results.size() ? "," : "");
    }
    bench::close_json(f);
    std::printf("wrote %s\n", out_path.c_str());
    if (!ok) return std::fprintf(stderr, "bench_block: the check failed (see above)\n"), 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_block: %s\n", e.what());
    return 1;
  }
}
