"""Everything the benchmark asks of coda itself, in one place: the weight layouts of the
fused block (gate/up interleaved by rows, [Q; K; V]), the middle-layer op, the same layer
through the C ABI alone (NativeMiddle), and building a coda Llama from the reference model."""
import torch

# Hugging Face names of the few model gradients the agreement check compares.
MODEL_CHECK_PARAMS = ("lm_head.weight", "model.norm.weight", "model.embed_tokens.weight",
                      "model.layers.0.input_layernorm.weight",
                      "model.layers.0.self_attn.q_proj.weight",
                      "model.layers.0.self_attn.k_proj.weight",
                      "model.layers.0.self_attn.v_proj.weight",
                      "model.layers.0.self_attn.o_proj.weight",
                      "model.layers.0.post_attention_layernorm.weight",
                      "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                      "model.layers.0.mlp.down_proj.weight")


def interleave_gate_up(gate, up):
    """coda's fused gate/up layout: row 2j = gate row j, row 2j + 1 = up row j ([2F, D])."""
    return torch.stack((gate, up), dim=1).flatten(0, 1)


def deinterleave_gate_up(fused):
    pairs = fused.unflatten(0, (-1, 2))
    return pairs[:, 0], pairs[:, 1]


def block_weights_from_reference(ref, grads=False):
    """coda's MiddleWeights (C names: w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv) from
    a ReferenceMiddle's parameters, or (grads=True) from their gradients, keyed 'd' + name."""
    def get(p):
        return p.grad if grads else p.detach()

    w = {
        "w_out": get(ref.o_proj.weight),
        "ffn_norm": get(ref.post_attention_layernorm.weight),
        "w_gate_up": interleave_gate_up(get(ref.mlp.gate_proj.weight), get(ref.mlp.up_proj.weight)),
        "w_down": get(ref.mlp.down_proj.weight),
        "attn_norm": get(ref.next_input_layernorm.weight),
        "w_qkv": torch.cat([get(ref.next_q_proj.weight), get(ref.next_k_proj.weight),
                            get(ref.next_v_proj.weight)]),
    }
    w = {k: v.contiguous() for k, v in w.items()}
    return {"d" + k: v for k, v in w.items()} if grads else w


def middle_op(n_heads, n_kv_heads, head_dim, eps, precision="native", fp8_weights_once=False):
    """A function (x0 [M, D], y0 [M, H hd], weights dict, positions [M] i32, inv_freq [hd/2] f32)
    -> (x2 [M, D], qkv [M, (H + 2 Hkv) hd]) running coda's fused middle layer with autograd;
    precision: coda.ops.BlockConfig's ("native": bf16 GEMMs, "fp8": E4M3 operands).
    fp8_weights_once (fp8): each call first makes the weights' FP8 copies in one pass
    (coda.ops.llama_fp8_weights) and hands them to the op, whose forward and backward then read
    them: a training step's cost with the copies made once per step (one micro-batch)."""
    import coda.ops

    block = coda.ops.BlockConfig(int(n_heads), int(n_kv_heads), int(head_dim), float(eps),
                                 precision=precision)

    def run(x0, y0, w, positions, inv_freq):
        fp8 = coda.ops.llama_fp8_weights("middle", w, block) if fp8_weights_once else None
        return coda.ops.llama_middle(x0, y0, w, positions, inv_freq, block, fp8_weights=fp8)

    return run


class NativeMiddle:
    """coda's middle layer called through its C ABI alone (coda._lib; no torch.library
    dispatch, no autograd): the outputs, saved activations, gradients, workspace and every
    descriptor are made once here, so forward() and backward() are one ctypes call each into
    libcoda on the stream current at construction. What coda.ops.llama_middle does around the
    same C calls (the dispatcher, autograd, fresh outputs and gradients per call, the copy of
    d/d x2 its backward makes because it may not write its input) is thereby left out.

    x0 [M, D], y0 [M, H hd]; weights: the dict of llama_middle (coda's layouts); the
    descriptors point at these tensors, which must stay alive and in place. The backward
    reads d/d x2 from `dx` (seed_dx() writes it) and leaves d/d x0 there, as the C call does;
    weight gradients are written (accumulate off), as coda.ops' are."""

    def __init__(self, x0, y0, weights, positions, inv_freq, n_heads, n_kv_heads, head_dim, eps):
        import coda.ops as ops
        from coda import _lib as L
        from coda import _torch as T

        self._L, self._T = L, T
        x0, y0 = x0.detach(), y0.detach()
        w = [weights[n].detach() for n in ops.MIDDLE_WEIGHTS]
        # The converted tensors coda.ops.llama_middle passes (no copies when already int32 /
        # f32 on the device), kept here because the descriptors point at them.
        self.positions, self.inv_freq = ops._positions(positions, x0), ops._inv_freq(inv_freq, x0)
        m, d, f = x0.shape[0], x0.shape[-1], w[3].shape[-1]
        self.cfg = ops._c_config(d, f, n_heads, n_kv_heads, head_dim, 0, eps)
        # The forward's outputs and saved tensors, shaped and typed as coda.ops allocates them.
        self.x2, self.qkv, self.x1, self.z1, self.r1, self.r2 = ops._middle_forward_fake(
            x0, y0, *w, self.positions, self.inv_freq, n_heads, n_kv_heads, head_dim, eps,
            L.LLAMA_NATIVE)
        self.dx = torch.empty_like(x0, memory_format=torch.contiguous_format)
        self.dy0 = torch.empty_like(y0, memory_format=torch.contiguous_format)
        self.dweights = {n: torch.empty_like(t, memory_format=torch.contiguous_format)
                         for n, t in zip(ops.MIDDLE_WEIGHTS, w)}
        self.weights_c, self.inputs_c, self.outputs_c, self.saved_c = ops._middle_tensors(
            x0, y0, *w, self.positions, self.inv_freq, self.x2, self.qkv, self.x1, self.z1,
            self.r1, self.r2)
        self.grads_c = L.LlamaMiddleGrads(
            dx=T.view(self.dx, "dx"), dqkv=L.Tensor(), dy0=T.view(self.dy0, "dy0"),
            dweights=L.LlamaMiddleWeights(*(T.view(self.dweights[n]) for n in ops.MIDDLE_WEIGHTS)))
        self._dqkv = None
        # One buffer for every call, each told the size it asks for (as coda.ops does); the
        # backward runs as coda.ops runs it, in its two parts.
        self._parts = (L.LLAMA_BACKWARD_PART1, L.LLAMA_BACKWARD_PART2)
        with T.device_guard(x0.device):
            sizes = [T.llama_workspace_bytes(L.LLAMA_MIDDLE, p, self.cfg, m, x0.device)
                     for p in (L.LLAMA_FORWARD,) + self._parts]
        self.workspace, _ = T.workspace(max(sizes), x0.device)
        self.ws_fwd, *self.ws_parts = (T.workspace_view(self.workspace, n) for n in sizes)
        self.stream = T.stream(x0)

    def seed_dx(self, dx2):
        """d loss / d x2 into dx, where the backward reads it (and overwrites it with d/d x0)."""
        self.dx.copy_(dx2.reshape(self.dx.shape))

    def bind_dqkv(self, dqkv):
        """d loss / d qkv [M, (H + 2 Hkv) hd] for the following backward calls (kept alive)."""
        self._dqkv = dqkv
        self.grads_c.dqkv = self._T.view(dqkv, "dqkv")

    def forward(self):
        self._L.llama_forward("middle", self.cfg, self.weights_c, self.inputs_c, self.outputs_c,
                              self.saved_c, self.ws_fwd, self.stream)

    def backward(self, dqkv=None):
        """The C backward (its two parts); dqkv: d/d qkv for this call alone (else the bound
        one). It is not kept: the caller holds it through the call, and the stream orders its
        reuse."""
        if dqkv is not None:
            self._dqkv = None
            self.grads_c.dqkv = self._T.view(dqkv, "dqkv")
        for part, ws in zip(self._parts, self.ws_parts):
            self._L.llama_middle_backward_part(part, self.cfg, self.weights_c, self.inputs_c,
                                               self.outputs_c, self.saved_c, self.grads_c, False,
                                               ws, self.stream)


def model_from_reference(ref):
    """coda's Llama holding the reference model's weights (converted, not shared)."""
    import coda

    return coda.from_hf(ref)


def model_grads_hf(module):
    """The MODEL_CHECK_PARAMS gradients in Hugging Face layout, from the reference model or
    from a coda Llama (through coda.to_hf_state_dict); {} where a model cannot say."""
    from .reference import ReferenceLlama

    if isinstance(module, ReferenceLlama):
        params = dict(module.named_parameters())
        grads = {n: params[n].grad for n in MODEL_CHECK_PARAMS if n in params}
    else:
        import coda

        to_hf = getattr(coda, "to_hf_state_dict", None)
        if to_hf is None:
            return {}
        grads = to_hf(module, grads=True)
    return {n: grads[n] for n in MODEL_CHECK_PARAMS if grads.get(n) is not None}


def set_eager_bypass(enabled):
    """coda's eager calls skip the torch dispatcher (coda.ops.set_eager_bypass)."""
    import coda.ops

    return coda.ops.set_eager_bypass(enabled)
