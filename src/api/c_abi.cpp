// The C ABI (include/coda/coda.h): hands each C struct on as its layout-identical C++ twin
// (api/abi_cast.hpp) and runs the C++ entry point inside `guarded`, which turns every exception
// into a status and a thread-local message. Nothing thrown here or below ever crosses extern "C".
#include "coda/coda.h"

#include <exception>
#include <new>
#include <string>

#include "api/abi_cast.hpp"
#include "api/c_guard.hpp"
#include "coda/coda.hpp"

namespace coda {
namespace {

using api::deref;
using api::from_c;
using api::guarded;

// The body of every kernel entry point: check the pointer, cast, call.
template <class CArgs, class Call>
coda_status call(const char* fn, const CArgs* args, coda_stream_t stream, Call cpp_call) noexcept {
  return guarded(fn, [&] { cpp_call(from_c(deref(fn, "args", args)), stream); });
}

} // namespace
} // namespace coda

using coda::call;
using coda::api::deref;
using coda::api::from_c;
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
    *bytes = coda::gemm_workspace_size(from_c(deref(fn, "args", args)));
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
    coda::interleave_gate_up(from_c(deref(fn, "stacked", stacked)),
                             from_c(deref(fn, "fused", fused)), stream);
  });
}

coda_status coda_deinterleave_gate_up(const coda_tensor* fused, const coda_tensor* stacked,
                                      coda_stream_t stream) {
  const char* fn = "coda_deinterleave_gate_up";
  return guarded(fn, [&] {
    coda::deinterleave_gate_up(from_c(deref(fn, "fused", fused)),
                               from_c(deref(fn, "stacked", stacked)), stream);
  });
}

const char* coda_last_error(void) { return coda::api::last_error(); }

const char* coda_version(void) { return CODA_VERSION_STRING; }

} // extern "C"
