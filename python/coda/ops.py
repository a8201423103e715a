"""coda's kernels as torch custom ops (namespace ``coda``), with fake (meta) implementations
for torch.compile and autograd formulas.

Ops (``torch.ops.coda.*``):

=============================  ===============================================================
``gemm``                       D = alpha op(A) op(B) + beta C; layouts fwd / dgrad / wgrad
``interleave_gate_up``         [gate; up] rows -> coda's interleaved gate/up rows
``deinterleave_gate_up``       the inverse
``llama_first_forward``        x -> qkv of layer 0 (and the saved rstd)
``llama_first_backward``       dqkv -> dx and the weight gradients
``llama_middle_forward``       (x0, y0) -> (x2, qkv) (and the saved x1, z1, r1, r2)
``llama_middle_backward``      (dx2, dqkv) -> dx0, dy0 and the weight gradients (mutates z1
                               and r2)
``llama_last_forward``         (x0, y0, targets) -> loss [, logits] (and the saved tensors)
``llama_last_backward``        dloss -> dx0, dy0 and the weight gradients (mutates z1)
=============================  ===============================================================

The forward ops return their outputs followed by the tensors their backward needs; those and
the logits are non-differentiable. The middle and last backward ops write d loss / d z1 over the
saved z1 (it needs no workspace then), so each runs once per forward: a second backward through
the same graph raises. The middle backward runs as the C ABI's two parts, each part's gradients
allocated just before it (zeta1 passes from one to the other over the saved r2), in either
precision. Weight gradients are returned (never
accumulated in place): autograd accumulates them. Each call runs on
``torch.cuda.current_stream()`` of its tensors' device (or synchronously on the CPU backend for
CPU tensors) and takes its workspace from the caching allocator.

The layer ops' non-tensor arguments are n_heads, n_kv_heads, head_dim, eps and precision (0:
native 16-bit GEMMs, 1: FP8, ``coda_llama_precision``), then, for the last layer, ignore_index,
reduction (and the forward's return_logits); last, every layer op takes fp8_weights, the FP8
copies of its GEMM weights (``llama_fp8_weights``; an empty list: the op quantizes its own).

The functions at the bottom (``gemm``, ``llama_first``, ``llama_middle``, ``llama_last``, ...)
are the Python-friendly entry points: they convert positions/targets, accept weights as a dict
or tuple and return only the user-facing outputs. Plain eager calls skip the dispatcher (unless
``set_eager_bypass(False)`` or ``CODA_EAGER_BYPASS=0``): the same implementation and autograd
formulas run through a plain ``torch.autograd.Function``; under torch.compile, a torch function
or dispatch mode, a functorch transform or with tensor subclasses among the arguments the custom
ops are used.
"""

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib as L
from . import _torch as T

__all__ = [
    "BlockConfig",
    "block_config",
    "gemm",
    "interleave_gate_up",
    "deinterleave_gate_up",
    "llama_first",
    "llama_middle",
    "llama_last",
    "llama_fp8_weights",
    "FIRST_WEIGHTS",
    "MIDDLE_WEIGHTS",
    "LAST_WEIGHTS",
    "set_eager_bypass",
]

FIRST_WEIGHTS = ("attn_norm", "w_qkv")
MIDDLE_WEIGHTS = ("w_out", "ffn_norm", "w_gate_up", "w_down", "attn_norm", "w_qkv")
LAST_WEIGHTS = ("w_out", "ffn_norm", "w_gate_up", "w_down", "final_norm", "lm_head")
# The GEMM weights of each layer with FP8 copies (llama_fp8_weights), in the C structs' order.
FP8_WEIGHTS = {"first": ("w_qkv",), "middle": ("w_out", "w_gate_up", "w_down", "w_qkv"),
               "last": ("w_out", "w_gate_up", "w_down")}

_LAYOUTS = {"fwd": L.GEMM_FWD, "dgrad": L.GEMM_DGRAD, "wgrad": L.GEMM_WGRAD}
_REDUCTIONS = {"mean": L.LOSS_MEAN, "sum": L.LOSS_SUM}
# BlockConfig.precision -> coda_llama_config.precision, the int the layer ops take.
_PRECISIONS = {"native": L.LLAMA_NATIVE, "fp8": L.LLAMA_FP8}

# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class BlockConfig:
    """What a block call needs besides the tensors' shapes (hidden, intermediate and vocab
    come from the weights).

    precision: "native" (the GEMMs on the 16-bit activations and weights) or "fp8" (every
    layer GEMM but the LM head's on block-scaled E4M3 copies of its operands, quantized by
    coda in the call; docs/python.md, "FP8")."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float = 1e-6
    ignore_index: int = -100
    precision: str = "native"

    def __post_init__(self):
        if self.precision not in tuple(_PRECISIONS):
            raise ValueError("BlockConfig.precision must be one of %s; got %r"
                             % (", ".join(repr(p) for p in _PRECISIONS), self.precision))


def block_config(config):
    """A BlockConfig from a BlockConfig, a coda.models.LlamaConfig or a Hugging Face
    LlamaConfig (Hugging Face field names), or a dict of either's fields. An optional
    "precision" field ("native" or "fp8") is read from either; absent or None: "native"."""
    if isinstance(config, BlockConfig):
        return config
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    precision = get("precision") or "native"
    if get("n_heads") is not None:
        return BlockConfig(
            int(get("n_heads")),
            int(get("n_kv_heads")),
            int(get("head_dim")),
            float(get("eps", 1e-6)),
            int(get("ignore_index", -100)),
            precision,
        )
    heads = int(get("num_attention_heads"))
    kv = get("num_key_value_heads")
    head_dim = get("head_dim") or int(get("hidden_size")) // heads
    return BlockConfig(
        heads, int(kv if kv is not None else heads), int(head_dim),
        float(get("rms_norm_eps", 1e-6)), precision=precision,
    )


def _c_config(hidden, intermediate, n_heads, n_kv_heads, head_dim, vocab, eps,
              ignore_index=-100, reduction=L.LOSS_MEAN, precision=L.LLAMA_NATIVE):
    return L.LlamaConfig(
        hidden=int(hidden),
        intermediate=int(intermediate),
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv_heads),
        head_dim=int(head_dim),
        vocab=int(vocab),
        eps=float(eps),
        ignore_index=int(ignore_index),
        loss_reduction=int(reduction),
        precision=int(precision),
    )


def _qkv_width(n_heads, n_kv_heads, head_dim):
    return (n_heads + 2 * n_kv_heads) * head_dim


def _f32(t):
    return t.new_empty(t.shape[0], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Op definition: the custom op, and the same implementation behind an autograd.Function for the
# eager bypass.
#
# Plain eager calls skip torch.library's dispatcher by default: its autograd wrapper, redispatch
# and backend wrapper are host time the GPU waits for when a pass is short (about 0.1 ms of a
# Llama-1B layer's 1.5 ms forward, docs/python.md "Host time per call"), and in plain eager code
# nothing needs them. Where something does (torch.compile, a torch function or dispatch mode such
# as FakeTensorMode or FlopCounterMode, a functorch transform, a tensor subclass such as DTensor
# among the arguments), calls go through the dispatcher (_plain_eager). CODA_EAGER_BYPASS=0 or
# set_eager_bypass(False) sends every call through it.

_EAGER_BYPASS = os.environ.get("CODA_EAGER_BYPASS", "1") not in ("", "0")


def set_eager_bypass(enabled=True):
    """Whether plain eager calls of the functional API skip the torch dispatcher (the default),
    running the same implementation and autograd formulas through a plain autograd.Function.
    Returns the previous setting."""
    global _EAGER_BYPASS
    previous, _EAGER_BYPASS = _EAGER_BYPASS, bool(enabled)
    return previous


class _Spec:
    def __init__(self, name, impl, op, setup=None, backward=None):
        self.name, self.impl, self.op = name, impl, op
        self.setup, self.backward = setup, backward


# torch.library.custom_op came with torch 2.4; older versions run the implementation through
# the autograd.Function below (eager only: no torch.compile support there).
HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op")


def _define(name, impl, fake, setup=None, backward=None, mutates=()):
    op = None
    if HAS_CUSTOM_OPS:
        definition = torch.library.custom_op("coda::" + name, mutates_args=mutates)(impl)
        definition.register_fake(fake)
        if backward is not None:
            definition.register_autograd(backward, setup_context=setup)
        op = getattr(torch.ops.coda, name).default  # the OpOverload: a direct dispatcher call
    return _Spec(name, impl, op, setup, backward)


class _Bypass(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, *args):
        out = spec.impl(*args)
        ctx.coda_spec = spec
        spec.setup(ctx, args, out)
        return out

    @staticmethod
    def backward(ctx, *grads):
        ctx.coda_needs_input_grad = ctx.needs_input_grad[1:]  # without `spec`
        result = ctx.coda_spec.backward(ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        return (None,) + result


def _compiling():
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    return False


def _needs_input_grad(ctx):
    return getattr(ctx, "coda_needs_input_grad", None) or ctx.needs_input_grad


# nn.Parameter is a plain tensor here (a model's weights); any other subclass may rely on the
# dispatcher (__torch_dispatch__ / __torch_function__).
_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


def _no_mode_or_transform():
    """No torch function mode, dispatch mode or functorch transform is active (each would see a
    dispatcher call, and not a bypassed one, as one op). False where torch cannot tell."""
    C = torch._C
    try:
        return (C._len_torch_function_stack() == 0 and C._len_torch_dispatch_stack() == 0
                and not C._are_functorch_transforms_active())
    except AttributeError:
        return False


def _plain_arguments(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            if not _plain_arguments(a):
                return False
        elif isinstance(a, Tensor) and type(a) not in _PLAIN_TENSOR_TYPES:
            return False
    return True


def _plain_eager(args):
    """A call the eager bypass may take: not traced by a compiler, no mode or transform active,
    only plain tensors (and parameters) among the arguments."""
    return not _compiling() and _no_mode_or_transform() and _plain_arguments(args)


def _bypassing(args):
    return _EAGER_BYPASS and _plain_eager(args)


_profiling = getattr(torch.autograd, "_profiler_enabled", lambda: False)


def _run(spec, *args):
    """Call an op: through the dispatcher, or (the eager bypass, or a torch without custom ops)
    its implementation directly, under its autograd.Function where a gradient is needed. While
    the torch profiler records, a bypassed call is a range named as the op (coda::<name>), as a
    dispatcher call is an op of that name."""
    if spec.op is not None and not _bypassing(args):
        return spec.op(*args)
    if _profiling():
        with torch.autograd.profiler.record_function("coda::" + spec.name):
            return _run_bypassed(spec, args)
    return _run_bypassed(spec, args)


def _run_bypassed(spec, args):
    if (
        spec.backward is not None
        and torch.is_grad_enabled()
        and any(isinstance(a, Tensor) and a.requires_grad for a in args)
    ):
        return _Bypass.apply(spec, *args)
    return spec.impl(*args)


def _grads_only(ctx, *outputs):
    """setup_context boilerplate: `outputs` carry no gradient; unused output gradients arrive
    as None instead of zero tensors."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


def _dense(g, like):
    """An incoming gradient as the contiguous tensor coda reads (zeros when None)."""
    if g is None:
        return torch.zeros_like(like, memory_format=torch.contiguous_format)
    if g.dtype == like.dtype and g.is_contiguous():
        return g  # what .to().contiguous() returns, without two calls through the dispatcher
    return g.to(like.dtype).contiguous()


# ---------------------------------------------------------------------------------------------
# gemm


def _gemm_shape(a, b, layout):
    if layout == L.GEMM_FWD:
        return (a.shape[0], b.shape[0])
    if layout == L.GEMM_DGRAD:
        return (a.shape[0], b.shape[1])
    return (a.shape[1], b.shape[1])


def _gemm_impl(
    a: Tensor,
    b: Tensor,
    layout: int,
    c: Optional[Tensor],
    alpha: float,
    beta: float,
    out_dtype: Optional[torch.dtype],
) -> Tensor:
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else a.dtype)
    d = torch.empty(_gemm_shape(a, b, layout), dtype=dtype, device=a.device)
    args = L.GemmArgs()
    args.layout = layout
    args.a, args.b, args.d = T.view(a, "a"), T.view(b, "b"), T.view(d, "d")
    args.c = T.view(c, "c")
    args.alpha = L.scalar(alpha)
    args.beta = beta
    key = (layout, tuple(a.shape), tuple(b.shape), a.dtype, dtype, c is not None)
    with T.device_guard(a.device):
        nbytes = T.gemm_workspace_bytes(args, key, a.device)
        if nbytes:
            ws, args.workspace = T.workspace(nbytes, a.device)
        L.gemm(args, T.stream(a))
    return d


def _gemm_fake(a, b, layout, c, alpha, beta, out_dtype):
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else a.dtype)
    return a.new_empty(_gemm_shape(a, b, layout), dtype=dtype)


def _gemm_setup(ctx, inputs, output):
    a, b, layout, c, alpha, beta, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.layout, ctx.alpha, ctx.beta = layout, alpha, beta
    ctx.c_dtype = c.dtype if c is not None else None


def _gemm_backward(ctx, dd):
    a, b = ctx.saved_tensors
    needs = _needs_input_grad(ctx)
    need_a, need_b, need_c = needs[0], needs[1], needs[3]
    g = dd.to(a.dtype).contiguous()  # coda's GEMM operands are 16-bit
    alpha, layout = ctx.alpha, ctx.layout
    da = db = dc = None
    if layout == L.GEMM_FWD:  # D = A B^T: dA = dD B, dB = dD^T A
        if need_a:
            da = _run(_GEMM, g, b, L.GEMM_DGRAD, None, alpha, 0.0, a.dtype)
        if need_b:
            db = _run(_GEMM, g, a, L.GEMM_WGRAD, None, alpha, 0.0, b.dtype)
    elif layout == L.GEMM_DGRAD:  # D = A B: dA = dD B^T, dB = A^T dD
        if need_a:
            da = _run(_GEMM, g, b, L.GEMM_FWD, None, alpha, 0.0, a.dtype)
        if need_b:
            db = _run(_GEMM, a, g, L.GEMM_WGRAD, None, alpha, 0.0, b.dtype)
    else:  # D = A^T B: dA = B dD^T, dB = A dD
        if need_a:
            da = _run(_GEMM, b, g, L.GEMM_FWD, None, alpha, 0.0, a.dtype)
        if need_b:
            db = _run(_GEMM, a, g, L.GEMM_DGRAD, None, alpha, 0.0, b.dtype)
    if need_c and ctx.c_dtype is not None:
        dc = (dd * ctx.beta).to(ctx.c_dtype)
    return da, db, None, dc, None, None, None


_GEMM = _define("gemm", _gemm_impl, _gemm_fake, _gemm_setup, _gemm_backward)

# ---------------------------------------------------------------------------------------------
# gate/up converters


def _gate_up_impl(fn, src, name):
    dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    with T.device_guard(src.device):
        fn(T.view(src, name), T.view(dst, "out"), T.stream(src))
    return dst


def _interleave_impl(stacked: Tensor) -> Tensor:
    return _gate_up_impl(L.interleave_gate_up, stacked, "stacked")


def _deinterleave_impl(fused: Tensor) -> Tensor:
    return _gate_up_impl(L.deinterleave_gate_up, fused, "fused")


def _like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _interleave_fake(stacked):
    return _like(stacked)


def _deinterleave_fake(fused):
    return _like(fused)


def _no_setup(ctx, inputs, output):
    pass


def _interleave_backward(ctx, g):
    return _run(_DEINTERLEAVE, g.contiguous())


def _deinterleave_backward(ctx, g):
    return _run(_INTERLEAVE, g.contiguous())


_INTERLEAVE = _define(
    "interleave_gate_up", _interleave_impl, _interleave_fake, _no_setup, _interleave_backward
)
_DEINTERLEAVE = _define(
    "deinterleave_gate_up", _deinterleave_impl, _deinterleave_fake, _no_setup,
    _deinterleave_backward
)

# ---------------------------------------------------------------------------------------------
# First layer: x -> RMSNorm -> QKV -> RoPE


_LAYERS = {"first": L.LLAMA_FIRST, "middle": L.LLAMA_MIDDLE, "last": L.LLAMA_LAST}


def _run_layer(layer, pass_, cfg, m, x, *args):
    """One coda.llama call (`args`: weights, inputs, outputs, saved[, grads]) on x's device and
    current stream, with a workspace of the size coda asks for (the smaller one where the inputs
    carry the weights' FP8 copies), freed when it returns (weight gradients written, not
    accumulated: autograd accumulates). pass_: L.LLAMA_FORWARD, LLAMA_BACKWARD, or one of the
    middle backward's two parts (LLAMA_BACKWARD_PART1/2)."""
    copies = (L.LLAMA_FP8_WEIGHTS_GIVEN if T.carries_fp8_weights(args[1])
              else L.LLAMA_FP8_WEIGHTS_IN_WORKSPACE)
    with T.device_guard(x.device):
        n = T.llama_workspace_bytes(_LAYERS[layer], pass_, cfg, m, x.device, copies)
        ws, ws_desc = T.workspace(n, x.device)  # ws keeps the buffer alive through the call
        if pass_ == L.LLAMA_FORWARD:
            L.llama_forward(layer, cfg, *args, ws_desc, T.stream(x))
        elif pass_ == L.LLAMA_BACKWARD:
            L.llama_backward(layer, cfg, *args, False, ws_desc, T.stream(x))
        else:
            L.llama_middle_backward_part(pass_, cfg, *args, False, ws_desc, T.stream(x))


def _first_forward_impl(
    x: Tensor,
    attn_norm: Tensor,
    w_qkv: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor]:
    m, d = x.shape[0], x.shape[-1]
    qkv = x.new_empty((m, _qkv_width(n_heads, n_kv_heads, head_dim)))
    rstd = _f32(x)
    cfg = _c_config(d, 0, n_heads, n_kv_heads, head_dim, 0, eps, precision=precision)
    w = T.pack(L.LlamaFirstWeights, attn_norm, w_qkv)
    inputs = T.pack_inputs(L.LlamaFirstInputs, fp8_weights, x, positions, inv_freq)
    outputs = T.pack(L.LlamaFirstOutputs, qkv)
    saved = T.pack(L.LlamaFirstSaved, rstd)
    _run_layer("first", L.LLAMA_FORWARD, cfg, m, x, w, inputs, outputs, saved)
    return qkv, rstd


def _first_forward_fake(x, attn_norm, w_qkv, positions, inv_freq, n_heads, n_kv_heads,
                        head_dim, eps, precision, fp8_weights):
    return x.new_empty((x.shape[0], _qkv_width(n_heads, n_kv_heads, head_dim))), _f32(x)


def _first_backward_impl(
    dqkv: Tensor,
    x: Tensor,
    attn_norm: Tensor,
    w_qkv: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    qkv: Tensor,
    rstd: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    m, d = x.shape[0], x.shape[-1]
    dx = torch.zeros_like(x, memory_format=torch.contiguous_format)  # accumulated into
    d_attn_norm = torch.empty_like(attn_norm, memory_format=torch.contiguous_format)
    d_w_qkv = torch.empty_like(w_qkv, memory_format=torch.contiguous_format)
    cfg = _c_config(d, 0, n_heads, n_kv_heads, head_dim, 0, eps, precision=precision)
    w = T.pack(L.LlamaFirstWeights, attn_norm, w_qkv)
    inputs = T.pack_inputs(L.LlamaFirstInputs, fp8_weights, x, positions, inv_freq)
    outputs = T.pack(L.LlamaFirstOutputs, qkv)
    saved = T.pack(L.LlamaFirstSaved, rstd)
    grads = T.pack(L.LlamaFirstGrads, dx, dqkv, d_attn_norm, d_w_qkv)
    _run_layer("first", L.LLAMA_BACKWARD, cfg, m, x, w, inputs, outputs, saved, grads)
    return dx, d_attn_norm, d_w_qkv


def _first_backward_fake(dqkv, x, attn_norm, w_qkv, positions, inv_freq, qkv, rstd, n_heads,
                         n_kv_heads, head_dim, eps, precision, fp8_weights):
    return _like(x), _like(attn_norm), _like(w_qkv)


_FIRST_BWD = _define("llama_first_backward", _first_backward_impl, _first_backward_fake)


def _with_fp8_weights_grads(ctx, grads):
    """A layer op's backward result, whose last input is the list fp8_weights: through the
    dispatcher (a custom op's autograd) its gradient is a list of the list's length, one None per
    copy, as torch checks the structure against the inputs'; through the eager bypass
    (_Bypass, an autograd.Function) the list is one non-tensor argument, whose gradient is None."""
    if getattr(ctx, "coda_spec", None) is not None:
        return grads
    return grads[:-1] + ([None] * ctx.coda_fp8_count,)


def _first_setup(ctx, inputs, output):
    (x, attn_norm, w_qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim, eps, precision,
     fp8_weights) = inputs
    qkv, rstd = output
    _grads_only(ctx, rstd)
    ctx.save_for_backward(x, attn_norm, w_qkv, positions, inv_freq, qkv, rstd, *fp8_weights)
    ctx.cfg = (n_heads, n_kv_heads, head_dim, eps, precision)
    ctx.coda_fp8_count = len(fp8_weights)


def _first_backward(ctx, dqkv, _drstd):
    if dqkv is None:
        return _with_fp8_weights_grads(ctx, (None,) * 11)
    x, attn_norm, w_qkv, positions, inv_freq, qkv, rstd, *fp8_weights = ctx.saved_tensors
    dx, dg, dw = _run(_FIRST_BWD, _dense(dqkv, qkv), x, attn_norm, w_qkv, positions, inv_freq,
                      qkv, rstd, *ctx.cfg, fp8_weights)
    # inputs: x, attn_norm, w_qkv, positions, inv_freq, 5 non-tensors (n_heads .. precision),
    # fp8_weights
    return _with_fp8_weights_grads(
        ctx, (dx, dg, dw, None, None, None, None, None, None, None, None))


_FIRST_FWD = _define(
    "llama_first_forward", _first_forward_impl, _first_forward_fake, _first_setup, _first_backward
)

# ---------------------------------------------------------------------------------------------
# Middle layer: (x0, y0) -> out-proj + residual -> RMSNorm -> SwiGLU MLP + residual = x2
#               -> RMSNorm -> QKV of the next layer -> RoPE


def _middle_tensors(x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv, positions,
                    inv_freq, x2, qkv, x1, z1, r1, r2, fp8_weights=()):
    return (T.pack(L.LlamaMiddleWeights, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv),
            T.pack_inputs(L.LlamaMiddleInputs, fp8_weights, x0, y0, positions, inv_freq),
            T.pack(L.LlamaMiddleOutputs, x2, qkv),
            T.pack(L.LlamaMiddleSaved, x1, z1, r1, r2))


def _middle_forward_impl(
    x0: Tensor,
    y0: Tensor,
    w_out: Tensor,
    ffn_norm: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    attn_norm: Tensor,
    w_qkv: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    x2, qkv, x1, z1, r1, r2 = _middle_forward_fake(
        x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv, positions, inv_freq,
        n_heads, n_kv_heads, head_dim, eps, precision, fp8_weights)
    m, d, f = x0.shape[0], x0.shape[-1], w_down.shape[-1]
    cfg = _c_config(d, f, n_heads, n_kv_heads, head_dim, 0, eps, precision=precision)
    w, inputs, outputs, saved = _middle_tensors(x0, y0, w_out, ffn_norm, w_gate_up, w_down,
                                                attn_norm, w_qkv, positions, inv_freq, x2, qkv,
                                                x1, z1, r1, r2, fp8_weights)
    _run_layer("middle", L.LLAMA_FORWARD, cfg, m, x0, w, inputs, outputs, saved)
    return x2, qkv, x1, z1, r1, r2


def _middle_forward_fake(x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv,
                         positions, inv_freq, n_heads, n_kv_heads, head_dim, eps, precision,
                         fp8_weights=()):
    m, d, f = x0.shape[0], x0.shape[-1], w_down.shape[-1]
    return (
        x0.new_empty((m, d)),
        x0.new_empty((m, _qkv_width(n_heads, n_kv_heads, head_dim))),
        x0.new_empty((m, d)),
        x0.new_empty((m, 2 * f)),
        _f32(x0),
        _f32(x0),
    )


def _middle_backward_impl(
    dx2: Tensor,
    dqkv: Tensor,
    x0: Tensor,
    y0: Tensor,
    w_out: Tensor,
    ffn_norm: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    attn_norm: Tensor,
    w_qkv: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    x2: Tensor,
    qkv: Tensor,
    x1: Tensor,
    z1: Tensor,
    r1: Tensor,
    r2: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _middle_backward_in_parts(dx2, dqkv, x0, y0, w_out, ffn_norm, w_gate_up, w_down,
                                     attn_norm, w_qkv, positions, inv_freq, x2, [qkv], x1, z1,
                                     r1, r2, n_heads, n_kv_heads, head_dim, eps, precision,
                                     fp8_weights)


def _middle_backward_in_parts(dx2, dqkv, x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm,
                              w_qkv, positions, inv_freq, x2, qkv_holder, x1, z1, r1, r2,
                              n_heads, n_kv_heads, head_dim, eps, precision, fp8_weights):
    """The middle backward as its two C calls. qkv comes in a one-item list that is emptied
    after part 1, the only part that reads it: where the list held the last reference (the eager
    op, _middle_backward), qkv's memory is free for part 2's gradients."""
    m, d, f = x0.shape[0], x0.shape[-1], w_down.shape[-1]
    cfg = _c_config(d, f, n_heads, n_kv_heads, head_dim, 0, eps, precision=precision)
    dx = dx2.clone(memory_format=torch.contiguous_format)  # in: d/d x2, out: d/d x0
    w, inputs, outputs, saved = _middle_tensors(x0, y0, w_out, ffn_norm, w_gate_up, w_down,
                                                attn_norm, w_qkv, positions, inv_freq, x2,
                                                qkv_holder[0], x1, z1, r1, r2, fp8_weights)

    def empty(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    # In two parts, each part's gradients allocated just before it: the peak of one call holds
    # every gradient beside its largest scratch (docs/python.md, "The backward's transient").
    # Part 1 (B0..B4) leaves d/d z1 over z1 and zeta1 over r2 for part 2 (B5..B8).
    d_down, d_attn, d_qkv = empty(w_down), empty(attn_norm), empty(w_qkv)
    grads = T.pack(L.LlamaMiddleGrads, dx, dqkv, None, None, None, None, d_down, d_attn, d_qkv)
    _run_layer("middle", L.LLAMA_BACKWARD_PART1, cfg, m, x0, w, inputs, outputs, saved, grads)
    # Part 2 does not read qkv (coda/block/llama.hpp: outputs.qkv may be absent there). Freed
    # memory is reused in stream order: part 1's kernels are queued before anything reuses it.
    del qkv_holder[0]
    outputs = T.pack(L.LlamaMiddleOutputs, x2, None)
    dy0, d_out, d_ffn, d_gate_up = empty(y0), empty(w_out), empty(ffn_norm), empty(w_gate_up)
    grads = T.pack(L.LlamaMiddleGrads, dx, None, dy0, d_out, d_ffn, d_gate_up, None, None, None)
    _run_layer("middle", L.LLAMA_BACKWARD_PART2, cfg, m, x0, w, inputs, outputs, saved, grads)
    return (dx, dy0, d_out, d_ffn, d_gate_up, d_down, d_attn, d_qkv)



def _middle_backward_fake(dx2, dqkv, x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm,
                          w_qkv, positions, inv_freq, x2, qkv, x1, z1, r1, r2, n_heads,
                          n_kv_heads, head_dim, eps, precision, fp8_weights):
    return tuple(_like(t) for t in (x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv))


# The layer backwards write d loss / d z1 over the saved z1 (coda/block/llama.hpp, MiddleSaved),
# and the middle one's first part zeta1 over r2: declared, so that torch.compile and opcheck know
# the op changes them.
_MIDDLE_BWD = _define("llama_middle_backward", _middle_backward_impl, _middle_backward_fake,
                      mutates=("z1", "r2"))


def _consume_saved(ctx):
    """A layer's backward overwrites its saved z1, so it runs once per forward: a second
    backward through the same graph (retain_graph=True) raises instead of reading gradients
    where the pre-activation was."""
    if getattr(ctx, "coda_consumed", False):
        raise RuntimeError(
            "coda: this layer's backward already ran for its forward; it overwrites the saved "
            "gate/up pre-activation with its gradient (no workspace for the largest tensor of "
            "the backward), so it cannot run twice. Run the forward again instead of "
            "backward(retain_graph=True) twice.")
    ctx.coda_consumed = True


def _traced(t):
    """True while a compiler traces the code that sees t (dynamo, AOTAutograd's functional and
    fake tensors), False for a plain eager tensor."""
    is_functional = getattr(torch._C, "_is_functional_tensor", None)
    return (_compiling() or type(t) is not torch.Tensor
            or (is_functional is not None and is_functional(t)))


def _overwritable(saved, index):
    """The saved tensor a layer's backward op overwrites (z1, and the middle layer's r2): itself
    when eager, which is the point (no memory for d/d z1), and a copy inside a traced graph:
    AOTAutograd's partitioner cannot keep a forward output that the backward mutates ("Node ...
    was invalid, but is output" from opcheck's aot_dispatch test, torch 2.11), and
    functionalization would copy it anyway (docs/python.md, "K7 in place")."""
    t = saved[index]
    return t.clone() if _traced(t) else t


def _saved_tensors_hooked():
    """True where saved-tensor hooks are active (activation checkpointing, CPU offload, a user's
    torch.autograd.graph.saved_tensors_hooks), or where that cannot be told: every tensor the
    backward reads must then go through them."""
    autograd = getattr(torch._C, "_autograd", None)
    top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return True
    try:
        return top(False) is not None
    except RuntimeError:  # hooks disabled (torch.autograd.graph.disable_saved_tensors_hooks)
        return True


def _middle_setup(ctx, inputs, output):
    x2, qkv, x1, z1, r1, r2 = output
    _grads_only(ctx, x1, z1, r1, r2)
    # Eager and unhooked, qkv (the op's output, 2 x (H + 2 KV) HD bytes a token) is kept beside
    # the saved tensors, as a detached alias (no reference cycle through its grad_fn), so that
    # the backward can drop it after the part that reads it: autograd holds a node's saved
    # tensors until its whole backward returns, and qkv and autograd's dqkv were the two largest
    # tensors at the block's peak (docs/PERFORMANCE.md, block-8b +attn). Its version is checked
    # as autograd checks a saved tensor's. Traced or hooked, it is saved as usual.
    kept_aside = not _traced(qkv) and not _saved_tensors_hooked()
    if kept_aside:
        ctx.coda_qkv, ctx.coda_qkv_version = qkv.detach(), qkv._version
    ctx.save_for_backward(*inputs[:10], x2, None if kept_aside else qkv, x1, z1, r1, r2,
                          *inputs[15])
    ctx.cfg = tuple(inputs[10:15])
    ctx.coda_fp8_count = len(inputs[15])


def _take_kept_qkv(ctx):
    """The middle op's qkv kept aside by _middle_setup, as a one-item list holding the only
    reference left (ctx's is dropped), after the check autograd makes on a saved tensor."""
    qkv = ctx.coda_qkv
    del ctx.coda_qkv
    if qkv._version != ctx.coda_qkv_version:
        raise RuntimeError(
            "coda: qkv, an output of llama_middle that its backward reads, was modified by an "
            "in-place operation (version %d; expected version %d instead). Apply the change "
            "out of place (e.g. q = q * s, not q.mul_(s)), or clone qkv before changing it."
            % (qkv._version, ctx.coda_qkv_version))
    return [qkv]


def _middle_backward(ctx, dx2, dqkv, *_saved_grads):
    if dx2 is None and dqkv is None:
        return _with_fp8_weights_grads(ctx, (None,) * 16)
    _consume_saved(ctx)
    saved = list(ctx.saved_tensors)
    saved, fp8_weights = saved[:16], saved[16:]
    x2 = saved[10]
    saved[13], saved[15] = _overwritable(saved, 13), _overwritable(saved, 15)  # z1, r2
    if hasattr(ctx, "coda_qkv"):
        # Eager (_middle_setup): the implementation itself, so that no caller's frame or
        # dispatcher argument keeps qkv alive through part 2; without grad mode, as the op's
        # call (which has no autograd formula) records nothing even under create_graph.
        holder = _take_kept_qkv(ctx)
        dqkv = _dense(dqkv, holder[0])
        with torch.no_grad():
            grads = _middle_backward_in_parts(_dense(dx2, x2), dqkv, *saved[:11], holder,
                                              *saved[12:], *ctx.cfg, fp8_weights)
    else:
        qkv = saved[11]
        grads = _run(_MIDDLE_BWD, _dense(dx2, x2), _dense(dqkv, qkv), *saved, *ctx.cfg,
                     fp8_weights)
    dx0, dy0 = grads[0], grads[1]
    # inputs: x0, y0, 6 weights, positions, inv_freq, 5 non-tensors (n_heads .. precision),
    # fp8_weights
    return _with_fp8_weights_grads(
        ctx, (dx0, dy0, *grads[2:], None, None, None, None, None, None, None, None))


_MIDDLE_FWD = _define("llama_middle_forward", _middle_forward_impl, _middle_forward_fake,
                      _middle_setup, _middle_backward)

# ---------------------------------------------------------------------------------------------
# Last layer: (x0, y0) -> ... -> x2 -> final RMSNorm -> LM head -> cross-entropy


def _last_tensors(x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head,
                  x1, z1, r1, x2, r2, dlogits, grad_scale, zeta, fp8_weights):
    return (T.pack(L.LlamaLastWeights, w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head),
            T.pack_inputs(L.LlamaLastInputs, fp8_weights, x0, y0, targets),
            T.pack(L.LlamaLastSaved, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta))


def _last_forward_impl(
    x0: Tensor,
    y0: Tensor,
    targets: Tensor,
    w_out: Tensor,
    ffn_norm: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    final_norm: Tensor,
    lm_head: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    ignore_index: int,
    reduction: int,
    return_logits: bool,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    out = _last_forward_fake(x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down, final_norm,
                             lm_head, n_heads, n_kv_heads, head_dim, eps, precision,
                             ignore_index, reduction, return_logits, fp8_weights)
    loss, logits, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta = out
    m, d, f, v = x0.shape[0], x0.shape[-1], w_down.shape[-1], lm_head.shape[0]
    cfg = _c_config(d, f, n_heads, n_kv_heads, head_dim, v, eps, ignore_index, reduction,
                    precision)
    w, inputs, saved = _last_tensors(x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down,
                                     final_norm, lm_head, x1, z1, r1, x2, r2, dlogits,
                                     grad_scale, zeta, fp8_weights)
    outputs = T.pack(L.LlamaLastOutputs, loss, logits if return_logits else None)
    _run_layer("last", L.LLAMA_FORWARD, cfg, m, x0, w, inputs, outputs, saved)
    return out


def _last_forward_fake(x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down, final_norm,
                       lm_head, n_heads, n_kv_heads, head_dim, eps, precision, ignore_index,
                       reduction, return_logits, fp8_weights):
    m, d, f, v = x0.shape[0], x0.shape[-1], w_down.shape[-1], lm_head.shape[0]
    one = x0.new_empty((1,), dtype=torch.float32)
    return (
        one,  # loss
        x0.new_empty((m, v) if return_logits else (0,)),  # logits
        x0.new_empty((m, d)),  # x1
        x0.new_empty((m, 2 * f)),  # z1
        _f32(x0),  # r1
        x0.new_empty((m, d)),  # x2
        _f32(x0),  # r2
        x0.new_empty((m, v)),  # dlogits
        x0.new_empty((1,), dtype=torch.float32),  # grad_scale
        _f32(x0),  # zeta
    )


def _last_backward_impl(
    dloss: Tensor,
    x0: Tensor,
    y0: Tensor,
    targets: Tensor,
    w_out: Tensor,
    ffn_norm: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    final_norm: Tensor,
    lm_head: Tensor,
    x1: Tensor,
    z1: Tensor,
    r1: Tensor,
    x2: Tensor,
    r2: Tensor,
    dlogits: Tensor,
    grad_scale: Tensor,
    zeta: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    precision: int,
    ignore_index: int,
    reduction: int,
    fp8_weights: List[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    m, d, f, v = x0.shape[0], x0.shape[-1], w_down.shape[-1], lm_head.shape[0]
    cfg = _c_config(d, f, n_heads, n_kv_heads, head_dim, v, eps, ignore_index, reduction,
                    precision)
    dx = torch.empty_like(x0, memory_format=torch.contiguous_format)
    dy0 = torch.empty_like(y0, memory_format=torch.contiguous_format)
    dw = [torch.empty_like(t, memory_format=torch.contiguous_format)
          for t in (w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head)]
    w, inputs, saved = _last_tensors(x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down,
                                     final_norm, lm_head, x1, z1, r1, x2, r2, dlogits,
                                     grad_scale, zeta, fp8_weights)
    # d(outer loss)/d(loss) stays on the device: coda reads it there (no host synchronization).
    dloss = dloss.reshape(1).to(torch.float32).contiguous()
    grads = L.LlamaLastGrads(
        dloss=L.scalar(1.0, T.view(dloss, "dloss")),
        dx=T.view(dx),
        dy0=T.view(dy0),
        dweights=T.pack(L.LlamaLastWeights, *dw),
    )
    _run_layer("last", L.LLAMA_BACKWARD, cfg, m, x0, w, inputs, None, saved, grads)
    return (dx, dy0, *dw)


def _last_backward_fake(dloss, x0, y0, targets, w_out, ffn_norm, w_gate_up, w_down, final_norm,
                        lm_head, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta, n_heads,
                        n_kv_heads, head_dim, eps, precision, ignore_index, reduction,
                        fp8_weights):
    return tuple(_like(t) for t in (x0, y0, w_out, ffn_norm, w_gate_up, w_down, final_norm,
                                    lm_head))


_LAST_BWD = _define("llama_last_backward", _last_backward_impl, _last_backward_fake,
                    mutates=("z1",))


def _last_setup(ctx, inputs, output):
    loss, logits, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta = output
    _grads_only(ctx, logits, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta)
    ctx.save_for_backward(*inputs[:9], x1, z1, r1, x2, r2, dlogits, grad_scale, zeta,
                          *inputs[17])
    ctx.cfg = tuple(inputs[9:16])  # n_heads .. reduction (precision after eps)
    ctx.coda_fp8_count = len(inputs[17])


def _last_backward(ctx, dloss, *_other_grads):
    if dloss is None:
        return _with_fp8_weights_grads(ctx, (None,) * 18)
    _consume_saved(ctx)
    saved = list(ctx.saved_tensors)
    saved, fp8_weights = saved[:17], saved[17:]
    saved[10] = _overwritable(saved, 10)  # z1
    grads = _run(_LAST_BWD, dloss, *saved, *ctx.cfg, fp8_weights)
    dx0, dy0 = grads[0], grads[1]
    # inputs: x0, y0, targets, 6 weights, 8 non-tensors (n_heads .. return_logits), fp8_weights
    return _with_fp8_weights_grads(
        ctx, (dx0, dy0, None, *grads[2:], None, None, None, None, None, None, None, None, None))


_LAST_FWD = _define("llama_last_forward", _last_forward_impl, _last_forward_fake, _last_setup,
                    _last_backward)

# ---------------------------------------------------------------------------------------------
# The functional API


def gemm(a, b, layout="fwd", c=None, alpha=1.0, beta=0.0, out_dtype=None):
    """D = alpha * op(A) op(B) + beta * C, differentiable in a, b and c.

    layout "fwd": A [M, K], B [N, K] (nn.Linear's weight), D = A B^T;
    "dgrad": A [M, K], B [K, N], D = A B; "wgrad": A [K, M], B [K, N], D = A^T B.
    A and B are bf16 or f16 (the same); D (and C) bf16, f16 or f32 (out_dtype, default C's
    dtype or A's). On the GPU, C must have D's dtype. N and K multiples of 8; M is free."""
    layout = _LAYOUTS[layout] if isinstance(layout, str) else int(layout)
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1:
        b = b.contiguous()
    return _run(_GEMM, a, b, layout, c, float(alpha), float(beta), out_dtype)


def interleave_gate_up(stacked):
    """Hugging Face's [gate; up] ([2F, K], gate rows first) -> coda's fused rows
    (gate0, up0, gate1, up1, ...). Differentiable."""
    return _run(_INTERLEAVE, stacked.contiguous())


def deinterleave_gate_up(fused):
    """coda's interleaved gate/up rows -> [gate; up]. Differentiable."""
    return _run(_DEINTERLEAVE, fused.contiguous())


def _weights(weights, names):
    if isinstance(weights, dict):
        missing = [n for n in names if n not in weights]
        if missing:
            raise ValueError("weights: missing %s (need %s)" % (missing, ", ".join(names)))
        weights = [weights[n] for n in names]
    else:
        weights = list(weights)
        if len(weights) != len(names):
            raise ValueError("weights: need %d tensors (%s); got %d"
                             % (len(names), ", ".join(names), len(weights)))
    for name, w in zip(names, weights):
        _not_sharded("weights." + name, w)
    return weights


def _not_sharded(name, t):
    """coda's kernels read whole, dense tensors: a DTensor (FSDP2's sharded parameters, tensor
    parallelism) gets an error that says what to do, before torch's dispatch would report a
    missing sharding rule. (By type name: no torch.distributed import on the call path.)"""
    if type(t).__name__ == "DTensor":
        raise TypeError(
            "coda: %s is a DTensor (a sharded parameter, e.g. under FSDP2's fully_shard or "
            "tensor parallelism); coda's kernels read whole, dense weights. Gather it first "
            "(.full_tensor()), or shard the model so that the parameters a coda call reads are "
            "unsharded while it runs: for a coda.models.Llama, fully_shard each group of "
            "model.fsdp_units() (not each decoder layer), then the model (docs/distributed.md, "
            "FSDP2)" % name)


# Both are called on every layer call and usually get what they return: then they return it
# without the reshape / to() calls through the dispatcher (same values, same memory).


def _positions(positions, like):
    if positions.dtype == torch.int32 and positions.dim() == 1 and positions.device == like.device:
        return positions
    return positions.reshape(-1).to(device=like.device, dtype=torch.int32)


def _inv_freq(inv_freq, like):
    if inv_freq.dtype == torch.float32 and inv_freq.device == like.device:
        return inv_freq
    return inv_freq.to(device=like.device, dtype=torch.float32)


def llama_first(x, weights, positions, inv_freq, config, fp8_weights=None):
    """The first layer: x [M, D] (the embedding output) -> qkv [M, (H + 2 KV) head_dim], the
    post-RoPE queries, keys and values of layer 0.

    weights: dict or tuple (attn_norm [D], w_qkv [(H + 2 KV) head_dim, D]); positions [M]
    (per-token RoPE positions, any integer dtype); inv_freq [head_dim / 2] f32; config: a
    BlockConfig, or any config block_config() accepts. fp8_weights (precision "fp8"): the FP8
    copies of these weights, llama_fp8_weights("first", weights, config), made since they last
    changed; None: the op quantizes them itself. The same results either way, bit for bit."""
    c = block_config(config)
    attn_norm, w_qkv = _weights(weights, FIRST_WEIGHTS)
    qkv, _ = _run(_FIRST_FWD, x, attn_norm, w_qkv, _positions(positions, x),
                  _inv_freq(inv_freq, x), c.n_heads, c.n_kv_heads, c.head_dim, c.eps,
                  _PRECISIONS[c.precision], list(fp8_weights or ()))
    return qkv


def llama_middle(x0, y0, weights, positions, inv_freq, config, fp8_weights=None):
    """A middle layer: (x0 [M, D] residual stream, y0 [M, H head_dim] attention output of layer
    l) -> (x2 [M, D] the residual stream leaving layer l, qkv of layer l + 1).

    weights: dict or tuple (w_out, ffn_norm, w_gate_up (interleaved), w_down of layer l;
    attn_norm, w_qkv of layer l + 1). fp8_weights: as llama_first's, of these weights."""
    c = block_config(config)
    w = _weights(weights, MIDDLE_WEIGHTS)
    positions, inv_freq = _positions(positions, x0), _inv_freq(inv_freq, x0)
    # The conditions first: under torch.compile they are false, so the tracer never reaches
    # the extension's loading (a lock, a build).
    if not fp8_weights and _on_host_path(x0, y0, w, positions, inv_freq):
        host = _host_path()
        if host is not None:
            out = host.middle_forward(x0, y0, *w, positions, inv_freq, c.n_heads, c.n_kv_heads,
                                      c.head_dim, c.eps, _PRECISIONS[c.precision],
                                      not _saved_tensors_hooked())
            if out is not None:
                return out
    x2, qkv, *_ = _run(_MIDDLE_FWD, x0, y0, *w, positions, inv_freq, c.n_heads, c.n_kv_heads,
                       c.head_dim, c.eps, _PRECISIONS[c.precision], list(fp8_weights or ()))
    return x2, qkv


_HOST_PATH = []  # [module or None], resolved at the first llama_middle call


def _host_path():
    """coda._host_path's extension, or None (off or not built; docs/python.md, "The C++ host
    path")."""
    if not _HOST_PATH:
        from . import _host_path as H
        _HOST_PATH.append(H.module())
    return _HOST_PATH[0]


def _on_host_path(x0, y0, w, positions, inv_freq):
    """A middle call the C++ host path may take: the eager bypass's (plain eager, no mode,
    transform or tensor subclass; no functional tensor)."""
    return _bypassing((x0, y0, w, positions, inv_freq)) and not _traced(x0)


def llama_last(x0, y0, targets, weights, config, return_logits=False, reduction="mean",
               fp8_weights=None):
    """The last layer: (x0, y0, targets [M]) -> (loss, logits or None).

    targets are the token ids each position predicts, or config.ignore_index (-100); the loss
    is their cross-entropy, "mean" over the non-ignored targets (0 when there are none) or
    "sum". weights: dict or tuple (w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head).
    The loss is differentiable; the logits ([M, V], in the activations' dtype) are not.
    fp8_weights: as llama_first's, of these weights (the LM head has none: it stays 16-bit)."""
    c = block_config(config)
    w = _weights(weights, LAST_WEIGHTS)
    targets = targets.reshape(-1).to(device=x0.device, dtype=torch.int32)
    out = _run(_LAST_FWD, x0, y0, targets, *w, c.n_heads, c.n_kv_heads, c.head_dim, c.eps,
               _PRECISIONS[c.precision], c.ignore_index, _REDUCTIONS[reduction],
               bool(return_logits), list(fp8_weights or ()))
    loss, logits = out[0], out[1]
    return loss.reshape(()), (logits if return_logits else None)


_LAYER_WEIGHTS = {"first": FIRST_WEIGHTS, "middle": MIDDLE_WEIGHTS, "last": LAST_WEIGHTS}
_FP8_WEIGHTS_STRUCTS = {"first": ("LlamaFirstWeights", "LlamaFirstFp8Weights"),
                        "middle": ("LlamaMiddleWeights", "LlamaMiddleFp8Weights"),
                        "last": ("LlamaLastWeights", "LlamaLastFp8Weights")}


@torch.no_grad()
def llama_fp8_weights(layer, weights, config):
    """The FP8 copies of the GEMM weights a layer op reads (layer "first", "middle" or "last";
    FP8_WEIGHTS[layer] names them; the LM head has none), for its fp8_weights argument: per
    weight [N, K] its codes [N, K], scales [ceil(N/128), ceil(K/128)], codes_t [K, N] and
    scales_t [ceil(K/128), ceil(N/128)], torch.uint8 tensors holding E4M3 codes and E8M0 block
    scales (coda/block/llama.hpp, Fp8Weight), both copies of each weight written in one pass
    over it (coda_llama_<layer>_quantize_weights). 2 bytes a parameter: made once per step (the
    weights' forward and backward calls, of every micro-batch, all read them), again after the
    weights change (docs/fp8.md, "The weights quantized once per step").

    weights: as the op takes them (a dict or tuple of all its weights); config: as the op's
    (its precision must be "fp8"). Not differentiable."""
    c = block_config(config)
    w = _weights(weights, _LAYER_WEIGHTS[layer])
    named = dict(zip(_LAYER_WEIGHTS[layer], w))
    shapes = []
    for name in FP8_WEIGHTS[layer]:
        n, k = named[name].shape
        nb, kb = -(-n // 128), -(-k // 128)
        shapes += [(n, k), (nb, kb), (k, n), (kb, nb)]
    # One allocation holds them all, each copy at a 256-byte boundary as the caching allocator
    # places its blocks (TMA reads the codes from 16-byte aligned addresses): one allocator call
    # instead of four a weight, host time that a step's first call pays before its first kernel.
    starts, end = [], 0
    for rows, cols in shapes:
        starts.append(end)
        end += -(-(rows * cols) // 256) * 256
    storage = w[0].new_empty(end, dtype=torch.uint8)
    copies = [storage[o:o + r * c].view(r, c) for o, (r, c) in zip(starts, shapes)]
    # The widths the config's checks need: D and F from the weights; the LM head's rows (the
    # last layer's config names a vocab; the head is not read).
    d = named["w_qkv"].shape[1] if layer == "first" else named["w_out"].shape[0]
    f = named["w_down"].shape[1] if layer != "first" else 0
    v = named["lm_head"].shape[0] if layer == "last" else 0
    cfg = _c_config(d, f, c.n_heads, c.n_kv_heads, c.head_dim, v, c.eps,
                    precision=_PRECISIONS[c.precision])
    weights_cls, fp8_cls = (getattr(L, name) for name in _FP8_WEIGHTS_STRUCTS[layer])
    x = w[0]
    with T.device_guard(x.device):
        L.llama_quantize_weights(layer, cfg, T.pack(weights_cls, *w),
                                 T.pack_fp8_weights(fp8_cls, copies), T.stream(x))
    return copies
