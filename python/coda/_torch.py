"""torch tensors as coda_tensor descriptors: dtype and device mapping, the stream, the device
guard and workspaces. Internal to coda.ops.

Descriptors are made on every call (a tensor's memory, shape or strides can change between
calls), so making them is on every call's host path: a coda_tensor is packed with `struct`
straight into the bytes of its ctypes Structure, and a Structure made only of coda_tensors
(the llama weights, inputs, outputs, saved and grads structs) from one buffer: a few times
cheaper than setting each field through ctypes. The packed bytes are looked up by exactly what
they encode (_packs), never by the tensor."""

import contextlib
import ctypes
import struct

import torch

from . import _lib as L

_DTYPES = {
    torch.bfloat16: L.BF16,
    torch.float16: L.F16,
    torch.float32: L.F32,
    torch.int32: L.I32,
}

# coda_tensor: data, dtype, rank, shape[MAX_RANK], stride[MAX_RANK], device, device_index. Native
# alignment, as the C struct; checked against ctypes (whose layout test_lib_cpu.py checks
# against a C compiler's) below.
_TENSOR = struct.Struct("@Pii%dq%dqii" % (L.MAX_RANK, L.MAX_RANK))
if _TENSOR.size != ctypes.sizeof(L.Tensor):
    raise ImportError("coda: coda_tensor is %d bytes in ctypes, %d packed"
                      % (ctypes.sizeof(L.Tensor), _TENSOR.size))
_ABSENT = bytes(_TENSOR.size)  # data NULL: an absent optional tensor
_PAD = tuple((0,) * (L.MAX_RANK - rank) for rank in range(L.MAX_RANK + 1))

# (torch dtype, torch device) -> (coda dtype, coda device, device index): what view() checks
# and maps, looked up once per dtype and device (shape-free, so it holds for any tensor).
_where = {}


def _classify(t, name):
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise L.DTypeError(
            "%s: coda takes bf16, f16, f32 or i32 tensors; got %s" % (name, t.dtype), L.TYPE_ERROR
        )
    where = _where[(t.dtype, t.device)] = (dtype, *_device_of(t, name))
    return where


def _device_of(t, name):
    """(coda device, device index) of t's device."""
    kind = t.device.type
    if kind == "cuda":
        return L.DEVICE_CUDA, t.device.index or 0
    if kind == "cpu":
        return L.DEVICE_CPU, 0
    raise L.InvalidArgument(
        "%s: coda runs on CUDA (Hopper) or CPU tensors; got a %s tensor" % (name, kind),
        L.INVALID_ARGUMENT,
    )


# Packed descriptors by everything they are made of: (data_ptr, shape, stride, dtype, device)
# -> bytes. An entry can never be stale (it holds nothing but its key, no tensor and no
# values), and the key costs about half of packing; the weights, the tensors a backward gets
# back from its forward and (the caching allocator handing out the same blocks) the fresh
# outputs hit it call after call. Cleared when full, so it stays small.
_packs = {}
_PACKS_MAX = 1024


def _packed(t, name, as_dtype=None):
    """The bytes of t's coda_tensor (see view()). as_dtype: the coda dtype of a tensor of bytes
    (torch.uint8) that holds another type (E4M3 codes, E8M0 scales), instead of t's own."""
    if t is None:
        return _ABSENT
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype if as_dtype is None else as_dtype,
           t.device)
    packed = _packs.get(key)
    if packed is None:
        packed = _pack_new(t, name, as_dtype)
        if len(_packs) >= _PACKS_MAX:
            _packs.clear()
        _packs[key] = packed
    return packed


def _pack_new(t, name, as_dtype=None):
    if as_dtype is None:
        where = _where.get((t.dtype, t.device)) or _classify(t, name)
    else:
        where = (as_dtype, *_device_of(t, name))
    shape = t.shape
    rank = len(shape)
    if rank == 0:
        shape, stride, rank = (1,), (1,), 1
    elif rank > L.MAX_RANK:
        raise L.InvalidArgument("%s: rank %d > %d" % (name, rank, L.MAX_RANK))
    else:
        stride = t.stride()
    pad = _PAD[rank]
    return _TENSOR.pack(t.data_ptr(), where[0], rank, *shape, *pad, *stride, *pad, where[1],
                        where[2])


def view(t, name="tensor"):
    """The coda_tensor of a torch tensor (absent for None). A 0-dim tensor is a [1] vector.
    Strides are passed as they are; coda's validation rejects what it cannot run."""
    return L.Tensor.from_buffer_copy(_packed(t, name))


def _tensor_fields(cls, prefix=""):
    """The dotted names of a Structure's coda_tensor fields in memory order, or None when it
    holds anything else."""
    names = []
    for field, ftype in cls._fields_:
        if ftype is L.Tensor:
            names.append(prefix + field)
        elif isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
            inner = _tensor_fields(ftype, prefix + field + ".")
            if inner is None:
                return None
            names.extend(inner)
        else:
            return None
    return names


_layouts = {}


def pack(cls, *tensors):
    """A `cls` (a ctypes Structure made only of coda_tensors, nested ones included, e.g.
    LlamaMiddleInputs: x0, y0, rope.positions, rope.inv_freq) over `tensors` in its fields'
    order (None: absent); errors name the field."""
    names = pack_names(cls)
    if len(tensors) != len(names):
        raise TypeError("%s: %d tensors for %d fields" % (cls.__name__, len(tensors), len(names)))
    return cls.from_buffer_copy(b"".join([_packed(t, n) for t, n in zip(tensors, names)]))


def _pack_bytes(t, dtype, name):
    """The coda_tensor bytes of a torch.uint8 matrix holding E4M3 codes or E8M0 scales (coda
    dtype `dtype`): torch has no E8M0 dtype before 2.7, so the block's FP8 weight copies are
    kept as bytes. None: absent."""
    if t is None:
        return _ABSENT
    if t.dtype != torch.uint8 or t.dim() != 2:
        raise L.DTypeError("%s: an FP8 copy is a 2-D torch.uint8 tensor (E4M3 codes or E8M0 "
                           "scales); got %s of shape %s" % (name, t.dtype, tuple(t.shape)),
                           L.TYPE_ERROR)
    return _packed(t, name, as_dtype=dtype)


def pack_fp8_weights(cls, tensors):
    """A coda_llama_*_fp8_weights `cls` over `tensors`: for each of its weights, in its fields'
    order, codes, scales, codes_t and scales_t (torch.uint8; coda.ops.llama_fp8_weights makes
    them). Empty: every field absent (the call quantizes its own)."""
    names = pack_names(cls)
    if not tensors:
        return cls()
    if len(tensors) != len(names):
        raise TypeError("%s: %d tensors for %d fields (codes, scales, codes_t, scales_t of each "
                        "weight)" % (cls.__name__, len(tensors), len(names)))
    # Codes and scales alternate: codes, scales, codes_t, scales_t.
    return cls.from_buffer_copy(b"".join(
        [_pack_bytes(t, L.E8M0 if i % 2 else L.E4M3, "fp8_weights." + n)
         for i, (t, n) in enumerate(zip(tensors, names))]))


def pack_names(cls):
    """The dotted names of a struct of coda_tensors' fields, in order."""
    names = _layouts.get(cls)
    if names is None:
        names = _tensor_fields(cls)
        if names is None or len(names) * _TENSOR.size != ctypes.sizeof(cls):
            raise TypeError("%s is not a struct of coda_tensors" % cls.__name__)
        _layouts[cls] = names
    return names


def pack_inputs(cls, fp8_weights, *tensors):
    """A layer's inputs struct `cls` (LlamaFirstInputs, ...) over `tensors` in its fields' order
    but for its last, fp8_weights, which holds the FP8 copies `fp8_weights` (pack_fp8_weights;
    empty: absent)."""
    fp8_cls = dict(cls._fields_)["fp8_weights"]
    inputs = pack(cls, *tensors, *(None,) * len(pack_names(fp8_cls)))
    if fp8_weights:
        inputs.fp8_weights = pack_fp8_weights(fp8_cls, fp8_weights)
    return inputs


# The current stream's cudaStream_t without making a torch.cuda.Stream object (what
# torch.cuda.current_stream() returns costs microseconds per call); torch before 2.0 lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(t):
    """The current torch stream of t's device as a coda_stream_t (None on the CPU)."""
    if not t.is_cuda:
        return None
    if _raw_stream is not None:
        return _raw_stream(t.get_device()) or None
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
    if buf.is_cuda:
        device, index = L.DEVICE_CUDA, buf.get_device()
    else:
        device, index = L.DEVICE_CPU, 0
    return L.Tensor.from_buffer_copy(_TENSOR.pack(buf.data_ptr(), L.I32, 1, words, *_PAD[1], 1,
                                                  *_PAD[1], device, index))


_llama_ws = {}


def llama_workspace_bytes(layer, pass_, config, tokens, device,
                          copies=L.LLAMA_FP8_WEIGHTS_IN_WORKSPACE):
    """coda_llama_workspace_size, cached per (layer, pass, config, tokens, device); `copies`
    L.LLAMA_FP8_WEIGHTS_GIVEN: the smaller size of a call given its weights' FP8 copies
    (coda_llama_fp8_workspace_size). Call it with the device current (device_guard) for a
    backward."""
    key = (
        layer,
        pass_,
        config.hidden,
        config.intermediate,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
        config.vocab,
        config.precision,  # FP8 adds its operands' E4M3 copies to the workspace
        copies,  # ... but for the weights' where they are given
        int(tokens),
        device_key(device),
    )
    n = _llama_ws.get(key)
    if n is None:
        if copies == L.LLAMA_FP8_WEIGHTS_IN_WORKSPACE:
            n = L.llama_workspace_size(layer, pass_, config, tokens)
        else:
            n = L.llama_fp8_workspace_size(layer, pass_, config, tokens, copies)
        _llama_ws[key] = n
    return n


def carries_fp8_weights(inputs):
    """Whether a layer's packed inputs struct (pack_inputs) carries the weights' FP8 copies: its
    fp8_weights' first tensor is given (a layer's copies are given all or none)."""
    fp8 = inputs.fp8_weights
    first = getattr(fp8, fp8._fields_[0][0])  # a coda_llama_fp8_weight
    return bool(first.codes.data)


_gemm_ws = {}


def gemm_workspace_bytes(args, key, device):
    """coda_gemm_workspace_size(args), cached under `key` (shapes, dtypes, layout) and device."""
    full = key + (device_key(device),)
    n = _gemm_ws.get(full)
    if n is None:
        n = L.gemm_workspace_size(args)
        _gemm_ws[full] = n
    return n
