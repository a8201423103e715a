// The C ABI (include/coda/coda.h): converts the C structs field by field and runs the C++
// entry point inside `guarded`, which turns every exception into a status and a thread-local
// message. Nothing thrown here or below ever crosses extern "C".
#include "coda/coda.h"

#include <exception>
#include <new>
#include <string>

#include "api/c_guard.hpp"
#include "coda/coda.hpp"

namespace coda {
namespace {

using api::deref;
using api::guarded;
using api::view;

static_assert(CODA_OK == int(Status::ok) &&
                  CODA_INVALID_ARGUMENT == int(Status::invalid_argument) &&
                  CODA_TYPE_ERROR == int(Status::type_error) &&
                  CODA_NOT_SUPPORTED == int(Status::not_supported) &&
                  CODA_CUDA_ERROR == int(Status::cuda_error) &&
                  CODA_INTERNAL == int(Status::internal),
              "coda_status must equal coda::Status");
static_assert(CODA_BF16 == int(DType::bf16) && CODA_F16 == int(DType::f16) &&
                  CODA_F32 == int(DType::f32) && CODA_I32 == int(DType::i32),
              "coda_dtype must equal coda::DType");
static_assert(CODA_DEVICE_CPU == int(Device::cpu) && CODA_DEVICE_CUDA == int(Device::cuda),
              "coda_device must equal coda::Device");
static_assert(CODA_GEMM_FWD == int(GemmLayout::fwd) && CODA_GEMM_DGRAD == int(GemmLayout::dgrad) &&
                  CODA_GEMM_WGRAD == int(GemmLayout::wgrad),
              "coda_gemm_layout must equal coda::GemmLayout");
static_assert(CODA_LOSS_MEAN == int(LossReduction::mean) &&
                  CODA_LOSS_SUM == int(LossReduction::sum),
              "coda_loss_reduction must equal coda::LossReduction");
static_assert(CODA_REDUCE_BLOCK == kReduceBlock && CODA_MAX_RANK == kMaxRank,
              "coda.h constants must equal the C++ ones");

Scalar scalar(const coda_scalar& s) { return {s.value, view(s.tensor)}; }

RopeSpec rope(const coda_rope_spec& r) {
  return {view(r.positions), view(r.inv_freq), r.n_q_heads, r.n_kv_heads, r.head_dim};
}

GemmArgs convert(const coda_gemm_args& c) {
  GemmArgs a;
  a.layout = GemmLayout(c.layout);
  a.a = view(c.a), a.b = view(c.b), a.d = view(c.d), a.c = view(c.c);
  a.alpha = scalar(c.alpha), a.beta = c.beta;
  a.workspace = view(c.workspace);
  return a;
}
ResidualRmsArgs convert(const coda_residual_rms_args& c) {
  return {view(c.a),   view(c.w),          view(c.residual),      view(c.gamma),
          view(c.out), view(c.out_scaled), view(c.sumsq_partials)};
}
RmsScaleArgs convert(const coda_rms_scale_args& c) {
  return {view(c.a), view(c.w), view(c.sumsq_partials), c.eps, view(c.out), view(c.rstd_out)};
}
RmsSwigluArgs convert(const coda_rms_swiglu_args& c) {
  return {view(c.a),      view(c.w),   view(c.sumsq_partials), c.eps,
          view(c.preact), view(c.act), view(c.rstd_out)};
}
RmsRopeArgs convert(const coda_rms_rope_args& c) {
  return {view(c.a),    view(c.w),   view(c.sumsq_partials), c.eps,
          rope(c.rope), view(c.out), view(c.rstd_out)};
}
RmsLseArgs convert(const coda_rms_lse_args& c) {
  return {view(c.a),       view(c.w),      view(c.sumsq_partials), c.eps,
          view(c.targets), view(c.logits), view(c.lse_partials),   view(c.target_logit),
          view(c.rstd_out)};
}
RmsBackwardArgs convert(const coda_rms_backward_args& c) {
  RmsBackwardArgs a;
  a.dz = view(c.dz), a.w = view(c.w), a.x = view(c.x), a.rstd = view(c.rstd);
  a.zeta = view(c.zeta), a.gamma = view(c.gamma);
  a.alpha = scalar(c.alpha);
  a.accumulate = c.accumulate != 0;
  a.dx = view(c.dx), a.h_hat = view(c.h_hat), a.dgamma_partials = view(c.dgamma_partials);
  return a;
}
SwigluBackwardArgs convert(const coda_swiglu_backward_args& c) {
  return {view(c.dx),  view(c.w),       view(c.preact),
          view(c.act), view(c.dpreact), view(c.zeta_partials)};
}
RmsStatsArgs convert(const coda_rms_stats_args& c) {
  return {view(c.x), view(c.gamma), view(c.out_scaled), view(c.sumsq_partials)};
}
RstdArgs convert(const coda_rstd_args& c) { return {view(c.partials), c.n, c.eps, view(c.rstd)}; }
RowReduceArgs convert(const coda_row_reduce_args& c) {
  return {view(c.partials), scalar(c.scale), view(c.out)};
}
ColReduceArgs convert(const coda_col_reduce_args& c) {
  return {view(c.partials), c.accumulate != 0, view(c.out)};
}
RopeBackwardArgs convert(const coda_rope_backward_args& c) {
  return {view(c.dqkv), view(c.qkv), rope(c.rope), c.scale, view(c.dz), view(c.zeta)};
}
CrossEntropyArgs convert(const coda_cross_entropy_args& c) {
  CrossEntropyArgs a;
  a.logits = view(c.logits), a.lse_partials = view(c.lse_partials);
  a.target_logit = view(c.target_logit), a.targets = view(c.targets);
  a.ignore_index = c.ignore_index;
  a.reduction = LossReduction(c.reduction);
  a.loss = view(c.loss), a.dlogits = view(c.dlogits), a.grad_scale = view(c.grad_scale);
  a.zeta = view(c.zeta), a.workspace = view(c.workspace);
  return a;
}

// The body of every kernel entry point: check the pointer, convert, call.
template <class CArgs, class Call>
coda_status call(const char* fn, const CArgs* args, coda_stream_t stream, Call cpp_call) noexcept {
  return guarded(fn, [&] { cpp_call(convert(deref(fn, "args", args)), stream); });
}

} // namespace
} // namespace coda

using coda::call;
using coda::api::guarded;

namespace coda::api {
namespace {
thread_local std::string t_last_error;
}
void set_last_error(const std::string& message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();
  }
}
const char* last_error() noexcept { return t_last_error.c_str(); }
} // namespace coda::api

extern "C" {

coda_status coda_gemm(const coda_gemm_args* args, coda_stream_t stream) {
  return call("coda_gemm", args, stream, [](const auto& a, auto s) { coda::gemm(a, s); });
}
coda_status coda_gemm_workspace_size(const coda_gemm_args* args, size_t* bytes) {
  const char* fn = "coda_gemm_workspace_size";
  return guarded(fn, [&] {
    if (bytes == nullptr)
      throw coda::Error(coda::Status::invalid_argument, std::string(fn) + ": bytes is NULL");
    *bytes = coda::gemm_workspace_size(coda::convert(coda::api::deref(fn, "args", args)));
  });
}
coda_status coda_gemm_residual_rms(const coda_residual_rms_args* args, coda_stream_t stream) {
  return call("coda_gemm_residual_rms", args, stream,
              [](const auto& a, auto s) { coda::gemm_residual_rms(a, s); });
}
coda_status coda_gemm_rms_scale(const coda_rms_scale_args* args, coda_stream_t stream) {
  return call("coda_gemm_rms_scale", args, stream,
              [](const auto& a, auto s) { coda::gemm_rms_scale(a, s); });
}
coda_status coda_gemm_rms_swiglu(const coda_rms_swiglu_args* args, coda_stream_t stream) {
  return call("coda_gemm_rms_swiglu", args, stream,
              [](const auto& a, auto s) { coda::gemm_rms_swiglu(a, s); });
}
coda_status coda_gemm_rms_rope(const coda_rms_rope_args* args, coda_stream_t stream) {
  return call("coda_gemm_rms_rope", args, stream,
              [](const auto& a, auto s) { coda::gemm_rms_rope(a, s); });
}
coda_status coda_gemm_rms_lse(const coda_rms_lse_args* args, coda_stream_t stream) {
  return call("coda_gemm_rms_lse", args, stream,
              [](const auto& a, auto s) { coda::gemm_rms_lse(a, s); });
}
coda_status coda_gemm_rms_backward(const coda_rms_backward_args* args, coda_stream_t stream) {
  return call("coda_gemm_rms_backward", args, stream,
              [](const auto& a, auto s) { coda::gemm_rms_backward(a, s); });
}
coda_status coda_gemm_swiglu_backward(const coda_swiglu_backward_args* args, coda_stream_t stream) {
  return call("coda_gemm_swiglu_backward", args, stream,
              [](const auto& a, auto s) { coda::gemm_swiglu_backward(a, s); });
}
coda_status coda_rms_stats(const coda_rms_stats_args* args, coda_stream_t stream) {
  return call("coda_rms_stats", args, stream, [](const auto& a, auto s) { coda::rms_stats(a, s); });
}
coda_status coda_rstd_from_partials(const coda_rstd_args* args, coda_stream_t stream) {
  return call("coda_rstd_from_partials", args, stream,
              [](const auto& a, auto s) { coda::rstd_from_partials(a, s); });
}
coda_status coda_reduce_row_partials(const coda_row_reduce_args* args, coda_stream_t stream) {
  return call("coda_reduce_row_partials", args, stream,
              [](const auto& a, auto s) { coda::reduce_row_partials(a, s); });
}
coda_status coda_reduce_col_partials(const coda_col_reduce_args* args, coda_stream_t stream) {
  return call("coda_reduce_col_partials", args, stream,
              [](const auto& a, auto s) { coda::reduce_col_partials(a, s); });
}
coda_status coda_rope_backward(const coda_rope_backward_args* args, coda_stream_t stream) {
  return call("coda_rope_backward", args, stream,
              [](const auto& a, auto s) { coda::rope_backward(a, s); });
}
coda_status coda_cross_entropy(const coda_cross_entropy_args* args, coda_stream_t stream) {
  return call("coda_cross_entropy", args, stream,
              [](const auto& a, auto s) { coda::cross_entropy(a, s); });
}

coda_status coda_cross_entropy_workspace_size(int64_t m, size_t* bytes) {
  const char* fn = "coda_cross_entropy_workspace_size";
  return guarded(fn, [&] {
    if (bytes == nullptr)
      throw coda::Error(coda::Status::invalid_argument, std::string(fn) + ": bytes is NULL");
    *bytes = coda::cross_entropy_workspace_size(m);
  });
}

coda_status coda_interleave_gate_up(const coda_tensor* stacked, const coda_tensor* fused,
                                    coda_stream_t stream) {
  const char* fn = "coda_interleave_gate_up";
  return guarded(fn, [&] {
    coda::interleave_gate_up(coda::api::view(coda::api::deref(fn, "stacked", stacked)),
                             coda::api::view(coda::api::deref(fn, "fused", fused)), stream);
  });
}

coda_status coda_deinterleave_gate_up(const coda_tensor* fused, const coda_tensor* stacked,
                                      coda_stream_t stream) {
  const char* fn = "coda_deinterleave_gate_up";
  return guarded(fn, [&] {
    coda::deinterleave_gate_up(coda::api::view(coda::api::deref(fn, "fused", fused)),
                               coda::api::view(coda::api::deref(fn, "stacked", stacked)), stream);
  });
}

const char* coda_last_error(void) { return coda::api::last_error(); }

const char* coda_version(void) { return CODA_VERSION_STRING; }

int coda_gpu_supported(void) { return coda::gpu_supported() ? 1 : 0; }

} // extern "C"
