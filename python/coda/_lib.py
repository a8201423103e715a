"""ctypes binding of libcoda's C ABI (``include/coda/coda.h``, ``include/coda/block/llama.h``).

Torch-free: this module needs only the standard library. Every ``Structure`` below mirrors its
C struct field for field, in order, with the same C types; ``tests/python/test_lib_cpu.py``
checks each ``ctypes.sizeof`` and field offset against the layout computed by hand from the
headers (x86-64 / aarch64 LP64) and the field names and order against the headers' text.

Errors: every call returns a ``coda_status``; a failure raises a subclass of :class:`Error`
that is also the matching Python built-in (ARCHITECTURE.md section 6):
``CODA_INVALID_ARGUMENT`` -> :class:`InvalidArgument` (a ``ValueError``),
``CODA_TYPE_ERROR`` -> :class:`DTypeError` (a ``TypeError``),
``CODA_NOT_SUPPORTED`` -> :class:`NotSupported` (a ``NotImplementedError``: fall back),
anything else -> :class:`CudaError` / :class:`InternalError` (``RuntimeError``s),
with ``coda_last_error()`` as the message.

The library is found (lazily, at the first call) at ``$CODA_LIBRARY`` when it is set; otherwise
at ``libcoda.so`` beside this file (an installed package), then the newest
``build*/src/libcoda.so`` of the source tree this file sits in (a development checkout).
"""

import ctypes
import glob
import os
import sys
import threading
from ctypes import POINTER, c_char_p, c_float, c_int32, c_int64, c_size_t, c_void_p

# ---- constants (coda.h)

MAX_RANK = 4  # CODA_MAX_RANK
REDUCE_BLOCK = 128  # CODA_REDUCE_BLOCK

OK, INVALID_ARGUMENT, TYPE_ERROR, NOT_SUPPORTED, CUDA_ERROR, INTERNAL = range(6)
BF16, F16, F32, I32 = range(4)  # coda_dtype
DEVICE_CPU, DEVICE_CUDA = range(2)  # coda_device
GEMM_FWD, GEMM_DGRAD, GEMM_WGRAD = range(3)  # coda_gemm_layout
LOSS_MEAN, LOSS_SUM = range(2)  # coda_loss_reduction
LLAMA_FIRST, LLAMA_MIDDLE, LLAMA_LAST = range(3)  # coda_llama_layer
LLAMA_FORWARD, LLAMA_BACKWARD = range(2)  # coda_llama_pass

DTYPE_SIZE = {BF16: 2, F16: 2, F32: 4, I32: 4}

# ---- errors


class Error(Exception):
    """A failed coda call. ``status`` is the coda_status, the message coda_last_error()."""

    status = INTERNAL

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(Error, ValueError):
    status = INVALID_ARGUMENT


class DTypeError(Error, TypeError):
    status = TYPE_ERROR


class NotSupported(Error, NotImplementedError):
    status = NOT_SUPPORTED


class CudaError(Error, RuntimeError):
    status = CUDA_ERROR


class InternalError(Error, RuntimeError):
    status = INTERNAL


_ERRORS = {
    INVALID_ARGUMENT: InvalidArgument,
    TYPE_ERROR: DTypeError,
    NOT_SUPPORTED: NotSupported,
    CUDA_ERROR: CudaError,
    INTERNAL: InternalError,
}


def error_for(status, message):
    """The exception a status maps to (InternalError for an unknown status)."""
    cls = _ERRORS.get(int(status), InternalError)
    return cls(message, int(status))


# ---- structs (field for field the C headers)


class Tensor(ctypes.Structure):
    """coda_tensor: a non-owning strided view. Absent (optional) when data is NULL."""

    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int32),
        ("rank", c_int32),
        ("shape", c_int64 * MAX_RANK),
        ("stride", c_int64 * MAX_RANK),
        ("device", c_int32),
        ("device_index", c_int32),
    ]


class Scalar(ctypes.Structure):
    """coda_scalar: value, times tensor[0] when the optional [1] f32 tensor is given."""

    _fields_ = [("value", c_float), ("tensor", Tensor)]


class RopeSpec(ctypes.Structure):
    _fields_ = [
        ("positions", Tensor),
        ("inv_freq", Tensor),
        ("n_q_heads", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
    ]


class GemmArgs(ctypes.Structure):
    _fields_ = [
        ("layout", c_int32),
        ("a", Tensor),
        ("b", Tensor),
        ("d", Tensor),
        ("c", Tensor),
        ("alpha", Scalar),
        ("beta", c_float),
        ("workspace", Tensor),
    ]


def _tensors(*names):
    return [(n, Tensor) for n in names]


class ResidualRmsArgs(ctypes.Structure):  # K0
    _fields_ = _tensors("a", "w", "residual", "gamma", "out", "out_scaled", "sumsq_partials")


class RmsScaleArgs(ctypes.Structure):  # K1
    _fields_ = _tensors("a", "w", "sumsq_partials") + [("eps", c_float)] + _tensors(
        "out", "rstd_out"
    )


class RmsSwigluArgs(ctypes.Structure):  # K2
    _fields_ = _tensors("a", "w", "sumsq_partials") + [("eps", c_float)] + _tensors(
        "preact", "act", "rstd_out"
    )


class RmsRopeArgs(ctypes.Structure):  # K4
    _fields_ = (
        _tensors("a", "w", "sumsq_partials")
        + [("eps", c_float), ("rope", RopeSpec)]
        + _tensors("out", "rstd_out")
    )


class RmsLseArgs(ctypes.Structure):  # K5
    _fields_ = (
        _tensors("a", "w", "sumsq_partials")
        + [("eps", c_float)]
        + _tensors("targets", "logits", "lse_partials", "target_logit", "rstd_out")
    )


class RmsBackwardArgs(ctypes.Structure):  # K6
    _fields_ = (
        _tensors("dz", "w", "x", "rstd", "zeta", "gamma")
        + [("alpha", Scalar), ("accumulate", c_int32)]
        + _tensors("dx", "h_hat", "dgamma_partials")
    )


class SwigluBackwardArgs(ctypes.Structure):  # K7
    _fields_ = _tensors("dx", "w", "preact", "act", "dpreact", "zeta_partials")


class RmsStatsArgs(ctypes.Structure):
    _fields_ = _tensors("x", "gamma", "out_scaled", "sumsq_partials")


class RstdArgs(ctypes.Structure):
    _fields_ = [("partials", Tensor), ("n", c_int64), ("eps", c_float), ("rstd", Tensor)]


class RowReduceArgs(ctypes.Structure):
    _fields_ = [("partials", Tensor), ("scale", Scalar), ("out", Tensor)]


class ColReduceArgs(ctypes.Structure):
    _fields_ = [("partials", Tensor), ("accumulate", c_int32), ("out", Tensor)]


class RopeBackwardArgs(ctypes.Structure):
    _fields_ = (
        _tensors("dqkv", "qkv") + [("rope", RopeSpec), ("scale", c_float)] + _tensors("dz", "zeta")
    )


class CrossEntropyArgs(ctypes.Structure):
    _fields_ = (
        _tensors("logits", "lse_partials", "target_logit", "targets")
        + [("ignore_index", c_int32), ("reduction", c_int32)]
        + _tensors("loss", "dlogits", "grad_scale", "zeta", "workspace")
    )


# ---- the Llama block (coda/block/llama.h)


class LlamaConfig(ctypes.Structure):
    _fields_ = [
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("n_heads", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("vocab", c_int64),
        ("eps", c_float),
        ("ignore_index", c_int32),
        ("loss_reduction", c_int32),
    ]


class LlamaRope(ctypes.Structure):
    _fields_ = _tensors("positions", "inv_freq")


class LlamaFirstWeights(ctypes.Structure):
    _fields_ = _tensors("attn_norm", "w_qkv")


class LlamaFirstInputs(ctypes.Structure):
    _fields_ = [("x", Tensor), ("rope", LlamaRope)]


class LlamaFirstOutputs(ctypes.Structure):
    _fields_ = _tensors("qkv")


class LlamaFirstSaved(ctypes.Structure):
    _fields_ = _tensors("rstd")


class LlamaFirstGrads(ctypes.Structure):
    _fields_ = _tensors("dx", "dqkv") + [("dweights", LlamaFirstWeights)]


class LlamaMiddleWeights(ctypes.Structure):
    _fields_ = _tensors("w_out", "ffn_norm", "w_gate_up", "w_down", "attn_norm", "w_qkv")


class LlamaMiddleInputs(ctypes.Structure):
    _fields_ = _tensors("x0", "y0") + [("rope", LlamaRope)]


class LlamaMiddleOutputs(ctypes.Structure):
    _fields_ = _tensors("x2", "qkv")


class LlamaMiddleSaved(ctypes.Structure):
    _fields_ = _tensors("x1", "z1", "r1", "r2")


class LlamaMiddleGrads(ctypes.Structure):
    _fields_ = _tensors("dx", "dqkv", "dy0") + [("dweights", LlamaMiddleWeights)]


class LlamaLastWeights(ctypes.Structure):
    _fields_ = _tensors("w_out", "ffn_norm", "w_gate_up", "w_down", "final_norm", "lm_head")


class LlamaLastInputs(ctypes.Structure):
    _fields_ = _tensors("x0", "y0", "targets")


class LlamaLastOutputs(ctypes.Structure):
    _fields_ = _tensors("loss", "logits")


class LlamaLastSaved(ctypes.Structure):
    _fields_ = _tensors("x1", "z1", "r1", "x2", "r2", "dlogits", "grad_scale", "zeta")


class LlamaLastGrads(ctypes.Structure):
    _fields_ = [("dloss", Scalar)] + _tensors("dx", "dy0") + [("dweights", LlamaLastWeights)]


# Every mirrored struct by its C name (the layout test walks this table).
STRUCTS = {
    "coda_tensor": Tensor,
    "coda_scalar": Scalar,
    "coda_rope_spec": RopeSpec,
    "coda_gemm_args": GemmArgs,
    "coda_residual_rms_args": ResidualRmsArgs,
    "coda_rms_scale_args": RmsScaleArgs,
    "coda_rms_swiglu_args": RmsSwigluArgs,
    "coda_rms_rope_args": RmsRopeArgs,
    "coda_rms_lse_args": RmsLseArgs,
    "coda_rms_backward_args": RmsBackwardArgs,
    "coda_swiglu_backward_args": SwigluBackwardArgs,
    "coda_rms_stats_args": RmsStatsArgs,
    "coda_rstd_args": RstdArgs,
    "coda_row_reduce_args": RowReduceArgs,
    "coda_col_reduce_args": ColReduceArgs,
    "coda_rope_backward_args": RopeBackwardArgs,
    "coda_cross_entropy_args": CrossEntropyArgs,
    "coda_llama_config": LlamaConfig,
    "coda_llama_rope": LlamaRope,
    "coda_llama_first_weights": LlamaFirstWeights,
    "coda_llama_first_inputs": LlamaFirstInputs,
    "coda_llama_first_outputs": LlamaFirstOutputs,
    "coda_llama_first_saved": LlamaFirstSaved,
    "coda_llama_first_grads": LlamaFirstGrads,
    "coda_llama_middle_weights": LlamaMiddleWeights,
    "coda_llama_middle_inputs": LlamaMiddleInputs,
    "coda_llama_middle_outputs": LlamaMiddleOutputs,
    "coda_llama_middle_saved": LlamaMiddleSaved,
    "coda_llama_middle_grads": LlamaMiddleGrads,
    "coda_llama_last_weights": LlamaLastWeights,
    "coda_llama_last_inputs": LlamaLastInputs,
    "coda_llama_last_outputs": LlamaLastOutputs,
    "coda_llama_last_saved": LlamaLastSaved,
    "coda_llama_last_grads": LlamaLastGrads,
}

# ---- functions: name -> argument types (all return coda_status unless listed in _RETURNS)

_P = POINTER
_STREAM = c_void_p  # coda_stream_t (cudaStream_t); None is the default stream

_KERNELS = {
    "coda_gemm": GemmArgs,
    "coda_gemm_residual_rms": ResidualRmsArgs,
    "coda_gemm_rms_scale": RmsScaleArgs,
    "coda_gemm_rms_swiglu": RmsSwigluArgs,
    "coda_gemm_rms_rope": RmsRopeArgs,
    "coda_gemm_rms_lse": RmsLseArgs,
    "coda_gemm_rms_backward": RmsBackwardArgs,
    "coda_gemm_swiglu_backward": SwigluBackwardArgs,
    "coda_rms_stats": RmsStatsArgs,
    "coda_rstd_from_partials": RstdArgs,
    "coda_reduce_row_partials": RowReduceArgs,
    "coda_reduce_col_partials": ColReduceArgs,
    "coda_rope_backward": RopeBackwardArgs,
    "coda_cross_entropy": CrossEntropyArgs,
}

_SIGNATURES = {name: [_P(args), _STREAM] for name, args in _KERNELS.items()}
_SIGNATURES.update(
    {
        "coda_gemm_workspace_size": [_P(GemmArgs), _P(c_size_t)],
        "coda_cross_entropy_workspace_size": [c_int64, _P(c_size_t)],
        "coda_interleave_gate_up": [_P(Tensor), _P(Tensor), _STREAM],
        "coda_deinterleave_gate_up": [_P(Tensor), _P(Tensor), _STREAM],
        "coda_llama_workspace_size": [c_int32, c_int32, _P(LlamaConfig), c_int64, _P(c_size_t)],
    }
)
for _layer, _has_outputs in (("first", True), ("middle", True), ("last", False)):
    _W, _I, _O, _S, _G = (
        STRUCTS["coda_llama_%s_%s" % (_layer, part)]
        for part in ("weights", "inputs", "outputs", "saved", "grads")
    )
    _SIGNATURES["coda_llama_%s_forward" % _layer] = [
        _P(LlamaConfig), _P(_W), _P(_I), _P(_O), _P(_S), _P(Tensor), _STREAM
    ]
    _SIGNATURES["coda_llama_%s_backward" % _layer] = (
        [_P(LlamaConfig), _P(_W), _P(_I)]
        + ([_P(_O)] if _has_outputs else [])
        + [_P(_S), _P(_G), c_int32, _P(Tensor), _STREAM]
    )
del _layer, _has_outputs, _W, _I, _O, _S, _G

_RETURNS = {"coda_last_error": c_char_p, "coda_version": c_char_p}

# ---- loading


def _source_tree_candidates():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
    found = glob.glob(os.path.join(root, "build*", "src", "libcoda.so"))
    return sorted(found, key=os.path.getmtime, reverse=True)


def candidate_paths():
    """Where the library is looked for, in order ($CODA_LIBRARY alone when it is set)."""
    env = os.environ.get("CODA_LIBRARY")
    if env:
        return [env]
    paths = []
    paths.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libcoda.so"))
    paths.extend(_source_tree_candidates())
    return paths


def _preload_cuda_runtime():
    """Load the CUDA runtime and cuBLASLt of NVIDIA's pip wheels (what torch uses), if present,
    so that a libcoda.so built with CUDA loads where the toolkit's libraries are not on the
    loader's path. Returns True when something was loaded."""
    loaded = False
    for entry in sys.path:
        base = os.path.join(entry or ".", "nvidia")
        if not os.path.isdir(base):
            continue
        for pattern in ("libcudart.so*", "libcublasLt.so*"):
            for path in sorted(glob.glob(os.path.join(base, "**", pattern), recursive=True)):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    loaded = True
                    break
                except OSError:
                    continue
    return loaded


_lock = threading.Lock()
_lib = None
_lib_path = None


def _declare(lib):
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = c_int32
    for name, restype in _RETURNS.items():
        fn = getattr(lib, name)
        fn.argtypes = []
        fn.restype = restype


def load(path=None):
    """The loaded library (a ctypes.CDLL), loading it on the first call."""
    global _lib, _lib_path
    if _lib is not None and path is None:
        return _lib
    with _lock:
        if _lib is not None and path is None:
            return _lib
        candidates = [path] if path else candidate_paths()
        errors = []
        for candidate in candidates:
            if not os.path.exists(candidate):
                errors.append("%s: not found" % candidate)
                continue
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as e:
                # A CUDA build may need the runtime from NVIDIA's pip wheels: load it, retry.
                if not _preload_cuda_runtime():
                    errors.append("%s: %s" % (candidate, e))
                    continue
                try:
                    lib = ctypes.CDLL(candidate)
                except OSError as e2:
                    errors.append("%s: %s" % (candidate, e2))
                    continue
            _declare(lib)
            _lib, _lib_path = lib, candidate
            return lib
        raise OSError(
            "coda: could not load libcoda.so. Install the package (pip install "
            "--no-build-isolation .), build it (cmake -S . -B build && cmake --build build) or "
            "set CODA_LIBRARY to its path. Tried:\n  " + "\n  ".join(errors)
        )


def library_path():
    """The path of the loaded library (loading it if needed)."""
    load()
    return _lib_path


def last_error():
    """coda_last_error() of this thread, as str."""
    msg = load().coda_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def version():
    """The loaded library's "MAJOR.MINOR.PATCH"."""
    return load().coda_version().decode()


def check(status, fn_name=""):
    """Raise the mapped exception for a failed status (the message: coda_last_error())."""
    if status != OK:
        message = last_error() or "%s failed with status %d" % (fn_name, status)
        raise error_for(status, message)


def call(name, *args):
    """Call the C function `name` (e.g. "coda_gemm") and raise on a failed status."""
    check(getattr(load(), name)(*args), name)


# ---- building descriptors


def tensor(data, dtype, shape, stride=None, device=DEVICE_CPU, device_index=0):
    """A coda_tensor over `data` (an address as int, or None: absent). `stride` in elements,
    row-major contiguous when omitted."""
    shape = tuple(int(s) for s in shape)
    if len(shape) > MAX_RANK:
        raise InvalidArgument("coda tensors have rank <= %d; got shape %s" % (MAX_RANK, shape))
    if stride is None:
        stride, step = [], 1
        for s in reversed(shape):
            stride.insert(0, step)
            step *= s
    t = Tensor()
    t.data = data or None
    t.dtype = int(dtype)
    t.rank = len(shape)
    for i, (s, st) in enumerate(zip(shape, stride)):
        t.shape[i] = s
        t.stride[i] = int(st)
    t.device = int(device)
    t.device_index = int(device_index)
    return t


def absent():
    """An absent optional tensor (data NULL)."""
    return Tensor()


def scalar(value, tensor_=None):
    """A coda_scalar: `value`, times tensor_[0] when a [1] f32 coda_tensor is given."""
    s = Scalar()
    s.value = float(value)
    if tensor_ is not None:
        s.tensor = tensor_
    return s


# ---- calls


def _kernel(c_name):
    def run(args, stream=None):
        call(c_name, ctypes.byref(args), stream)

    run.__name__ = c_name[len("coda_"):]
    run.__doc__ = "%s(args, stream=None): raises on failure." % c_name
    return run


gemm = _kernel("coda_gemm")
gemm_residual_rms = _kernel("coda_gemm_residual_rms")
gemm_rms_scale = _kernel("coda_gemm_rms_scale")
gemm_rms_swiglu = _kernel("coda_gemm_rms_swiglu")
gemm_rms_rope = _kernel("coda_gemm_rms_rope")
gemm_rms_lse = _kernel("coda_gemm_rms_lse")
gemm_rms_backward = _kernel("coda_gemm_rms_backward")
gemm_swiglu_backward = _kernel("coda_gemm_swiglu_backward")
rms_stats = _kernel("coda_rms_stats")
rstd_from_partials = _kernel("coda_rstd_from_partials")
reduce_row_partials = _kernel("coda_reduce_row_partials")
reduce_col_partials = _kernel("coda_reduce_col_partials")
rope_backward = _kernel("coda_rope_backward")
cross_entropy = _kernel("coda_cross_entropy")


def gemm_workspace_size(args):
    """Bytes of args.workspace coda_gemm(args) can use on the current device (0 on the CPU)."""
    n = c_size_t()
    call("coda_gemm_workspace_size", ctypes.byref(args), ctypes.byref(n))
    return n.value


def cross_entropy_workspace_size(m):
    n = c_size_t()
    call("coda_cross_entropy_workspace_size", int(m), ctypes.byref(n))
    return n.value


def interleave_gate_up(stacked, fused, stream=None):
    """[gate; up] rows -> (gate0, up0, gate1, up1, ...): both [2F, K] coda_tensors."""
    call("coda_interleave_gate_up", ctypes.byref(stacked), ctypes.byref(fused), stream)


def deinterleave_gate_up(fused, stacked, stream=None):
    call("coda_deinterleave_gate_up", ctypes.byref(fused), ctypes.byref(stacked), stream)


def llama_workspace_size(layer, pass_, config, tokens):
    """Bytes of workspace one block call needs (for a backward: on the current CUDA device)."""
    n = c_size_t()
    call(
        "coda_llama_workspace_size",
        int(layer),
        int(pass_),
        ctypes.byref(config),
        int(tokens),
        ctypes.byref(n),
    )
    return n.value


def llama_forward(layer, config, weights, inputs, outputs, saved, workspace, stream=None):
    """coda_llama_{first,middle,last}_forward; layer: "first", "middle" or "last"."""
    call(
        "coda_llama_%s_forward" % layer,
        ctypes.byref(config),
        ctypes.byref(weights),
        ctypes.byref(inputs),
        ctypes.byref(outputs),
        ctypes.byref(saved),
        ctypes.byref(workspace),
        stream,
    )


def llama_backward(
    layer, config, weights, inputs, outputs, saved, grads, accumulate, workspace, stream=None
):
    """coda_llama_{first,middle,last}_backward (`outputs` is ignored for the last layer, whose
    backward does not take them)."""
    args = [ctypes.byref(config), ctypes.byref(weights), ctypes.byref(inputs)]
    if layer != "last":
        args.append(ctypes.byref(outputs))
    args += [ctypes.byref(saved), ctypes.byref(grads), 1 if accumulate else 0]
    call("coda_llama_%s_backward" % layer, *args, ctypes.byref(workspace), stream)
