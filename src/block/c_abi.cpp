// The block's C ABI (include/coda/block/llama.h): converts the C structs field by field and
// runs the C++ entry point inside `guarded`, which turns every exception into a status and a
// thread-local message. Nothing thrown here or below crosses extern "C".
#include "coda/block/llama.h"

#include <exception>
#include <new>
#include <string>

#include "api/c_guard.hpp"
#include "coda/block/llama.hpp"
#include "coda/core/error.hpp"

namespace coda::llama {
namespace {

using api::deref;
using api::view;

static_assert(CODA_LLAMA_FIRST == int(Layer::first) && CODA_LLAMA_MIDDLE == int(Layer::middle) &&
                  CODA_LLAMA_LAST == int(Layer::last),
              "coda_llama_layer must equal coda::llama::Layer");
static_assert(CODA_LLAMA_FORWARD == int(Pass::forward) &&
                  CODA_LLAMA_BACKWARD == int(Pass::backward),
              "coda_llama_pass must equal coda::llama::Pass");

Config convert(const coda_llama_config& c) {
  Config out;
  out.hidden = c.hidden;
  out.intermediate = c.intermediate;
  out.n_heads = c.n_heads;
  out.n_kv_heads = c.n_kv_heads;
  out.head_dim = c.head_dim;
  out.vocab = c.vocab;
  out.eps = c.eps;
  out.ignore_index = c.ignore_index;
  out.loss_reduction = LossReduction(c.loss_reduction);
  return out;
}
Rope convert(const coda_llama_rope& r) { return {view(r.positions), view(r.inv_freq)}; }

FirstWeights convert(const coda_llama_first_weights& w) {
  return {view(w.attn_norm), view(w.w_qkv)};
}
FirstInputs convert(const coda_llama_first_inputs& in) { return {view(in.x), convert(in.rope)}; }
FirstOutputs convert(const coda_llama_first_outputs& out) { return {view(out.qkv)}; }
FirstSaved convert(const coda_llama_first_saved& s) { return {view(s.rstd)}; }
FirstGrads convert(const coda_llama_first_grads& g) {
  return {view(g.dx), view(g.dqkv), convert(g.dweights)};
}

MiddleWeights convert(const coda_llama_middle_weights& w) {
  return {view(w.w_out),  view(w.ffn_norm),  view(w.w_gate_up),
          view(w.w_down), view(w.attn_norm), view(w.w_qkv)};
}
MiddleInputs convert(const coda_llama_middle_inputs& in) {
  return {view(in.x0), view(in.y0), convert(in.rope)};
}
MiddleOutputs convert(const coda_llama_middle_outputs& out) {
  return {view(out.x2), view(out.qkv)};
}
MiddleSaved convert(const coda_llama_middle_saved& s) {
  return {view(s.x1), view(s.z1), view(s.r1), view(s.r2)};
}
MiddleGrads convert(const coda_llama_middle_grads& g) {
  return {view(g.dx), view(g.dqkv), view(g.dy0), convert(g.dweights)};
}

LastWeights convert(const coda_llama_last_weights& w) {
  return {view(w.w_out),  view(w.ffn_norm),   view(w.w_gate_up),
          view(w.w_down), view(w.final_norm), view(w.lm_head)};
}
LastInputs convert(const coda_llama_last_inputs& in) {
  return {view(in.x0), view(in.y0), view(in.targets)};
}
LastOutputs convert(const coda_llama_last_outputs& out) {
  return {view(out.loss), view(out.logits)};
}
LastSaved convert(const coda_llama_last_saved& s) {
  return {view(s.x1), view(s.z1),      view(s.r1),         view(s.x2),
          view(s.r2), view(s.dlogits), view(s.grad_scale), view(s.zeta)};
}
LastGrads convert(const coda_llama_last_grads& g) {
  return {Scalar{g.dloss.value, view(g.dloss.tensor)}, view(g.dx), view(g.dy0),
          convert(g.dweights)};
}

// One C struct argument, converted; NULL is an invalid_argument naming it.
template <class C> auto arg(const char* fn, const char* name, const C* p) {
  return convert(deref(fn, name, p));
}

} // namespace
} // namespace coda::llama

using coda::api::deref;
using coda::api::guarded;
using coda::api::view;
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
                               arg(fn, "saved", saved), view(deref(fn, "workspace", workspace)),
                               stream);
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
                                view(deref(fn, "workspace", workspace)), stream);
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
                                arg(fn, "saved", saved), view(deref(fn, "workspace", workspace)),
                                stream);
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
                                 view(deref(fn, "workspace", workspace)), stream);
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
                              arg(fn, "saved", saved), view(deref(fn, "workspace", workspace)),
                              stream);
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
                               view(deref(fn, "workspace", workspace)), stream);
  });
}

} // extern "C"
