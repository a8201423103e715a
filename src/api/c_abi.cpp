// The C ABI (include/coda/coda.h): hands each C struct on as its layout-identical C++ twin
// (api/abi_cast.hpp) and runs the C++ entry point inside `guarded`, which turns every exception
// into a status and a thread-local message. Nothing thrown here or below ever crosses extern "C".
#include "coda/coda.h"

#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "api/abi_cast.hpp"
#include "api/c_guard.hpp"
#include "coda/coda.hpp"

namespace coda {
namespace {

using api::deref;
using api::from_c;
using api::guarded;

// The body of every kernel entry point: check the pointer, cast, call.
template <class CArgs>
coda_status call(const char* fn, const CArgs* args, coda_stream_t stream,
                 void (*cpp_function)(const typename api::CppOf<CArgs>::type&, Stream)) noexcept {
  return guarded(fn, [&] { cpp_function(from_c(deref(fn, "args", args)), stream); });
}

// The gate/up converters' body: both tensors required, from `src` into `dst`.
coda_status convert_rows(const char* fn, const char* src_name, const coda_tensor* src,
                         const char* dst_name, const coda_tensor* dst, coda_stream_t stream,
                         void (*cpp_function)(const TensorView&, const TensorView&,
                                              Stream)) noexcept {
  return guarded(fn, [&] {
    cpp_function(from_c(deref(fn, src_name, src)), from_c(deref(fn, dst_name, dst)), stream);
  });
}

} // namespace
} // namespace coda

using coda::call;
using coda::convert_rows;
using coda::api::deref;
using coda::api::from_c;
using coda::api::guarded;
using coda::api::size_query;

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

// The kernels: coda_gemm, coda_gemm_residual_rms, ..., coda_cross_entropy, each the C++ entry
// point of its name on the C++ twin of its argument struct (the list: api/abi_layout.inc).
#define CODA_ABI_KERNEL(c_function, CArgs, cpp_function)                                           \
  coda_status c_function(const CArgs* args, coda_stream_t stream) {                                \
    return call(#c_function, args, stream, cpp_function);                                          \
  }
#include "api/abi_layout.inc"
#undef CODA_ABI_KERNEL

coda_status coda_gemm_workspace_size(const coda_gemm_args* args, size_t* bytes) {
  const char* fn = "coda_gemm_workspace_size";
  return size_query(fn, bytes,
                    [&] { return coda::gemm_workspace_size(from_c(deref(fn, "args", args))); });
}
coda_status coda_cross_entropy_workspace_size(int64_t m, size_t* bytes) {
  return size_query("coda_cross_entropy_workspace_size", bytes,
                    [&] { return coda::cross_entropy_workspace_size(m); });
}

coda_status coda_interleave_gate_up(const coda_tensor* stacked, const coda_tensor* fused,
                                    coda_stream_t stream) {
  return convert_rows("coda_interleave_gate_up", "stacked", stacked, "fused", fused, stream,
                      coda::interleave_gate_up);
}
coda_status coda_deinterleave_gate_up(const coda_tensor* fused, const coda_tensor* stacked,
                                      coda_stream_t stream) {
  return convert_rows("coda_deinterleave_gate_up", "fused", fused, "stacked", stacked, stream,
                      coda::deinterleave_gate_up);
}

const char* coda_last_error(void) { return coda::api::last_error(); }

const char* coda_version(void) { return CODA_VERSION_STRING; }

} // extern "C"

// The kernels above are coda.h's (each calls its C++ function, so none can lack one). The other
// way round, the two GEMMs, the two quantizers and every kernel of the C++ tables
// (coda/kernels/args.hpp), the rows of api/coda.cpp's CODA_ENTRY_POINT, must have their C entry
// point: coda_<name>, declared in coda.h on the C twin of its Args.
#define CODA_REQUIRE_C_ENTRY_POINT(fn, Args)                                                       \
  static_assert(                                                                                   \
      std::is_same_v<decltype(&coda_##fn),                                                         \
                     coda_status (*)(const coda::api::COf<coda::Args>::type*, coda_stream_t)>,     \
      "coda.h must declare coda_" #fn " on the C twin of coda::" #Args);
CODA_REQUIRE_C_ENTRY_POINT(gemm, GemmArgs)
CODA_REQUIRE_C_ENTRY_POINT(gemm_fp8, Fp8GemmArgs)
CODA_REQUIRE_C_ENTRY_POINT(quantize_weight_fp8, QuantizeWeightFp8Args)
CODA_REQUIRE_C_ENTRY_POINT(quantize_activation_fp8, QuantizeActivationFp8Args)
CODA_FUSED_KERNELS(CODA_REQUIRE_C_ENTRY_POINT)
CODA_AUX_KERNELS(CODA_REQUIRE_C_ENTRY_POINT)
#undef CODA_REQUIRE_C_ENTRY_POINT
