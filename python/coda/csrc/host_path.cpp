// The C++ host path of coda.ops.llama_middle (docs/python.md, "The C++ host path"): what the
// Python path does around libcoda's C calls (the outputs' and workspaces' allocations, the
// coda_tensor descriptors, the autograd node and its backward in two parts), without the
// interpreter. A torch extension, built against the installed torch by coda._host_path, and
// taken by coda.ops on the eager bypass's conditions; everything else stays on the Python path.
//
// Results are those of the Python path bit for bit (the same C calls on the same tensors). What
// this file does not describe (a dtype, device or rank coda does not take) is left to the Python
// path, whose checks raise the errors users see: middle_forward returns None then.
//
// libcoda is not linked: coda._lib has loaded it, and bind() gives the addresses of the four
// entry points used here, so both paths call the same library.

#include <torch/extension.h>

#include <array>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "coda/block/llama.h"

#ifdef CODA_HOST_PATH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace coda_host_path {
namespace {

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- libcoda's entry points, bound once by coda._host_path

struct Library {
  decltype(&coda_llama_middle_forward) middle_forward = nullptr;
  decltype(&coda_llama_middle_backward_part) middle_backward_part = nullptr;
  decltype(&coda_llama_workspace_size) workspace_size = nullptr;
  decltype(&coda_last_error) last_error = nullptr;
};
Library lib;

// A failed coda call: its status and coda_last_error(), raised in Python as coda._lib maps them
// (forward) or as a RuntimeError with the same message (backward, which the autograd engine
// runs, possibly on a thread without the interpreter).
struct CallError : std::runtime_error {
  int status;
  CallError(int status_, const std::string& message)
      : std::runtime_error(message), status(status_) {}
};

void check(coda_status status, const char* what) {
  if (status == CODA_OK) return;
  const char* message = lib.last_error ? lib.last_error() : nullptr;
  throw CallError(status, message && *message ? std::string(message)
                                              : std::string(what) + " failed with status " +
                                                    std::to_string(static_cast<int>(status)));
}

// ---- descriptors

// The coda_tensor of t (strides as given, a 0-dim tensor a [1] vector, as coda._torch.view), or
// false where coda._torch would raise: the Python path then takes the call and raises it.
bool describe(const at::Tensor& t, coda_tensor* out) {
  std::memset(out, 0, sizeof(*out));
  if (!t.defined()) return true; // absent
  switch (t.scalar_type()) {
  case at::kBFloat16:
    out->dtype = CODA_BF16;
    break;
  case at::kHalf:
    out->dtype = CODA_F16;
    break;
  case at::kFloat:
    out->dtype = CODA_F32;
    break;
  case at::kInt:
    out->dtype = CODA_I32;
    break;
  default:
    return false;
  }
  const at::Device device = t.device();
  if (device.is_cuda()) {
#ifdef CODA_HOST_PATH_CUDA
    out->device = CODA_DEVICE_CUDA;
    out->device_index = device.has_index() ? device.index() : 0;
#else
    return false; // this build cannot name the current stream
#endif
  } else if (device.is_cpu()) {
    out->device = CODA_DEVICE_CPU;
  } else {
    return false;
  }
  const int64_t rank = t.dim();
  if (rank > CODA_MAX_RANK) return false;
  out->data = t.data_ptr();
  if (rank == 0) {
    out->rank = 1;
    out->shape[0] = out->stride[0] = 1;
    return true;
  }
  out->rank = static_cast<int32_t>(rank);
  for (int64_t i = 0; i < rank; ++i) {
    out->shape[i] = t.size(i);
    out->stride[i] = t.stride(i);
  }
  return true;
}

coda_tensor described(const at::Tensor& t) {
  coda_tensor d;
  if (!describe(t, &d)) throw std::logic_error("coda: a tensor described before changed type");
  return d;
}

coda_stream_t current_stream(const at::Tensor& t) {
#ifdef CODA_HOST_PATH_CUDA
  if (t.is_cuda()) {
    return reinterpret_cast<coda_stream_t>(
        c10::cuda::getCurrentCUDAStream(t.get_device()).stream());
  }
#endif
  (void)t;
  return nullptr; // the CPU backend runs synchronously
}

// ---- workspaces

// coda_llama_workspace_size per (pass, config, tokens, device), as coda._torch caches it: the
// backward's includes the stream-K scratch of the current device.
struct WorkspaceKey {
  int32_t pass;
  coda_llama_config config;
  int64_t tokens;
  int32_t device_type, device_index;
  bool operator==(const WorkspaceKey& o) const { return std::memcmp(this, &o, sizeof(o)) == 0; }
};

std::mutex workspace_sizes_mutex;
std::vector<std::pair<WorkspaceKey, size_t>> workspace_sizes;

size_t workspace_bytes(int32_t pass, const coda_llama_config& config, int64_t tokens,
                       const at::Device& device) {
  WorkspaceKey key;
  std::memset(&key, 0, sizeof(key)); // padding compared too
  key.pass = pass;
  key.config = config;
  key.tokens = tokens;
  key.device_type = static_cast<int32_t>(device.type());
  key.device_index = device.has_index() ? device.index() : 0;
  {
    std::lock_guard<std::mutex> lock(workspace_sizes_mutex);
    for (const auto& [k, bytes] : workspace_sizes)
      if (k == key) return bytes;
  }
  size_t bytes = 0;
  check(lib.workspace_size(CODA_LLAMA_MIDDLE, pass, &config, tokens, &bytes),
        "coda_llama_workspace_size");
  std::lock_guard<std::mutex> lock(workspace_sizes_mutex);
  if (workspace_sizes.size() >= 256) workspace_sizes.clear();
  workspace_sizes.emplace_back(key, bytes);
  return bytes;
}

// `bytes` of scratch from the caching allocator, described to coda as i32 words (at least four),
// as coda._torch.workspace.
struct Workspace {
  at::Tensor buffer; // kept alive through the call
  coda_tensor view;
};

Workspace workspace(int32_t pass, const coda_llama_config& config, int64_t tokens,
                    const at::Tensor& like) {
  const int64_t words = std::max<int64_t>(
      (static_cast<int64_t>(workspace_bytes(pass, config, tokens, like.device())) + 3) / 4, 4);
  Workspace w;
  w.buffer = at::empty({words}, like.options().dtype(at::kInt)); // the same bytes as Python's
  w.view = described(w.buffer);
  return w;
}

at::Tensor empty_like_contiguous(const at::Tensor& t) {
  return at::empty_like(t, at::MemoryFormat::Contiguous);
}

// An incoming gradient as the contiguous tensor coda reads (zeros when undefined), as
// coda.ops._dense.
at::Tensor dense(const at::Tensor& g, const at::Tensor& like) {
  if (!g.defined()) return at::zeros_like(like, at::MemoryFormat::Contiguous);
  if (g.scalar_type() == like.scalar_type() && g.is_contiguous()) return g;
  return g.to(like.scalar_type()).contiguous();
}

// ---- the middle layer

// The inputs of a call, in the order of the op's arguments (coda.ops._middle_forward_impl).
enum Input {
  X0,
  Y0,
  W_OUT,
  FFN_NORM,
  W_GATE_UP,
  W_DOWN,
  ATTN_NORM,
  W_QKV,
  POSITIONS,
  INV_FREQ,
  N_INPUTS
};

void fill(coda_llama_middle_weights* w, coda_llama_middle_inputs* in,
          const std::array<coda_tensor, N_INPUTS>& d) {
  *w = {d[W_OUT], d[FFN_NORM], d[W_GATE_UP], d[W_DOWN], d[ATTN_NORM], d[W_QKV]};
  std::memset(in, 0, sizeof(*in)); // fp8_weights absent: the call quantizes its own
  in->x0 = d[X0];
  in->y0 = d[Y0];
  in->rope.positions = d[POSITIONS];
  in->rope.inv_freq = d[INV_FREQ];
}

constexpr const char* kConsumedMessage =
    "coda: this layer's backward already ran for its forward; it overwrites the saved "
    "gate/up pre-activation with its gradient (no workspace for the largest tensor of the "
    "backward), so it cannot run twice. Run the forward again instead of "
    "backward(retain_graph=True) twice.";

struct MiddleCall {
  bool keep_qkv_aside;
  coda_llama_config config;
  std::array<coda_tensor, N_INPUTS> descriptors;
};

// The config travels from the forward to the backward as its bytes (an IValue string).
std::string config_bytes(const coda_llama_config& c) {
  return std::string(reinterpret_cast<const char*>(&c), sizeof(c));
}

coda_llama_config config_of(const std::string& bytes) {
  coda_llama_config c;
  std::memcpy(&c, bytes.data(), sizeof(c));
  return c;
}

// The autograd node: forward as coda.ops._middle_forward_impl + _middle_setup (the eager,
// unhooked case: qkv kept aside and let go after the backward's first part), backward as
// _middle_backward + _middle_backward_in_parts.
struct Middle : torch::autograd::Function<Middle> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x0, const at::Tensor& y0,
                               const at::Tensor& w_out, const at::Tensor& ffn_norm,
                               const at::Tensor& w_gate_up, const at::Tensor& w_down,
                               const at::Tensor& attn_norm, const at::Tensor& w_qkv,
                               const at::Tensor& positions, const at::Tensor& inv_freq,
                               const MiddleCall* call) {
    const coda_llama_config& cfg = call->config;
    const int64_t m = x0.size(0), d = x0.size(-1), f = w_down.size(-1);
    const int64_t qkv_width = static_cast<int64_t>(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim;
    const auto opts = x0.options();
    at::Tensor x2 = at::empty({m, d}, opts), qkv = at::empty({m, qkv_width}, opts);
    at::Tensor x1 = at::empty({m, d}, opts), z1 = at::empty({m, 2 * f}, opts);
    at::Tensor r1 = at::empty({m}, opts.dtype(at::kFloat)),
               r2 = at::empty({m}, opts.dtype(at::kFloat));

    coda_llama_middle_weights weights;
    coda_llama_middle_inputs inputs;
    fill(&weights, &inputs, call->descriptors);
    const coda_llama_middle_outputs outputs{described(x2), described(qkv)};
    const coda_llama_middle_saved saved{described(x1), described(z1), described(r1), described(r2)};
    {
      Workspace ws = workspace(CODA_LLAMA_FORWARD, cfg, m, x0);
      check(lib.middle_forward(&cfg, &weights, &inputs, &outputs, &saved, &ws.view,
                               current_stream(x0)),
            "coda_llama_middle_forward");
    }

    ctx->set_materialize_grads(false);
    // Where no saved-tensor hooks are active, qkv is kept beside the saved tensors as a
    // detached alias (no cycle through its grad_fn), so that the backward can drop it after
    // part 1, its version checked as autograd checks a saved tensor's; hooked, it is saved as
    // usual (coda.ops._middle_setup).
    variable_list to_save{x0,        y0,       w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv,
                          positions, inv_freq, x2,    x1,       z1,        r1,     r2};
    if (call->keep_qkv_aside) {
      at::Tensor kept = qkv.detach();
      ctx->saved_data["qkv_version"] = static_cast<int64_t>(kept._version());
      ctx->saved_data["qkv"] = std::move(kept);
    } else {
      to_save.push_back(qkv);
    }
    ctx->save_for_backward(to_save);
    ctx->saved_data["config"] = config_bytes(cfg);
    return {x2, qkv};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(N_INPUTS + 1); // + the call: no gradient
    const at::Tensor& dx2 = grads[0];
    const at::Tensor& dqkv_in = grads[1];
    if (!dx2.defined() && !dqkv_in.defined()) return result;
    if (ctx->saved_data.count("consumed")) throw std::runtime_error(kConsumedMessage);
    ctx->saved_data["consumed"] = true;
    at::NoGradGuard no_grad; // as the Python path: nothing recorded even under create_graph

    variable_list s = ctx->get_saved_variables();
    const at::Tensor &x0 = s[X0], &y0 = s[Y0], &x2 = s[10], &x1 = s[11], &z1 = s[12], &r1 = s[13],
                     &r2 = s[14];
    at::Tensor qkv;
    if (s.size() > 15) {
      qkv = s[15]; // saved as usual (hooked): its version checked by autograd
    } else {
      qkv = ctx->saved_data["qkv"].toTensor();
      ctx->saved_data.erase("qkv"); // the last reference is `qkv`, dropped after part 1
      const int64_t version = ctx->saved_data["qkv_version"].toInt();
      if (qkv._version() != version) {
        throw std::runtime_error(
            "coda: qkv, an output of llama_middle that its backward reads, was modified by an "
            "in-place operation (version " +
            std::to_string(qkv._version()) + "; expected version " + std::to_string(version) +
            " instead). Apply the change out of place (e.g. q = q * s, "
            "not q.mul_(s)), or clone qkv before changing it.");
      }
    }
    const coda_llama_config cfg = config_of(ctx->saved_data["config"].toStringRef());
    const int64_t m = x0.size(0);

    std::array<coda_tensor, N_INPUTS> d;
    for (int i = 0; i < N_INPUTS; ++i) d[i] = described(s[i]);
    coda_llama_middle_weights weights;
    coda_llama_middle_inputs inputs;
    fill(&weights, &inputs, d);
    const coda_llama_middle_saved saved{described(x1), described(z1), described(r1), described(r2)};
    const at::Tensor dqkv = dense(dqkv_in, qkv);
    // in: d/d x2, out: d/d x0
    const at::Tensor dx = dx2.defined() ? dense(dx2, x2).clone(at::MemoryFormat::Contiguous)
                                        : at::zeros_like(x2, at::MemoryFormat::Contiguous);
    const coda_stream_t stream = current_stream(x0);
    c10::OptionalDeviceGuard device_guard(x0.device());

    auto run_part = [&](int32_t part, const coda_llama_middle_outputs& outputs,
                        const coda_llama_middle_grads& grads) {
      Workspace ws = workspace(part, cfg, m, x0);
      check(lib.middle_backward_part(part, &cfg, &weights, &inputs, &outputs, &saved, &grads, 0,
                                     &ws.view, stream),
            "coda_llama_middle_backward_part");
    };

    // Part 1 (B0..B4), its gradients allocated just before it (coda.ops: "The backward's
    // transient"); it leaves d/d z1 over z1 and zeta1 over r2 for part 2.
    at::Tensor d_down = empty_like_contiguous(s[W_DOWN]),
               d_attn = empty_like_contiguous(s[ATTN_NORM]),
               d_qkv = empty_like_contiguous(s[W_QKV]);
    coda_llama_middle_grads part1{}; // value-initialized: every tensor absent
    part1.dx = described(dx);
    part1.dqkv = described(dqkv);
    part1.dweights.w_down = described(d_down);
    part1.dweights.attn_norm = described(d_attn);
    part1.dweights.w_qkv = described(d_qkv);
    run_part(CODA_LLAMA_BACKWARD_PART1, {described(x2), described(qkv)}, part1);
    // Part 2 does not read qkv: its memory is free for part 2's gradients (reused in stream
    // order, after part 1's kernels).
    qkv.reset();
    at::Tensor dy0 = empty_like_contiguous(y0), d_out = empty_like_contiguous(s[W_OUT]),
               d_ffn = empty_like_contiguous(s[FFN_NORM]),
               d_gate_up = empty_like_contiguous(s[W_GATE_UP]);
    coda_llama_middle_grads part2{};
    part2.dx = described(dx);
    part2.dy0 = described(dy0);
    part2.dweights.w_out = described(d_out);
    part2.dweights.ffn_norm = described(d_ffn);
    part2.dweights.w_gate_up = described(d_gate_up);
    run_part(CODA_LLAMA_BACKWARD_PART2, {described(x2), coda_tensor{}}, part2);
    result[X0] = dx;
    result[Y0] = dy0;
    result[W_OUT] = d_out;
    result[FFN_NORM] = d_ffn;
    result[W_GATE_UP] = d_gate_up;
    result[W_DOWN] = d_down;
    result[ATTN_NORM] = d_attn;
    result[W_QKV] = d_qkv;
    return result;
  }
};

// coda._lib.error_for(status, message): the exception Python raises. Never destroyed: a
// py::object released after the interpreter's finalization would crash the exit.
py::object* error_for = nullptr;

// coda.ops.llama_middle's call on the C++ path: (x2, qkv), or None where the Python path must
// take it (a tensor coda's descriptors cannot name; a shape the outputs cannot be made of).
py::object middle_forward(const at::Tensor& x0, const at::Tensor& y0, const at::Tensor& w_out,
                          const at::Tensor& ffn_norm, const at::Tensor& w_gate_up,
                          const at::Tensor& w_down, const at::Tensor& attn_norm,
                          const at::Tensor& w_qkv, const at::Tensor& positions,
                          const at::Tensor& inv_freq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, double eps, int64_t precision, bool keep_qkv_aside) {
  if (lib.middle_forward == nullptr) throw std::runtime_error("coda: host path not bound");
  if (x0.dim() != 2 || w_down.dim() != 2) return py::none();
  MiddleCall call;
  call.keep_qkv_aside = keep_qkv_aside;
  const at::Tensor* tensors[N_INPUTS] = {&x0,     &y0,        &w_out, &ffn_norm,  &w_gate_up,
                                         &w_down, &attn_norm, &w_qkv, &positions, &inv_freq};
  for (int i = 0; i < N_INPUTS; ++i)
    if (!describe(*tensors[i], &call.descriptors[i])) return py::none();
  std::memset(&call.config, 0, sizeof(call.config));
  call.config.hidden = x0.size(-1);
  call.config.intermediate = w_down.size(-1);
  call.config.n_heads = static_cast<int32_t>(n_heads);
  call.config.n_kv_heads = static_cast<int32_t>(n_kv_heads);
  call.config.head_dim = static_cast<int32_t>(head_dim);
  call.config.eps = static_cast<float>(eps);
  call.config.ignore_index = -100;
  call.config.precision = static_cast<int32_t>(precision);
  variable_list out;
  try {
    RECORD_FUNCTION("coda::llama_middle_forward", std::vector<c10::IValue>());
    c10::OptionalDeviceGuard device_guard(x0.device());
    out = Middle::apply(x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv, positions,
                        inv_freq, &call);
  } catch (const CallError& e) {
    py::object exc = (*error_for)(e.status, std::string(e.what()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
  }
  return py::make_tuple(out[0], out[1]);
}

void bind(uintptr_t middle_forward_fn, uintptr_t middle_backward_part_fn,
          uintptr_t workspace_size_fn, uintptr_t last_error_fn, py::object error_factory) {
  lib.middle_forward = reinterpret_cast<decltype(lib.middle_forward)>(middle_forward_fn);
  lib.middle_backward_part =
      reinterpret_cast<decltype(lib.middle_backward_part)>(middle_backward_part_fn);
  lib.workspace_size = reinterpret_cast<decltype(lib.workspace_size)>(workspace_size_fn);
  lib.last_error = reinterpret_cast<decltype(lib.last_error)>(last_error_fn);
  if (error_for == nullptr) error_for = new py::object();
  *error_for = std::move(error_factory);
}

} // namespace
} // namespace coda_host_path

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "coda's C++ host path (coda._host_path builds and binds it)";
  m.def("bind", &coda_host_path::bind);
  m.def("middle_forward", &coda_host_path::middle_forward);
#ifdef CODA_HOST_PATH_CUDA
  m.attr("cuda") = true;
#else
  m.attr("cuda") = false;
#endif
}
