// The block's C ABI (include/coda/block/llama.h): hands each C struct on as its layout-identical
// C++ twin (api/abi_cast.hpp) and runs the C++ entry point inside `guarded`, which turns every
// exception into a status and a thread-local message. Nothing thrown below crosses extern "C".
#include "coda/block/llama.h"

#include <exception>
#include <new>
#include <string>

#include "api/abi_cast.hpp"
#include "api/c_guard.hpp"
#include "coda/block/llama.hpp"
#include "coda/core/error.hpp"

namespace coda::llama {
namespace {

using api::deref;

// One C struct argument as its C++ twin; NULL is an invalid_argument naming it.
template <class C> auto arg(const char* fn, const char* name, const C* p) {
  return api::from_c(deref(fn, name, p));
}

} // namespace
} // namespace coda::llama

using coda::api::guarded;
using coda::llama::arg;

extern "C" {

coda_status coda_llama_workspace_size(int32_t layer, int32_t pass, const coda_llama_config* config,
                                      int64_t tokens, size_t* bytes) {
  const char* fn = "coda_llama_workspace_size";
  return coda::api::size_query(fn, bytes, [&] {
    return coda::llama::workspace_size(coda::llama::Layer(layer), coda::llama::Pass(pass),
                                       arg(fn, "config", config), tokens);
  });
}

coda_status coda_llama_fp8_workspace_size(int32_t layer, int32_t pass,
                                          const coda_llama_config* config, int64_t tokens,
                                          int32_t fp8_weight_copies, size_t* bytes) {
  const char* fn = "coda_llama_fp8_workspace_size";
  return coda::api::size_query(fn, bytes, [&] {
    return coda::llama::workspace_size(coda::llama::Layer(layer), coda::llama::Pass(pass),
                                       arg(fn, "config", config), tokens,
                                       coda::llama::Fp8WeightCopies(fp8_weight_copies));
  });
}

// coda_llama_{first,middle,last}_forward, and the first and middle layers' backward (the last
// layer's takes no outputs; it follows): each the C++ entry point of its name on the C++ twins of
// its argument structs.
#define CODA_LLAMA_FORWARD(layer)                                                                  \
  coda_status coda_llama_##layer##_forward(                                                        \
      const coda_llama_config* config, const coda_llama_##layer##_weights* weights,                \
      const coda_llama_##layer##_inputs* inputs, const coda_llama_##layer##_outputs* outputs,      \
      const coda_llama_##layer##_saved* saved, const coda_tensor* workspace,                       \
      coda_stream_t stream) {                                                                      \
    const char* fn = "coda_llama_" #layer "_forward";                                              \
    return guarded(fn, [&] {                                                                       \
      coda::llama::layer##_forward(arg(fn, "config", config), arg(fn, "weights", weights),         \
                                   arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),         \
                                   arg(fn, "saved", saved), arg(fn, "workspace", workspace),       \
                                   stream);                                                        \
    });                                                                                            \
  }
#define CODA_LLAMA_BACKWARD(layer)                                                                 \
  coda_status coda_llama_##layer##_backward(                                                       \
      const coda_llama_config* config, const coda_llama_##layer##_weights* weights,                \
      const coda_llama_##layer##_inputs* inputs, const coda_llama_##layer##_outputs* outputs,      \
      const coda_llama_##layer##_saved* saved, const coda_llama_##layer##_grads* grads,            \
      int32_t accumulate, const coda_tensor* workspace, coda_stream_t stream) {                    \
    const char* fn = "coda_llama_" #layer "_backward";                                             \
    return guarded(fn, [&] {                                                                       \
      coda::llama::layer##_backward(arg(fn, "config", config), arg(fn, "weights", weights),        \
                                    arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),        \
                                    arg(fn, "saved", saved), arg(fn, "grads", grads),              \
                                    accumulate != 0, arg(fn, "workspace", workspace), stream);     \
    });                                                                                            \
  }
CODA_LLAMA_FORWARD(first)
CODA_LLAMA_FORWARD(middle)
CODA_LLAMA_FORWARD(last)
CODA_LLAMA_BACKWARD(first)
CODA_LLAMA_BACKWARD(middle)
#undef CODA_LLAMA_BACKWARD
#undef CODA_LLAMA_FORWARD

coda_status coda_llama_middle_backward_part(
    int32_t part, const coda_llama_config* config, const coda_llama_middle_weights* weights,
    const coda_llama_middle_inputs* inputs, const coda_llama_middle_outputs* outputs,
    const coda_llama_middle_saved* saved, const coda_llama_middle_grads* grads, int32_t accumulate,
    const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_middle_backward_part";
  return guarded(fn, [&] {
    coda::llama::middle_backward_part(
        coda::llama::Pass(part), arg(fn, "config", config), arg(fn, "weights", weights),
        arg(fn, "inputs", inputs), arg(fn, "outputs", outputs), arg(fn, "saved", saved),
        arg(fn, "grads", grads), accumulate != 0, arg(fn, "workspace", workspace), stream);
  });
}

coda_status coda_llama_fp8_weights_size(int32_t layer, const coda_llama_config* config,
                                        size_t* bytes) {
  const char* fn = "coda_llama_fp8_weights_size";
  return coda::api::size_query(fn, bytes, [&] {
    return coda::llama::fp8_weights_size(coda::llama::Layer(layer), arg(fn, "config", config));
  });
}

// coda_llama_{first,middle,last}_quantize_weights: coda::llama::quantize_weights on the layer's
// C++ twins.
#define CODA_LLAMA_QUANTIZE_WEIGHTS(layer)                                                         \
  coda_status coda_llama_##layer##_quantize_weights(                                               \
      const coda_llama_config* config, const coda_llama_##layer##_weights* weights,                \
      const coda_llama_##layer##_fp8_weights* fp8_weights, coda_stream_t stream) {                 \
    const char* fn = "coda_llama_" #layer "_quantize_weights";                                     \
    return guarded(fn, [&] {                                                                       \
      coda::llama::quantize_weights(arg(fn, "config", config), arg(fn, "weights", weights),        \
                                    arg(fn, "fp8_weights", fp8_weights), stream);                  \
    });                                                                                            \
  }
CODA_LLAMA_QUANTIZE_WEIGHTS(first)
CODA_LLAMA_QUANTIZE_WEIGHTS(middle)
CODA_LLAMA_QUANTIZE_WEIGHTS(last)
#undef CODA_LLAMA_QUANTIZE_WEIGHTS

coda_status coda_llama_last_backward(const coda_llama_config* config,
                                     const coda_llama_last_weights* weights,
                                     const coda_llama_last_inputs* inputs,
                                     const coda_llama_last_saved* saved,
                                     const coda_llama_last_grads* grads, int32_t accumulate,
                                     const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_last_backward";
  return guarded(fn, [&] {
    coda::llama::last_backward(arg(fn, "config", config), arg(fn, "weights", weights),
                               arg(fn, "inputs", inputs), arg(fn, "saved", saved),
                               arg(fn, "grads", grads), accumulate != 0,
                               arg(fn, "workspace", workspace), stream);
  });
}

} // extern "C"
