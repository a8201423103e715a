#include "block/steps.hpp"

#include "coda/coda.hpp"

namespace coda::llama::detail {

RopeSpec rope_spec(const Config& c, const Rope& rope) {
  RopeSpec spec;
  spec.positions = rope.positions;
  spec.inv_freq = rope.inv_freq;
  spec.n_q_heads = c.n_heads;
  spec.n_kv_heads = c.n_kv_heads;
  spec.head_dim = c.head_dim;
  return spec;
}

void weight_gradient(const TensorView& dy, const TensorView& x, const TensorView& dw,
                     const Scalar& alpha, bool accumulate, const TensorView& workspace,
                     Stream stream) {
  GemmArgs g;
  g.layout = GemmLayout::wgrad;
  g.a = dy;
  g.b = x;
  g.d = dw;
  g.alpha = alpha;
  g.workspace = workspace;
  if (accumulate) {
    g.c = dw;
    g.beta = 1.f;
  }
  gemm(g, stream);
}

namespace {

// x [M, K] quantized by rows into `rows` and, when `columns` has tensors, by columns into it
// (quantize_activation_fp8's optional transposed copy).
void quantize_both(const TensorView& x, const Fp8Operand& rows, const Fp8Operand& columns,
                   Stream stream) {
  QuantizeActivationFp8Args q;
  q.x = x;
  q.codes = rows.codes;
  q.scales = rows.scales;
  q.codes_t = columns.codes;
  q.scales_t = columns.scales;
  quantize_activation_fp8(q, stream);
}

// A weight (or an activation in 128 x 128 blocks) quantized into `rows` (the forward's B) and
// `columns` (its transposed copy: what a backward reads, its B scaled by blocks), each only when
// it has tensors. No FP8 step reads both, so each call passes one.
void quantize_weight(const TensorView& w, const Fp8Operand& rows, const Fp8Operand& columns,
                     Stream stream) {
  QuantizeWeightFp8Args q;
  q.w = w;
  q.codes = rows.codes;
  q.scales = rows.scales;
  q.codes_t = columns.codes;
  q.scales_t = columns.scales;
  quantize_weight_fp8(q, stream);
}

// A weight's copy as a GEMM reads it: by rows (the forward's B) or transposed (`columns`, the
// input gradient's), the caller's where given (Fp8Operand::given), else quantized from w now.
enum class Copy { rows, columns };
const Fp8Operand& weight_copy(const TensorView& w, const Fp8Operand& copy, Copy which,
                              Stream stream) {
  if (copy.given) return copy;
  if (which == Copy::rows)
    quantize_weight(w, copy, {}, stream);
  else
    quantize_weight(w, {}, copy, stream);
  return copy;
}

// One forward GEMM's operands as a fused kernel's Args take them: a [M, K] and w [N, K]
// themselves, or (FP8) their codes and scales: a quantized into `qa` first, and w's copy `qw`
// (weight_copy).
struct ForwardOperands {
  TensorView a, w, a_scales, w_scales;
};
ForwardOperands forward_operands(const TensorView& a, const TensorView& w, const Fp8Operand* qa,
                                 const Fp8Operand* qw, Stream stream) {
  if (qa == nullptr) return {a, w, {}, {}};
  quantize_both(a, *qa, {}, stream);
  const Fp8Operand& b = weight_copy(w, *qw, Copy::rows, stream);
  return {qa->codes, b.codes, qa->scales, b.scales};
}

// The operand pair of one GEMM of the FP8 forward (null for native precision).
const Fp8Operand* part(const Fp8ForwardScratch* fp8, Fp8Operand Fp8ForwardScratch::*operand) {
  return fp8 != nullptr ? &(fp8->*operand) : nullptr;
}

template <class Args> void set_operands(Args& args, const ForwardOperands& o) {
  args.a = o.a;
  args.w = o.w;
  args.a_scales = o.a_scales;
  args.w_scales = o.w_scales;
}

} // namespace

void mlp_forward(const MlpForward& f, float eps, const MlpForwardScratch& scratch, Stream stream,
                 const Fp8ForwardScratch* fp8) {
  using S = Fp8ForwardScratch;
  ResidualRmsArgs attention_residual; // F1
  set_operands(attention_residual,
               forward_operands(f.y0, f.w_out, part(fp8, &S::y0), part(fp8, &S::w_out), stream));
  attention_residual.residual = f.x0;
  attention_residual.gamma = f.ffn_norm;
  attention_residual.out = f.x1;
  attention_residual.out_scaled = scratch.h;
  attention_residual.sumsq_partials = scratch.sumsq;
  gemm_residual_rms(attention_residual, stream);

  RmsSwigluArgs gate_up; // F2 (and A1: r1 from S1 inside its epilogue)
  set_operands(gate_up, forward_operands(scratch.h, f.w_gate_up, part(fp8, &S::h),
                                         part(fp8, &S::w_gate_up), stream));
  gate_up.sumsq_partials = scratch.sumsq;
  gate_up.eps = eps;
  gate_up.preact = f.z1;
  gate_up.act = scratch.y1;
  gate_up.rstd_out = f.r1;
  gemm_rms_swiglu(gate_up, stream);

  ResidualRmsArgs mlp_residual; // F3: h1 and S1 are dead, so h2 and S2 reuse their space
  set_operands(mlp_residual, forward_operands(scratch.y1, f.w_down, part(fp8, &S::y1),
                                              part(fp8, &S::w_down), stream));
  mlp_residual.residual = f.x1;
  mlp_residual.gamma = f.next_norm;
  mlp_residual.out = f.x2;
  mlp_residual.out_scaled = scratch.h;
  mlp_residual.sumsq_partials = scratch.sumsq;
  gemm_residual_rms(mlp_residual, stream);
}

namespace {

// dw (+)= dyᵀ x: dy quantized along the tokens (1 x 128 blocks of dy_t, its column copy), x in
// 128 x 128 blocks (x_t, quantize_weight_fp8's transposed codes), so that gemm_fp8 scales B by
// blocks: its rows form, a scale per output column, took 2.15x the blocks form's time
// (docs/fp8.md, "The weight gradient's activation in blocks").
void fp8_weight_gradient(const Fp8Operand& dy_t, const Fp8Operand& x_t, const TensorView& dw,
                         bool accumulate, Stream stream) {
  Fp8GemmArgs g;
  g.a = dy_t.codes;
  g.a_scales = dy_t.scales;
  g.b = x_t.codes;
  g.b_scales = x_t.scales;
  g.b_scaling = Fp8BScaling::blocks;
  g.d = dw;
  g.accumulate = accumulate;
  gemm_fp8(g, stream);
}

} // namespace

void norm_backward(const NormBackward& b, bool accumulate_grads, const NormBackwardScratch& scratch,
                   Stream stream, const Fp8NormBackwardScratch* fp8) {
  if (fp8 != nullptr && (b.alpha.value != 1.f || b.alpha.tensor.data != nullptr))
    throw Error(Status::internal, "coda::llama: an FP8 norm backward with a gradient scale "
                                  "(gemm_fp8 has no alpha)");
  RmsBackwardArgs k6;
  k6.dz = b.dz;
  k6.w = b.w;
  if (fp8 != nullptr) { // B1 on E4M3 operands: dz by rows, the weight's transposed codes
    quantize_both(b.dz, fp8->dz, fp8->dz_t, stream);
    const Fp8Operand& w_t = weight_copy(b.w, fp8->w_t, Copy::columns, stream);
    k6.dz = fp8->dz.codes;
    k6.dz_scales = fp8->dz.scales;
    k6.w = w_t.codes;
    k6.w_scales = w_t.scales;
  }
  k6.x = b.x;
  k6.rstd = b.rstd;
  k6.zeta = scratch.zeta;
  k6.gamma = b.gamma;
  k6.alpha = b.alpha;
  k6.accumulate = b.accumulate_dx;
  k6.dx = b.dx;
  k6.h_hat = scratch.h_hat;
  k6.dgamma_partials = scratch.dgamma_partials;
  gemm_rms_backward(k6, stream);

  ColReduceArgs dgamma;
  dgamma.partials = scratch.dgamma_partials;
  dgamma.accumulate = accumulate_grads;
  dgamma.out = b.dgamma;
  reduce_col_partials(dgamma, stream);

  if (fp8 == nullptr)
    return weight_gradient(b.dz, scratch.h_hat, b.dw, b.alpha, accumulate_grads,
                           scratch.gemm_workspace, stream);
  quantize_weight(scratch.h_hat, {}, fp8->h_hat_t, stream);
  fp8_weight_gradient(fp8->dz_t, fp8->h_hat_t, b.dw, accumulate_grads, stream);
}

void attention_input_forward(const AttentionInput& f, const Config& c, const Rope& rope,
                             const TensorView& h, const TensorView& sumsq, Stream stream,
                             const Fp8ForwardScratch* fp8) {
  using S = Fp8ForwardScratch;
  RmsRopeArgs qkv; // K4 (and the norm's rstd from the partials inside its epilogue)
  set_operands(qkv, forward_operands(h, f.w_qkv, part(fp8, &S::h), part(fp8, &S::w_qkv), stream));
  qkv.sumsq_partials = sumsq;
  qkv.eps = c.eps;
  qkv.rope = rope_spec(c, rope);
  qkv.out = f.qkv;
  qkv.rstd_out = f.rstd;
  gemm_rms_rope(qkv, stream);
}

void attention_input_backward(const AttentionInput& f, const AttentionInputGrads& g,
                              const Config& c, const Rope& rope, bool accumulate_grads,
                              const TensorView& dz, const NormBackwardScratch& scratch,
                              Stream stream, const Fp8NormBackwardScratch* fp8) {
  RopeBackwardArgs unrotate; // B0: dz = RoPEᵀ(dqkv), zeta = (1/D) sum qkv * dqkv
  unrotate.dqkv = g.dqkv;
  unrotate.qkv = f.qkv;
  unrotate.rope = rope_spec(c, rope);
  unrotate.scale = float(1.0 / double(c.hidden));
  unrotate.dz = dz;
  unrotate.zeta = scratch.zeta;
  rope_backward(unrotate, stream);

  NormBackward attn_norm; // B1 K6 (dx += ...), A3 dgamma, B2 dW_qkv
  attn_norm.dz = dz;
  attn_norm.w = f.w_qkv;
  attn_norm.x = f.x;
  attn_norm.rstd = f.rstd;
  attn_norm.gamma = f.attn_norm;
  attn_norm.dx = g.dx;
  attn_norm.dgamma = g.dattn_norm;
  attn_norm.dw = g.dw_qkv;
  norm_backward(attn_norm, accumulate_grads, scratch, stream, fp8);
}

void swiglu_and_down_backward(const MlpBackward& b, int64_t hidden, bool accumulate_grads,
                              const MlpBackwardScratch& mlp, const TensorView& zeta1,
                              const TensorView& gemm_workspace, Stream stream,
                              const Fp8MlpBackwardScratch* fp8) {
  SwigluBackwardArgs k7; // B3
  k7.dx = b.dx;
  k7.w = b.w_down;
  if (fp8 != nullptr) { // dx by rows (and columns, for B4), W_down's transposed codes
    quantize_both(b.dx, fp8->dx, fp8->dx_t, stream);
    const Fp8Operand& w_t = weight_copy(b.w_down, fp8->w_down_t, Copy::columns, stream);
    k7.dx = fp8->dx.codes;
    k7.dx_scales = fp8->dx.scales;
    k7.w = w_t.codes;
    k7.w_scales = w_t.scales;
  }
  k7.preact = b.z1; // read, then overwritten with its gradient (no scratch for dz1)
  k7.act = mlp.y1;
  if (fp8 != nullptr) { // act as B4 reads it: K7 writes its transposed FP8 copy, not the 16 bits
    k7.act = {};
    k7.act_codes_t = fp8->y1_t.codes;
    k7.act_scales_t = fp8->y1_t.scales;
  }
  k7.dpreact = b.z1;
  k7.zeta_partials = mlp.zeta_partials;
  gemm_swiglu_backward(k7, stream);

  RowReduceArgs zeta; // A4: zeta1 = (1/D) sum_k z1 dz1, D the RMSNorm width
  zeta.partials = mlp.zeta_partials;
  zeta.scale = float(1.0 / double(hidden));
  zeta.out = zeta1;
  reduce_row_partials(zeta, stream);

  if (fp8 == nullptr)
    return weight_gradient(b.dx, mlp.y1, b.dw_down, 1.f, accumulate_grads, gemm_workspace,
                           stream); // B4
  fp8_weight_gradient(fp8->dx_t, fp8->y1_t, b.dw_down, accumulate_grads, stream); // B4
}

void gate_up_and_out_backward(const MlpBackward& b, bool accumulate_grads,
                              const NormBackwardScratch& norm, Stream stream,
                              const Fp8MlpBackwardScratch* fp8) {
  NormBackward ffn; // B5, A5, B6
  ffn.dz = b.z1;    // d loss / d z1, where K7 wrote it
  ffn.w = b.w_gate_up;
  ffn.x = b.x1;
  ffn.rstd = b.r1;
  ffn.gamma = b.ffn_norm;
  ffn.dx = b.dx;
  ffn.dgamma = b.dffn_norm;
  ffn.dw = b.dw_gate_up;
  norm_backward(ffn, accumulate_grads, norm, stream, fp8 != nullptr ? &fp8->ffn : nullptr);

  if (fp8 != nullptr) { // B7 and B8 on dx as B5 left it, quantized again
    quantize_both(b.dx, fp8->dx, fp8->dx_t, stream);
    const Fp8Operand& w_out_t = weight_copy(b.w_out, fp8->w_out_t, Copy::columns, stream);
    Fp8GemmArgs dy0; // B7: dy0 = dx1 · W0, W0ᵀ's codes as gemm_fp8's b
    dy0.a = fp8->dx.codes;
    dy0.a_scales = fp8->dx.scales;
    dy0.b = w_out_t.codes;
    dy0.b_scales = w_out_t.scales;
    dy0.d = b.dy0;
    gemm_fp8(dy0, stream);
    quantize_weight(b.y0, {}, fp8->y0_t, stream);
    fp8_weight_gradient(fp8->dx_t, fp8->y0_t, b.dw_out, accumulate_grads, stream); // B8
    return;
  }

  GemmArgs attention_input; // B7: dy0 = dx1 · W0
  attention_input.layout = GemmLayout::dgrad;
  attention_input.a = b.dx;
  attention_input.b = b.w_out;
  attention_input.d = b.dy0;
  attention_input.workspace = norm.gemm_workspace;
  gemm(attention_input, stream);

  weight_gradient(b.dx, b.y0, b.dw_out, 1.f, accumulate_grads, norm.gemm_workspace,
                  stream); // B8
}

void mlp_backward(const MlpBackward& b, int64_t hidden, bool accumulate_grads,
                  const MlpBackwardScratch& mlp, const NormBackwardScratch& norm, Stream stream,
                  const Fp8MlpBackwardScratch* fp8) {
  swiglu_and_down_backward(b, hidden, accumulate_grads, mlp, norm.zeta, norm.gemm_workspace, stream,
                           fp8);
  gate_up_and_out_backward(b, accumulate_grads, norm, stream, fp8);
}

} // namespace coda::llama::detail
