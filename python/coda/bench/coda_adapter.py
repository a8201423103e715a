"""Everything the benchmark asks of coda itself, in one place: the weight layouts of the
fused block (gate/up interleaved by rows, [Q; K; V]), the middle-layer op, and building a
coda Llama from the reference model."""
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


def middle_op(n_heads, n_kv_heads, head_dim, eps):
    """A function (x0 [M, D], y0 [M, H hd], weights dict, positions [M] i32, inv_freq [hd/2] f32)
    -> (x2 [M, D], qkv [M, (H + 2 Hkv) hd]) running coda's fused middle layer with autograd."""
    import coda.ops

    block = coda.ops.BlockConfig(int(n_heads), int(n_kv_heads), int(head_dim), float(eps))

    def run(x0, y0, w, positions, inv_freq):
        return coda.ops.llama_middle(x0, y0, w, positions, inv_freq, block)

    return run


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
