#include "block/scratch.hpp"

#include <algorithm>
#include <string>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"

namespace coda::llama::detail {

namespace {
// NOTE: 256 bytes keeps every carved tensor aligned for TMA (16 B) and for vectorized loads of
// whole 128-byte lines, whatever the sizes before it.
constexpr size_t kAlignment = 256;
} // namespace

Arena::Arena(const TensorView& memory)
    : base_(static_cast<char*>(memory.data)), device_(memory.device),
      device_index_(memory.device_index) {}

size_t Arena::take(int64_t rows, int64_t cols, DType dtype) {
  int64_t bytes = 0;
  size_t offset = 0, end = 0;
  if (__builtin_mul_overflow(rows, cols, &bytes) ||
      __builtin_mul_overflow(bytes, dtype_size(dtype), &bytes) ||
      __builtin_add_overflow(next_, kAlignment - 1, &offset) ||
      __builtin_add_overflow(offset / kAlignment * kAlignment, size_t(bytes), &end))
    throw Error(Status::invalid_argument, "coda::llama: the workspace size overflows 64 bits (a [" +
                                              std::to_string(rows) + ", " + std::to_string(cols) +
                                              "] scratch tensor); check the config and M");
  offset = offset / kAlignment * kAlignment;
  next_ = end;
  used_ = std::max(used_, end);
  return offset;
}

TensorView Arena::matrix(DType dtype, int64_t rows, int64_t cols) {
  const size_t offset = take(rows, cols, dtype);
  TensorView v = make_view(base_ ? base_ + offset : nullptr, dtype, rows, cols, device_);
  v.device_index = device_index_;
  return v;
}

TensorView Arena::vector(DType dtype, int64_t n) {
  const size_t offset = take(n, 1, dtype);
  TensorView v = make_view(base_ ? base_ + offset : nullptr, dtype, n, device_);
  v.device_index = device_index_;
  return v;
}

TensorView Arena::bytes(size_t n) {
  return vector(DType::f32, int64_t((n + sizeof(float) - 1) / sizeof(float)));
}

namespace {

// What one RMSNorm backward keeps from K6 to its weight gradient, but for h_hat, which the caller
// carves (the middle and last layers put it over a finished phase). With Zeta::provided the caller
// provides zeta (the middle backward's part 2: zeta1 in saved.r2).
enum class Zeta { carved, provided };
NormBackwardScratch carve_norm_statistics(Arena& arena, Layer layer, const Config& c, int64_t m,
                                          Zeta zeta = Zeta::carved) {
  NormBackwardScratch s;
  s.dgamma_partials = arena.matrix(DType::f32, c.hidden, num_reduce_blocks(m));
  if (zeta == Zeta::carved) s.zeta = arena.vector(DType::f32, m);
  if (const size_t bytes = gemm_scratch_bytes(layer, c, m)) s.gemm_workspace = arena.bytes(bytes);
  return s;
}

// The backward of a middle or last layer after its first norm backward (B3..B8), then that norm
// backward's own h_hat, in three phases over one region:
//   B3..B4  y1 [M, F]        (K7 writes it; dW2 reads it: dead after B4; with Precision::fp8
//                             none: K7 writes y1's FP8 copy, which dW2 reads, in the FP8 scratch)
//   B5..B6  h_hat [M, D]     (K6 writes h_hat over y1; dW1 reads it)
//   before  first [..]       (the phase before B3)
// dz1 [M, 2F], the largest tensor of the backward, takes no scratch: K7 (B3) writes it over the
// saved pre-activation z1, which it reads element by element before writing that element's
// gradient (nothing after K7 reads z1), and K6 (B5) and dW1 (B6) read it there.
// `first` carves the earlier phase's tensors; it runs last, from the region's start. zeta
// partials, the norm statistics and the GEMMs' scratch live through the whole call.
template <class CarveFirst>
void carve_mlp_backward(Arena& arena, Layer layer, const Config& c, int64_t m, DType act,
                        NormBackwardScratch& first, MlpBackwardScratch& mlp,
                        NormBackwardScratch& ffn, CarveFirst carve_first) {
  first = carve_norm_statistics(arena, layer, c, m);
  mlp.zeta_partials = arena.matrix(DType::f32, m, num_staged_reduce_blocks(c.intermediate));
  const size_t region = arena.mark();
  if (c.precision != Precision::fp8) mlp.y1 = arena.matrix(act, m, c.intermediate);
  arena.rewind(region); // y1 is dead after B4 (dW2): the ffn norm's h_hat over it
  ffn = first;
  ffn.h_hat = arena.matrix(act, m, c.hidden);
  arena.rewind(region); // the earlier phase is over before K7 (B3) writes y1
  carve_first();
}

} // namespace

namespace {

Fp8Operand carve_fp8_activation(Arena& arena, int64_t m, int64_t k) {
  return {arena.matrix(DType::e4m3, m, k), arena.matrix(DType::e8m0, m, num_fp8_scale_blocks(k))};
}
Fp8Operand carve_fp8_weight(Arena& arena, int64_t n, int64_t k) {
  return {arena.matrix(DType::e4m3, n, k),
          arena.matrix(DType::e8m0, num_fp8_scale_blocks(n), num_fp8_scale_blocks(k))};
}
// A weight's copy [n, k] (its codes or its transposed codes) that a step quantizes the weight
// into; none where the caller gives the copies (use_fp8_weights puts them there).
Fp8Operand carve_weight_copy(Arena& arena, int64_t n, int64_t k, Fp8WeightCopies copies) {
  return copies == Fp8WeightCopies::given ? Fp8Operand{} : carve_fp8_weight(arena, n, k);
}

// Each of `carves` from the same mark, over one another (tensors no two of which are alive at
// once, in stream order), then the arena after the longest.
template <class... Carve> void carve_over_one_another(Arena& arena, const Carve&... carves) {
  const size_t start = arena.mark();
  size_t end = start;
  ((arena.rewind(start), carves(), end = std::max(end, arena.mark())), ...);
  arena.rewind(end);
}

} // namespace

Fp8ForwardScratch carve_fp8_forward(Arena& arena, Layer layer, const Config& c, int64_t m,
                                    Fp8WeightCopies copies) {
  Fp8ForwardScratch s;
  const int64_t d = c.hidden, f = c.intermediate;
  if (layer == Layer::first) {
    s.h = carve_fp8_activation(arena, m, d);
    s.w_qkv = carve_weight_copy(arena, c.qkv_width(), d, copies);
    return s;
  }
  carve_over_one_another(
      arena, [&] { s.y0 = carve_fp8_activation(arena, m, c.attention_width()); },
      [&] { s.h = carve_fp8_activation(arena, m, d); },
      [&] { s.y1 = carve_fp8_activation(arena, m, f); });
  carve_over_one_another(
      arena, [&] { s.w_out = carve_weight_copy(arena, d, c.attention_width(), copies); },
      [&] { s.w_gate_up = carve_weight_copy(arena, 2 * f, d, copies); },
      [&] { s.w_down = carve_weight_copy(arena, d, f, copies); },
      [&] {
        if (layer == Layer::middle) s.w_qkv = carve_weight_copy(arena, c.qkv_width(), d, copies);
      });
  return s;
}

namespace {

// An activation by rows and by columns (quantize_activation_fp8's codes and codes_t).
void carve_fp8_activation_both(Arena& arena, int64_t m, int64_t k, Fp8Operand& rows,
                               Fp8Operand& columns) {
  rows = carve_fp8_activation(arena, m, k);
  columns = {arena.matrix(DType::e4m3, k, m),
             arena.matrix(DType::e8m0, k, num_fp8_scale_blocks(m))};
}

// K: the consumer's output width (dz's), the consumer weight [K, D]. The weight and h_hat [M, D]
// (the weight gradient's B in 128 x 128 blocks, as quantize_weight_fp8 writes a weight: steps.cpp,
// fp8_weight_gradient; docs/fp8.md, "The weight gradient's activation in blocks") transposed only.
Fp8NormBackwardScratch carve_fp8_norm_backward(Arena& arena, const Config& c, int64_t m, int64_t k,
                                               Fp8WeightCopies copies) {
  Fp8NormBackwardScratch s;
  carve_fp8_activation_both(arena, m, k, s.dz, s.dz_t);
  s.w_t = carve_weight_copy(arena, c.hidden, k, copies);
  s.h_hat_t = carve_fp8_weight(arena, c.hidden, m);
  return s;
}

// The MLP backward's phases, in stream order, read disjoint sets of FP8 operands: B3 and B4
// (dx, W_down, y1), B5 and B6 (the ffn norm's), B7 and B8 (dx again, W_out, y0). So they lie over
// one another, the largest phase (the ffn norm's dz1 [M, 2F] twice) setting the size. dx is
// carved first in both of its phases, from the same mark: the same region, which each of them
// quantizes dx into anew.
Fp8MlpBackwardScratch carve_fp8_mlp_backward(Arena& arena, const Config& c, int64_t m,
                                             Fp8WeightCopies copies) {
  Fp8MlpBackwardScratch s;
  const int64_t d = c.hidden, f = c.intermediate, a = c.attention_width();
  carve_over_one_another(
      arena,
      [&] { // B3, B4
        carve_fp8_activation_both(arena, m, d, s.dx, s.dx_t);
        s.w_down_t = carve_weight_copy(arena, f, d, copies);
        s.y1_t = carve_fp8_weight(arena, f, m);
      },
      [&] { // B5, B6
        s.ffn = carve_fp8_norm_backward(arena, c, m, 2 * f, copies);
      },
      [&] { // B7, B8
        carve_fp8_activation_both(arena, m, d, s.dx, s.dx_t);
        s.w_out_t = carve_weight_copy(arena, a, d, copies);
        s.y0_t = carve_fp8_weight(arena, a, m);
      });
  return s;
}

} // namespace

MlpForwardScratch carve_mlp_forward(Arena& arena, const Config& c, int64_t m, DType act) {
  MlpForwardScratch s;
  s.h = arena.matrix(act, m, c.hidden);
  s.sumsq = arena.matrix(DType::f32, m, num_reduce_blocks(c.hidden));
  s.y1 = arena.matrix(act, m, c.intermediate);
  return s;
}

MiddleForwardScratch carve_middle_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                          Fp8WeightCopies copies) {
  MiddleForwardScratch s;
  s.mlp = carve_mlp_forward(arena, c, m, act);
  if (c.precision == Precision::fp8) s.fp8 = carve_fp8_forward(arena, Layer::middle, c, m, copies);
  return s;
}

FirstForwardScratch carve_first_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                        Fp8WeightCopies copies) {
  FirstForwardScratch s;
  s.h = arena.matrix(act, m, c.hidden);
  s.sumsq = arena.matrix(DType::f32, m, num_reduce_blocks(c.hidden));
  if (c.precision == Precision::fp8) s.fp8 = carve_fp8_forward(arena, Layer::first, c, m, copies);
  return s;
}

FirstBackwardScratch carve_first_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                          Fp8WeightCopies copies) {
  FirstBackwardScratch s; // one phase: rope_backward's dz, then K6's h_hat, both read by dW_qkv
  s.dz = arena.matrix(act, m, c.qkv_width());
  s.norm = carve_norm_statistics(arena, Layer::first, c, m);
  s.norm.h_hat = arena.matrix(act, m, c.hidden);
  if (c.precision == Precision::fp8)
    s.fp8 = carve_fp8_norm_backward(arena, c, m, c.qkv_width(), copies);
  return s;
}

LastForwardScratch carve_last_forward(Arena& arena, const Config& c, int64_t m, DType act,
                                      Fp8WeightCopies copies) {
  LastForwardScratch s;
  s.mlp.h = arena.matrix(act, m, c.hidden);
  s.mlp.sumsq = arena.matrix(DType::f32, m, num_reduce_blocks(c.hidden));
  const size_t y1_at = arena.mark();
  s.mlp.y1 = arena.matrix(act, m, c.intermediate);
  // F3 (K0) is y1's last reader; K5 and the cross-entropy run after it, so their partials and
  // workspace go over y1. h (h2) and sumsq (S2), which K5 reads, stay.
  arena.rewind(y1_at);
  s.lse_partials = arena.matrix(DType::f32, m, num_staged_reduce_blocks(c.vocab));
  s.target_logit = arena.vector(DType::f32, m);
  s.ce_workspace = arena.bytes(cross_entropy_workspace_size(m));
  // F1..F3's codes after everything: they are alive with y1 (the quantizers read it), whose
  // region K5's partials reuse.
  if (c.precision == Precision::fp8) {
    arena.rewind(arena.used()); // past y1, which the quantizer reads before F3
    s.fp8 = carve_fp8_forward(arena, Layer::last, c, m, copies);
  }
  return s;
}

MiddleBackwardScratch carve_middle_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                            Fp8WeightCopies copies) {
  MiddleBackwardScratch s;
  // B0..B2 (rope_backward's dz2, K6's h_hat; dW_qkv is their last reader) over the MLP's phases.
  carve_mlp_backward(arena, Layer::middle, c, m, act, s.norm, s.mlp, s.ffn, [&] {
    s.dz2 = arena.matrix(act, m, c.qkv_width());
    s.norm.h_hat = arena.matrix(act, m, c.hidden);
  });
  if (c.precision == Precision::fp8) { // after every phase: the codes are alive across them
    arena.rewind(arena.used());
    // B1 and B2 read theirs before B3 starts: the two lie over one another.
    carve_over_one_another(
        arena, [&] { s.fp8_attn = carve_fp8_norm_backward(arena, c, m, c.qkv_width(), copies); },
        [&] { s.fp8_mlp = carve_fp8_mlp_backward(arena, c, m, copies); });
  }
  return s;
}

MiddleBackwardPart2Scratch carve_middle_backward_part2(Arena& arena, const Config& c, int64_t m,
                                                       DType act, Fp8WeightCopies copies) {
  MiddleBackwardPart2Scratch s;
  s.ffn = carve_norm_statistics(arena, Layer::middle, c, m, Zeta::provided);
  s.ffn.h_hat = arena.matrix(act, m, c.hidden);
  // NOTE: the one-call backward's regions, y1's codes and (not given) W_down's among them, which
  // part 2 does not use: one layout for both parts' callers, at the cost of those bytes.
  if (c.precision == Precision::fp8) s.fp8_mlp = carve_fp8_mlp_backward(arena, c, m, copies);
  return s;
}

LastBackwardScratch carve_last_backward(Arena& arena, const Config& c, int64_t m, DType act,
                                        Fp8WeightCopies copies) {
  LastBackwardScratch s;
  s.alpha = arena.vector(DType::f32, 1);
  // The final norm's K6 and dW_lm (h_hat's last reader) over the MLP's phases.
  carve_mlp_backward(arena, Layer::last, c, m, act, s.norm, s.mlp, s.ffn,
                     [&] { s.norm.h_hat = arena.matrix(act, m, c.hidden); });
  if (c.precision == Precision::fp8) { // after every phase: the codes are alive across them
    arena.rewind(arena.used());
    s.fp8_mlp = carve_fp8_mlp_backward(arena, c, m, copies);
  }
  return s;
}

namespace {

// A weight's copies as the forward's B (codes [N, K]) and as the input gradient's (codes_t).
Fp8Operand given_rows(const Fp8Weight& w) { return {w.codes, w.scales, true}; }
Fp8Operand given_columns(const Fp8Weight& w) { return {w.codes_t, w.scales_t, true}; }

// B3..B8's weights: W_down's and W_out's transposed copies, and W_gate_up's in the ffn norm's.
template <class Fp8Weights>
void use_fp8_mlp_weights(Fp8MlpBackwardScratch& s, const Fp8Weights& w) {
  s.w_down_t = given_columns(w.w_down);
  s.w_out_t = given_columns(w.w_out);
  s.ffn.w_t = given_columns(w.w_gate_up);
}

template <class Fp8Weights> void use_fp8_mlp_weights(Fp8ForwardScratch& s, const Fp8Weights& w) {
  s.w_out = given_rows(w.w_out);
  s.w_gate_up = given_rows(w.w_gate_up);
  s.w_down = given_rows(w.w_down);
}

} // namespace

void use_fp8_weights(Fp8ForwardScratch& s, const FirstFp8Weights& w) {
  s.w_qkv = given_rows(w.w_qkv);
}
void use_fp8_weights(Fp8ForwardScratch& s, const MiddleFp8Weights& w) {
  use_fp8_mlp_weights(s, w);
  s.w_qkv = given_rows(w.w_qkv);
}
void use_fp8_weights(Fp8ForwardScratch& s, const LastFp8Weights& w) { use_fp8_mlp_weights(s, w); }
void use_fp8_weights(Fp8NormBackwardScratch& s, const FirstFp8Weights& w) {
  s.w_t = given_columns(w.w_qkv);
}
void use_fp8_weights(MiddleBackwardScratch& s, const MiddleFp8Weights& w) {
  s.fp8_attn.w_t = given_columns(w.w_qkv);
  use_fp8_mlp_weights(s.fp8_mlp, w);
}
void use_fp8_weights(Fp8MlpBackwardScratch& s, const MiddleFp8Weights& w) {
  use_fp8_mlp_weights(s, w);
}
void use_fp8_weights(Fp8MlpBackwardScratch& s, const LastFp8Weights& w) {
  use_fp8_mlp_weights(s, w);
}

} // namespace coda::llama::detail
