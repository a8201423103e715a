"""coda: fused Llama-block kernels for NVIDIA Hopper, from PyTorch.

    import coda
    model = coda.from_hf(hf_model)            # a coda.models.Llama with the same weights
    loss = model(input_ids, labels=labels)    # first / middle / last layers on coda
    loss.backward()

Importing coda needs neither torch nor a GPU; ``coda._lib`` (the ctypes binding of the C ABI)
is torch-free. ``coda.ops`` (torch custom ops), ``coda.kernels`` (the named kernels as torch
ops), ``coda.models`` and the Hugging Face helpers import torch when first used. docs/python.md
describes the API.
"""

import importlib

from . import _lib
from ._lib import CudaError, DTypeError, Error, InternalError, InvalidArgument, NotSupported

__version__ = "0.1.0"

# name -> (submodule, attribute or None for the module itself); loaded on first access so that
# `import coda` does not import torch.
_LAZY = {
    "ops": ("ops", None),
    "kernels": ("kernels", None),
    "models": ("models", None),
    "hf": ("hf", None),
    "LlamaConfig": ("models", "LlamaConfig"),
    "Llama": ("models", "Llama"),
    "from_hf": ("hf", "from_hf"),
    "to_hf_state_dict": ("hf", "to_hf_state_dict"),
    "patch_hf": ("hf", "patch_hf"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError("module 'coda' has no attribute %r" % name)
    module, attr = _LAZY[name]
    value = importlib.import_module("." + module, __name__)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def library_version():
    """The version of the loaded libcoda.so (loads it)."""
    return _lib.version()


__all__ = [
    "Error",
    "InvalidArgument",
    "DTypeError",
    "NotSupported",
    "CudaError",
    "InternalError",
    "library_version",
] + list(_LAZY)
