// Argument rules of the auxiliary kernels and the gate/up layout converters.
#include <string>

#include "api/checks.hpp"
#include "api/rules.hpp"
#include "coda/coda.hpp"

namespace coda::api {
namespace {

// The partials a reduce finishes: [rows, P] f32, both at least 1, where `rows` names the first
// dim ("M" or "N"). Returns the row count.
int64_t partials_input(Validator& v, const char* rows, const TensorView& partials) {
  v.input("partials", partials, Elem::f32, {any(rows), at_least_one("P")});
  v.at_least_one(rows, partials.shape[0], "partials");
  return partials.shape[0];
}

} // namespace

Device validate(const RmsStatsArgs& args) {
  Validator v("rms_stats");
  // N a GEMM dimension: out_scaled is the next GEMM's A [M, K = N].
  const auto [m, n] = gemm_rows_input(v, "x", args.x, "N");
  v.input("gamma", args.gamma, Elem::half, {exactly("N", n)});
  v.output("out_scaled", args.out_scaled, Elem::half, {exactly("M", m), exactly("N", n)});
  v.output("sumsq_partials", args.sumsq_partials, Elem::f32,
           {exactly("M", m), reduce_blocks("ceil(N/128)", n)});
  return v.finish();
}

Device validate(const RstdArgs& args) {
  Validator v("rstd_from_partials");
  const int64_t m = partials_input(v, "M", args.partials);
  if (args.n < 1)
    v.fail(Status::invalid_argument,
           "n (the RMSNorm width) must be >= 1; got " + std::to_string(args.n));
  v.non_negative("eps", args.eps);
  v.output("rstd", args.rstd, Elem::f32, {exactly("M", m)});
  return v.finish();
}

Device validate(const RowReduceArgs& args) {
  Validator v("reduce_row_partials");
  const int64_t m = partials_input(v, "M", args.partials);
  scalar_input(v, "scale", "scale.tensor", args.scale);
  v.output("out", args.out, Elem::f32, {exactly("M", m)});
  return v.finish();
}

Device validate(const ColReduceArgs& args) {
  Validator v("reduce_col_partials");
  const int64_t n = partials_input(v, "N", args.partials);
  v.output("out", args.out, Elem::half_or_f32, {exactly("N", n)});
  return v.finish();
}

Device validate(const RopeBackwardArgs& args) {
  Validator v("rope_backward");
  const int64_t qkv_width = rope_width(v, args.rope);
  v.input("dqkv", args.dqkv, Elem::half, {any("M"), exactly(kQkvWidth, qkv_width)});
  const int64_t m = args.dqkv.shape[0];
  v.at_least_one("M", m, "dqkv");
  v.gemm_dim("N", qkv_width, "dqkv");
  const Dim M = exactly("M", m), N = exactly(kQkvWidth, qkv_width);
  v.input("qkv", args.qkv, Elem::half, {M, N});
  rope_tables(v, args.rope, m);
  v.finite("scale", args.scale);
  v.output("dz", args.dz, Elem::half, {M, N});
  v.output("zeta", args.zeta, Elem::f32, {M});
  v.allow_alias("dz", "dqkv");
  return v.finish();
}

namespace {

// The CPU backend reads targets as indices: reject out-of-range ones before any output is
// written. (Device targets are not read on the host.)
void check_host_targets(const Validator& v, const CrossEntropyArgs& args, int64_t m,
                        int64_t vocab) {
  const int32_t* targets = args.targets.ptr<const int32_t>();
  for (int64_t i = 0; i < m; ++i) {
    const int32_t t = targets[i];
    if (t == args.ignore_index || (t >= 0 && t < vocab)) continue;
    v.fail(Status::invalid_argument, "targets[" + std::to_string(i) + "] = " + std::to_string(t) +
                                         " is outside [0, V) = [0, " + std::to_string(vocab) +
                                         ") and is not ignore_index (" +
                                         std::to_string(args.ignore_index) + ")");
  }
}

void check_workspace(const Validator& v, const TensorView& workspace, Device device, int64_t m) {
  const size_t needed = cross_entropy_workspace_size(m);
  if (workspace.data == nullptr) {
    if (device == Device::cpu) return;
    v.fail(Status::invalid_argument, "workspace is required on the GPU path: pass " +
                                         std::to_string(needed) +
                                         " bytes (cross_entropy_workspace_size(M))");
  }
  const auto bytes = size_t(workspace.shape[0]) * size_t(dtype_size(workspace.dtype));
  if (bytes < needed)
    v.fail(Status::invalid_argument,
           "workspace must hold cross_entropy_workspace_size(M) = " + std::to_string(needed) +
               " bytes; got " + std::to_string(bytes));
}

} // namespace

Device validate(const CrossEntropyArgs& args) {
  Validator v("cross_entropy");
  const auto [m, vocab] = gemm_rows_input(v, "logits", args.logits, "V");
  const Dim M = exactly("M", m), one = exactly("1", 1);
  v.input("lse_partials", args.lse_partials, Elem::f32, {M, at_least_one("P")});
  v.input("target_logit", args.target_logit, Elem::f32, {M});
  v.input("targets", args.targets, Elem::i32, {M});
  const int32_t reduction = int32_t(args.reduction);
  if (reduction != int32_t(LossReduction::mean) && reduction != int32_t(LossReduction::sum))
    v.fail(Status::invalid_argument,
           "reduction must be mean (0) or sum (1); got " + std::to_string(reduction));
  v.output("loss", args.loss, Elem::f32, {one});
  v.output("dlogits", args.dlogits, Elem::half, {M, exactly("V", vocab)});
  v.output("grad_scale", args.grad_scale, Elem::f32, {one});
  v.output("zeta", args.zeta, Elem::f32, {M});
  v.optional_output("workspace", args.workspace, Elem::any, {any("bytes")});
  v.allow_alias("dlogits", "logits");
  const Device device = v.finish();
  check_workspace(v, args.workspace, device, m);
  if (device == Device::cpu) check_host_targets(v, args, m, vocab);
  return device;
}

Device validate_gate_up(const char* op, const char* src_name, const TensorView& src,
                        const char* dst_name, const TensorView& dst) {
  Validator v(op);
  v.input(src_name, src, Elem::any, {any("2F"), any("K")});
  const int64_t rows = src.shape[0], k = src.shape[1];
  v.at_least_one("2F", rows, src_name);
  if (rows % 2 != 0)
    v.fail(Status::invalid_argument, std::string(src_name) +
                                         " must have an even number of rows [2F, K] (F gate rows "
                                         "and F up rows); got " +
                                         std::to_string(rows));
  v.at_least_one("K", k, src_name);
  v.output(dst_name, dst, Elem::any, {exactly("2F", rows), exactly("K", k)});
  if (dst.dtype != src.dtype)
    v.fail(Status::type_error, std::string(dst_name) + " and " + src_name +
                                   " must have the same dtype; got " + dst_name + " " +
                                   dtype_name(dst.dtype) + ", " + src_name + " " +
                                   dtype_name(src.dtype));
  return v.finish();
}

} // namespace coda::api
