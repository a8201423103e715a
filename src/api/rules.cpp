#include "api/rules.hpp"

#include <string>

#include "coda/core/fp8.hpp"

namespace coda::api {

GemmRows gemm_rows_input(Validator& v, const char* name, const TensorView& t, const char* width) {
  v.input(name, t, Elem::half, {any("M"), any(width)});
  const GemmRows r{t.shape[0], t.shape[1]};
  v.at_least_one("M", r.m, name);
  v.gemm_dim(width, r.width, name);
  return r;
}

Mnk forward_operands(Validator& v, const TensorView& a, const TensorView& w, Dim n_dim) {
  const auto [m, k] = gemm_rows_input(v, "a", a, "K");
  v.input("w", w, Elem::half, {n_dim, exactly("K", k)});
  return {m, w.shape[0], k};
}

namespace {

// E4M3 operands in gemm_fp8's form (a [M, K] named a_name, w [N, K], K a multiple of 16) with
// their block scales; false, after refusing any scale, when a is not E4M3.
bool fp8_operands(Validator& v, const char* a_name, const char* a_scales_name, const TensorView& a,
                  const TensorView& w, Dim n_dim, const TensorView& a_scales,
                  const TensorView& w_scales, Mnk& p) {
  if (a.dtype != DType::e4m3) {
    if (a_scales.data != nullptr || w_scales.data != nullptr)
      v.fail(Status::invalid_argument, std::string(a_scales_name) +
                                           " and w_scales go with E4M3 operands; " + a_name +
                                           " is " + dtype_name(a.dtype) +
                                           " (pass them absent, or " + a_name + " and w as e4m3)");
    return false;
  }
  v.input(a_name, a, Elem::e4m3, {any("M"), any("K")});
  const int64_t m = a.shape[0], k = a.shape[1];
  v.at_least_one("M", m, a_name);
  v.gemm_dim("K", k, a_name, /*multiple=*/16); // 1-byte codes: 16-byte rows are 16 of them
  v.input("w", w, Elem::e4m3, {n_dim, exactly("K", k)});
  const int64_t n = w.shape[0];
  const Dim k_blocks = exactly("ceil(K/128)", num_fp8_scale_blocks(k));
  v.input(a_scales_name, a_scales, Elem::e8m0, {exactly("M", m), k_blocks});
  v.input("w_scales", w_scales, Elem::e8m0,
          {exactly("ceil(N/128)", num_fp8_scale_blocks(n)), k_blocks});
  p = {m, n, k};
  return true;
}

} // namespace

Mnk forward_operands(Validator& v, const TensorView& a, const TensorView& w, Dim n_dim,
                     const TensorView& a_scales, const TensorView& w_scales) {
  Mnk p{};
  if (fp8_operands(v, "a", "a_scales", a, w, n_dim, a_scales, w_scales, p)) return p;
  return forward_operands(v, a, w, n_dim);
}

Mnk backward_operands(Validator& v, const char* grad_name, const TensorView& grad,
                      const TensorView& w, const char* n_name) {
  const auto [m, k] = gemm_rows_input(v, grad_name, grad, "K");
  v.input("w", w, Elem::half, {exactly("K", k), any(n_name)});
  const int64_t n = w.shape[1];
  v.gemm_dim(n_name, n, "w");
  return {m, n, k};
}

Mnk backward_operands(Validator& v, const char* grad_name, const char* grad_scales_name,
                      const TensorView& grad, const TensorView& w, const char* n_name,
                      const TensorView& grad_scales, const TensorView& w_scales) {
  Mnk p{};
  if (!fp8_operands(v, grad_name, grad_scales_name, grad, w, any(n_name), grad_scales, w_scales, p))
    return backward_operands(v, grad_name, grad, w, n_name);
  v.gemm_dim(n_name, p.n, "w");
  return p;
}

void normalization_inputs(Validator& v, const TensorView& sumsq_partials, float eps, int64_t m) {
  v.input("sumsq_partials", sumsq_partials, Elem::f32, {exactly("M", m), at_least_one("P")});
  v.non_negative("eps", eps);
}

int64_t rope_width(const Validator& v, const RopeSpec& rope) {
  if (rope.n_q_heads < 1)
    v.fail(Status::invalid_argument,
           "rope.n_q_heads must be >= 1; got " + std::to_string(rope.n_q_heads));
  if (rope.n_kv_heads < 1)
    v.fail(Status::invalid_argument,
           "rope.n_kv_heads must be >= 1; got " + std::to_string(rope.n_kv_heads));
  if (rope.head_dim < 2 || rope.head_dim % 2 != 0)
    v.fail(
        Status::invalid_argument,
        "rope.head_dim must be even and >= 2 (RoPE rotates the pairs (i, i + head_dim/2)); got " +
            std::to_string(rope.head_dim));
  // At most (3 * 2^31) * 2^31, past int64: a width that overflows is an error.
  int64_t width = 0;
  if (__builtin_mul_overflow(int64_t(rope.n_q_heads) + 2 * int64_t(rope.n_kv_heads), rope.head_dim,
                             &width))
    v.fail(Status::invalid_argument,
           "rope: (n_q_heads + 2*n_kv_heads)*head_dim overflows 64 bits; got n_q_heads " +
               std::to_string(rope.n_q_heads) + ", n_kv_heads " + std::to_string(rope.n_kv_heads) +
               ", head_dim " + std::to_string(rope.head_dim));
  return width;
}

void rope_tables(Validator& v, const RopeSpec& rope, int64_t m) {
  v.input("rope.positions", rope.positions, Elem::i32, {exactly("M", m)});
  v.input("rope.inv_freq", rope.inv_freq, Elem::f32, {exactly("head_dim/2", rope.head_dim / 2)});
}

void scalar_input(Validator& v, const char* value_name, const char* tensor_name, const Scalar& s) {
  v.finite(value_name, s.value);
  v.optional_input(tensor_name, s.tensor, Elem::f32, {exactly("1", 1)});
}

} // namespace coda::api
