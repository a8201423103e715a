"""The FP8 block's weights quantized once per step (docs/fp8.md, "The weights quantized once per
step"): coda.ops.llama_fp8_weights and the ops' fp8_weights argument, and coda.models.Llama's
fp8_weights_once, which keeps each op's copies and makes them again after a weight changes.

The copies come from the quantizer the ops run when they quantize their own, so everything here
is held bit for bit to the same calls without copies; and a copy the op is given is read (a
doubled scale changes the results: an op that quantized its own anyway would not see it)."""

import copy

import pytest

torch = pytest.importorskip("torch")

from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
# test_models' small model (every GEMM width a multiple of 16, FP8's rule; hidden above 128, so
# that the weights have more than one 128 x 128 block), its weights and its batches.
from test_models import batch, randomize, small_config  # noqa: E402

DEVICES = R.device_params()


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def layer_inputs(gen, device, layer, config):
    """One op's differentiable inputs and weights (a dict), and its other arguments."""
    c = config
    d, f, h, kv, hd = (c.hidden_size, c.intermediate_size, c.num_attention_heads,
                       c.num_key_value_heads, c.head_dim)
    m, qkv = 48, (h + 2 * kv) * hd

    def w(out_features, in_features):
        return R.weight(out_features, in_features, gen, device=device).requires_grad_()

    def g(n):
        return R.norm_weight(n, gen, device=device).requires_grad_()

    def act(width):
        return R.uniform((m, width), -1, 1, gen, device=device).requires_grad_()

    positions = torch.arange(m, device=device)
    inv_freq = models.rope_inv_freq(c).to(device)
    mlp = {"w_out": w(d, h * hd), "ffn_norm": g(d), "w_gate_up": w(2 * f, d), "w_down": w(d, f)}
    if layer == "first":
        return [act(d)], {"attn_norm": g(d), "w_qkv": w(qkv, d)}, (positions, inv_freq)
    if layer == "middle":
        return ([act(d), act(h * hd)], dict(mlp, attn_norm=g(d), w_qkv=w(qkv, d)),
                (positions, inv_freq))
    targets = torch.randint(0, c.vocab_size, (m,), generator=gen).to(device)
    return ([act(d), act(h * hd)], dict(mlp, final_norm=g(d), lm_head=w(c.vocab_size, d)),
            (targets,))


def run_op(layer, inputs, weights, other, block, fp8_weights=None):
    """The op's outputs and every gradient (inputs', weights') of a fixed linear function of
    them."""
    for t in inputs + list(weights.values()):
        t.grad = None
    kw = {} if fp8_weights is None else {"fp8_weights": fp8_weights}
    if layer == "first":
        outs = [ops.llama_first(*inputs, weights, *other, block, **kw)]
    elif layer == "middle":
        outs = list(ops.llama_middle(*inputs, weights, *other, block, **kw))
    else:
        outs = [ops.llama_last(*inputs, *other, weights, block, **kw)[0]]
    sum(o.float().sin().sum() for o in outs).backward()
    return ([o.detach() for o in outs],
            [t.grad.clone() for t in inputs + list(weights.values())])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["first", "middle", "last"])
def test_ops_read_the_given_copies(device, layer):
    """llama_fp8_weights makes both copies of each GEMM weight (uint8 codes [N, K] and [K, N],
    scales [ceil(N/128), ceil(K/128)] and transposed); an op given them gives its own results
    bit for bit, outputs and gradients, and other results where a given scale is doubled, in the
    forward's copy (the outputs move) and in the transposed one (the forward's bits stay, the
    gradients move)."""
    gen = R.generator(SEED, 90)
    config = small_config()
    block = config.block(precision="fp8")
    inputs, weights, other = layer_inputs(gen, device, layer, config)
    fp8 = ops.llama_fp8_weights(layer, weights, block)
    names = ops.FP8_WEIGHTS[layer]
    assert len(fp8) == 4 * len(names)
    for i, name in enumerate(names):
        n, k = weights[name].shape
        nb, kb = -(-n // 128), -(-k // 128)
        assert [tuple(t.shape) for t in fp8[4 * i:4 * i + 4]] == [(n, k), (nb, kb), (k, n),
                                                                    (kb, nb)], name
        assert all(t.dtype == torch.uint8 and t.device == weights[name].device
                   for t in fp8[4 * i:4 * i + 4])
        # Transposed codes, the same scales transposed: one 128 x 128 block has one scale.
        assert torch.equal(fp8[4 * i + 2], fp8[4 * i].t()), name
        assert torch.equal(fp8[4 * i + 3], fp8[4 * i + 1].t()), name

    own_out, own_grads = run_op(layer, inputs, weights, other, block)
    out, grads_ = run_op(layer, inputs, weights, other, block, fp8)
    assert all(torch.equal(a, b) for a, b in zip(own_out, out)), layer
    assert all(torch.equal(a, b) for a, b in zip(own_grads, grads_)), layer

    for transposed in (False, True):
        changed = [t.clone() for t in fp8]
        changed[3 if transposed else 1] += 1  # E8M0: 2^(e + 1), the first weight doubled
        c_out, c_grads = run_op(layer, inputs, weights, other, block, changed)
        if transposed:
            assert all(torch.equal(a, b) for a, b in zip(own_out, c_out)), layer
            assert not all(torch.equal(a, b) for a, b in zip(own_grads, c_grads)), layer
        else:
            assert not all(torch.equal(a, b) for a, b in zip(own_out, c_out)), layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["first", "middle", "last"])
def test_ops_given_copies_take_the_smaller_workspace(device, layer, monkeypatch):
    """Each C call of an op given the copies gets a workspace of exactly the size coda asks for
    a call given them (coda_llama_fp8_workspace_size, LLAMA_FP8_WEIGHTS_GIVEN), smaller than the
    one the same call takes without them (coda_llama_workspace_size), which is what it gets
    without them: forward and backward (the middle layer's in its two parts). One after the
    other, so a size cached for the call without copies would be handed to the one with them."""
    from coda import _lib as L
    from coda import _torch as T

    gen = R.generator(SEED, 91)
    config = small_config()
    block = config.block(precision="fp8")
    inputs, weights, other = layer_inputs(gen, device, layer, config)
    fp8 = ops.llama_fp8_weights(layer, weights, block)
    asked, allocated = [], []
    real_bytes, real_workspace = T.llama_workspace_bytes, T.workspace

    def workspace_bytes(which, pass_, cfg, tokens, dev, copies=L.LLAMA_FP8_WEIGHTS_IN_WORKSPACE):
        n = real_bytes(which, pass_, cfg, tokens, dev, copies)
        asked.append((which, pass_, tokens, copies, n,
                      L.llama_workspace_size(which, pass_, cfg, tokens)))
        return n

    def workspace(nbytes, dev):
        allocated.append(nbytes)
        return real_workspace(nbytes, dev)

    monkeypatch.setattr(T, "llama_workspace_bytes", workspace_bytes)
    monkeypatch.setattr(T, "workspace", workspace)
    # The Python path's workspaces, seen through the two functions above (the C++ host path,
    # taken where no copies are given, asks for the same size: coda_llama_workspace_size).
    monkeypatch.setattr(ops, "_HOST_PATH", [None])
    run_op(layer, inputs, weights, other, block)
    own = list(asked)
    del asked[:]
    run_op(layer, inputs, weights, other, block, fp8)
    passes = [L.LLAMA_FORWARD] + ([L.LLAMA_BACKWARD_PART1, L.LLAMA_BACKWARD_PART2]
                                  if layer == "middle" else [L.LLAMA_BACKWARD])
    assert [a[1] for a in own] == passes and [a[1] for a in asked] == passes
    assert allocated == [a[4] for a in own + asked]
    cfg = ops._c_config(config.hidden_size, config.intermediate_size,
                        config.num_attention_heads, config.num_key_value_heads,
                        config.head_dim, config.vocab_size, 1e-5, precision=L.LLAMA_FP8)
    for (which, pass_, tokens, copies, n, full), mine in zip(asked, own):
        assert mine[3] == L.LLAMA_FP8_WEIGHTS_IN_WORKSPACE and mine[4] == mine[5], (layer, pass_)
        assert copies == L.LLAMA_FP8_WEIGHTS_GIVEN, (layer, pass_)
        assert n == L.llama_fp8_workspace_size(which, pass_, cfg, tokens,
                                               L.LLAMA_FP8_WEIGHTS_GIVEN), (layer, pass_)
        assert n < full == mine[4], (layer, pass_, n, full)


@pytest.mark.parametrize("device", DEVICES)
def test_llama_quantizes_once_per_step(device, monkeypatch):
    """Llama(precision="fp8", fp8_weights_once=True) against the same model quantizing in every
    call, over two steps of two micro-batches each with an SGD step between: every loss and
    gradient the same bit for bit; the copies made once per op in the first step (both
    micro-batches' forward and backward read them), and again, once, after the optimizer's
    step; after a weight written in place, again for its op alone."""
    gen = R.generator(SEED, 91)
    config = small_config()
    plain = models.Llama(config, device=device, precision="fp8")
    randomize(plain, gen)
    once = models.Llama(config, device=device, precision="fp8", fp8_weights_once=True)
    once.load_state_dict(plain.state_dict())
    assert once.fp8_weights_once and not plain.fp8_weights_once
    made = []
    quantize = ops.llama_fp8_weights
    monkeypatch.setattr(ops, "llama_fp8_weights",
                        lambda layer, *a: made.append(layer) or quantize(layer, *a))
    steps = [[batch(gen, config, device, b=1, s=48) for _ in range(2)] for _ in range(2)]
    sgd = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (plain, once)]
    ops_per_step = ["first"] + ["middle"] * (config.num_hidden_layers - 1) + ["last"]
    context = "(seed %d)" % SEED

    for step, micro_batches in enumerate(steps):
        for model in (plain, once):
            model.zero_grad(set_to_none=True)
        for ids, labels in micro_batches:
            losses = [model(ids, labels=labels) for model in (plain, once)]
            for loss in losses:
                loss.backward()
            assert torch.equal(losses[0], losses[1]), context
        assert same(grads(plain), grads(once)), "step %d %s" % (step, context)
        assert sorted(made) == sorted(ops_per_step), (step, made)
        made.clear()
        for opt in sgd:
            opt.step()

    # After the last step's update: made again once, then kept; a weight written in place (no
    # optimizer) has its op alone make its copies again.
    ids, labels = steps[0][0]
    for expected in (ops_per_step, [], ["middle"]):
        if expected == ["middle"]:
            with torch.no_grad():
                for model in (plain, once):
                    model.layers[1].w_down.mul_(0.5)
        with torch.no_grad():
            losses = [model(ids, labels=labels) for model in (plain, once)]
        assert torch.equal(losses[0], losses[1]), context
        assert sorted(made) == sorted(expected), (expected, made)
        made.clear()


@pytest.mark.parametrize("device", DEVICES)
def test_llama_copies_can_be_dropped_and_turned_off(device):
    """drop_fp8_weights() forgets the copies (the next call makes them again, the same bits);
    fp8_weights_once = False drops them for good; a deep copy of the model starts without."""
    gen = R.generator(SEED, 92)
    config = small_config(num_hidden_layers=2)
    model = models.Llama(config, device=device, precision="fp8", fp8_weights_once=True)
    randomize(model, gen)
    ids, labels = batch(gen, config, device, b=1, s=48)
    first = model(ids, labels=labels)
    held = model.layers[0].attn_input.fp8_copies
    assert held is not None and held._copies is not None
    model.drop_fp8_weights()
    assert held._copies is None
    assert torch.equal(model(ids, labels=labels), first)
    twin = copy.deepcopy(model)
    assert twin.fp8_weights_once and twin.layers[0].attn_input.fp8_copies._copies is None
    assert torch.equal(twin(ids, labels=labels), first)
    model.fp8_weights_once = False
    assert model.layers[0].attn_input.fp8_copies is None
    assert all(layer.mlp.fp8_copies is None for layer in model.layers)
    assert torch.equal(model(ids, labels=labels), first)
    model.precision = "native"  # kept copies are for FP8 calls only
    model.fp8_weights_once = True
    assert math_isfinite(model(ids, labels=labels).item())
    assert model.layers[0].attn_input.fp8_copies._copies is None


def math_isfinite(x):
    return x == x and abs(x) != float("inf")


def test_bench_model_side_quantizes_in_every_timed_step(monkeypatch):
    """coda.bench times a model's forward + backward as one training step: a model keeping its
    FP8 weight copies makes them in every timed forward (as the optimizer's step would make it),
    not once for all the repetitions."""
    from coda.bench.sides import ModelInputs, ModelSide

    gen = R.generator(SEED, 93)
    config = small_config(num_hidden_layers=2)
    model = models.Llama(config, device="cpu", precision="fp8", fp8_weights_once=True)
    randomize(model, gen)
    side = ModelSide(model, ModelInputs(config, tokens=48, batch=1, device="cpu"))
    made = []
    quantize = ops.llama_fp8_weights
    monkeypatch.setattr(ops, "llama_fp8_weights",
                        lambda layer, *a: made.append(layer) or quantize(layer, *a))
    for _ in range(2):
        side.backward(side.forward())
    assert sorted(made) == sorted(["first", "middle", "last"] * 2), made
