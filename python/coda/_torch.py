"""torch tensors as coda_tensor descriptors: dtype and device mapping, the stream, the device
guard and workspaces. Internal to coda.ops."""

import contextlib

import torch

from . import _lib as L

_DTYPES = {
    torch.bfloat16: L.BF16,
    torch.float16: L.F16,
    torch.float32: L.F32,
    torch.int32: L.I32,
}
_Dims = L.Tensor._fields_[3][1]  # int64_t[CODA_MAX_RANK]


def view(t, name="tensor"):
    """The coda_tensor of a torch tensor (absent for None). A 0-dim tensor is a [1] vector.
    Strides are passed as they are; coda's validation rejects what it cannot run."""
    if t is None:
        return L.Tensor()
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise L.DTypeError(
            "%s: coda takes bf16, f16, f32 or i32 tensors; got %s" % (name, t.dtype), L.TYPE_ERROR
        )
    kind = t.device.type
    if kind == "cuda":
        device, index = L.DEVICE_CUDA, t.device.index or 0
    elif kind == "cpu":
        device, index = L.DEVICE_CPU, 0
    else:
        raise L.InvalidArgument(
            "%s: coda runs on CUDA (Hopper) or CPU tensors; got a %s tensor" % (name, kind),
            L.INVALID_ARGUMENT,
        )
    shape, stride = tuple(t.shape), t.stride()
    if len(shape) == 0:
        shape, stride = (1,), (1,)
    if len(shape) > L.MAX_RANK:
        raise L.InvalidArgument("%s: rank %d > %d" % (name, len(shape), L.MAX_RANK))
    return L.Tensor(t.data_ptr(), dtype, len(shape), _Dims(*shape), _Dims(*stride), device, index)


def stream(t):
    """The current torch stream of t's device as a coda_stream_t (None on the CPU)."""
    if t.device.type != "cuda":
        return None
    return torch.cuda.current_stream(t.device).cuda_stream or None


@contextlib.contextmanager
def _cuda_device(index):
    with torch.cuda.device(index):
        yield


def device_guard(device):
    """Make `device` the current CUDA device for the call (coda checks the tensors are on it;
    size queries that depend on the device read the current one)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index != torch.cuda.current_device():
            return _cuda_device(index)
    return contextlib.nullcontext()


def device_key(device):
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, 0)


def _words(nbytes):
    return max((int(nbytes) + 3) // 4, 4)


def workspace(nbytes, device):
    """(tensor, descriptor): `nbytes` of scratch from the caching allocator as uint8, described
    to coda as i32 words (coda's dtypes have no byte type; the bytes are what count)."""
    buf = torch.empty(_words(nbytes) * 4, dtype=torch.uint8, device=device)
    return buf, workspace_view(buf, nbytes)


def workspace_view(buf, nbytes):
    """The descriptor workspace() gives for `nbytes`, over the start of an existing uint8 buffer
    at least that large: one buffer can serve calls that ask for different sizes, each told
    exactly the size it asked for."""
    words = _words(nbytes)
    if buf.numel() < words * 4:
        raise ValueError("workspace buffer of %d bytes; %d needed" % (buf.numel(), words * 4))
    device = buf.device
    return L.tensor(
        buf.data_ptr(),
        L.I32,
        (words,),
        device=L.DEVICE_CUDA if device.type == "cuda" else L.DEVICE_CPU,
        device_index=(device.index or 0) if device.type == "cuda" else 0,
    )


_llama_ws = {}


def llama_workspace_bytes(layer, pass_, config, tokens, device):
    """coda_llama_workspace_size, cached per (layer, pass, config, tokens, device). Call it with
    the device current (device_guard) for a backward."""
    key = (
        layer,
        pass_,
        config.hidden,
        config.intermediate,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
        config.vocab,
        int(tokens),
        device_key(device),
    )
    n = _llama_ws.get(key)
    if n is None:
        n = L.llama_workspace_size(layer, pass_, config, tokens)
        _llama_ws[key] = n
    return n


_gemm_ws = {}


def gemm_workspace_bytes(args, key, device):
    """coda_gemm_workspace_size(args), cached under `key` (shapes, dtypes, layout) and device."""
    full = key + (device_key(device),)
    n = _gemm_ws.get(full)
    if n is None:
        n = L.gemm_workspace_size(args)
        _gemm_ws[full] = n
    return n
