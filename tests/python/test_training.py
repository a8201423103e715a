"""Training features of coda.models.Llama: gradient accumulation over micro-batches, activation
checkpointing (Llama(checkpoint=True)), a whole training step (forward and backward) captured in
a CUDA graph, torch.compile(fullgraph=True) of a checkpointed model on a padded batch, and
bit-for-bit reproducible training loops.

coda's kernels are deterministic; torch's flash-attention backward is not unless
torch.use_deterministic_algorithms(True), so the CUDA cases that compare bits turn it on
(deterministic_torch)."""

import collections
import contextlib

import pytest

torch = pytest.importorskip("torch")

from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
from test_models import randomize, small_config  # noqa: E402

DEVICES = R.device_params()
NEEDS_SM90 = pytest.mark.skipif(not R.sm90(), reason="needs an sm_90 GPU")


@contextlib.contextmanager
def deterministic_torch(device, monkeypatch):
    """On CUDA, torch.use_deterministic_algorithms(True) for the span: SDPA's flash backward
    then sums its blocks' dq in a fixed order. warn_only=False, since warn_only keeps the
    non-deterministic backward. CUBLAS_WORKSPACE_CONFIG is set because torch refuses cuBLAS
    calls in this mode without it (coda's path makes none; SDPA's math fallback would). The
    CPU path needs nothing."""
    if device != "cuda":
        yield
        return
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def make_model(device, gen, **kwargs):
    model = models.Llama(small_config(), device=device, **kwargs)
    randomize(model, gen)
    return model


def tokens(gen, config, device, b=2, s=40, padded=False):
    """(ids, labels, attention_mask or None): labels are the ids, so that each row has S - 1
    targets (the last position predicts nothing); padded: R.pad_batch's two-sided padding."""
    ids = torch.randint(0, config.vocab_size, (b, s), generator=gen)
    labels, mask = ids.clone(), None
    if padded:
        ids, labels, mask = R.pad_batch(ids, labels)
        mask = mask.to(device)
    return ids.to(device), labels.to(device), mask


def gradients(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def norm(t):
    return t.double().norm().item()


def assert_bitwise(name, got, want, context):
    assert torch.equal(got, want), "%s differs: max |diff| %.3e %s" % (
        name, R.max_err(got, want), context)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_accumulation(device, monkeypatch):
    """Two micro-batches, each loss scaled by 1/2, accumulated in .grad: (a) exactly the sum of
    the two micro-batches' gradients computed alone (autograd's bf16 add of the same tensors;
    coda writes each backward's weight gradients afresh and never into .grad); (b) the
    gradient of the whole batch up to the roundings that separate them. Every gradient is a
    sum over tokens: the whole batch rounds it once, accumulation rounds each half and their
    sum, each rounding at most half an ulp (2^-8 |value| in bf16), so
    |acc - full| <= 2^-8 (|g1| + |g2| + |acc| + |full|) elementwise, and so in norm; twice
    that is allowed (torch's bf16 embedding backward on the CPU rounds at each token it adds).
    A dropped micro-batch or a missing 1/2 is off by half or all of the gradient. The halves
    have equal target counts, so the mean loss of the whole is the mean of the halves'."""
    gen = R.generator(SEED, 61)
    model = make_model(device, gen)
    ids, labels, _ = tokens(gen, model.config, device, b=4)
    halves = [(ids[:2], labels[:2]), (ids[2:], labels[2:])]
    context = "(seed %d, %s)" % (SEED, device)

    with deterministic_torch(device, monkeypatch):
        full_loss = model(ids, labels=labels)
        full_loss.backward()
        full = gradients(model)
        alone = []
        for half_ids, half_labels in halves:
            model.zero_grad(set_to_none=True)
            (model(half_ids, labels=half_labels) / 2).backward()
            alone.append(gradients(model))
        model.zero_grad(set_to_none=True)
        losses = []
        for half_ids, half_labels in halves:
            loss = model(half_ids, labels=half_labels)
            (loss / 2).backward()
            losses.append(loss.detach())
    accumulated = gradients(model)

    mean = (losses[0] + losses[1]) / 2
    assert abs(mean.item() - full_loss.item()) <= 2.0 ** -8 * abs(full_loss.item()), context
    for name, acc in accumulated.items():
        g1, g2 = alone[0][name], alone[1][name]
        assert_bitwise("grad " + name + " (accumulated vs the sum of the halves)", acc, g1 + g2,
                       context)
        err = norm(acc - full[name])
        bound = 2 * 2.0 ** -8 * (norm(g1) + norm(g2) + norm(acc) + norm(full[name]))
        assert err <= bound, "grad %s: accumulated differs from the whole batch's by %.3e " \
            "(norm) > %.3e %s" % (name, err, bound, context)


def count_calls(monkeypatch):
    """Count the coda layer calls run_layers makes (forward and recomputation alike)."""
    calls = collections.Counter()
    for name in ("llama_first", "llama_middle", "llama_last"):
        def counted(*args, _fn=getattr(ops, name), _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(ops, name, counted)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_is_bitwise_equal(device, padded, tied, monkeypatch):
    """Llama(checkpoint=True): the loss, the logits and every gradient bit for bit those
    without it; the backward recomputed the first and middle calls (and the attention after
    each: they run in the same stages) and not the last; in eval mode or without gradients
    nothing is recomputed."""
    gen = R.generator(SEED, 62 + tied)
    config = small_config(tie_word_embeddings=tied)
    model = models.Llama(config, device=device)
    randomize(model, gen)
    ids, labels, mask = tokens(gen, config, device, padded=padded)
    calls = count_calls(monkeypatch)
    context = "(seed %d, %s, padded=%s, tied=%s)" % (SEED, device, padded, tied)
    middles = config.num_hidden_layers - 1

    def step(checkpoint):
        model.checkpoint = checkpoint
        model.zero_grad(set_to_none=True)
        calls.clear()
        loss, logits = model(ids, labels=labels, attention_mask=mask, return_logits=True)
        forward = dict(calls)
        loss.backward()
        return loss.detach(), logits, gradients(model), forward, dict(calls)

    with deterministic_torch(device, monkeypatch):
        loss, logits, grads, fwd, total = step(False)
        c_loss, c_logits, c_grads, c_fwd, c_total = step(True)
    assert fwd == c_fwd == total == {"llama_first": 1, "llama_middle": middles, "llama_last": 1}
    assert c_total == {"llama_first": 2, "llama_middle": 2 * middles, "llama_last": 1}
    assert_bitwise("loss", c_loss, loss, context)
    assert_bitwise("logits", c_logits, logits, context)
    for name, g in grads.items():
        assert_bitwise("grad " + name, c_grads[name], g, context)

    # Outside training the option changes nothing: no recomputation.
    model.checkpoint = True
    model.eval()
    calls.clear()
    model(ids, labels=labels, attention_mask=mask).backward()
    assert calls["llama_first"] == 1 and calls["llama_middle"] == middles
    model.train()
    calls.clear()
    with torch.no_grad():
        model(ids, labels=labels, attention_mask=mask)
    assert calls["llama_first"] == 1 and calls["llama_middle"] == middles


@NEEDS_SM90
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["stored", "checkpointed"])
def test_cuda_graph_of_a_training_step(padded, checkpoint, monkeypatch):
    """A training step (forward and backward) captured in one CUDA graph (torch's pattern: a
    side stream, warm-up steps, then torch.cuda.graph), replayed on new batches copied into the
    static inputs: the loss and every gradient bit for bit those of an eager step on the same
    batch. coda's calls take their workspaces from torch's caching allocator (the graph's
    private pool under capture) and never synchronize; padding_keys skips its host read of the
    mask while the stream is captured."""
    gen = R.generator(SEED, 64)
    model = make_model("cuda", gen, checkpoint=checkpoint)
    batches = [tokens(gen, model.config, "cuda", padded=padded) for _ in range(3)]
    static_ids, static_labels, static_mask = [None if t is None else t.clone()
                                              for t in batches[0]]
    context = "(seed %d, padded=%s, checkpoint=%s)" % (SEED, padded, checkpoint)

    def step():
        loss = model(static_ids, labels=static_labels, attention_mask=static_mask)
        loss.backward()
        return loss

    with deterministic_torch("cuda", monkeypatch):
        # Warm-up on the side stream: what runs once (coda's size queries and kernel
        # attributes, torch's kernel selection) runs before the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)

        # .grad None before the capture: the graph's backward allocates the gradients in its
        # pool and each replay writes them afresh (no accumulation across replays).
        model.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
        static_grads = {n: p.grad for n, p in model.named_parameters()}

        for ids, labels, mask in batches[1:]:
            static_ids.copy_(ids)
            static_labels.copy_(labels)
            if mask is not None:
                static_mask.copy_(mask)
            graph.replay()
            replayed = static_loss.clone()
            replayed_grads = {n: g.clone() for n, g in static_grads.items()}

            model.zero_grad(set_to_none=True)  # the eager step gets gradients of its own
            loss = model(ids, labels=labels, attention_mask=mask)
            loss.backward()
            assert_bitwise("loss", replayed, loss.detach(), context)
            for name, p in model.named_parameters():
                assert_bitwise("grad " + name, replayed_grads[name], p.grad, context)
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_compile_checkpointed_padded_model(device):
    """torch.compile(model, fullgraph=True) on what test_compile.py's model test leaves out:
    activation checkpointing (torch.compile traces torch.utils.checkpoint's recomputation) and
    a padded batch (padding_keys' host read of the mask would break the graph; under
    torch.compile it is skipped). Forward and backward as eager, within test_compile's
    tolerance (inductor fuses torch's ops around coda's differently)."""
    if not ops.HAS_CUSTOM_OPS or not hasattr(torch, "compile"):
        pytest.skip("needs torch >= 2.4 (custom ops, torch.compile)")
    from test_compile import backend, close

    torch._dynamo.reset()
    gen = R.generator(SEED, 65)
    model = make_model(device, gen, checkpoint=True)
    ids, labels, mask = tokens(gen, model.config, device, padded=True)

    loss = model(ids, labels=labels, attention_mask=mask)
    loss.backward()
    grads = gradients(model)
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, fullgraph=True, backend=backend(device))
    c_loss = compiled(ids, labels=labels, attention_mask=mask)
    c_loss.backward()
    close("loss", c_loss, loss)
    for name, p in model.named_parameters():
        close("grad " + name, p.grad, grads[name])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checkpoint", [False, True], ids=["stored", "checkpointed"])
def test_training_is_deterministic(device, checkpoint, monkeypatch):
    """The same training loop twice from the same seed (initial weights, batches): AdamW steps
    on three batches give bit-for-bit the same losses, parameters and optimizer state. The
    loop does train: every parameter has moved (a learning rate whose steps exceed half an ulp
    of the unit-size norm weights)."""
    context = "(seed %d, %s, checkpoint=%s)" % (SEED, device, checkpoint)

    def train():
        gen = R.generator(SEED, 66)
        model = make_model(device, gen, checkpoint=checkpoint)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            ids, labels, _ = tokens(gen, model.config, device)
            optimizer.zero_grad(set_to_none=True)
            loss = model(ids, labels=labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return model, start, losses, optimizer

    with deterministic_torch(device, monkeypatch):
        first, start, first_losses, first_opt = train()
        second, _, second_losses, second_opt = train()
    for i, (a, b) in enumerate(zip(first_losses, second_losses)):
        assert torch.isfinite(a), context
        assert_bitwise("loss of step %d" % i, b, a, context)
    for (name, p), q in zip(first.named_parameters(), second.parameters()):
        assert_bitwise(name, q, p, context)
        assert not torch.equal(p, start[name]), "%s did not move %s" % (name, context)
        s1, s2 = first_opt.state[p], second_opt.state[q]
        for key in ("exp_avg", "exp_avg_sq"):
            assert_bitwise("%s's %s" % (name, key), s2[key], s1[key], context)
