"""coda's C++ host path (csrc/host_path.cpp): the middle layer's call, outputs, descriptors and
autograd node in C++, for the eager calls whose host time the GPU waits for (docs/python.md,
"The C++ host path"). Internal to coda.ops.

A torch extension cannot ship in coda's wheel, which is built once for every Python and torch
version; so it is compiled against the installed torch on first use (torch.utils.cpp_extension,
a C++ compiler and, for CUDA tensors, the CUDA toolkit's headers), cached under
$CODA_HOST_PATH_DIR (default ~/.cache/coda/host_path), keyed by the source, the headers and the
torch build: the first middle call of the first process builds it (about a minute; a line on
stderr says so), later ones load it. CODA_HOST_PATH=0 turns it off; where it is off or cannot be
built, coda.ops keeps the Python path, and reason() says why.
"""

import ctypes
import hashlib
import os
import sys
import threading

import torch

from . import _lib as L

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "csrc", "host_path.cpp")
_HEADERS = ("coda/block/llama.h", "coda/core/types.h")
_BOUND = ("coda_llama_middle_forward", "coda_llama_middle_backward_part",
          "coda_llama_workspace_size", "coda_last_error")

_lock = threading.Lock()
_module = None
_reason = "not loaded yet"
_tried = False


def enabled():
    """Whether the C++ host path is on (CODA_HOST_PATH unset or not "0")."""
    return os.environ.get("CODA_HOST_PATH", "1") not in ("", "0")


def _include_dir():
    """The directory holding coda/block/llama.h: the package's own copy (an installed wheel),
    else the source tree's include/."""
    for candidate in (os.path.join(_HERE, "include"),
                      os.path.join(_HERE, os.pardir, os.pardir, "include")):
        if all(os.path.exists(os.path.join(candidate, h)) for h in _HEADERS):
            return os.path.abspath(candidate)
    return None


def _cuda():
    """Whether to build for CUDA tensors: torch has CUDA and the toolkit's headers are found."""
    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension
    return cpp_extension.CUDA_HOME is not None


def _fingerprint(include, cuda):
    h = hashlib.sha256()
    for path in (_SOURCE,) + tuple(os.path.join(include, p) for p in _HEADERS):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(("%s|%s|%s" % (torch.__version__, torch.version.cuda, cuda)).encode())
    return h.hexdigest()[:16]


def build(verbose=False):
    """Compile (or find in the cache) and import the extension; returns the module."""
    from torch.utils import cpp_extension
    include = _include_dir()
    if include is None:
        raise RuntimeError("coda's C headers (coda/block/llama.h) are not found beside the "
                           "package or in its source tree")
    cuda = _cuda()
    key = _fingerprint(include, cuda)
    root = os.environ.get("CODA_HOST_PATH_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "coda", "host_path")
    directory = os.path.join(root, key)
    os.makedirs(directory, exist_ok=True)
    flags = ["-O2", "-std=c++17"] + (["-DCODA_HOST_PATH_CUDA"] if cuda else [])
    name = "coda_host_path_" + key
    if not os.path.exists(os.path.join(directory, name + ".so")):
        sys.stderr.write("coda: building the C++ host path for torch %s in %s (once; "
                         "CODA_HOST_PATH=0 skips it)\n" % (torch.__version__, directory))
    return cpp_extension.load(name=name, sources=[_SOURCE],
                              extra_include_paths=[include], extra_cflags=flags,
                              with_cuda=cuda, build_directory=directory, verbose=verbose)


def bind(module, lib=None):
    """Give the extension the addresses of libcoda's entry points it calls (`lib`: the loaded
    library, or an object with the same attributes)."""
    lib = lib if lib is not None else L.load()
    addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _BOUND]
    module.bind(*addresses, L.error_for)


def module():
    """The bound extension, or None (off, or it could not be built: reason() says why). Built
    at most once per process."""
    global _module, _reason, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        if not enabled():
            _reason = "off (CODA_HOST_PATH=0)"
        else:
            try:
                m = build()
                bind(m)
                _module = m
                _reason = "built" if m.cuda or torch.version.cuda is None else (
                    "built for CPU tensors only (the CUDA toolkit's headers were not found: "
                    "set CUDA_HOME); CUDA tensors take the Python path")
            except Exception as e:  # the Python path stays: say why
                _reason = "could not be built: %s: %s" % (type(e).__name__, e)
        _tried = True
    return _module


def reason():
    """Why the C++ host path is or is not used."""
    return _reason
