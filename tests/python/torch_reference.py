"""The textbook (unfused) Llama block in plain torch, written as Hugging Face's LlamaForCausalLM
computes it, and the project's tolerance rule (ARCHITECTURE.md section 7):

    max|coda - ref_fp32| <= 2 * max|torch_bf16 - ref_fp32| + 1e-6

where ref_fp32 is this reference on fp32 copies of the inputs and torch_bf16 the same reference
on the 16-bit inputs (torch's own rounding)."""

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    """LlamaRMSNorm: normalize in fp32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(t, positions, inv_freq):
    """Rotate-half RoPE on t [M, heads, head_dim]; cos/sin in t's dtype as HF does."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(t.dtype)[:, None], emb.sin().to(t.dtype)[:, None]
    return t * cos + rotate_half(t) * sin


def qkv_projection(x, attn_norm, w_qkv, positions, inv_freq, block):
    h, kv, d = block.n_heads, block.n_kv_heads, block.head_dim
    m = x.shape[0]
    qkv = rms_norm(x, attn_norm, block.eps) @ w_qkv.t()
    q = rope(qkv[:, : h * d].reshape(m, h, d), positions, inv_freq).reshape(m, -1)
    k = rope(qkv[:, h * d:(h + kv) * d].reshape(m, kv, d), positions, inv_freq).reshape(m, -1)
    return torch.cat((q, k, qkv[:, (h + kv) * d:]), dim=1)


def mlp_residual(x0, y0, w_out, ffn_norm, w_gate_up, w_down, eps):
    """x1 = x0 + o_proj(y0); x2 = x1 + down(silu(gate) * up), gate/up interleaved rows."""
    x1 = x0 + y0 @ w_out.t()
    gu = rms_norm(x1, ffn_norm, eps) @ w_gate_up.t()
    gate, up = gu[:, 0::2], gu[:, 1::2]
    return x1 + (F.silu(gate) * up) @ w_down.t()


def first(x, attn_norm, w_qkv, positions, inv_freq, block):
    return qkv_projection(x, attn_norm, w_qkv, positions, inv_freq, block)


def middle(x0, y0, w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv, positions, inv_freq,
           block):
    x2 = mlp_residual(x0, y0, w_out, ffn_norm, w_gate_up, w_down, block.eps)
    return x2, qkv_projection(x2, attn_norm, w_qkv, positions, inv_freq, block)


def last_logits(x0, y0, w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head, block):
    x2 = mlp_residual(x0, y0, w_out, ffn_norm, w_gate_up, w_down, block.eps)
    return rms_norm(x2, final_norm, block.eps) @ lm_head.t()


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean"):
    """HF's loss on (already shifted) targets: fp32 logits; a mean over no valid target is 0
    (coda's convention) instead of NaN."""
    targets = targets.long()
    total = F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")
    if reduction == "sum":
        return total
    return total / (targets != ignore_index).sum().clamp(min=1)


def token_losses(logits, targets, ignore_index=-100):
    """Per-token losses (0 for ignored targets), fp32."""
    return F.cross_entropy(logits.float(), targets.long(), ignore_index=ignore_index,
                           reduction="none")


def max_err(got, ref):
    return (got.detach().double() - ref.detach().double()).abs().max().item()


def check_rule(name, got, ref_fp32, torch_bf16, context="", atol=1e-6):
    """Assert the section 7 rule for one tensor; returns (coda error, torch error). Another atol
    only with its reason beside the call (the rounding floor of an fp32 statistic, e.g.)."""
    assert got.shape == ref_fp32.shape, "%s: shape %s, expected %s" % (
        name, tuple(got.shape), tuple(ref_fp32.shape))
    assert not torch.isnan(got.detach().float()).any(), "%s: NaN %s" % (name, context)
    err, base = max_err(got, ref_fp32), max_err(torch_bf16, ref_fp32)
    assert err <= 2 * base + atol, (
        "%s: coda error %.3e > 2 x torch's bf16 error %.3e + %.1e %s"
        % (name, err, base, atol, context))
    return err, base


def check_rounded_rule(name, got, ref_fp32, torch_bf16, context=""):
    """check_rule for a 16-bit gradient of sums (a weight's, a gamma's): each element of `got`
    first moved toward the reference by up to half an ulp of its dtype at that element, as the
    C++ block suites' check_grad does (tests/common/kernel_fixtures.cpp, check_rounded_output).
    Both sides round their sum once at the end, and at a gradient's largest elements half an ulp
    is as large as the sums' own error: the baseline's largest error need not sit where its
    rounding went the wrong way (docs/reliability.md, "Cpu/Block gradients")."""
    g, r = got.detach().double(), ref_fp32.detach().double()
    eps = torch.finfo(got.dtype).eps  # one ulp at 1 (2^-7 for bf16)
    top = torch.maximum(g.abs(), r.abs()).clamp(min=torch.finfo(got.dtype).tiny)
    half = eps * torch.exp2(torch.floor(torch.log2(top))) / 2
    d = g - r
    moved = torch.where(d.abs() <= half, r, g - torch.sign(d) * half)
    return check_rule(name + " (less half an ulp)", moved, ref_fp32, torch_bf16, context)


def check_loss(name, got, token_ref, token_bf16, targets, ignore_index=-100, reduction="mean",
               context=""):
    """The rule for a reduced loss, applied per token (as examples/llama_block.cpp does): the
    bound is twice the summed per-token |torch bf16 - fp32| loss error, scaled like the loss.
    A scalar's own error would make the bound depend on cancellation luck."""
    valid = (targets.reshape(-1) != ignore_index)
    base = (token_bf16.double() - token_ref.double()).abs()[valid].sum().item()
    ref = token_ref.double()[valid].sum().item()
    if reduction == "mean":
        n = max(int(valid.sum().item()), 1)
        base, ref = base / n, ref / n
    err = abs(float(got.detach() if hasattr(got, "detach") else got) - ref)  # (a loss with its graph)
    assert err <= 2 * base + 1e-6, (
        "%s: coda error %.3e > 2 x torch's bf16 error %.3e + 1e-6 %s" % (name, err, base, context))


# ---- test set-up shared by the torch test files


def sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def device_params():
    """["cpu", "cuda"] as pytest params; cuda skipped (reported) without an sm_90 GPU."""
    import pytest

    return [
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not sm90(), reason="needs an sm_90 GPU")),
    ]


def pad_batch(ids, labels, right=7, left=5, ignore_index=-100):
    """A [2, S] batch padded as Hugging Face's collators pad (token 0, label -100): row 0 on the
    right by `right` positions, row 1 on the left by `left`, whose pad positions then attend to
    no key. -> (ids, labels, attention_mask)."""
    mask = torch.ones_like(ids)
    mask[0, ids.shape[1] - right:] = 0
    mask[1, :left] = 0
    return (ids.masked_fill(mask == 0, 0), labels.masked_fill(mask == 0, ignore_index), mask)


def generator(seed, salt=0):
    g = torch.Generator()
    g.manual_seed((seed * 1000003 + salt) % (1 << 63))
    return g


def uniform(shape, lo, hi, gen, dtype=torch.bfloat16, device="cpu"):
    return (torch.rand(shape, generator=gen) * (hi - lo) + lo).to(dtype=dtype, device=device)


def weight(out_features, in_features, gen, dtype=torch.bfloat16, device="cpu"):
    """Entries of size 1/sqrt(in): activations stay O(1) through the layers."""
    b = in_features ** -0.5
    return uniform((out_features, in_features), -b, b, gen, dtype, device)


def norm_weight(n, gen, dtype=torch.bfloat16, device="cpu"):
    return uniform((n,), 0.5, 1.5, gen, dtype, device)


# ---- a whole causal LM on coda-layout weights (what coda.models.Llama computes)


def causal_attention(q, k, v, key_mask=None):
    """q [B, H, S, d], k/v [B, KV, S, d] -> [B, H, S, d]: causal softmax attention (fp32
    softmax), key/value head h // (H / KV) for query head h. key_mask [B, S] (False: padding)
    removes keys; a query left with none outputs zeros (torch >= 2.5's SDPA: an empty softmax
    row is zeros)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    s = q.shape[-2]
    allowed = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    if key_mask is not None:
        allowed = allowed & key_mask.to(torch.bool)[:, None, None, :]
    empty = ~allowed.any(-1, keepdim=True)
    # An empty row keeps its scores through the softmax (finite, so that no NaN reaches the
    # gradients) and is zeroed after it.
    probs = scores.masked_fill(~allowed & ~empty, float("-inf")).softmax(-1)
    return probs.masked_fill(empty, 0.0).to(q.dtype) @ v


def model_logits(params, input_ids, position_ids, inv_freq, block, key_mask=None):
    """params: {"embed", "layers": [{attn_norm, w_qkv, w_out, ffn_norm, w_gate_up, w_down}],
    "norm", "lm_head"} -> logits [B, S, V] in the parameters' dtype. key_mask: as
    causal_attention takes it."""
    b, s = input_ids.shape
    h, kv, d = block.n_heads, block.n_kv_heads, block.head_dim
    x = params["embed"][input_ids].reshape(b * s, -1)
    positions = position_ids.expand(b, s).reshape(-1)
    for layer in params["layers"]:
        qkv = qkv_projection(x, layer["attn_norm"], layer["w_qkv"], positions, inv_freq, block)
        q, k, v = qkv.view(b, s, h + 2 * kv, d).split([h, kv, kv], dim=2)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), key_mask)
        y = o.transpose(1, 2).reshape(b * s, h * d)
        x = mlp_residual(x, y, layer["w_out"], layer["ffn_norm"], layer["w_gate_up"],
                         layer["w_down"], block.eps)
    return (rms_norm(x, params["norm"], block.eps) @ params["lm_head"].t()).view(b, s, -1)


def expect_bypass_bitwise_equal(ops, run):
    """run() through the torch.library dispatcher and again with coda.ops' eager bypass on (ops:
    the coda.ops module); every tensor it returns must be bit for bit the same."""
    previous = ops.set_eager_bypass(False)
    try:
        through_dispatcher = run()
        ops.set_eager_bypass(True)
        bypassed = run()
    finally:
        ops.set_eager_bypass(previous)
    assert len(through_dispatcher) == len(bypassed)
    for a, b in zip(through_dispatcher, bypassed):
        assert torch.equal(a, b)


# ---- coda.patch_hf's fused weights (test_patch_hf.py, test_hf.py)


def projection_groups(layer):
    """A Hugging Face decoder layer's weights by the tensor patch_hf fuses them into."""
    attn, mlp = layer.self_attn, layer.mlp
    return {"qkv": [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
            "gate_up": [mlp.gate_proj.weight, mlp.up_proj.weight]}


def assert_row_blocks(tensors, whole=None):
    """tensors: dense and consecutive in memory, from whole's first element to its last when
    whole is given."""
    address = tensors[0].data_ptr() if whole is None else whole.data_ptr()
    for t in tensors:
        assert t.is_contiguous() and t.data_ptr() == address
        address += t.numel() * t.element_size()
    if whole is not None:
        assert address == whole.data_ptr() + whole.numel() * whole.element_size()


def assert_fused(model):
    """Every patched layer's q/k/v and gate/up parameters are the row blocks of its fused
    tensors."""
    fused = model._coda_state["fused"]
    assert len(fused) == len(model.model.layers)
    for layer, tensors in zip(model.model.layers, fused):
        for group, params in projection_groups(layer).items():
            assert_row_blocks(params, tensors[group])


def fused_tensors(model):
    """The patched model's fused tensors, in order (to compare by identity)."""
    return [t[group] for t in model._coda_state["fused"] for group in ("qkv", "gate_up")]


def same_objects(xs, ys):
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys))


def storage_address(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def watch_coda_weights(monkeypatch, ops):
    """Record the address of each w_qkv that reaches coda's layers and of each [gate; up]
    tensor interleaved for them: {"w_qkv": [...], "gate_up": [...]}, one per decoder layer."""
    seen = {"w_qkv": [], "gate_up": []}

    def watch(name, key, pick):
        fn = getattr(ops, name)

        def wrapper(*args, **kwargs):
            seen[key].append(pick(*args).data_ptr())
            return fn(*args, **kwargs)

        monkeypatch.setattr(ops, name, wrapper)

    watch("llama_first", "w_qkv", lambda x, w, *rest: w[1])
    watch("llama_middle", "w_qkv", lambda x, y, w, *rest: w[5])
    watch("interleave_gate_up", "gate_up", lambda stacked: stacked)
    return seen


def assert_no_weight_copies(model, seen):
    """What watch_coda_weights saw: coda read each layer's fused q/k/v tensor, and the
    interleave its fused [gate; up] tensor."""
    layers = model.model.layers
    assert seen["w_qkv"] == [layer.self_attn.q_proj.weight.data_ptr() for layer in layers]
    assert seen["gate_up"] == [layer.mlp.gate_proj.weight.data_ptr() for layer in layers]


# ---- the model tests' gradients, step by step (test_models.py; docs/reliability.md says why)


def record_chain(monkeypatch, ops, models):
    """Record each step of coda's layer loop (models.run_layers) as the forward and backward
    run it: every llama_first / llama_middle / llama_last call and every attention between
    them, with the tensors it read and, once the backward has run, the gradient that reached
    each of its inputs and outputs. -> the list of steps, in forward order: dicts with "kind",
    "inputs" (tensors, weights apart), "input_ids" (their id()s: the embedding output feeds two
    calls), "weights", "outputs", "args" (the rest of the call) and "grads" ({"in": [...],
    "out": [...], "w": [...]}, None where nothing arrived: an input's is the total of all its
    uses; "w" only for weights that are not leaves, e.g. a patched Hugging Face model's fused
    w_qkv and interleaved w_gate_up, which hold no .grad of their own)."""
    steps = []

    def hooked(tensors, slots, leaves=True):
        for i, t in enumerate(tensors):
            if t.requires_grad and (leaves or not t.is_leaf):
                t.register_hook(lambda g, i=i: slots.__setitem__(i, g.detach().clone()))

    def step(kind, inputs, weights, outputs, args, saved=None):
        s = {"kind": kind, "inputs": [t.detach() for t in inputs], "weights": list(weights),
             "saved": saved,
             "input_ids": [id(t) for t in inputs], "sources": list(inputs),  # ids stay unique
             "outputs": [t.detach() for t in outputs], "args": args,
             "grads": {"in": [None] * len(inputs), "out": [None] * len(outputs),
                       "w": [None] * len(weights)}}
        hooked(inputs, s["grads"]["in"])
        hooked(outputs, s["grads"]["out"])
        # A parameter keeps a hook for good, and a tied one's would see both uses summed: its
        # gradient is read from its .grad instead.
        hooked(weights, s["grads"]["w"], leaves=False)
        steps.append(s)

    first, middle, last, attend = ops.llama_first, ops.llama_middle, ops.llama_last, models._attend

    @torch.no_grad()
    def forward_outputs(spec, names, *args):
        """Every output of the call's forward op, the activations its backward reads among
        them (the public functions return two): the same kernels on the same tensors again."""
        return dict(zip(names, ops._run(spec, *args)))

    def rope_args(positions, inv_freq, x, c):
        return (ops._positions(positions, x), ops._inv_freq(inv_freq, x), c.n_heads,
                c.n_kv_heads, c.head_dim, c.eps, ops._PRECISIONS[c.precision])

    # kw: fp8_weights, the op's FP8 weight copies where the model keeps them (models.Llama's
    # fp8_weights_once), passed on to the op and to the re-run of its forward.
    def first_(x, weights, positions, inv_freq, config, **kw):
        qkv = first(x, weights, positions, inv_freq, config, **kw)
        c = ops.block_config(config)
        saved = forward_outputs(ops._FIRST_FWD, ("qkv", "r"), x.detach(),
                                *[w.detach() for w in weights],
                                *rope_args(positions, inv_freq, x, c),
                                list(kw.get("fp8_weights") or ()))
        assert torch.equal(saved["qkv"], qkv)
        step("first", [x], weights, [qkv], (positions, inv_freq, c), saved)
        return qkv

    def middle_(x0, y0, weights, positions, inv_freq, config, **kw):
        x2, qkv = middle(x0, y0, weights, positions, inv_freq, config, **kw)
        c = ops.block_config(config)
        saved = forward_outputs(ops._MIDDLE_FWD, ("x2", "qkv", "x1", "z1", "r1", "r2"),
                                x0.detach(), y0.detach(), *[w.detach() for w in weights],
                                *rope_args(positions, inv_freq, x0, c),
                                list(kw.get("fp8_weights") or ()))
        assert torch.equal(saved["x2"], x2) and torch.equal(saved["qkv"], qkv)
        step("middle", [x0, y0], weights, [x2, qkv], (positions, inv_freq, c), saved)
        return x2, qkv

    def last_(x0, y0, targets, weights, config, **kw):
        loss, logits = last(x0, y0, targets, weights, config, **kw)
        fp8_weights = list(kw.get("fp8_weights") or ())
        c = ops.block_config(config)
        reduction = kw.get("reduction", "mean")
        saved = forward_outputs(
            ops._LAST_FWD, ("loss", "logits", "x1", "z1", "r1", "x2", "r2", "dlogits",
                            "grad_scale"), x0.detach(),
            y0.detach(), targets.reshape(-1).to(device=x0.device, dtype=torch.int32),
            *[w.detach() for w in weights], c.n_heads, c.n_kv_heads, c.head_dim, c.eps,
            ops._PRECISIONS[c.precision], c.ignore_index, ops._REDUCTIONS[reduction], True,
            fp8_weights)
        step("last", [x0, y0], weights, [loss], (targets, c, reduction), saved)
        return loss, logits

    def attend_(qkv, batch, seq, block, padding):
        y = attend(qkv, batch, seq, block, padding)
        step("attention", [qkv], (), [y], (batch, seq, block, padding, attend))
        return y

    monkeypatch.setattr(ops, "llama_first", first_)
    monkeypatch.setattr(ops, "llama_middle", middle_)
    monkeypatch.setattr(ops, "llama_last", last_)
    monkeypatch.setattr(models, "_attend", attend_)
    return steps


class DropRow(torch.autograd.Function):
    """Identity forward; the backward loses row `row` of the gradient (a planted mistake for
    the tests of check_chain)."""

    @staticmethod
    def forward(ctx, t, row):
        ctx.row = row
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        g[ctx.row] = 0
        return g, None


PATCHED_MISTAKES = ["scale", "dropped_row", "fused_rows"]


def plant_patched_mistake(mistake, monkeypatch, ops, token):
    """A planted mistake in a patched Hugging Face model's step, for the tests that check_chain
    (and the HF-gradient mapping) still catches it: an HF gamma's gradient 1/32 off in scale,
    one middle call losing dqkv row `token`, or one row of k_proj's gradient (a view into the
    fused q/k/v gradient) changed after the backward. -> (plant(model) or None, the failure
    message's pattern)."""
    layer = lambda model: model.model.layers[1]  # noqa: E731
    if mistake == "scale":
        def plant(model):
            layer(model).post_attention_layernorm.weight.grad *= 1 + 2.0 ** -5
        return plant, r"grad layers\.1\.ffn_norm"
    if mistake == "fused_rows":
        def plant(model):
            layer(model).self_attn.k_proj.weight.grad[7] += 2.0 ** -6
        return plant, r"grad model\.layers\.1\.self_attn\.k_proj\.weight: not the rows"
    middle = ops.llama_middle

    def dropping(x0, y0, weights, *args):
        x2, qkv = middle(x0, y0, weights, *args)
        return x2, DropRow.apply(qkv, token)
    monkeypatch.setattr(ops, "llama_middle", dropping)
    return None, r"grad layers\.0\."  # the call's own weights: the first check


class _Saved(torch.autograd.Function):
    """The value of `saved` (an activation coda's forward stored), the gradient of `t` (the
    textbook's own): the textbook's backward then reads what coda's backward reads."""

    @staticmethod
    def forward(ctx, t, saved):
        return saved.to(t.dtype).reshape(t.shape).clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


def _norm_saved(x, weight, rstd, eps):
    """rms_norm with the saved rstd (coda's, from the unrounded sum of squares) as its value."""
    dtype = x.dtype
    h = x.float()
    r = _Saved.apply(torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps), rstd.float())
    return weight * (h * r).to(dtype)


def _qkv_saved(normed, w_qkv, positions, inv_freq, block):
    h, kv, d = block.n_heads, block.n_kv_heads, block.head_dim
    m = normed.shape[0]
    qkv = normed @ w_qkv.t()
    q = rope(qkv[:, : h * d].reshape(m, h, d), positions, inv_freq).reshape(m, -1)
    k = rope(qkv[:, h * d:(h + kv) * d].reshape(m, kv, d), positions, inv_freq).reshape(m, -1)
    return torch.cat((q, k, qkv[:, (h + kv) * d:]), dim=1)


def _mlp_saved(x0, y0, w_out, ffn_norm, w_gate_up, w_down, sv, eps):
    """mlp_residual with x1, the gate/up pre-activation and x2 taking coda's stored values."""
    x1 = _Saved.apply(x0 + y0 @ w_out.t(), sv["x1"])
    gu = _Saved.apply(_norm_saved(x1, ffn_norm, sv["r1"], eps) @ w_gate_up.t(), sv["z1"])
    gate, up = gu[:, 0::2], gu[:, 1::2]
    return _Saved.apply(x1 + (F.silu(gate) * up) @ w_down.t(), sv["x2"])


def _textbook_step(s, dtype, key_mask, names):
    """The textbook (unfused) form of one recorded step on fp32 copies (dtype float32) or the
    16-bit tensors as coda's step read them (None), its activations taking the values coda's
    forward stored (x1, the pre-activation, x2, the rstds, the logits: what coda's backward
    reads; the rest, e.g. the normalized inputs, formed from them as an unfused forward forms
    them), driven backward by the gradients coda's chain handed the step. -> {name: gradient}
    for the step's inputs ("d in0", "d in1") and weights (names: their parameter names)."""
    inputs = [t.detach().clone().to(dtype or t.dtype).requires_grad_() for t in s["inputs"]]
    weights = [w.detach().clone().to(dtype or w.dtype).requires_grad_() for w in s["weights"]]
    sv = s["saved"]
    if s["kind"] == "first":
        positions, inv_freq, block = s["args"]
        (x,), (attn_norm, w_qkv) = inputs, weights
        outs = [_qkv_saved(_norm_saved(x, attn_norm, sv["r"], block.eps), w_qkv, positions,
                           inv_freq, block)]
    elif s["kind"] == "middle":
        positions, inv_freq, block = s["args"]
        w_out, ffn_norm, w_gate_up, w_down, attn_norm, w_qkv = weights
        x2 = _mlp_saved(*inputs, w_out, ffn_norm, w_gate_up, w_down, sv, block.eps)
        outs = [x2, _qkv_saved(_norm_saved(x2, attn_norm, sv["r2"], block.eps), w_qkv,
                               positions, inv_freq, block)]
    elif s["kind"] == "last":
        # From the logits' gradient down. Coda's cross-entropy stores dlogits = softmax - onehot
        # rounded to bf16 and applies the loss's scale (1/#targets for the mean) in fp32 later,
        # as the GEMMs' alpha; torch's autograd rounds the scaled gradient instead: two
        # roundings of one size at different points, whose errors are independent draws (the
        # last layer's gamma and head gradients reached 0.96 of the bound from them alone).
        # So the textbook backward takes coda's stored dlogits and the scale is applied to its
        # results in fp32; check_chain holds dlogits to their fp32 value on their own.
        w_out, ffn_norm, w_gate_up, w_down, final_norm, lm_head = weights
        x2 = _mlp_saved(*inputs, w_out, ffn_norm, w_gate_up, w_down, sv, s["args"][1].eps)
        logits = _norm_saved(x2, final_norm, sv["r2"], s["args"][1].eps) @ lm_head.t()
        dloss = s["grads"]["out"][0]
        scale = sv["grad_scale"].float().reshape(()) * (1.0 if dloss is None else dloss.float())
        leaves = inputs + weights
        grads = torch.autograd.grad(logits, leaves, sv["dlogits"].to(logits.dtype))
        keys = ["d in%d" % i for i in range(len(inputs))] + list(names)
        return {k: (g.float() * scale).to(g.dtype) for k, g in zip(keys, grads)}
    else:  # attention: torch's, outside coda
        # The 16-bit baseline is the very attention the model ran (SDPA where torch has it),
        # so the rule holds coda's steps, not SDPA's kernels against the textbook: on the CPU,
        # torch 2.11's SDPA backward gave the qkv gradient 2.1x the textbook bf16 error (seed
        # 1785069625); with torch 1.13 (no SDPA) both were the same math.
        batch, seq, block, padding, attend = s["args"]
        if dtype is None:
            outs = [attend(inputs[0], batch, seq, block, padding)]
        else:
            h, kv, d = block.n_heads, block.n_kv_heads, block.head_dim
            q, k, v = inputs[0].view(batch, seq, h + 2 * kv, d).split([h, kv, kv], dim=2)
            o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 key_mask)
            outs = [o.transpose(1, 2).reshape(batch * seq, h * d)]
    # The last step's loss is the model's own: its incoming gradient is 1 (loss.backward()).
    incoming = [torch.ones_like(o) if g is None else g.to(o.dtype)
                for o, g in zip(outs, s["grads"]["out"])]
    leaves = inputs + weights
    grads = torch.autograd.grad(outs, leaves, incoming, allow_unused=True)
    keys = ["d in%d" % i for i in range(len(inputs))] + list(names)
    return dict(zip(keys, grads))


_STEP_WEIGHTS = {  # the weights each call of run_layers reads, in order, and whose layer
    "first": [(0, "attn_norm"), (0, "w_qkv")],
    "middle": [(0, "w_out"), (0, "ffn_norm"), (0, "w_gate_up"), (0, "w_down"),
               (1, "attn_norm"), (1, "w_qkv")],  # the next layer's
    "last": [(0, "w_out"), (0, "ffn_norm"), (0, "w_gate_up"), (0, "w_down"), (None, "norm"),
             (None, "lm_head")],
}


def step_weight_names(steps):
    """The coda names (coda.models.Llama's parameter names: layers.<i>.<weight>, norm, lm_head)
    of the weights each recorded step read, from the step's place in run_layers' loop: the same
    for a coda model and for a patched Hugging Face one, whose weights have other names or are
    not parameters at all (the fused w_qkv, the interleaved w_gate_up)."""
    names, layer = [], 0
    for s in steps:
        places = _STEP_WEIGHTS.get(s["kind"], [])
        names.append([k if i is None else "layers.%d.%s" % (layer + i, k) for i, k in places])
        if s["kind"] == "middle":
            layer += 1
    return names


def check_chain(steps, model, ids, key_mask, context=""):
    """Hold every gradient of coda's layer loop to the section 7 rule step by step: each step
    (a layer call, an attention) against its textbook form fed the very tensors that step read
    and the gradients that reached its outputs; the input gradients each step handed on, every
    layer weight's gradient, and the embedding's (the embedding backward of the gradient the
    first call handed on, plus the LM head's where the weights are tied). model: a 16-bit
    coda.models.Llama, or a patched Hugging Face LlamaForCausalLM (coda.patch_hf), whose
    backward has run. A weight's gradient is its .grad where the step read a parameter, else
    (a patched model's fused w_qkv and interleaved w_gate_up) the gradient record_chain saw
    reach it. -> {coda name: the gradient checked} for every weight and "embed_tokens.weight"
    (a tied head's share is in the embedding's), for hf_gradients."""
    embed = getattr(model, "model", model).embed_tokens.weight  # HF: the decoder is .model
    params = dict(model.named_parameters())  # coda's names: each must be the tensor read
    checked = {}
    embed_ref = embed_base = None
    uses = {}  # input tensor -> (coda's gradient, [(label, ref, base)] of every step reading it)
    for index, (s, w_names) in enumerate(zip(steps, step_weight_names(steps))):
        label = "%s step %d" % (s["kind"], index)
        ref = _textbook_step(s, torch.float32, key_mask, w_names)
        base = _textbook_step(s, None, key_mask, w_names)
        for i, (key, got) in enumerate(zip(s["input_ids"], s["grads"]["in"])):
            if got is not None:
                uses.setdefault(key, (got, []))[1].append(
                    (label, ref["d in%d" % i], base["d in%d" % i]))
        for w, n, hooked in zip(s["weights"], w_names, s["grads"]["w"]):
            assert params.get(n, w) is w, "%s: the step read another tensor" % n
            if w is embed:  # tied: the head's share of the embedding's
                embed_ref, embed_base = ref[n], base[n]
                continue
            got = w.grad if w.is_leaf else hooked
            assert got is not None, "grad %s: none reached the weight %s" % (n, context)
            check_rounded_rule("grad " + n, got, ref[n], base[n], context)
            checked[n] = got
        if s["kind"] == "first":
            dx = s["grads"]["in"][0]
        if s["kind"] == "last":  # dlogits = softmax(logits) - onehot, from the stored logits
            targets, block, _ = s["args"]
            ref_d = torch.softmax(s["saved"]["logits"].float(), -1)
            valid = targets != block.ignore_index
            ref_d[valid, targets[valid].long()] -= 1
            ref_d[~valid] = 0
            check_rule("dlogits", s["saved"]["dlogits"], ref_d,
                       ref_d.to(s["saved"]["dlogits"].dtype), context)
    # Each input's gradient, summed over the steps that read it as autograd sums them (the
    # embedding output is the first call's input and the first middle call's residual x0).
    # A sum of two is rounded once more, by autograd's bf16 add, on both sides: that rounding
    # is the result's own (half an ulp allowed, as for the weight gradients). Seed 271 (tied,
    # unpadded) put the embedding output's gradient at 0.974 of the plain rule, an error of one
    # ulp at its largest elements (docs/reliability.md).
    for got, terms in uses.values():
        ref, base = terms[0][1], terms[0][2]
        for _, r, b in terms[1:]:
            ref, base = ref + r, base + b
        check = check_rule if len(terms) == 1 else check_rounded_rule
        check("d input of " + " + ".join(t[0] for t in terms), got, ref, base, context)
    # The embedding: its backward on the gradient the first call handed on (fp32 and bf16,
    # as the textbook's autograd accumulates a row's tokens), the tied head's share added.
    flat = ids.reshape(-1)

    def embedding_grad(dtype, head):
        table = embed.detach().clone().to(dtype or embed.dtype).requires_grad_()
        out = torch.nn.functional.embedding(flat, table)
        (g,) = torch.autograd.grad(out, table, dx.to(out.dtype))
        return g if head is None else g + head
    check_rounded_rule("grad embed_tokens.weight", embed.grad,
                       embedding_grad(torch.float32, embed_ref), embedding_grad(None, embed_base),
                       context)
    checked["embed_tokens.weight"] = embed.grad
    return checked


_HF_NAMES = {"attn_norm": "input_layernorm.weight", "w_out": "self_attn.o_proj.weight",
             "ffn_norm": "post_attention_layernorm.weight", "w_down": "mlp.down_proj.weight"}


def hf_gradients(checked, block):
    """check_chain's gradients (coda's names) under a Hugging Face LlamaForCausalLM's parameter
    names, each HF weight's the rows of the coda tensor it is part of (coda/hf.py's mapping,
    restated): q, k and v the consecutive row blocks of w_qkv, gate and up the even and odd
    rows of w_gate_up (gate0, up0, gate1, ...). lm_head.weight only where the head is untied."""
    rows = [block.n_heads * block.head_dim] + [block.n_kv_heads * block.head_dim] * 2
    out = {"model.embed_tokens.weight": checked["embed_tokens.weight"],
           "model.norm.weight": checked["norm"]}
    if "lm_head" in checked:
        out["lm_head.weight"] = checked["lm_head"]
    for name, g in checked.items():
        if not name.startswith("layers."):
            continue
        _, i, key = name.split(".")
        prefix = "model.layers.%s." % i
        if key == "w_qkv":
            for proj, part in zip("qkv", g.split(rows, dim=0)):
                out[prefix + "self_attn.%s_proj.weight" % proj] = part
        elif key == "w_gate_up":
            out[prefix + "mlp.gate_proj.weight"] = g[0::2]
            out[prefix + "mlp.up_proj.weight"] = g[1::2]
        else:
            out[prefix + _HF_NAMES[key]] = g
    return out


def assert_hf_gradients(got, hf_model, want, context=""):
    """The gradients coda gave a Hugging Face model's parameters (got: {HF name: gradient}, a
    patched model's .grad or coda.to_hf_state_dict(model, grads=True)) are, for every
    parameter of hf_model and nothing else, of its shape and bit for bit what check_chain held
    to the rule (want: hf_gradients')."""
    names = []
    for name, p in hf_model.named_parameters():
        names.append(name)
        g = got.get(name)
        assert g is not None, "grad %s: none %s" % (name, context)
        assert g.shape == p.shape, "grad %s: shape %s, parameter %s %s" % (
            name, tuple(g.shape), tuple(p.shape), context)
        assert torch.equal(g, want[name].to(g.dtype)), (
            "grad %s: not the rows of coda's gradient that check_chain checked %s"
            % (name, context))
    assert sorted(names) == sorted(want), "coda's gradients %s, the model's parameters %s" % (
        sorted(set(want) - set(names)), sorted(set(names) - set(want)))
