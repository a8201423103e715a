// Argument rules of the GEMM and of the named kernels K0..K7 and K2g.
#include "api/checks.hpp"
#include "api/rules.hpp"
#include "coda/core/fp8.hpp"

namespace coda::api {
namespace {

// An optional FP8 copy of a quantizer: its codes and scales given together (checked as outputs)
// or both absent.
void optional_fp8_copy(Validator& v, const char* codes_name, const TensorView& codes,
                       std::initializer_list<Dim> codes_shape, const char* scales_name,
                       const TensorView& scales, std::initializer_list<Dim> scales_shape) {
  v.optional_output(codes_name, codes, Elem::e4m3, codes_shape);
  if (codes.data != nullptr)
    v.output(scales_name, scales, Elem::e8m0, scales_shape);
  else if (scales.data != nullptr)
    v.fail(Status::invalid_argument, std::string(scales_name) + " is given but " + codes_name +
                                         " is absent; pass both or neither");
}

} // namespace

Device validate(const GemmArgs& args) {
  Validator v("gemm");
  const int32_t layout = int32_t(args.layout);
  if (layout < 0 || layout > int32_t(GemmLayout::wgrad))
    v.fail(Status::invalid_argument,
           "layout must be fwd (0), dgrad (1) or wgrad (2); got " + std::to_string(layout));
  const bool wgrad = args.layout == GemmLayout::wgrad;
  if (wgrad)
    v.input("a", args.a, Elem::half, {any("K"), any("M")});
  else
    v.input("a", args.a, Elem::half, {any("M"), any("K")});
  const int64_t M = wgrad ? args.a.shape[1] : args.a.shape[0];
  const int64_t K = wgrad ? args.a.shape[0] : args.a.shape[1];
  // Only row lengths must be multiples of 8 (16-byte rows for TMA). In wgrad both operands are
  // stored [K, *], so K (the token count) is an outer dimension and may be anything.
  if (wgrad) {
    v.gemm_dim("M", M, "a"); // a [K, M] is stored with M-element rows
    v.at_least_one("K", K, "a");
  } else {
    v.at_least_one("M", M, "a");
    v.gemm_dim("K", K, "a");
  }
  if (args.layout == GemmLayout::fwd)
    v.input("b", args.b, Elem::half, {any("N"), exactly("K", K)});
  else
    v.input("b", args.b, Elem::half, {exactly("K", K), any("N")});
  const int64_t N = args.layout == GemmLayout::fwd ? args.b.shape[0] : args.b.shape[1];
  v.gemm_dim("N", N, "b");
  v.output("d", args.d, Elem::half_or_f32, {exactly("M", M), exactly("N", N)});
  v.optional_input("c", args.c, Elem::half_or_f32, {exactly("M", M), exactly("N", N)});
  v.allow_alias("d", "c");
  // Its size depends on the plan of the call's device; the GPU launch checks it.
  v.optional_output("workspace", args.workspace, Elem::any, {any("bytes / element size")});
  scalar_input(v, "alpha", "alpha.tensor", args.alpha); // a device alpha is read by the kernel
  v.finite("beta", args.beta);
  if (args.beta != 0.f && !args.has_c())
    v.fail(Status::invalid_argument,
           "beta is " + std::to_string(args.beta) +
               " but c is absent; pass c (it may alias d) or set beta = 0");
  return v.finish();
}

static_assert(kFp8ScaleBlock == 128, "the scale shapes in messages say ceil(K/128), ceil(N/128)");

Device validate(const Fp8GemmArgs& args) {
  Validator v("gemm_fp8");
  v.input("a", args.a, Elem::e4m3, {any("M"), any("K")});
  const int64_t M = args.a.shape[0], K = args.a.shape[1];
  v.at_least_one("M", M, "a");
  v.gemm_dim("K", K, "a", /*multiple=*/16); // 1-byte codes: 16-byte rows are 16 of them
  v.input("b", args.b, Elem::e4m3, {any("N"), exactly("K", K)});
  const int64_t N = args.b.shape[0];
  v.gemm_dim("N", N, "b"); // d's 16-byte rows
  const Dim k_blocks = exactly("ceil(K/128)", num_fp8_scale_blocks(K));
  v.input("a_scales", args.a_scales, Elem::e8m0, {exactly("M", M), k_blocks});
  switch (args.b_scaling) {
  case Fp8BScaling::blocks:
    v.input("b_scales", args.b_scales, Elem::e8m0,
            {exactly("ceil(N/128)", num_fp8_scale_blocks(N)), k_blocks});
    break;
  case Fp8BScaling::rows:
    v.input("b_scales", args.b_scales, Elem::e8m0, {exactly("N", N), k_blocks});
    break;
  default:
    v.fail(Status::invalid_argument, "b_scaling must be blocks (0) or rows (1); got " +
                                         std::to_string(int32_t(args.b_scaling)));
  }
  v.output("d", args.d, Elem::bf16_or_f32, {exactly("M", M), exactly("N", N)});
  return v.finish();
}

Device validate(const QuantizeWeightFp8Args& args) {
  Validator v("quantize_weight_fp8");
  v.input("w", args.w, Elem::half_or_f32, {any("N"), any("K")});
  const int64_t N = args.w.shape[0], K = args.w.shape[1];
  // Both copies are gemm_fp8 operands: codes [N, K] reduces over K, codes_t [K, N] over N, whose
  // 1-byte rows TMA reads 16 bytes at a time.
  v.gemm_dim("N", N, "w", /*multiple=*/16);
  v.gemm_dim("K", K, "w", /*multiple=*/16);
  const Dim n_blocks = exactly("ceil(N/128)", num_fp8_scale_blocks(N));
  const Dim k_blocks = exactly("ceil(K/128)", num_fp8_scale_blocks(K));
  // Either copy may be left out (a backward reads only the transposed one), not both.
  if (args.codes.data == nullptr && args.codes_t.data == nullptr)
    v.fail(Status::invalid_argument,
           "neither codes nor codes_t is given; pass codes and scales, codes_t and scales_t, or "
           "all four");
  optional_fp8_copy(v, "codes", args.codes, {exactly("N", N), exactly("K", K)}, "scales",
                    args.scales, {n_blocks, k_blocks});
  optional_fp8_copy(v, "codes_t", args.codes_t, {exactly("K", K), exactly("N", N)}, "scales_t",
                    args.scales_t, {k_blocks, n_blocks});
  return v.finish();
}

Device validate(const QuantizeActivationFp8Args& args) {
  Validator v("quantize_activation_fp8");
  v.input("x", args.x, Elem::half_or_f32, {any("M"), any("K")});
  const int64_t M = args.x.shape[0], K = args.x.shape[1];
  v.at_least_one("M", M, "x");
  // codes [M, K] is a gemm_fp8 operand reduced over K, whose 1-byte rows TMA reads 16 bytes at a
  // time; codes_t [K, M] (below) likewise over M.
  v.gemm_dim("K", K, "x", /*multiple=*/16);
  const Dim m_blocks = exactly("ceil(M/128)", num_fp8_scale_blocks(M));
  const Dim k_blocks = exactly("ceil(K/128)", num_fp8_scale_blocks(K));
  v.output("codes", args.codes, Elem::e4m3, {exactly("M", M), exactly("K", K)});
  v.output("scales", args.scales, Elem::e8m0, {exactly("M", M), k_blocks});
  // Before codes_t's own checks, which would only see its row stride.
  if (args.codes_t.data != nullptr && M % 16 != 0)
    v.fail(Status::not_supported,
           "M must be a multiple of 16 when codes_t is given (codes_t [K, M] is a gemm_fp8 "
           "operand: 16-byte rows for TMA); got " +
               std::to_string(M) + " (from x); pad it to " + std::to_string((M + 15) / 16 * 16) +
               " or leave codes_t and scales_t absent");
  optional_fp8_copy(v, "codes_t", args.codes_t, {exactly("K", K), exactly("M", M)}, "scales_t",
                    args.scales_t, {exactly("K", K), m_blocks});
  return v.finish();
}

Device validate(const ResidualRmsArgs& args) {
  Validator v("gemm_residual_rms");
  const Mnk p = forward_operands(v, args.a, args.w, any("N"), args.a_scales, args.w_scales);
  const Dim M = exactly("M", p.m), N = exactly("N", p.n);
  v.input("residual", args.residual, Elem::half, {M, N});
  v.input("gamma", args.gamma, Elem::half, {N});
  v.output("out", args.out, Elem::half, {M, N});
  v.output("out_scaled", args.out_scaled, Elem::half, {M, N});
  v.output("sumsq_partials", args.sumsq_partials, Elem::f32,
           {M, reduce_blocks("ceil(N/128)", p.n)});
  v.allow_alias("out", "residual");
  return v.finish();
}

Device validate(const RmsScaleArgs& args) {
  Validator v("gemm_rms_scale");
  const Mnk p = forward_operands(v, args.a, args.w, any("N"), args.a_scales, args.w_scales);
  normalization_inputs(v, args.sumsq_partials, args.eps, p.m);
  v.output("out", args.out, Elem::half, {exactly("M", p.m), exactly("N", p.n)});
  v.optional_output("rstd_out", args.rstd_out, Elem::f32, {exactly("M", p.m)});
  return v.finish();
}

namespace {

// K2 and its variants with another gated activation: the fused interleaved gate/up GEMM.
template <class GatedArgs> Device validate_rms_gated(const char* kernel, const GatedArgs& args) {
  Validator v(kernel);
  const Mnk p = forward_operands(v, args.a, args.w, any("2F"), args.a_scales, args.w_scales);
  if (p.n % 2 != 0)
    v.fail(Status::invalid_argument,
           "w must have an even number of rows ([2F, K], gate and up rows interleaved); got " +
               std::to_string(p.n));
  const int64_t F = p.n / 2;
  v.gemm_dim("F", F, "w");
  normalization_inputs(v, args.sumsq_partials, args.eps, p.m);
  v.output("preact", args.preact, Elem::half, {exactly("M", p.m), exactly("2F", p.n)});
  v.output("act", args.act, Elem::half, {exactly("M", p.m), exactly("F", F)});
  v.optional_output("rstd_out", args.rstd_out, Elem::f32, {exactly("M", p.m)});
  return v.finish();
}

} // namespace

Device validate(const RmsSwigluArgs& args) { return validate_rms_gated("gemm_rms_swiglu", args); }
Device validate(const RmsGegluArgs& args) { return validate_rms_gated("gemm_rms_geglu", args); }

Device validate(const RmsRopeArgs& args) {
  Validator v("gemm_rms_rope");
  const int64_t qkv_width = rope_width(v, args.rope);
  const Mnk p = forward_operands(v, args.a, args.w, exactly(kQkvWidth, qkv_width), args.a_scales,
                                 args.w_scales);
  v.gemm_dim("N", p.n, "w");
  rope_tables(v, args.rope, p.m);
  normalization_inputs(v, args.sumsq_partials, args.eps, p.m);
  v.output("out", args.out, Elem::half, {exactly("M", p.m), exactly("N", p.n)});
  v.optional_output("rstd_out", args.rstd_out, Elem::f32, {exactly("M", p.m)});
  return v.finish();
}

Device validate(const RmsLseArgs& args) {
  Validator v("gemm_rms_lse");
  const Mnk p = forward_operands(v, args.a, args.w, any("V"));
  v.gemm_dim("V", p.n, "w");
  normalization_inputs(v, args.sumsq_partials, args.eps, p.m);
  const Dim M = exactly("M", p.m);
  v.input("targets", args.targets, Elem::i32, {M});
  v.output("logits", args.logits, Elem::half, {M, exactly("V", p.n)});
  v.output("lse_partials", args.lse_partials, Elem::f32,
           {M, staged_reduce_blocks("ceil(V/64)", p.n)});
  v.output("target_logit", args.target_logit, Elem::f32, {M});
  v.optional_output("rstd_out", args.rstd_out, Elem::f32, {M});
  return v.finish();
}

Device validate(const RmsBackwardArgs& args) {
  Validator v("gemm_rms_backward");
  const Mnk p =
      backward_operands(v, "dz", "dz_scales", args.dz, args.w, "N", args.dz_scales, args.w_scales);
  const int64_t m = p.m, n = p.n;
  const Dim M = exactly("M", m), N = exactly("N", n);
  v.input("x", args.x, Elem::half, {M, N});
  v.input("rstd", args.rstd, Elem::f32, {M});
  v.input("zeta", args.zeta, Elem::f32, {M});
  v.input("gamma", args.gamma, Elem::half, {N});
  scalar_input(v, "alpha", "alpha.tensor", args.alpha);
  v.output("dx", args.dx, Elem::half, {M, N});
  v.output("h_hat", args.h_hat, Elem::half, {M, N});
  v.output("dgamma_partials", args.dgamma_partials, Elem::f32,
           {N, reduce_blocks("ceil(M/128)", m)});
  return v.finish();
}

Device validate(const SwigluBackwardArgs& args) {
  Validator v("gemm_swiglu_backward");
  const Mnk p =
      backward_operands(v, "dx", "dx_scales", args.dx, args.w, "F", args.dx_scales, args.w_scales);
  const int64_t m = p.m, f = p.n;
  const Dim M = exactly("M", m);
  v.input("preact", args.preact, Elem::half, {M, exactly("2F", 2 * f)});
  if (args.act_codes_t.data == nullptr && args.act_scales_t.data == nullptr) {
    v.output("act", args.act, Elem::half, {M, exactly("F", f)});
  } else {
    // act's FP8 copy in its place (the FP8 block's down weight gradient reads only that).
    if (args.dx.dtype != DType::e4m3)
      v.fail(Status::invalid_argument,
             "act_codes_t is given but dx and w are 16-bit: act's FP8 copy is written on E4M3 "
             "operands only; pass act");
    if (args.act.data != nullptr)
      v.fail(Status::invalid_argument,
             "act and act_codes_t are both given; pass one: act (16-bit), or act_codes_t with "
             "act_scales_t (its FP8 copy)");
    // The copy is quantize_weight_fp8's codes_t of act [M, F], which takes both multiples of 16.
    v.gemm_dim("M", m, "dx", /*multiple=*/16);
    v.gemm_dim("F", f, "w", /*multiple=*/16);
    optional_fp8_copy(v, "act_codes_t", args.act_codes_t, {exactly("F", f), M}, "act_scales_t",
                      args.act_scales_t,
                      {exactly("ceil(F/128)", num_fp8_scale_blocks(f)),
                       exactly("ceil(M/128)", num_fp8_scale_blocks(m))});
  }
  v.output("dpreact", args.dpreact, Elem::half, {M, exactly("2F", 2 * f)});
  v.output("zeta_partials", args.zeta_partials, Elem::f32,
           {M, staged_reduce_blocks("ceil(F/64)", f)});
  // In place: each element's (g, u) is read before its (dg, du) is written over it, by the same
  // thread (GPU) or step (CPU), and no other element's computation reads it.
  v.allow_alias("dpreact", "preact");
  return v.finish();
}

} // namespace coda::api
