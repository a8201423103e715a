"""A Llama causal LM whose non-attention work runs on coda.

``Llama(config)`` holds its weights in coda's layout: per layer a fused ``w_qkv`` ([Q; K; V]
rows), ``w_out``, ``w_gate_up`` (gate and up rows interleaved: gate0, up0, gate1, up1, ...) and
``w_down``, plus the two RMSNorm weights. Its forward runs the first / middle / last layers of
coda's shifted decomposition (``coda.ops.llama_first/middle/last``) and attention between
them in torch (``scaled_dot_product_attention``, causal, with the padding mask when there is
one), on the post-RoPE q, k, v of the fused qkv. ``coda.from_hf`` builds one from a Hugging Face ``LlamaForCausalLM``.
"""

import dataclasses
import math
import weakref
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from . import ops

__all__ = ["LlamaConfig", "Llama", "LlamaLayer", "AttentionInput", "Mlp", "Fp8WeightCopies",
           "rope_inv_freq", "attention", "padding_keys", "shift_labels", "run_layers"]

_ROPE_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")


def _rope_type(scaling):
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


@dataclass
class LlamaConfig:
    """The Llama architecture, with Hugging Face LlamaConfig's field names.

    rope_scaling: None, or a Llama-3 dict {"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}. Unsupported
    settings raise NotImplementedError; inconsistent ones ValueError."""

    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    vocab_size: int = 32000
    num_hidden_layers: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rope_scaling is not None and _rope_type(self.rope_scaling) == "default":
            self.rope_scaling = None
        self.validate()

    def validate(self):
        for name in ("hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_hidden_layers"):
            if int(getattr(self, name)) < 1:
                raise ValueError("LlamaConfig.%s must be >= 1; got %r" % (name, getattr(self, name)))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)"
                % (self.num_attention_heads, self.num_key_value_heads))
        if self.head_dim % 2:
            raise NotImplementedError(
                "coda's RoPE rotates the halves of a head: head_dim must be even; got %d"
                % self.head_dim)
        widths = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_attention_heads * head_dim": self.num_attention_heads * self.head_dim,
            "(num_attention_heads + 2 * num_key_value_heads) * head_dim":
                (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim,
        }
        for name, value in widths.items():
            if value % 8:
                raise NotImplementedError(
                    "coda's GEMMs need 16-byte rows: %s must be a multiple of 8; got %d (pad it "
                    "to %d)" % (name, value, (value + 7) // 8 * 8))
        if not (self.rms_norm_eps >= 0 and math.isfinite(self.rms_norm_eps)):
            raise ValueError("rms_norm_eps must be finite and >= 0; got %r" % self.rms_norm_eps)
        rope_type = _rope_type(self.rope_scaling)
        if rope_type not in ("default", "llama3"):
            raise NotImplementedError(
                "coda supports the default RoPE and Llama-3 rope scaling; got rope_type %r"
                % rope_type)
        if rope_type == "llama3":
            missing = [k for k in _ROPE_LLAMA3_KEYS if k not in self.rope_scaling]
            if missing:
                raise ValueError("Llama-3 rope_scaling needs %s; missing %s"
                                 % (", ".join(_ROPE_LLAMA3_KEYS), missing))

    @classmethod
    def from_hf(cls, hf_config):
        """From a Hugging Face LlamaConfig (transformers 4.x or 5.x); NotImplementedError for
        what coda does not run (biases, other activations, other rope types, ...)."""
        get = lambda k, d=None: getattr(hf_config, k, d)  # noqa: E731
        model_type = get("model_type", "llama")
        if model_type != "llama":
            raise NotImplementedError("coda runs Llama models; got model_type %r" % model_type)
        if get("hidden_act", "silu") not in ("silu", "swish"):
            raise NotImplementedError(
                "coda's MLP is SwiGLU (hidden_act 'silu'); got %r" % get("hidden_act"))
        for flag in ("attention_bias", "mlp_bias"):
            if get(flag, False):
                raise NotImplementedError("coda's projections have no bias; got %s=True" % flag)
        if float(get("attention_dropout", 0.0) or 0.0) != 0.0:
            raise NotImplementedError(
                "attention dropout is not supported; got attention_dropout=%r"
                % get("attention_dropout"))
        if float(get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
            raise NotImplementedError("partial rotary embeddings are not supported")
        theta, scaling = _hf_rope(hf_config)
        heads = int(get("num_attention_heads"))
        head_dim = get("head_dim") or int(get("hidden_size")) // heads
        return cls(
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_attention_heads=heads,
            num_key_value_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab_size=int(get("vocab_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            max_position_embeddings=int(get("max_position_embeddings", 2048) or 2048),
            initializer_range=float(get("initializer_range", 0.02) or 0.02),
        )

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def block(self, ignore_index=-100, precision="native"):
        """The coda.ops.BlockConfig of this model; precision "native" or "fp8" (ValueError
        otherwise)."""
        return ops.BlockConfig(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                               float(self.rms_norm_eps), int(ignore_index), precision)


def _hf_rope(hf_config):
    """(rope_theta, rope_scaling or None) of a Hugging Face config: transformers 5's
    `rope_parameters` or 4's `rope_theta` / `rope_scaling`."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        if "rope_theta" not in params and any(isinstance(v, dict) for v in params.values()):
            raise NotImplementedError("per-layer-type rope parameters are not supported")
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        scaling = None if _rope_type(params) == "default" else dict(params)
    else:
        theta = getattr(hf_config, "rope_theta", 10000.0)
        scaling = getattr(hf_config, "rope_scaling", None)
        scaling = None if _rope_type(scaling) == "default" else dict(scaling)
    if scaling is not None and float(scaling.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise NotImplementedError("partial rotary embeddings are not supported")
    return theta, scaling


def rope_inv_freq(config):
    """The RoPE frequency table [head_dim / 2] (f32, on the CPU), computed as transformers
    computes it (the same float32 operations in the same order, so the values are equal): the
    default table 1 / theta^(2i / head_dim), then, for Llama-3 rope scaling, the
    _compute_llama3_parameters adjustment."""
    dim = config.head_dim
    base = float(config.rope_theta)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if _rope_type(config.rope_scaling) != "llama3":
        return inv_freq
    s = config.rope_scaling
    factor = s["factor"]
    low_freq_factor = s["low_freq_factor"]
    high_freq_factor = s["high_freq_factor"]
    old_context_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths: divided by factor; short ones: kept; in between: interpolated
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


# ---------------------------------------------------------------------------------------------
# The layer loop, shared by Llama and patched Hugging Face models

_SDPA_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def attention(qkv, batch, seq, block, key_mask=None):
    """Causal self-attention on coda's post-RoPE qkv [B*S, (H + 2 KV) head_dim] -> the attention
    output [B*S, H head_dim] (heads concatenated, as o_proj reads it). Scale 1/sqrt(head_dim),
    no dropout, GQA (query head h reads key/value head h // (H / KV)).

    key_mask: None (every position is a token), or a bool [B, S], False at padding: query i of
    row b then reads the keys j <= i with key_mask[b, j]. A query with no such key (a pad
    position before a left-padded row's first token) gets a zero output, which is what
    Hugging Face's SDPA path gives with torch >= 2.5 (its empty softmax rows are zeros)."""
    return _attend(qkv, batch, seq, block, _padding_mask(key_mask, seq))


def _attend(qkv, batch, seq, block, padding):
    """attention() with its mask made: padding is _padding_mask's pair, made once per forward
    rather than once per layer."""
    h, kv, d = block.n_heads, block.n_kv_heads, block.head_dim
    q, k, v = qkv.view(batch, seq, h + 2 * kv, d).split([h, kv, kv], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    mask, empty = padding
    # Without a mask, is_causal lets SDPA pick its flash kernel.
    masked = {"is_causal": True} if mask is None else {"attn_mask": mask}
    if kv == h:
        o = _sdpa(q, k, v, **masked)
    elif _SDPA_GQA and mask is None:
        o = _sdpa(q, k, v, enable_gqa=True, **masked)
    else:
        # With a mask, enable_gqa makes SDPA fall back to its math kernel (transformers' SDPA
        # path repeats the heads for that reason too): repeated heads keep the fused kernels.
        rep = h // kv
        o = _sdpa(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), **masked)
    if empty is not None:
        o = o.masked_fill(empty, 0.0)
    return o.transpose(1, 2).reshape(batch * seq, h * d)


def _padding_mask(key_mask, seq):
    """(allowed [B, 1, S, S] bool, empty [B, 1, S, 1] bool) for _attend(): causal and not
    padding; a query with no allowed key is given its own position, so that no softmax row is
    empty (torch < 2.5's SDPA returns NaN there, whose gradient would reach the weights through
    the padded rows), and is flagged in `empty` for its output to be zeroed. (None, None)
    without a key_mask."""
    if key_mask is None:
        return None, None
    keys = key_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, S]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=key_mask.device).tril()
    allowed = causal & keys
    empty = ~allowed.any(dim=-1, keepdim=True)
    diagonal = torch.eye(seq, dtype=torch.bool, device=key_mask.device)
    return allowed | (empty & diagonal), empty


def _attention_math(q, k, v, is_causal=False, attn_mask=None):
    """Softmax attention in the inputs' dtype (float32 softmax), for torch without SDPA:
    attn_mask a bool mask (True: attend) broadcast to the scores, or is_causal."""
    scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
    if is_causal:
        s = q.shape[-2]
        attn_mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1).to(q.dtype) @ v


_sdpa = getattr(F, "scaled_dot_product_attention", _attention_math)


def padding_keys(attention_mask, batch, seq):
    """A [B, S] padding mask (nonzero: a token) -> the key_mask attention() takes: None when
    there is no padding (plain causal attention, SDPA's fastest path; eager calls only, see
    below), else a bool [B, S]. Only 2D masks: a 4D one (a custom attention pattern) raises
    NotImplementedError."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise NotImplementedError(
            "coda takes a 2D padding mask [batch, seq]; got a %dD attention_mask (custom "
            "attention patterns are not supported)" % attention_mask.dim())
    if tuple(attention_mask.shape) != (batch, seq):
        raise ValueError("attention_mask: expected shape %s (the inputs'); got %s"
                         % ((batch, seq), tuple(attention_mask.shape)))
    keys = attention_mask != 0
    # Whether anything is padded is known on the mask's device only. Eager calls read it back
    # (one host synchronization, as Hugging Face's mask creation makes) so that an all-ones
    # mask takes the unmasked path. Under torch.compile that read is a graph break (fullgraph
    # raises) and in a CUDA graph capture an error, so there the mask is applied as it is: an
    # all-ones mask removes no key, only SDPA's kernel (and its rounding) differs.
    if _tracing(keys):
        return keys
    if bool(keys.all()):
        return None
    return keys


def _tracing(t):
    """True while torch.compile traces or t's CUDA stream is being captured into a CUDA graph:
    then nothing may wait for the device's values."""
    return ops._compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def shift_labels(labels, ignore_index=-100):
    """Hugging Face's causal-LM targets: position t predicts labels[t + 1]; the last position of
    each row predicts nothing (ignore_index). [B, S] -> [B, S]."""
    return F.pad(labels[:, 1:], (0, 1), value=ignore_index)


class Rope:
    """RoPE's positions (int32) and frequencies (f32) as the layer modules' forward takes them:
    an object, not tensors, because FSDP2 casts the floating-point tensors among a unit's
    forward arguments to its MixedPrecisionPolicy's param_dtype (cast_forward_inputs, on by
    default), which would round the frequencies to bf16 and move every rotation (the first
    FSDP2 run on the H100, 57f4a19: the loss 6.5045 against the plain model's 6.5043)."""

    __slots__ = ("positions", "inv_freq")

    def __init__(self, positions, inv_freq):
        self.positions, self.inv_freq = positions, inv_freq


def run_layers(x, batch, seq, positions, targets, inv_freq, block, layers, final_norm, lm_head,
               return_logits=False, reduction="mean", key_mask=None, checkpoint=False):
    """Embedding output x [B*S, D] -> (loss, logits or None) through coda's first, middle and
    last layers, attention between them. `layers`: a list, one per decoder layer, of dicts with
    the coda-layout weights attn_norm, w_qkv, w_out, ffn_norm, w_gate_up, w_down, or of
    LlamaLayer modules, whose submodules then run the ops (so that FSDP2's hooks on them fire:
    Llama.fsdp_units). key_mask: as
    attention() takes it (None: no padding). checkpoint: keep only each stage's inputs for the
    backward and recompute the rest there (torch.utils.checkpoint; the stages below)."""
    padding = _padding_mask(key_mask, seq)
    # Converted once (int32 positions, f32 inv_freq on x's device), so every layer is handed, and
    # saves for its backward, the same tensors rather than a copy of its own.
    positions, inv_freq = ops._positions(positions, x), ops._inv_freq(inv_freq, x)
    rope = Rope(positions, inv_freq)

    modules = isinstance(layers[0], LlamaLayer)

    def first_stage(x):
        first = layers[0]
        if modules:
            qkv = first.attn_input(x, rope, block)
        else:
            qkv = ops.llama_first(x, (first["attn_norm"], first["w_qkv"]), positions, inv_freq,
                                  block)
        return _attend(qkv, batch, seq, block, padding)

    def middle_stage(layer, following):
        # The weights are closed over, not passed: torch.compile traces a checkpointed function
        # whose arguments are tensors (the parameters it reads become the graph's inputs).
        def run(x, y):
            if modules:
                x, qkv = layer.mlp(x, y, rope, block, following=following.attn_input)
            else:
                x, qkv = ops.llama_middle(
                    x, y,
                    (layer["w_out"], layer["ffn_norm"], layer["w_gate_up"], layer["w_down"],
                     following["attn_norm"], following["w_qkv"]),
                    positions, inv_freq, block)
            return x, _attend(qkv, batch, seq, block, padding)
        return run

    # The stages end after an attention: the tensors crossing a boundary are then the residual
    # stream x [M, D] and the attention output y [M, H head_dim], the least any cut between
    # coda's calls keeps (a cut before the attention would keep qkv [M, (H + 2 KV) head_dim]).
    # The last call is not recomputed: its backward runs first, while every stage's inputs are
    # still held, so recomputing it (the LM head GEMM again) would not lower the peak.
    stage = _recomputed if checkpoint else _called
    y = stage(first_stage, x)
    for layer, following in zip(layers[:-1], layers[1:]):
        x, y = stage(middle_stage(layer, following), x, y)
    last = layers[-1]
    if modules:
        return last.mlp(x, y, rope, block, head=(final_norm, lm_head),
                        targets=targets, return_logits=return_logits, reduction=reduction)
    return ops.llama_last(
        x, y, targets,
        (last["w_out"], last["ffn_norm"], last["w_gate_up"], last["w_down"], final_norm, lm_head),
        block, return_logits=return_logits, reduction=reduction)


def _called(fn, *args):
    return fn(*args)


def _recomputed(fn, *args):
    """fn(*args) under torch.utils.checkpoint: the backward recomputes fn's activations from
    args. Non-reentrant (the one torch recommends, and the one torch.compile traces). No RNG
    state is stashed: a stage draws no random numbers (no dropout), and reading the CUDA
    generator's state is an error inside a CUDA graph capture. coda's kernels and SDPA's
    forward are deterministic, so the recomputed activations are bit for bit the forward's."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                             preserve_rng_state=False)


# ---------------------------------------------------------------------------------------------
# The FP8 weight copies kept across calls (Llama's fp8_weights_once)


class Fp8WeightCopies:
    """The FP8 copies of the weights one coda op reads (coda.ops.llama_fp8_weights), kept from
    call to call and made again when a weight they came from has changed since: another tensor,
    or the same one written (its version counter, which every in-place write through torch bumps:
    the optimizer's step, load_state_dict, copy_). So a training step quantizes each weight once
    (both copies in one pass) for its forward and backward calls, and for every micro-batch's.
    A write that bypasses the version counter (through .data, or outside torch) is not seen:
    call drop() after one. Not under torch.compile or a CUDA graph capture (the checks read the
    host's view of the tensors), nor on a module FSDP2 shards (its all-gathers rewrite the
    unsharded weights): there the op quantizes its own, as without copies."""

    __slots__ = ("_refs", "_state", "_copies")

    def __init__(self):
        self.drop()

    def __reduce__(self):  # copied or pickled empty: the copies are made again on use
        return (Fp8WeightCopies, ())

    def drop(self):
        """Forget the copies (their memory goes with the last call that saved them)."""
        self._refs, self._state, self._copies = (), None, None

    def get(self, layer, weights, block, modules=()):
        """The copies of `weights` (the op's, a tuple) for `block`: the kept ones while every
        weight is the tensor they came from, unwritten since; None where they cannot be kept
        (above). `modules`: those holding the weights, checked for FSDP2."""
        if block.precision != "fp8" or _tracing(weights[0]) or any(map(_fsdp_managed, modules)):
            return None
        state = tuple((w.data_ptr(), w._version) for w in weights)
        if (state != self._state or len(self._refs) != len(weights)
                or any(ref() is not w for ref, w in zip(self._refs, weights))):
            self._copies = ops.llama_fp8_weights(layer, weights, block)
            self._refs = tuple(weakref.ref(w) for w in weights)
            self._state = state
        return self._copies


def _fp8_weights(copies, layer, weights, block, *modules):
    """The op's fp8_weights keyword: {} where no copies are kept (`copies` None) or none can be
    (Fp8WeightCopies.get), so that the op's call is the plain one."""
    fp8 = copies.get(layer, weights, block, modules) if copies is not None else None
    return {} if fp8 is None else {"fp8_weights": fp8}


def _fsdp_managed(module):
    """True for a module FSDP2's fully_shard manages (its class derives from FSDPModule; by
    name, as ops._not_sharded checks: no torch.distributed import on the call path)."""
    return any(c.__name__ == "FSDPModule" for c in type(module).__mro__)


# ---------------------------------------------------------------------------------------------
# The module


class AttentionInput(nn.Module):
    """A decoder layer's attention input in coda's layout: the pre-attention RMSNorm weight
    `attn_norm` and the fused [Q; K; V] projection `w_qkv`. Its forward is coda's first op
    (layer 0); the middle op before it reads it as the following layer's (Mlp.forward)."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        c, kw = config, {"device": device, "dtype": dtype}
        d, h, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(d, **kw))
        self.w_qkv = nn.Parameter(torch.empty((h + 2 * kv) * hd, d, **kw))
        # The first op's FP8 weight copies, where Llama keeps them (fp8_weights_once).
        self.fp8_copies = None

    def forward(self, x, rope, block):
        """Layer 0's post-RoPE qkv from the embedding output x (coda.ops.llama_first)."""
        weights = (self.attn_norm, self.w_qkv)
        return ops.llama_first(x, weights, rope.positions, rope.inv_freq, block,
                               **_fp8_weights(self.fp8_copies, "first", weights, block, self))


class Mlp(nn.Module):
    """A decoder layer's attention output projection `w_out`, its pre-MLP RMSNorm weight
    `ffn_norm` and its SwiGLU MLP (`w_gate_up`, gate and up rows interleaved, and `w_down`).
    Its forward is the coda op that starts with them: the middle op, which ends with the
    following layer's attention input, or for the last layer the last op, which ends with the
    final norm, the LM head and the loss. An FSDP2 unit holding this module must hold what its
    op reads beside it (Llama.fsdp_units)."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        c, kw = config, {"device": device, "dtype": dtype}
        d, f, attn = c.hidden_size, c.intermediate_size, c.num_attention_heads * c.head_dim
        self.w_out = nn.Parameter(torch.empty(d, attn, **kw))
        self.ffn_norm = nn.Parameter(torch.ones(d, **kw))
        self.w_gate_up = nn.Parameter(torch.empty(2 * f, d, **kw))
        self.w_down = nn.Parameter(torch.empty(d, f, **kw))
        # Its op's FP8 weight copies (the following layer's w_qkv among them in a middle op),
        # where Llama keeps them (fp8_weights_once).
        self.fp8_copies = None

    def weights(self):
        return (self.w_out, self.ffn_norm, self.w_gate_up, self.w_down)

    def forward(self, x, y, rope, block, following=None, head=None, targets=None,
                return_logits=False, reduction="mean"):
        """following (an AttentionInput): the middle op, (x0, y0) -> (x2, qkv of the following
        layer). Otherwise head = (final_norm, lm_head): the last op, -> (loss, logits or
        None)."""
        if following is not None:
            weights = self.weights() + (following.attn_norm, following.w_qkv)
            return ops.llama_middle(
                x, y, weights, rope.positions, rope.inv_freq, block,
                **_fp8_weights(self.fp8_copies, "middle", weights, block, self, following))
        weights = self.weights() + tuple(head)
        return ops.llama_last(x, y, targets, weights, block, return_logits=return_logits,
                              reduction=reduction,
                              **_fp8_weights(self.fp8_copies, "last", weights, block, self))


class LlamaLayer(nn.Module):
    """One decoder layer's weights in coda's layout, in two submodules cut where coda's ops
    cut the layer: `attn_input` (attn_norm, w_qkv) and `mlp` (w_out, ffn_norm, w_gate_up,
    w_down). The weights are also attributes of the layer (layer.w_qkv). A state dict that
    names them without the submodule (an older checkpoint) still loads."""

    _SUBMODULE = {"attn_norm": "attn_input", "w_qkv": "attn_input", "w_out": "mlp",
                  "ffn_norm": "mlp", "w_gate_up": "mlp", "w_down": "mlp"}

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        self.attn_input = AttentionInput(config, device=device, dtype=dtype)
        self.mlp = Mlp(config, device=device, dtype=dtype)
        self._register_load_state_dict_pre_hook(self._rename_flat_keys)

    def _rename_flat_keys(self, state_dict, prefix, *_):
        for name, sub in LlamaLayer._SUBMODULE.items():
            old = prefix + name
            if old in state_dict:
                state_dict[prefix + sub + "." + name] = state_dict.pop(old)

    # The weights as attributes of the layer (plain properties: torch.compile inlines them).
    attn_norm = property(lambda self: self.attn_input.attn_norm)
    w_qkv = property(lambda self: self.attn_input.w_qkv)
    w_out = property(lambda self: self.mlp.w_out)
    ffn_norm = property(lambda self: self.mlp.ffn_norm)
    w_gate_up = property(lambda self: self.mlp.w_gate_up)
    w_down = property(lambda self: self.mlp.w_down)

    def weights(self):
        return {
            "attn_norm": self.attn_norm, "w_qkv": self.w_qkv, "w_out": self.w_out,
            "ffn_norm": self.ffn_norm, "w_gate_up": self.w_gate_up, "w_down": self.w_down,
        }


class Llama(nn.Module):
    """A Llama causal LM on coda.

    forward(input_ids [B, S], labels=None, position_ids=None, return_logits=False,
            attention_mask=None):
      * labels given: the loss, the mean cross-entropy over targets != -100, where position t
        predicts labels[t + 1] (Hugging Face's shift; the last position predicts nothing);
        with return_logits=True, (loss, logits [B, S, V]);
      * labels None: the logits [B, S, V].
    The logits are in the model's dtype and carry no gradient (train through the loss).
    position_ids ([B, S] or [S], default 0..S-1 per row) drive RoPE only; attention is causal
    over each row of input_ids. attention_mask ([B, S], 0 at padding; None: all ones) removes
    the padded positions from the keys, as Hugging Face's does (a query with no unpadded key
    gets a zero attention output); the loss skips only targets of -100, so padded positions
    take labels -100, as with Hugging Face.

    checkpoint=True (activation checkpointing): in training (model.train() and gradients on),
    each decoder layer's coda call and the attention after it run under
    torch.utils.checkpoint (non-reentrant), so that the forward keeps only the residual stream
    and the attention output between layers and the backward recomputes the rest; the last
    call (last layer, LM head, loss) is not recomputed. Loss and gradients are bit for bit
    those without it (on CUDA, where torch's attention backward is deterministic too:
    torch.use_deterministic_algorithms(True)). The attribute may be changed between steps.

    precision="fp8": every decoder layer's GEMMs, forward and backward, run on block-scaled
    E4M3 copies of their operands, which coda makes in the call (the parameters, the
    activations between the calls and the gradients stay 16-bit; the LM head and the loss stay
    16-bit). It needs the widths (hidden, intermediate, the attention and QKV widths)
    multiples of 16, a token count (B * S) that is a multiple of 16 for the backward, and bf16
    for training; docs/python.md, "FP8". "native" (the default): 16-bit GEMMs. The attribute
    may be changed between steps. Anything else raises ValueError.

    fp8_weights_once=True (with precision "fp8"): each coda op keeps the FP8 copies of the
    weights it reads (Fp8WeightCopies) and makes them again only after a weight changes (the
    optimizer's step), so a step quantizes each weight once, both copies in one pass, instead of
    once per forward and once per backward of every micro-batch; the results are the same bit
    for bit. It costs the copies' memory across the step, 2 bytes a decoder-layer parameter
    (docs/python.md, "FP8"). Without effect under torch.compile, in a CUDA graph capture and on
    FSDP2-sharded units, where the ops quantize their own. The attribute may be changed between
    steps (False drops the copies); drop_fp8_weights() forgets them after a write the version
    counters do not see (through .data).
    """

    def __init__(self, config, device="cuda", dtype=torch.bfloat16, init_weights=True,
                 checkpoint=False, precision="native", fp8_weights_once=False):
        super().__init__()
        self.checkpoint = bool(checkpoint)
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError("coda runs bf16 or f16 models; got dtype %s" % dtype)
        config.validate()
        self.config = config
        kw = {"device": device, "dtype": dtype}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(
            LlamaLayer(config, **kw) for _ in range(config.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size, **kw))
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, **kw))
        # The RoPE table is f32 whatever the model's dtype; kept as its int32 bits so that
        # model.to(dtype) / .half() move it without rounding it.
        bits = rope_inv_freq(config).view(torch.int32)
        self.register_buffer("rope_inv_freq_bits", bits.to(device), persistent=False)
        self.block = config.block(precision=precision)
        self.fp8_weights_once = fp8_weights_once
        if init_weights:
            self.reset_parameters()

    def _fp8_copy_holders(self):
        """The modules whose coda op's FP8 weight copies they hold: layer 0's attention input
        (the first op) and every layer's MLP (a middle op, or the last)."""
        return [self.layers[0].attn_input] + [layer.mlp for layer in self.layers]

    @property
    def fp8_weights_once(self):
        """Whether the ops keep their FP8 weight copies from call to call (see the class)."""
        return self.layers[0].attn_input.fp8_copies is not None

    @fp8_weights_once.setter
    def fp8_weights_once(self, value):
        for module in self._fp8_copy_holders():
            module.fp8_copies = Fp8WeightCopies() if value else None

    def drop_fp8_weights(self):
        """Forget every kept FP8 weight copy: the next calls make them again."""
        for module in self._fp8_copy_holders():
            if module.fp8_copies is not None:
                module.fp8_copies.drop()

    @property
    def precision(self):
        """"native" or "fp8": the precision of the decoder layers' GEMMs (the block config's)."""
        return self.block.precision

    @precision.setter
    def precision(self, value):
        self.block = dataclasses.replace(self.block, precision=value)  # validates it

    @property
    def inv_freq(self):
        """The RoPE frequency table [head_dim / 2], f32."""
        return self.rope_inv_freq_bits.view(torch.float32)

    @property
    def lm_head_weight(self):
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head

    def fsdp_units(self):
        """The module groups to shard with FSDP2, one unit each, so that every coda op finds
        all the weights it reads unsharded (docs/distributed.md): layer 0's attention input
        (the first op), then for each layer its MLP with the following layer's attention input
        (a middle op), and the last layer's MLP (the last op; the final norm, LM head and
        embedding stay with the root)::

            for unit in model.fsdp_units():
                fully_shard(unit, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
        """
        layers = list(self.layers)
        units = [[layers[0].attn_input]]
        units += [[layer.mlp, following.attn_input]
                  for layer, following in zip(layers[:-1], layers[1:])]
        units.append([layers[-1].mlp])
        return units

    @torch.no_grad()
    def reset_parameters(self):
        """Hugging Face's initialization: normal(0, initializer_range) weights, unit norms."""
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("norm"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)

    def forward(self, input_ids, labels=None, position_ids=None, return_logits=False,
                attention_mask=None):
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
            labels = labels.unsqueeze(0) if labels is not None else None
            attention_mask = attention_mask.unsqueeze(0) if attention_mask is not None else None
        batch, seq = input_ids.shape
        key_mask = padding_keys(attention_mask, batch, seq)
        x = self.embed_tokens(input_ids).reshape(batch * seq, -1)
        if position_ids is None:
            positions = torch.arange(seq, device=input_ids.device).repeat(batch)
        else:
            positions = position_ids.expand(batch, seq).reshape(-1)
        if labels is None:
            targets = torch.full((batch * seq,), self.block.ignore_index, dtype=torch.int32,
                                 device=input_ids.device)
        else:
            targets = shift_labels(labels, self.block.ignore_index).reshape(-1)
        want_logits = return_logits or labels is None
        loss, logits = run_layers(
            x, batch, seq, positions, targets, self.inv_freq, self.block,
            list(self.layers), self.norm, self.lm_head_weight,
            return_logits=want_logits, key_mask=key_mask,
            checkpoint=self.checkpoint and self.training and torch.is_grad_enabled())
        if want_logits:
            logits = logits.view(batch, seq, -1)
        if labels is None:
            return logits
        return (loss, logits) if return_logits else loss
