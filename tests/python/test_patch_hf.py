"""coda.patch_hf without transformers: a stand-in for LlamaForCausalLM (the same module tree and
parameter names, its forward Hugging Face's math in plain torch) is patched, so that this runs
wherever torch does (the CPU backend included); test_hf.py repeats the essentials on the real
transformers model.

* the parameters stay the same objects and become row blocks of the fused tensors (q/k/v and
  [gate; up]); coda reads the q/k/v one without a copy and gradients come back as views of
  coda's weight gradients;
* a patched step equals a coda.from_hf step bit for bit, padded or not;
* optimizer steps, state_dict / torch.save / load_state_dict, .to(), a replaced parameter and
  deepcopy keep the fusion (or redo it) with the same results; unpatch_hf restores separate
  memory;
* a padded batch (left and right padding) against the stand-in's own forward under the
  section 7 rule (fp32 reference, its bf16 run the baseline): the loss and logits end to end,
  the gradients step by step (torch_reference.check_chain), each HF parameter's gradient bit
  for bit the rows of the coda gradient checked; planted mistakes fail that check.
"""

import copy
import io
import types

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import coda  # noqa: E402
from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
from test_training import count_calls, deterministic_torch  # noqa: E402

DEVICES = R.device_params()
IGNORE = -100
B, S = 2, 24


def hf_like_config(tied=False):
    """The fields LlamaConfig.from_hf reads from a Hugging Face config."""
    return types.SimpleNamespace(
        model_type="llama", hidden_act="silu", hidden_size=128, intermediate_size=176,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=264,
        num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
        tie_word_embeddings=tied, max_position_embeddings=128, initializer_range=0.02)


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.q_proj = linear(d, c.num_attention_heads * hd)
        self.k_proj = linear(d, c.num_key_value_heads * hd)
        self.v_proj = linear(d, c.num_key_value_heads * hd)
        self.o_proj = linear(c.num_attention_heads * hd, d)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = linear(c.hidden_size, c.intermediate_size)
        self.up_proj = linear(c.hidden_size, c.intermediate_size)
        self.down_proj = linear(c.intermediate_size, c.hidden_size)


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size)
        self.post_attention_layernorm = RMSNorm(c.hidden_size)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size)
        self.gradient_checkpointing = False  # as LlamaModel's (gradient_checkpointing_enable)


class CausalLM(nn.Module):
    """LlamaForCausalLM's module tree; forward: its math in plain torch (HF's RMSNorm, RoPE in
    the activations' dtype, SDPA-like attention with the padding mask, SwiGLU, the shifted
    mean cross-entropy over labels != -100)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Model(config)
        self.lm_head = linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids=None, attention_mask=None, labels=None, **unused):
        c, m = self.config, self.model
        h, kv, d, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        b, s = input_ids.shape
        inv_freq = models.rope_inv_freq(models.LlamaConfig.from_hf(c)).to(input_ids.device)
        positions = torch.arange(s, device=input_ids.device).repeat(b)
        key_mask = None if attention_mask is None else attention_mask != 0
        x = m.embed_tokens(input_ids).reshape(b * s, -1)
        for layer in m.layers:
            a = layer.self_attn
            n = R.rms_norm(x, layer.input_layernorm.weight, eps)
            q = R.rope(a.q_proj(n).view(b * s, h, d), positions, inv_freq)
            k = R.rope(a.k_proj(n).view(b * s, kv, d), positions, inv_freq)
            v = a.v_proj(n).view(b * s, kv, d)
            heads = lambda t, n_heads: t.view(b, s, n_heads, d).transpose(1, 2)  # noqa: E731
            o = R.causal_attention(heads(q, h), heads(k, kv), heads(v, kv), key_mask)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b * s, h * d))
            n = R.rms_norm(x, layer.post_attention_layernorm.weight, eps)
            x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(n)) * layer.mlp.up_proj(n))
        logits = self.lm_head(R.rms_norm(x, m.norm.weight, eps)).view(b, s, -1)
        loss = None
        if labels is not None:
            targets = models.shift_labels(labels).reshape(-1)
            loss = R.cross_entropy(logits.reshape(b * s, -1), targets)
        return types.SimpleNamespace(loss=loss, logits=logits)


@torch.no_grad()
def hf_like(tied=False, device="cpu", dtype=torch.bfloat16, salt=0):
    """A random stand-in: weights of size 1/sqrt(fan-in), norms in [0.5, 1.5]."""
    model = CausalLM(hf_like_config(tied))
    gen = R.generator(SEED, 60 + salt)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
        else:
            b = p.shape[1] ** -0.5
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * b)
    return model.to(device=device, dtype=dtype)


def batch(device, padded=False, salt=61):
    gen = R.generator(SEED, salt)
    ids = torch.randint(0, 264, (B, S), generator=gen)
    labels = ids.clone()
    labels[torch.rand(B, S, generator=gen) < 0.1] = IGNORE
    mask = None
    if padded:
        ids, labels, mask = R.pad_batch(ids, labels)
        mask = mask.to(device)
    return ids.to(device), labels.to(device), mask


def fused(model, layer, group):
    return model._coda_state["fused"][layer][group]


def step(model, ids, labels, mask=None):
    """(loss, logits, {name: grad}) of one forward and backward of a patched model."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    out.loss.backward()
    return out.loss.detach(), out.logits, {n: p.grad for n, p in model.named_parameters()}


def coda_step(hf_model, ids, labels, mask=None, precision="native"):
    """The same step on coda.from_hf(hf_model) (a copy), its gradients under HF's names."""
    model = coda.from_hf(hf_model, precision=precision)
    assert model.precision == precision
    loss, logits = model(ids, labels=labels, return_logits=True, attention_mask=mask)
    loss.backward()
    return loss.detach(), logits, coda.to_hf_state_dict(model, grads=True)


def assert_same_step(patched_step, coda_step_result, but=()):
    """Bit for bit, except the gradients named in `but`."""
    loss, logits, grads = patched_step
    c_loss, c_logits, c_grads = coda_step_result
    assert torch.equal(loss, c_loss) and torch.equal(logits, c_logits)
    for name, g in grads.items():
        if name not in but:
            assert torch.equal(g, c_grads[name].to(g.dtype)), name


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_patch_keeps_the_parameters_and_fuses_their_memory(tied):
    model = hf_like(tied)
    before = list(model.named_parameters())
    values = {n: v.clone() for n, v in model.state_dict().items()}
    coda.patch_hf(model)
    after = list(model.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(p is q for (_, p), (_, q) in zip(after, before))  # optimizers keep working
    sd = model.state_dict()
    assert set(sd) == set(values)
    for name, value in sd.items():
        assert torch.equal(value, values[name]), name
    R.assert_fused(model)
    for i, layer in enumerate(model.model.layers):
        qkv = fused(model, i, "qkv")
        assert qkv.shape == ((4 + 2 * 2) * 64, 128) and not qkv.requires_grad
        assert fused(model, i, "gate_up").shape == (2 * 176, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_patched_step_is_a_from_hf_step_without_copies(device, tied, padded, monkeypatch):
    model = hf_like(tied, device)
    ids, labels, mask = batch(device, padded)
    want = coda_step(model, ids, labels, mask)
    coda.patch_hf(model)

    # What reaches coda: w_qkv is the fused tensor itself; the interleave reads the fused
    # [gate; up] tensor (its copy is the one left, see coda/hf.py).
    seen = R.watch_coda_weights(monkeypatch, ops)
    got = step(model, ids, labels, mask)
    R.assert_no_weight_copies(model, seen)
    assert_same_step(got, want)
    # The gradients are views of coda's weight gradients: one block per fused tensor.
    for layer in model.model.layers:
        for params in R.projection_groups(layer).values():
            R.assert_row_blocks([p.grad for p in params])
    R.assert_fused(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_fp8_patched_step_is_an_fp8_from_hf_step(device, padded):
    """precision="fp8" through both entry points (48 tokens, every width a multiple of 16):
    a patched step equals the step of coda.from_hf(..., precision="fp8") bit for bit, and not
    the native one (the FP8 GEMMs ran); patching again sets the precision back. A precision
    other than "native" or "fp8" is refused before the model is touched."""
    model = hf_like(False, device)
    ids, labels, mask = batch(device, padded)
    with pytest.raises(ValueError, match="'native', 'fp8'"):
        coda.patch_hf(model, precision="bf8")
    assert "_coda_state" not in model.__dict__
    native = coda_step(model, ids, labels, mask)
    want = coda_step(model, ids, labels, mask, precision="fp8")
    assert not torch.equal(want[1], native[1])
    coda.patch_hf(model, precision="fp8")
    assert_same_step(step(model, ids, labels, mask), want)
    coda.patch_hf(model)
    assert_same_step(step(model, ids, labels, mask), native)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_hf_gradient_checkpointing_recomputes_coda_calls(device, padded, monkeypatch):
    """Hugging Face's gradient_checkpointing_enable() (the decoder's gradient_checkpointing
    set): a patched training step recomputes the first and middle calls in the backward, as
    Llama(checkpoint=True) does, and gives the same loss, logits and gradients bit for bit;
    in eval mode nothing is recomputed."""
    model = hf_like(False, device)
    ids, labels, mask = batch(device, padded)
    coda.patch_hf(model)
    calls = count_calls(monkeypatch)
    middles = model.config.num_hidden_layers - 1

    def counted_step():
        calls.clear()
        return step(model, ids, labels, mask), dict(calls)

    with deterministic_torch(device, monkeypatch):
        want, plain = counted_step()
        model.model.gradient_checkpointing = True
        got, recomputed = counted_step()
    assert plain == {"llama_first": 1, "llama_middle": middles, "llama_last": 1}
    assert recomputed == {"llama_first": 2, "llama_middle": 2 * middles, "llama_last": 1}
    assert_same_step(got, want)
    model.eval()
    _, evaluated = counted_step()
    assert evaluated == plain


def test_fp32_model_fuses_fp32_memory_and_gets_fp32_gradients():
    model = hf_like(dtype=torch.float32)
    ids, labels, mask = batch("cpu", padded=True)
    want = coda_step(model, ids, labels, mask)  # from_hf computes in bf16 too
    coda.patch_hf(model)
    assert fused(model, 0, "qkv").dtype == torch.float32
    got = step(model, ids, labels, mask)
    assert all(g.dtype == torch.float32 for g in got[2].values())
    # The embedding's gradient sums a token's rows in fp32 here, in bf16 in the coda model.
    embed = "model.embed_tokens.weight"
    assert_same_step(got, want, but=(embed,))
    assert torch.allclose(got[2][embed], want[2][embed].float(), rtol=1e-2, atol=1e-3)
    R.assert_fused(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw", "adamw_foreach", "adamw_fused"])
def test_optimizer_steps_reach_coda(device, optimizer):
    model = hf_like(device=device)
    kinds = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
             "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
             "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
             "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True)}
    if optimizer == "adamw_fused" and device != "cuda":
        pytest.skip("torch's fused AdamW is tested on CUDA (it needs dense parameters)")
    opt = kinds[optimizer](model.parameters())  # built before the patch: the same objects
    coda.patch_hf(model)
    tensors = R.fused_tensors(model)
    ids, labels, _ = batch(device)
    first = step(model, ids, labels)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters()
               if "norm" not in n)
    # The step wrote into the fused tensors (no new fusion), and coda reads the new weights.
    assert R.same_objects(R.fused_tensors(model), tensors)
    R.assert_fused(model)
    want = coda_step(model, ids, labels)
    got = step(model, ids, labels)
    assert_same_step(got, want)
    assert not torch.equal(got[0], first[0])


def test_state_dict_save_and_load_keep_the_fusion():
    model = coda.patch_hf(hf_like())
    tensors = R.fused_tensors(model)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    fresh = hf_like(salt=1)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer))
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    # Loading another model's weights copies into the fused memory.
    other = hf_like(salt=2)
    model.load_state_dict(other.state_dict())
    assert R.same_objects(R.fused_tensors(model), tensors)
    R.assert_fused(model)
    ids, labels, _ = batch("cpu")
    assert_same_step(step(model, ids, labels), coda_step(other, ids, labels))


def test_moved_or_replaced_parameters_are_fused_again():
    model = coda.patch_hf(hf_like())
    ids, labels, mask = batch("cpu", padded=True)
    want = step(model, ids, labels, mask)
    # A parameter given memory of its own: the next forward fuses its layer again (one copy).
    layer = model.model.layers[1]
    layer.self_attn.k_proj.weight.data = layer.self_attn.k_proj.weight.data.clone()
    layer.mlp.up_proj.weight = nn.Parameter(layer.mlp.up_proj.weight.detach().clone())
    old = dict(model._coda_state["fused"][1])
    assert_same_step(step(model, ids, labels, mask), want)
    assert all(model._coda_state["fused"][1][g] is not old[g] for g in old)
    R.assert_fused(model)
    # .to(dtype) gives every parameter new memory (twice here, back to bf16).
    old = R.fused_tensors(model)
    model.to(torch.float16).to(torch.bfloat16)
    got = step(model, ids, labels, mask)
    R.assert_fused(model)
    assert all(t is not o for t, o in zip(R.fused_tensors(model), old))
    assert_same_step(got, coda_step(model, ids, labels, mask))


def test_inference_mode_does_not_fuse():
    """Tensors made under inference_mode could not be trained afterwards: a layer whose
    parameters moved is concatenated there, and fused at the next forward outside it."""
    model = coda.patch_hf(hf_like())
    ids, labels, _ = batch("cpu")
    model.to(torch.float16).to(torch.bfloat16)
    want = coda_step(model, ids, labels)
    with torch.inference_mode():
        out = model(input_ids=ids, labels=labels)
    assert torch.equal(out.loss, want[0]) and torch.equal(out.logits, want[1])
    assert all(t is None for t in R.fused_tensors(model))
    assert_same_step(step(model, ids, labels), want)
    R.assert_fused(model)


def test_deepcopy_of_a_patched_model():
    model = coda.patch_hf(hf_like())
    ids, labels, _ = batch("cpu")
    want = step(model, ids, labels)
    twin = copy.deepcopy(model)
    got = step(twin, ids, labels)
    assert_same_step(got, want)
    R.assert_fused(twin)
    assert (twin.model.layers[0].self_attn.q_proj.weight.data_ptr()
            != model.model.layers[0].self_attn.q_proj.weight.data_ptr())


def test_unpatch_gives_each_parameter_its_own_memory():
    model = hf_like()
    original = model.forward(input_ids=batch("cpu")[0]).logits
    params = dict(model.named_parameters())
    coda.patch_hf(model)
    ids, labels, _ = batch("cpu")
    _, _, grads = step(model, ids, labels)
    grads = {n: g.clone() for n, g in grads.items()}
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    coda.hf.unpatch_hf(model)
    assert "forward" not in model.__dict__ and not hasattr(model, "_coda_state")
    assert dict(model.named_parameters()) == params  # the same objects
    storages = set()
    for name, p in model.named_parameters():
        assert torch.equal(p, values[name]) and torch.equal(p.grad, grads[name]), name
        for t in (p, p.grad):
            assert R.storage_address(t) not in storages, name
            storages.add(R.storage_address(t))
    assert torch.equal(model(input_ids=ids).logits, original)


def test_patching_twice_keeps_the_original_forward():
    model = hf_like()
    coda.patch_hf(model)
    coda.patch_hf(model, keep_logits=False)
    ids, labels, _ = batch("cpu")
    assert model(input_ids=ids, labels=labels).logits is None
    coda.hf.unpatch_hf(model)
    assert "forward" not in model.__dict__
    assert model(input_ids=ids, labels=labels).logits.shape == (B, S, 264)


def test_changing_a_parameter_between_forward_and_backward_raises():
    """coda saved the fused tensor, the parameter's own memory: as torch does for a saved
    parameter, the backward refuses to run on weights changed in place since the forward."""
    model = coda.patch_hf(hf_like())
    ids, labels, _ = batch("cpu")
    loss = model(input_ids=ids, labels=labels).loss
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.weight.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_masks_coda_does_not_take():
    model = coda.patch_hf(hf_like())
    ids, labels, _ = batch("cpu")
    with pytest.raises(NotImplementedError):
        model(input_ids=ids, attention_mask=torch.ones(B, 1, S, S))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_padded_batch_against_the_plain_forward(device, tied, monkeypatch):
    """Left and right padding; labels -100 at the pads (so that, as with HF, the loss counts
    the left-padded row's last pad position predicting its first token, through a zero
    attention output)."""
    check_padded(device, tied, monkeypatch)


@pytest.mark.parametrize("mistake", R.PATCHED_MISTAKES)
def test_padded_check_catches_planted_mistakes(mistake, monkeypatch):
    """The step-by-step check of a patched model still fails a wrong gradient: a Hugging Face
    gamma's gradient 1/32 off in scale (a parameter coda's step read itself), one middle call
    losing a token's dqkv row (token 10 of row 0, not padding), or one row of k_proj's
    gradient, a view into the fused q/k/v gradient, changed after the backward (the HF
    gradients are then no longer coda's checked ones)."""
    plant, match = R.plant_patched_mistake(mistake, monkeypatch, ops, token=10)
    with pytest.raises(AssertionError, match=match):
        check_padded("cpu", False, monkeypatch, plant)


def check_padded(device, tied, monkeypatch, plant=None):
    """A padded batch through the patched stand-in against its own plain forward: the loss
    and logits end to end (fp32 the reference, its bf16 run the baseline), the gradients step
    by step (torch_reference.check_chain; the end-to-end rule compared two independent draws of
    carried rounding error, docs/reliability.md, "The model tests' gradients"), and every HF
    parameter's gradient bit for bit the rows of the coda gradient checked. plant(model), when
    given, runs after the backward (a planted mistake)."""
    hf16 = hf_like(tied, device)
    hf32 = copy.deepcopy(hf16).float()
    ids, labels, mask = batch(device, padded=True)
    with torch.no_grad():
        r_logits = hf32(input_ids=ids, labels=labels, attention_mask=mask).logits
        b_logits = hf16(input_ids=ids, labels=labels, attention_mask=mask).logits

    patched = coda.patch_hf(hf16)
    steps = R.record_chain(monkeypatch, ops, models)
    loss, logits, grads = step(patched, ids, labels, mask)
    if plant is not None:
        plant(patched)
    assert [s["kind"] for s in steps] == (["first"] + ["attention", "middle"] * 2
                                          + ["attention", "last"])

    context = "(seed %d, %s, %s)" % (SEED, device, "tied" if tied else "untied")
    targets = models.shift_labels(labels).reshape(-1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    R.check_loss("loss", loss, R.token_losses(flat(r_logits), targets),
                 R.token_losses(flat(b_logits), targets), targets, context=context)
    R.check_rule("logits", logits, r_logits, b_logits, context)
    checked = R.check_chain(steps, patched, ids, mask != 0, context)
    R.assert_hf_gradients(grads, patched, R.hf_gradients(checked, patched._coda_state["block"]),
                          context)


class DTensor(torch.Tensor):
    """A stand-in named like torch.distributed's DTensor: coda tells them apart by type name
    (no torch.distributed import on the call path)."""


def test_sharded_parameters_are_refused_with_what_to_do():
    """A patched model whose parameters are DTensors (FSDP2's fully_shard) raises before any
    weight is read, naming coda.from_hf and fsdp_units; test_distributed runs real FSDP2."""
    model = coda.patch_hf(hf_like())
    layer = model.model.layers[0].self_attn
    layer.q_proj.weight = nn.Parameter(
        torch.Tensor._make_subclass(DTensor, layer.q_proj.weight.detach()))
    ids, labels, _ = batch("cpu")
    with pytest.raises(NotImplementedError, match=r"DTensors.*coda\.from_hf.*fsdp_units"):
        model(input_ids=ids, labels=labels)
