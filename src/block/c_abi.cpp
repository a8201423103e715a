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
  return guarded(fn, [&] {
    if (bytes == nullptr)
      throw coda::Error(coda::Status::invalid_argument, std::string(fn) + ": bytes is NULL");
    *bytes = coda::llama::workspace_size(coda::llama::Layer(layer), coda::llama::Pass(pass),
                                         arg(fn, "config", config), tokens);
  });
}

coda_status coda_llama_first_forward(const coda_llama_config* config,
                                     const coda_llama_first_weights* weights,
                                     const coda_llama_first_inputs* inputs,
                                     const coda_llama_first_outputs* outputs,
                                     const coda_llama_first_saved* saved,
                                     const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_first_forward";
  return guarded(fn, [&] {
    coda::llama::first_forward(arg(fn, "config", config), arg(fn, "weights", weights),
                               arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),
                               arg(fn, "saved", saved), arg(fn, "workspace", workspace), stream);
  });
}

coda_status coda_llama_first_backward(const coda_llama_config* config,
                                      const coda_llama_first_weights* weights,
                                      const coda_llama_first_inputs* inputs,
                                      const coda_llama_first_outputs* outputs,
                                      const coda_llama_first_saved* saved,
                                      const coda_llama_first_grads* grads, int32_t accumulate,
                                      const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_first_backward";
  return guarded(fn, [&] {
    coda::llama::first_backward(arg(fn, "config", config), arg(fn, "weights", weights),
                                arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),
                                arg(fn, "saved", saved), arg(fn, "grads", grads), accumulate != 0,
                                arg(fn, "workspace", workspace), stream);
  });
}

coda_status coda_llama_middle_forward(const coda_llama_config* config,
                                      const coda_llama_middle_weights* weights,
                                      const coda_llama_middle_inputs* inputs,
                                      const coda_llama_middle_outputs* outputs,
                                      const coda_llama_middle_saved* saved,
                                      const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_middle_forward";
  return guarded(fn, [&] {
    coda::llama::middle_forward(arg(fn, "config", config), arg(fn, "weights", weights),
                                arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),
                                arg(fn, "saved", saved), arg(fn, "workspace", workspace), stream);
  });
}

coda_status coda_llama_middle_backward(const coda_llama_config* config,
                                       const coda_llama_middle_weights* weights,
                                       const coda_llama_middle_inputs* inputs,
                                       const coda_llama_middle_outputs* outputs,
                                       const coda_llama_middle_saved* saved,
                                       const coda_llama_middle_grads* grads, int32_t accumulate,
                                       const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_middle_backward";
  return guarded(fn, [&] {
    coda::llama::middle_backward(arg(fn, "config", config), arg(fn, "weights", weights),
                                 arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),
                                 arg(fn, "saved", saved), arg(fn, "grads", grads), accumulate != 0,
                                 arg(fn, "workspace", workspace), stream);
  });
}

coda_status coda_llama_last_forward(const coda_llama_config* config,
                                    const coda_llama_last_weights* weights,
                                    const coda_llama_last_inputs* inputs,
                                    const coda_llama_last_outputs* outputs,
                                    const coda_llama_last_saved* saved,
                                    const coda_tensor* workspace, coda_stream_t stream) {
  const char* fn = "coda_llama_last_forward";
  return guarded(fn, [&] {
    coda::llama::last_forward(arg(fn, "config", config), arg(fn, "weights", weights),
                              arg(fn, "inputs", inputs), arg(fn, "outputs", outputs),
                              arg(fn, "saved", saved), arg(fn, "workspace", workspace), stream);
  });
}

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
