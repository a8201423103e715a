"""The sides of every case (PyTorch eager, torch.compile of the same module, coda, and for
blocks coda's layer through its C ABI alone: native), each with forward / backward / zero_grad
(and optionally prepare) for timing.py, plus what the agreement check compares.

Blocks: the inputs are x0 [B, S, D] (residual stream) and y0 [B, S, H hd] (layer l's attention
output), both requiring grad, and per-token positions; the backward is seeded with fixed random
gradients of the outputs. Without attention the outputs are x2 and the post-RoPE q, k, v of
layer l+1 (coda returns them as one [Q; K; V] tensor [M, (H + 2 Hkv) hd]; PyTorch as three
tensors, seeded with the matching slices of the same gradient); with attention they are x2 and
y1 = causal GQA SDPA(q, k, v) [B, S, H hd], the same SDPA call on both sides.

Model: input_ids [B, S] with labels = input_ids (shifted inside); the loss is the output.
"""
import torch

from . import coda_adapter
from .reference import ReferenceLlama, ReferenceMiddle, RefConfig, init_weights, rope_cos_sin, sdpa


def _clear(tensors):
    for t in tensors:
        t.grad = None


class BlockInputs:
    def __init__(self, cfg, tokens, batch, attention, device="cuda", dtype=torch.bfloat16, seed=0):
        if tokens % batch:
            raise ValueError("tokens (%d) must be a multiple of batch (%d)" % (tokens, batch))
        seq = tokens // batch
        d, hd = cfg.hidden_size, cfg.head_dim
        h, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

        self.cfg, self.batch, self.seq, self.attention = cfg, batch, seq, attention
        self.x0 = randn(batch, seq, d).requires_grad_()
        self.y0 = randn(batch, seq, h * hd).requires_grad_()
        self.positions = torch.arange(seq, device=device, dtype=torch.int32).repeat(batch)  # [M]
        self.inv_freq = (1.0 / (cfg.rope_theta ** (
            torch.arange(0, hd, 2, device=device, dtype=torch.int64).float() / hd)))
        self.cos, self.sin = rope_cos_sin(self.positions.view(batch, seq), self.inv_freq, dtype)
        self.g_x2 = randn(batch, seq, d)
        if attention:
            self.g_y1 = randn(batch, seq, h * hd)
        else:
            self.g_qkv = randn(batch, seq, (h + 2 * hkv) * hd)
            gq, gk, gv = self.g_qkv.split([h * hd, hkv * hd, hkv * hd], dim=-1)
            # Contiguous copies: PyTorch's q, k, v are separate tensors, so are their gradients.
            self.g_q = gq.unflatten(-1, (h, hd)).contiguous()
            self.g_k = gk.unflatten(-1, (hkv, hd)).contiguous()
            self.g_v = gv.unflatten(-1, (hkv, hd)).contiguous()

    def leaves(self):
        return [self.x0, self.y0]


def _attention(cfg, qkv):
    """y1 [B, S, H hd]: causal GQA SDPA over coda's [Q; K; V] output [B, S, (H + 2 Hkv) hd]."""
    h, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, k, v = qkv.split([h * hd, hkv * hd, hkv * hd], dim=-1)
    return sdpa(q.unflatten(-1, (h, hd)), k.unflatten(-1, (hkv, hd)), v.unflatten(-1, (hkv, hd)))


class TorchBlockSide:
    """ReferenceMiddle run eagerly, or through torch.compile (fn = torch.compile(module))."""

    def __init__(self, module, inputs, fn=None):
        self.module, self.inputs, self.fn = module, inputs, (module if fn is None else fn)

    def forward(self):
        i = self.inputs
        return self.fn(i.x0, i.y0, i.cos, i.sin)

    def backward(self, outs):
        i = self.inputs
        grads = (i.g_x2, i.g_y1) if i.attention else (i.g_x2, i.g_q, i.g_k, i.g_v)
        torch.autograd.backward(outs, grads)

    def zero_grad(self):
        self.module.zero_grad(set_to_none=True)
        _clear(self.inputs.leaves())

    def results(self, outs):
        """Outputs and gradients in coda's layouts, for the agreement check."""
        m, i = self.module, self.inputs
        res = {"x2": outs[0]}
        if i.attention:
            res["y1"] = outs[1]
        else:
            res["qkv"] = torch.cat([t.flatten(-2) for t in outs[1:]], dim=-1)
        res.update(dx0=i.x0.grad, dy0=i.y0.grad)
        res.update(coda_adapter.block_weights_from_reference(m, grads=True))
        return {k: v.detach() for k, v in res.items() if v is not None}


class CodaBlockSide:
    """coda's middle-layer op on weights converted from the same ReferenceMiddle; precision
    "fp8" runs its FP8 form (coda.ops.BlockConfig.precision) on the same bf16 weights, and with
    fp8_weights_once its forward makes the weights' FP8 copies first (coda_adapter.middle_op)."""

    def __init__(self, module, inputs, precision="native", fp8_weights_once=False):
        self.inputs = inputs
        self.weights = {k: v.detach().clone().requires_grad_()
                        for k, v in coda_adapter.block_weights_from_reference(module).items()}
        self.config = (module.n_heads, module.n_kv, module.head_dim,
                       module.post_attention_layernorm.variance_epsilon)
        self.precision = precision
        self.op = coda_adapter.middle_op(*self.config, precision=precision,
                                         fp8_weights_once=fp8_weights_once)

    def forward(self):
        i = self.inputs
        cfg, b, s = i.cfg, i.batch, i.seq
        x2, qkv = self.op(i.x0.view(b * s, -1), i.y0.view(b * s, -1), self.weights,
                          i.positions, i.inv_freq)
        x2, qkv = x2.view(b, s, -1), qkv.view(b, s, -1)
        return (x2, _attention(cfg, qkv)) if i.attention else (x2, qkv)

    def backward(self, outs):
        i = self.inputs
        torch.autograd.backward(outs, (i.g_x2, i.g_y1 if i.attention else i.g_qkv))

    def zero_grad(self):
        _clear(self.weights.values())
        _clear(self.inputs.leaves())

    def results(self, outs):
        i = self.inputs
        res = {"x2": outs[0], ("y1" if i.attention else "qkv"): outs[1],
               "dx0": i.x0.grad, "dy0": i.y0.grad}
        res.update({"d" + k: w.grad for k, w in self.weights.items()})
        return {k: v.detach() for k, v in res.items() if v is not None}

    def param_tensors(self):
        return list(self.weights.values())


class NativeBlockSide:
    """The coda side's layer on its weights and inputs, called through coda's C ABI alone
    (coda_adapter.NativeMiddle: buffers and descriptors made once, no dispatcher, no autograd).
    prepare() (untimed) writes the seed gradient of x2 where the C backward reads it. With
    attention, the same SDPA call as the coda side's runs after the C forward, under autograd
    on a leaf over the preallocated qkv, and its gradient feeds the C backward: the two sides
    then differ only in what coda.ops does around the C calls."""

    def __init__(self, coda_side):
        i = self.inputs = coda_side.inputs
        m = i.batch * i.seq
        self.block = coda_adapter.NativeMiddle(i.x0.view(m, -1), i.y0.view(m, -1),
                                               coda_side.weights, i.positions, i.inv_freq,
                                               *coda_side.config)
        self.x2 = self.block.x2.view(i.batch, i.seq, -1)
        self.qkv = self.block.qkv.view(i.batch, i.seq, -1)
        if i.attention:
            self.qkv = self.qkv.detach().requires_grad_()
        else:
            self.block.bind_dqkv(i.g_qkv.view(m, -1))

    def prepare(self):
        self.block.seed_dx(self.inputs.g_x2)

    def forward(self):
        self.block.forward()
        return _attention(self.inputs.cfg, self.qkv) if self.inputs.attention else None

    def backward(self, y1):
        i = self.inputs
        if not i.attention:
            self.block.backward()
            return
        torch.autograd.backward(y1, i.g_y1)
        dqkv, self.qkv.grad = self.qkv.grad, None
        # .contiguous() as coda.ops' backward does (a no-op for what autograd gives here).
        self.block.backward(dqkv.reshape(i.batch * i.seq, -1).contiguous())

    def zero_grad(self):
        # The C backward writes its gradients (accumulate off): nothing to clear but the SDPA
        # leaf's, which autograd accumulates.
        if self.inputs.attention:
            self.qkv.grad = None

    def results(self, y1):
        i, b = self.inputs, self.block
        res = {"x2": self.x2, ("y1" if i.attention else "qkv"): y1 if i.attention else self.qkv,
               "dx0": b.dx.view_as(i.x0), "dy0": b.dy0.view_as(i.y0)}
        res.update({"d" + k: g for k, g in b.dweights.items()})
        return {k: v.detach() for k, v in res.items()}


class ModelInputs:
    def __init__(self, cfg, tokens, batch, device="cuda", seed=0):
        if tokens % batch:
            raise ValueError("tokens (%d) must be a multiple of batch (%d)" % (tokens, batch))
        gen = torch.Generator(device=device).manual_seed(seed)
        self.input_ids = torch.randint(0, cfg.vocab_size, (batch, tokens // batch), generator=gen,
                                       device=device)
        self.labels = self.input_ids


class ModelSide:
    """A causal LM whose forward(input_ids, labels=labels) returns the mean loss: the
    reference eagerly (fn = module), through torch.compile, or coda's Llama."""

    def __init__(self, module, inputs, fn=None):
        self.module, self.inputs, self.fn = module, inputs, (module if fn is None else fn)

    def forward(self):
        # A timed forward + backward stands for a training step, whose optimizer step changes
        # every weight: a coda Llama keeping its FP8 weight copies (fp8_weights_once) makes
        # them again in each, as training would, not once for all the repetitions.
        drop = getattr(self.module, "drop_fp8_weights", None)
        if drop is not None:
            drop()
        return self.fn(self.inputs.input_ids, labels=self.inputs.labels)

    def backward(self, loss):
        loss.backward()

    def zero_grad(self):
        self.module.zero_grad(set_to_none=True)

    def results(self, loss):
        res = {"loss": loss.detach().float().reshape(1)}
        res.update(coda_adapter.model_grads_hf(self.module))
        return {k: v.detach() for k, v in res.items() if v is not None}


def build_reference_block(cfg, attention, seed=0, device="cuda", dtype=torch.bfloat16):
    return init_weights(ReferenceMiddle(cfg, attention=attention, device=device, dtype=dtype), seed)


def build_reference_model(cfg, seed=0, device="cuda", dtype=torch.bfloat16):
    return init_weights(ReferenceLlama(cfg, device=device, dtype=dtype), seed)


__all__ = ["BlockInputs", "TorchBlockSide", "CodaBlockSide", "NativeBlockSide", "ModelInputs",
           "ModelSide", "build_reference_block", "build_reference_model", "RefConfig"]
