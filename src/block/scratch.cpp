#include "block/scratch.hpp"

#include <string>

#include "coda/coda.hpp"

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
      __builtin_add_overflow(used_, kAlignment - 1, &offset) ||
      __builtin_add_overflow(offset / kAlignment * kAlignment, size_t(bytes), &end))
    throw Error(Status::invalid_argument, "coda::llama: the workspace size overflows 64 bits (a [" +
                                              std::to_string(rows) + ", " + std::to_string(cols) +
                                              "] scratch tensor); check the config and M");
  offset = offset / kAlignment * kAlignment;
  used_ = end;
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

NormBackwardScratch carve_norm_backward(Arena& arena, Layer layer, const Config& c, int64_t m,
                                        DType act) {
  NormBackwardScratch s;
  s.h_hat = arena.matrix(act, m, c.hidden);
  s.dgamma_partials = arena.matrix(DType::f32, c.hidden, num_reduce_blocks(m));
  s.zeta = arena.vector(DType::f32, m);
  if (const size_t bytes = gemm_scratch_bytes(layer, c, m)) s.gemm_workspace = arena.bytes(bytes);
  return s;
}

MlpBackwardScratch carve_mlp_backward(Arena& arena, const Config& c, int64_t m, DType act) {
  MlpBackwardScratch s;
  s.y1 = arena.matrix(act, m, c.intermediate);
  s.dz1 = arena.matrix(act, m, 2 * c.intermediate);
  s.zeta_partials = arena.matrix(DType::f32, m, num_staged_reduce_blocks(c.intermediate));
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

FirstForwardScratch carve_first_forward(Arena& arena, const Config& c, int64_t m, DType act) {
  FirstForwardScratch s;
  s.h = arena.matrix(act, m, c.hidden);
  s.sumsq = arena.matrix(DType::f32, m, num_reduce_blocks(c.hidden));
  return s;
}

FirstBackwardScratch carve_first_backward(Arena& arena, const Config& c, int64_t m, DType act) {
  FirstBackwardScratch s;
  s.dz = arena.matrix(act, m, c.qkv_width());
  s.norm = carve_norm_backward(arena, Layer::first, c, m, act);
  return s;
}

LastForwardScratch carve_last_forward(Arena& arena, const Config& c, int64_t m, DType act) {
  LastForwardScratch s;
  s.mlp = carve_mlp_forward(arena, c, m, act);
  s.lse_partials = arena.matrix(DType::f32, m, num_staged_reduce_blocks(c.vocab));
  s.target_logit = arena.vector(DType::f32, m);
  s.ce_workspace = arena.bytes(cross_entropy_workspace_size(m));
  return s;
}

MiddleBackwardScratch carve_middle_backward(Arena& arena, const Config& c, int64_t m, DType act) {
  MiddleBackwardScratch s;
  s.dz2 = arena.matrix(act, m, c.qkv_width());
  s.norm = carve_norm_backward(arena, Layer::middle, c, m, act);
  s.mlp = carve_mlp_backward(arena, c, m, act);
  return s;
}

LastBackwardScratch carve_last_backward(Arena& arena, const Config& c, int64_t m, DType act) {
  LastBackwardScratch s;
  s.norm = carve_norm_backward(arena, Layer::last, c, m, act);
  s.mlp = carve_mlp_backward(arena, c, m, act);
  s.alpha = arena.vector(DType::f32, 1);
  return s;
}

} // namespace coda::llama::detail
