"""The plain-PyTorch side of the benchmark: a Llama written the way Hugging Face writes it.

Module and parameter names follow transformers' ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.N.self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm``, ``model.norm``,
``lm_head``), so its ``state_dict`` is a Hugging Face checkpoint and ``coda.from_hf`` reads it.
The math is Hugging Face's too: RMSNorm in fp32 then cast back before the gain, rotate-half
RoPE with cos/sin computed in fp32 and cast to the activation dtype, SwiGLU
``down(silu(gate(x)) * up(x))``, causal SDPA with grouped KV heads, and the loss is the mean
cross-entropy of fp32 logits against labels shifted by one (-100 ignored).

``ReferenceMiddle`` is coda's "shifted" middle block (include/coda/block/llama.hpp) in the same
style: from layer l's attention output y0 and residual x0 to x2 and the post-RoPE q, k, v of
layer l+1; with ``attention=True`` it continues through SDPA to layer l+1's attention output.

Nothing here imports coda: these modules are the baseline that eager PyTorch and
torch.compile run.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class RefConfig:
    """The Hugging Face LlamaConfig fields the benchmark uses (same names)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False

    def to_dict(self):
        return dict(self.__dict__)


def rope_inv_freq(head_dim, theta, device=None):
    """Llama's inverse frequencies, fp32 [head_dim / 2] (no rope scaling)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta ** exponent)


def rope_cos_sin(positions, inv_freq, dtype):
    """cos, sin [..., S, head_dim] for integer positions [..., S], computed in fp32 and cast."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, S, heads, head_dim]; cos, sin [B, S, head_dim]."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return x * cos + rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


def _linear(n_in, n_out, device, dtype):
    return nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype)


def sdpa(q, k, v):
    """Causal attention with grouped KV heads. q [B, S, H, hd], k/v [B, S, Hkv, hd] ->
    [B, S, H * hd]."""
    b, s = q.shape[0], q.shape[1]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                       enable_gqa=k.shape[1] != q.shape[1])
    return y.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = _linear(d, self.n_heads * hd, device, dtype)
        self.k_proj = _linear(d, self.n_kv * hd, device, dtype)
        self.v_proj = _linear(d, self.n_kv * hd, device, dtype)
        self.o_proj = _linear(self.n_heads * hd, d, device, dtype)

    def qkv(self, h, cos, sin):
        """Post-RoPE q [B, S, H, hd], k and v [B, S, Hkv, hd]."""
        b, s, _ = h.shape
        q = self.q_proj(h).view(b, s, self.n_heads, self.head_dim)
        k = self.k_proj(h).view(b, s, self.n_kv, self.head_dim)
        v = self.v_proj(h).view(b, s, self.n_kv, self.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, h, cos, sin):
        return self.o_proj(sdpa(*self.qkv(h, cos, sin)))


class MLP(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _linear(d, f, device, dtype)
        self.up_proj = _linear(d, f, device, dtype)
        self.down_proj = _linear(f, d, device, dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.self_attn = Attention(cfg, device, dtype)
        self.mlp = MLP(cfg, device, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, device, dtype)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        # Like Hugging Face's rotary module: an fp32 buffer, not a parameter (not in state_dict).
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta, device),
                             persistent=False)

    def forward(self, input_ids, position_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.inv_freq, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def shift_labels(labels, ignore_index=-100):
    """targets[:, t] = labels[:, t + 1], the last position ignored: the same mean loss as
    Hugging Face's logits[:, :-1] vs labels[:, 1:], without copying the logits."""
    pad = torch.full_like(labels[:, :1], ignore_index)
    return torch.cat((labels[:, 1:], pad), dim=1)


class ReferenceLlama(nn.Module):
    """A Llama causal LM in plain PyTorch with Hugging Face's structure and names."""

    def __init__(self, cfg, device=None, dtype=torch.bfloat16):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, device, dtype)
        self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size, device, dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels=None, position_ids=None, return_logits=False):
        if position_ids is None:
            s = input_ids.shape[1]
            position_ids = torch.arange(s, device=input_ids.device).expand_as(input_ids)
        logits = self.lm_head(self.model(input_ids, position_ids))
        if labels is None:
            return logits
        targets = shift_labels(labels)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-100)
        return (loss, logits) if return_logits else loss


def init_weights(model, seed, std=0.02):
    """Deterministic init: normal(0, std) for every matrix (embedding, projections, LM head),
    scaled by 1/sqrt(2 * layers) for the two residual-branch outputs (o_proj, down_proj), ones
    for the RMSNorm gains. Same seed and device type, same weights."""
    n_layers = max(1, sum(1 for n, _ in model.named_modules() if n.endswith("self_attn")))
    gens = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            if p.device not in gens:
                gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            s = std / math.sqrt(2 * n_layers) if ("o_proj" in name or "down_proj" in name) else std
            p.copy_(torch.randn(p.shape, generator=gens[p.device], device=p.device,
                                dtype=torch.float32).mul_(s))
    return model


class ReferenceMiddle(nn.Module):
    """coda's middle block in plain PyTorch: layer l's out-projection + residual, MLP +
    residual, then layer l+1's pre-attention RMSNorm and QKV with RoPE.

    forward(x0 [B, S, D], y0 [B, S, H hd], cos, sin) returns (x2, q, k, v) with q
    [B, S, H, hd], k and v [B, S, Hkv, hd] (post-RoPE); with attention=True it returns
    (x2, y1), y1 = causal SDPA(q, k, v) as [B, S, H hd], layer l+1's attention output.
    Parameter names are Hugging Face's for one layer (``o_proj``, ``post_attention_layernorm``,
    ``mlp.*``) plus the next layer's (``next_input_layernorm``, ``next_q_proj``, ...).
    """

    def __init__(self, cfg, attention=False, device=None, dtype=torch.bfloat16):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.attention = attention
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.o_proj = _linear(self.n_heads * hd, d, device, dtype)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps, device, dtype)
        self.mlp = MLP(cfg, device, dtype)
        self.next_input_layernorm = RMSNorm(d, cfg.rms_norm_eps, device, dtype)
        self.next_q_proj = _linear(d, self.n_heads * hd, device, dtype)
        self.next_k_proj = _linear(d, self.n_kv * hd, device, dtype)
        self.next_v_proj = _linear(d, self.n_kv * hd, device, dtype)

    def forward(self, x0, y0, cos, sin):
        b, s, _ = x0.shape
        x1 = x0 + self.o_proj(y0)
        x2 = x1 + self.mlp(self.post_attention_layernorm(x1))
        h = self.next_input_layernorm(x2)
        q = apply_rope(self.next_q_proj(h).view(b, s, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.next_k_proj(h).view(b, s, self.n_kv, self.head_dim), cos, sin)
        v = self.next_v_proj(h).view(b, s, self.n_kv, self.head_dim)
        if self.attention:
            return x2, sdpa(q, k, v)
        return x2, q, k, v
