"""ctypes binding of libcoda's C ABI (``include/coda/coda.h``, ``include/coda/block/llama.h``).

Torch-free: this module needs only the standard library. The constants, the ``Structure`` of
every C struct and every function's signature come from ``coda._abi``, which
``tools/gen_abi.py`` generates from the headers (``--check`` fails when it is stale; ctest runs
it); ``tests/python/test_lib_cpu.py`` checks each ``ctypes.sizeof`` and field offset against a C
compiler's. This module loads the library, maps errors and wraps the calls.

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
from ctypes import c_size_t

# ---- constants, structs and signatures (generated from the headers)

from ._abi import *  # noqa: E402,F401,F403  (BF16, ..., Tensor, GemmArgs, ..., STRUCTS)
from ._abi import KERNELS as _KERNELS
from ._abi import SIGNATURES as _SIGNATURES

DTYPE_SIZE = {BF16: 2, F16: 2, F32: 4, I32: 4, E4M3: 1, E8M0: 1}

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
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
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


# gemm, gemm_residual_rms, ..., cross_entropy: one wrapper per C kernel that takes an argument
# struct and a stream (KERNELS of coda._abi).
for _c_name in _KERNELS:
    globals()[_c_name[len("coda_"):]] = _kernel(_c_name)
del _c_name


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


def llama_fp8_workspace_size(layer, pass_, config, tokens, copies):
    """llama_workspace_size for a call whose FP8 weight copies come from `copies`
    (coda_llama_fp8_workspace_size): LLAMA_FP8_WEIGHTS_GIVEN, the smaller workspace of a call
    given them (config FP8 only); LLAMA_FP8_WEIGHTS_IN_WORKSPACE, llama_workspace_size's."""
    n = c_size_t()
    call(
        "coda_llama_fp8_workspace_size",
        int(layer),
        int(pass_),
        ctypes.byref(config),
        int(tokens),
        int(copies),
        ctypes.byref(n),
    )
    return n.value


def llama_fp8_weights_size(layer, config):
    """Bytes of a layer's FP8 weight copies (coda_llama_fp8_weights_size; config FP8)."""
    n = c_size_t()
    call("coda_llama_fp8_weights_size", int(layer), ctypes.byref(config), ctypes.byref(n))
    return n.value


def llama_quantize_weights(layer, config, weights, fp8_weights, stream=None):
    """coda_llama_{first,middle,last}_quantize_weights: both FP8 copies of each of the layer's
    GEMM weights, one pass over each; layer: "first", "middle" or "last"."""
    call(
        "coda_llama_%s_quantize_weights" % layer,
        ctypes.byref(config),
        ctypes.byref(weights),
        ctypes.byref(fp8_weights),
        stream,
    )


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


def llama_middle_backward_part(
    part, config, weights, inputs, outputs, saved, grads, accumulate, workspace, stream=None
):
    """coda_llama_middle_backward_part: part LLAMA_BACKWARD_PART1 (B0..B4), then
    LLAMA_BACKWARD_PART2 (B5..B8), each with its own gradients and workspace."""
    call(
        "coda_llama_middle_backward_part",
        int(part),
        ctypes.byref(config),
        ctypes.byref(weights),
        ctypes.byref(inputs),
        ctypes.byref(outputs),
        ctypes.byref(saved),
        ctypes.byref(grads),
        1 if accumulate else 0,
        ctypes.byref(workspace),
        stream,
    )
