"""Hugging Face interop: from_hf (a coda.models.Llama with a LlamaForCausalLM's weights),
to_hf_state_dict (back, bit for bit) and patch_hf (run a LlamaForCausalLM's forward on coda,
in place).

Weight mapping, per decoder layer i (HF name -> coda):
  input_layernorm.weight                 -> layers[i].attn_norm
  self_attn.{q,k,v}_proj.weight          -> layers[i].w_qkv = [q; k; v] (rows)
  self_attn.o_proj.weight                -> layers[i].w_out
  post_attention_layernorm.weight        -> layers[i].ffn_norm
  mlp.{gate,up}_proj.weight              -> layers[i].w_gate_up = interleave([gate; up])
  mlp.down_proj.weight                   -> layers[i].w_down
and model.embed_tokens.weight -> embed_tokens.weight, model.norm.weight -> norm,
lm_head.weight -> lm_head (absent when the embeddings are tied).

from_hf copies; patch_hf makes the HF q/k/v weights of a layer row blocks of one tensor that
coda reads as w_qkv, and gate/up row blocks of one [gate; up] tensor (see "patch_hf's fused
weights" below).
"""

import types

import torch

from . import ops
from .models import Llama, LlamaConfig, padding_keys, run_layers, shift_labels

__all__ = ["from_hf", "to_hf_state_dict", "patch_hf", "unpatch_hf"]


def _causal_lm(hf_model):
    if not (hasattr(hf_model, "model") and hasattr(hf_model, "lm_head")):
        raise NotImplementedError(
            "coda converts causal LMs (LlamaForCausalLM: .model and .lm_head); got %s"
            % type(hf_model).__name__)
    return hf_model.model


def _hf_layer_weights(layer, dtype=None, device=None):
    """One HF decoder layer's weights in coda's layout (differentiable functions of the HF
    parameters: concatenation, interleaving, casting)."""
    attn, mlp = layer.self_attn, layer.mlp
    cast = (lambda t: t.to(device=device, dtype=dtype)) if dtype is not None else (lambda t: t)
    w_qkv = torch.cat([cast(attn.q_proj.weight), cast(attn.k_proj.weight),
                       cast(attn.v_proj.weight)], dim=0)
    stacked = torch.cat([cast(mlp.gate_proj.weight), cast(mlp.up_proj.weight)], dim=0)
    return {
        "attn_norm": cast(layer.input_layernorm.weight),
        "w_qkv": w_qkv,
        "w_out": cast(attn.o_proj.weight),
        "ffn_norm": cast(layer.post_attention_layernorm.weight),
        "w_gate_up": ops.interleave_gate_up(stacked),
        "w_down": cast(mlp.down_proj.weight),
    }


def _model_device(module):
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def _model_dtype(module):
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _coda_dtype(dtype):
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


@torch.no_grad()
def from_hf(hf_model, device=None, dtype=None, precision="native"):
    """A coda.models.Llama with a copy of a Hugging Face LlamaForCausalLM's weights.

    device: default the HF model's; dtype: default the HF model's when bf16 or f16, else bf16
    (coda computes in 16-bit). precision: "native" or "fp8", as Llama takes it (the layers'
    GEMMs on E4M3 copies of their operands; docs/python.md, "FP8"). Unsupported
    architectures raise NotImplementedError."""
    base = _causal_lm(hf_model)
    config = LlamaConfig.from_hf(hf_model.config)
    device = torch.device(device) if device is not None else _model_device(hf_model)
    dtype = dtype if dtype is not None else _coda_dtype(_model_dtype(hf_model))
    model = Llama(config, device=device, dtype=dtype, init_weights=False, precision=precision)

    def put(dst, src):
        dst.copy_(src.detach().to(device=device, dtype=dtype))

    put(model.embed_tokens.weight, base.embed_tokens.weight)
    for layer, hf_layer in zip(model.layers, base.layers):
        w = _hf_layer_weights(hf_layer, dtype=dtype, device=device)
        for name, value in w.items():
            put(getattr(layer, name), value)
    put(model.norm, base.norm.weight)
    if model.lm_head is not None:
        put(model.lm_head, hf_model.lm_head.weight)
    return model


def _split_layer(layer_tensors, config):
    """coda-layout tensors of one layer -> {HF suffix: tensor} (fresh, contiguous tensors)."""
    h, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    out = {}
    if layer_tensors.get("w_qkv") is not None:
        q, k, v = layer_tensors["w_qkv"].split([h * hd, kv * hd, kv * hd], dim=0)
        out["self_attn.q_proj.weight"] = q.clone()
        out["self_attn.k_proj.weight"] = k.clone()
        out["self_attn.v_proj.weight"] = v.clone()
    if layer_tensors.get("w_gate_up") is not None:
        stacked = ops.deinterleave_gate_up(layer_tensors["w_gate_up"])
        gate, up = stacked.chunk(2, dim=0)
        out["mlp.gate_proj.weight"] = gate.clone()
        out["mlp.up_proj.weight"] = up.clone()
    simple = {
        "attn_norm": "input_layernorm.weight",
        "w_out": "self_attn.o_proj.weight",
        "ffn_norm": "post_attention_layernorm.weight",
        "w_down": "mlp.down_proj.weight",
    }
    for name, hf_name in simple.items():
        if layer_tensors.get(name) is not None:
            out[hf_name] = layer_tensors[name].clone()
    return out


@torch.no_grad()
def to_hf_state_dict(model, grads=False):
    """The Hugging Face LlamaForCausalLM state dict of a coda.models.Llama (exact: the inverse
    of from_hf on the same dtype). grads=True maps the parameters' .grad instead (entries whose
    gradient is None are left out). With tied embeddings, lm_head.weight is the embedding
    tensor, as in the HF model's own state_dict()."""
    pick = (lambda p: p.grad) if grads else (lambda p: p)
    sd = {}

    def put(name, value):
        if value is not None:
            sd[name] = value.detach().clone()

    put("model.embed_tokens.weight", pick(model.embed_tokens.weight))
    for i, layer in enumerate(model.layers):
        tensors = {name: pick(p) for name, p in layer.weights().items()}
        for suffix, value in _split_layer(tensors, model.config).items():
            sd["model.layers.%d.%s" % (i, suffix)] = value.detach()
    put("model.norm.weight", pick(model.norm))
    if model.lm_head is None:
        if "model.embed_tokens.weight" in sd:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    else:
        put("lm_head.weight", pick(model.lm_head))
    return sd


# ---------------------------------------------------------------------------------------------
# patch_hf's fused weights
#
# A patched layer's q, k and v projection weights are the consecutive row blocks of one
# [(H + 2 KV) head_dim, D] tensor, which is w_qkv as coda reads it: each Parameter's .data is
# its block. The Parameter objects stay, so optimizers built before the patch, hooks and
# state_dict's names are unchanged, and every parameter is still a dense tensor of its own shape
# (what fused optimizers and safetensors require). Each forward hands that tensor to coda as it
# is and the backward gives each parameter its rows of coda's gradient: no copy either way.
#
# gate and up are likewise the row blocks of one [2F, D] tensor ([gate; up], Hugging Face's
# order), but coda's kernels read gate row j and up row j as rows 2j and 2j + 1 of w_gate_up,
# so that the pair sits in one thread's accumulators (docs/DESIGN.md). No dense view of two
# separate matrices has that layout, so each forward interleaves the [gate; up] tensor (one
# copy) and the backward de-interleaves its gradient (one copy; the parameters' gradients are
# then its row blocks). Removing these two needs kernels that read [gate; up] rows directly.
# Strided views into an interleaved tensor (gate = fused[0::2]) would avoid both copies, but
# then gate_proj.weight and up_proj.weight are no longer dense: torch's fused optimizers
# (AdamW(fused=True), transformers' Trainer default with torch >= 2.8) reject them, and
# save_pretrained's shared-tensor check calls .view(-1) on them, which fails.


def _group_parts(layer):
    """One decoder layer's projection weights by fused tensor: {"qkv": (q, k, v) weights,
    "gate_up": (gate, up) weights}."""
    attn, mlp = layer.self_attn, layer.mlp
    return {"qkv": (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight),
            "gate_up": (mlp.gate_proj.weight, mlp.up_proj.weight)}


def _is_blocks_of(fused, parts):
    """Whether `parts` are, in order, the dense consecutive row blocks that make up all of
    `fused` (same dtype and device)."""
    if fused is None:
        return False
    row_bytes = fused.shape[1] * fused.element_size()
    address = fused.data_ptr()
    for p in parts:
        if (p.device != fused.device or p.dtype != fused.dtype or p.dim() != 2
                or p.shape[1] != fused.shape[1] or not p.is_contiguous()
                or p.data_ptr() != address):
            return False
        address += p.shape[0] * row_bytes
    return address == fused.data_ptr() + fused.shape[0] * row_bytes


def _fusable(parts):
    """Plain 2D parameters of one dtype, device and width (not, e.g., a quantized or sharded
    parameter subclass, FSDP's plain-tensor views, or a model split over devices), outside
    inference mode (whose tensors could not be trained afterwards)."""
    first = parts[0]
    if torch.is_inference_mode_enabled():
        return False
    return all(type(p) is torch.nn.Parameter and p.dim() == 2 and p.dtype == first.dtype
               and p.device == first.device and p.device.type != "meta"
               and p.shape[1] == first.shape[1] for p in parts)


@torch.no_grad()
def _fuse(parts):
    """A new tensor holding `parts` as its consecutive row blocks; each parameter's .data
    becomes its block (one copy, at patch time or after the aliasing was undone)."""
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for p in parts:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


@torch.no_grad()
def _separate(parts):
    """Each parameter, and its gradient, back in memory of its own (as before patch_hf)."""
    for p in parts:
        p.data = p.data.clone()
        if p.grad is not None:
            p.grad = p.grad.clone()


def _fused_tensors(state, base):
    """Per decoder layer {"qkv": tensor or None, "gate_up": tensor or None}, the tensors whose
    row blocks the parameters are. A check per forward (a few data_ptr() calls per layer) fuses
    again where the parameters no longer are those blocks: after model.to(...) or .half(),
    load_state_dict(assign=True), a Parameter replaced. None where the parameters
    cannot be fused (_fusable): those are concatenated at each forward, as before."""
    fused = state["fused"]
    while len(fused) < len(base.layers):
        fused.append({})
    for layer, tensors in zip(base.layers, fused):
        for group, parts in _group_parts(layer).items():
            if not _is_blocks_of(tensors.get(group), parts):
                tensors[group] = _fuse(parts) if _fusable(parts) else None
    return fused


class _RowBlocks(torch.autograd.Function):
    """A fused tensor as a differentiable function of the parameters that are its row blocks,
    without a copy: forward returns the fused tensor itself (it is the parameters' memory),
    backward gives each parameter its rows of the gradient as a view (autograd keeps such a
    view as the .grad when there is none yet, so no copy there either)."""

    @staticmethod
    def forward(ctx, holder, *parts):
        # holder: a list around the fused tensor, so that autograd does not take it for an
        # input (its gradient is the parameters').
        ctx.rows = [p.shape[0] for p in parts]
        ctx.save_for_backward(*parts)
        return holder[0].detach()

    @staticmethod
    def backward(ctx, grad):
        # Unpacking the parameters is autograd's in-place check: coda's ops saved the fused
        # tensor, which an in-place update of a parameter since the forward would have changed.
        ctx.saved_tensors
        return (None,) + tuple(grad.split(ctx.rows, dim=0))


def _patched_layer_weights(layer, tensors, dtype, device):
    """One patched decoder layer's weights in coda's layout (differentiable in the HF
    parameters): w_qkv the fused q/k/v tensor itself, w_gate_up the fused [gate; up] tensor
    interleaved, casts only where the model is not in the compute dtype."""
    attn, mlp = layer.self_attn, layer.mlp
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731  (no copy when equal)
    parts = _group_parts(layer)

    def fused(group):
        if tensors[group] is None:
            return torch.cat([cast(p) for p in parts[group]], dim=0)
        return cast(_RowBlocks.apply([tensors[group]], *parts[group]))

    return {
        "attn_norm": cast(layer.input_layernorm.weight),
        "w_qkv": fused("qkv"),
        "w_out": cast(attn.o_proj.weight),
        "ffn_norm": cast(layer.post_attention_layernorm.weight),
        "w_gate_up": ops.interleave_gate_up(fused("gate_up")),
        "w_down": cast(mlp.down_proj.weight),
    }


# ---------------------------------------------------------------------------------------------
# patch_hf


def _output_class():
    try:
        from transformers.modeling_outputs import CausalLMOutputWithPast
        return CausalLMOutputWithPast
    except ImportError:  # transformers absent: a plain object with the same fields
        return types.SimpleNamespace


def _refuse_sharded(base):
    """A patched model whose parameters FSDP2 (or tensor parallelism) made DTensors: its coda
    calls read the weights of two decoder layers without calling their modules, so FSDP2's
    hooks would not gather them (docs/distributed.md, FSDP2), and the fused q/k/v memory would
    alias FSDP2's own buffers. Say what works instead, before any weight is read."""
    weight = base.layers[0].self_attn.q_proj.weight
    if type(weight).__name__ == "DTensor":
        raise NotImplementedError(
            "coda.patch_hf: this model's parameters are DTensors (sharded, e.g. by FSDP2's "
            "fully_shard), which a patched Hugging Face model does not run on yet. Convert it "
            "instead: model = coda.from_hf(hf_model), then fully_shard each group of "
            "model.fsdp_units() and the model (docs/distributed.md, FSDP2)")


def _coda_forward(self, input_ids=None, attention_mask=None, position_ids=None,
                  past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                  output_attentions=None, output_hidden_states=None, return_dict=None,
                  cache_position=None, logits_to_keep=0, **kwargs):
    state = self._coda_state
    if past_key_values is not None and (not hasattr(past_key_values, "get_seq_length")
                                        or past_key_values.get_seq_length() > 0):
        raise NotImplementedError("coda's patched forward has no KV cache (past_key_values)")
    if output_attentions or output_hidden_states:
        raise NotImplementedError(
            "coda's patched forward does not return attentions or hidden states")
    base = self.model
    _refuse_sharded(base)
    dtype = state["dtype"]
    if inputs_embeds is None:
        inputs_embeds = base.embed_tokens(input_ids)
    batch, seq = inputs_embeds.shape[0], inputs_embeds.shape[1]
    device = inputs_embeds.device
    x = inputs_embeds.to(dtype).reshape(batch * seq, -1)
    key_mask = padding_keys(attention_mask, batch, seq)
    # Hugging Face's forward takes positions 0 .. S-1 whatever the padding (only generate()
    # derives them from the mask), and so does this one.
    if position_ids is None:
        positions = torch.arange(seq, device=device).repeat(batch)
    else:
        positions = position_ids.expand(batch, seq).reshape(-1)
    block = state["block"]
    shifted = kwargs.get("shift_labels")
    if shifted is not None:
        targets = shifted.reshape(-1)
    elif labels is not None:
        targets = shift_labels(labels, block.ignore_index).reshape(-1)
    else:
        targets = torch.full((batch * seq,), block.ignore_index, dtype=torch.int32, device=device)
    has_labels = labels is not None or shifted is not None
    items = kwargs.get("num_items_in_batch")
    want_logits = state["keep_logits"] or not has_labels
    inv_freq = state["inv_freq"].get(device)
    if inv_freq is None:
        inv_freq = state["inv_freq"][device] = state["inv_freq"]["cpu"].to(device)
    fused = _fused_tensors(state, base)
    layers = [_patched_layer_weights(layer, tensors, dtype, device)
              for layer, tensors in zip(base.layers, fused)]
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    # Hugging Face's gradient_checkpointing_enable() sets the decoder's gradient_checkpointing;
    # coda then checkpoints its own stages, as Llama(checkpoint=True) does (non-reentrant
    # whatever gradient_checkpointing_kwargs say: coda's stages have no reentrant form).
    checkpoint = (bool(getattr(base, "gradient_checkpointing", False)) and self.training
                  and torch.is_grad_enabled())
    loss, logits = run_layers(
        x, batch, seq, positions, targets, inv_freq, block, layers, cast(base.norm.weight),
        cast(self.lm_head.weight), return_logits=want_logits,
        reduction="sum" if items is not None else "mean", key_mask=key_mask,
        checkpoint=checkpoint)
    if items is not None:
        loss = loss / items
    if want_logits:
        logits = logits.view(batch, seq, -1)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
    return _output_class()(loss=loss if has_labels else None, logits=logits,
                           past_key_values=None)


def patch_hf(hf_model, keep_logits=True, dtype=None, precision="native"):
    """Run a Hugging Face LlamaForCausalLM's forward on coda, in place; returns the model.

    The HF parameters stay the model's parameters (the same objects: optimizers, state_dict,
    save_pretrained and hooks are unchanged), but each layer's q/k/v projection weights become
    the row blocks of one fused tensor, which coda reads directly, and gate/up the row blocks of
    one [gate; up] tensor, interleaved at each forward (the one copy left: see the comment
    above _group_parts). Gradients reach the HF parameters as before. The patched forward
    takes the usual arguments (input_ids or inputs_embeds, labels, position_ids, an
    attention_mask of 0 at padding, num_items_in_batch, shift_labels) and returns a
    CausalLMOutputWithPast with loss (HF's shifted mean cross-entropy over labels != -100;
    sum / num_items_in_batch when given) and logits ([B, S, V] in the compute dtype; None when
    labels are given and keep_logits=False). Padded positions are left out of attention as in
    HF; the loss skips them through their labels (-100), as HF's does. After HF's
    `gradient_checkpointing_enable()`, training steps recompute coda's layer calls in the
    backward (coda.models.Llama's checkpoint=True; bit for bit the same gradients). KV caches,
    4D attention masks and attention / hidden-state outputs raise NotImplementedError.

    dtype: the compute dtype (default the model's when bf16 or f16, else bf16: an fp32 model's
    weights are cast on the fly and receive fp32 gradients). precision: "native" or "fp8", as
    coda.models.Llama takes it (docs/python.md, "FP8"); patching again changes it."""
    base = _causal_lm(hf_model)
    config = LlamaConfig.from_hf(hf_model.config)
    from .models import rope_inv_freq

    previous = hf_model.__dict__.get("_coda_state")
    state = {
        "config": config,
        "block": config.block(precision=precision),
        "inv_freq": {"cpu": rope_inv_freq(config)},  # per device
        "dtype": dtype if dtype is not None else _coda_dtype(_model_dtype(hf_model)),
        "keep_logits": bool(keep_logits),
        "fused": previous["fused"] if previous is not None else [],
    }
    _fused_tensors(state, base)  # fuse now: the memory moves once, before any optimizer step
    hf_model._coda_state = state
    if previous is None:  # patching again only changes the settings
        hf_model._coda_original_forward = hf_model.__dict__.get("forward")
        hf_model.forward = types.MethodType(_coda_forward, hf_model)
    return hf_model


def unpatch_hf(hf_model):
    """Undo patch_hf: the original forward, and each fused parameter (and gradient) in memory
    of its own again, the same Parameter objects with the same values."""
    state = hf_model.__dict__.get("_coda_state")
    if state is None:
        return hf_model
    for layer, tensors in zip(hf_model.model.layers, state["fused"]):
        for group, parts in _group_parts(layer).items():
            if _is_blocks_of(tensors.get(group), parts):
                _separate(parts)
            tensors[group] = None  # freed now, not after every layer's copy is made
    original = hf_model.__dict__.get("_coda_original_forward")
    del hf_model.forward
    if original is not None:
        hf_model.forward = original
    del hf_model._coda_state
    del hf_model._coda_original_forward
    return hf_model
