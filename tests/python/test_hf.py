"""coda against Hugging Face transformers' LlamaForCausalLM: a small random model (hidden 256,
4 layers, 4 query / 2 key-value heads of 64, GQA), untied and tied, with and without Llama-3
rope scaling.

* from_hf / to_hf_state_dict round-trip bit for bit; the RoPE table equals HF's;
* logits and loss of coda.from_hf(model) (bf16) against the HF model in fp32, under the
  section 7 rule with HF in bf16 as the baseline; the weights come from an fp32 model (coda
  and HF-bf16 round them) or from a bf16 one (all three share them). The gradients step by
  step (torch_reference.check_chain: each coda layer call and attention against its textbook
  form fed the tensors it read; end to end, the rule compared two independent draws of
  carried rounding error and failed on rare seeds, docs/reliability.md), and every HF
  parameter's gradient (to_hf_state_dict) bit for bit the rows of the coda gradient checked;
* patch_hf gives the coda model's results bit for bit (padded batches too), with coda reading
  the fused q/k/v tensor the HF parameters are row blocks of; save_pretrained, a fused AdamW
  step and unpatch_hf work on a patched model; on a batch padded on both sides, the patched
  model's loss and logits against HF's own forward (same mask) under the section 7 rule, its
  gradients step by step as above, each HF parameter's .grad the rows of the coda gradient
  checked; planted mistakes fail that check;
* unsupported configs raise NotImplementedError.

test_patch_hf.py checks the same patch_hf on a stand-in for the HF model without transformers.
"""

import copy
import inspect

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import coda  # noqa: E402
from coda import models  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402

DEVICES = R.device_params()
IGNORE = -100
B, S = 2, 48
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # short, so that it changes positions < S


def hf_config(tied=False, rope_scaling=None, **overrides):
    fields = dict(hidden_size=256, intermediate_size=704, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=512, num_hidden_layers=4,
                  rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=256,
                  tie_word_embeddings=tied)
    if rope_scaling is not None:
        fields["rope_scaling"] = dict(rope_scaling)
    fields.update(overrides)
    return transformers.LlamaConfig(**fields)


@torch.no_grad()
def hf_model(config, seed, device="cpu"):
    """A random fp32 LlamaForCausalLM: HF's initialization (normal(0, 0.02)), then norm
    weights in [0.5, 1.5] so that they matter."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    gen = R.generator(seed, 51)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    return model.to(device).eval()


def batch(device, vocab=512, seed_salt=52):
    gen = R.generator(SEED, seed_salt)
    ids = torch.randint(0, vocab, (B, S), generator=gen)
    labels = ids.clone()
    labels[torch.rand(B, S, generator=gen) < 0.1] = IGNORE
    return ids.to(device), labels.to(device)


@torch.no_grad()
def hf_forward(model, ids, labels, mask=None):
    """HF's own forward: (logits, loss)."""
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    return out.logits, out.loss


def hf_run(model, ids, labels, mask=None):  # (tools/hf_numerics.py: HF's own gradients)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3], ids=["rope", "llama3"])
def test_rope_table_matches_hf(rope_scaling):
    hf = hf_model(hf_config(rope_scaling=rope_scaling), SEED)
    ours = models.rope_inv_freq(models.LlamaConfig.from_hf(hf.config))
    assert torch.equal(ours, hf.model.rotary_emb.inv_freq.float().cpu())
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return
    if rope_scaling is not None and "llama3" in ROPE_INIT_FUNCTIONS:
        theirs = ROPE_INIT_FUNCTIONS["llama3"](hf.config, "cpu")[0]
        assert torch.equal(ours, theirs.float())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_round_trip_is_exact(tied):
    hf32 = hf_model(hf_config(tied=tied), SEED)
    for source in (hf32, copy.deepcopy(hf32).to(torch.bfloat16)):
        model = coda.from_hf(source, device="cpu", dtype=torch.bfloat16)
        assert (model.lm_head is None) == tied
        sd = coda.to_hf_state_dict(model)
        want = source.state_dict()
        assert set(want) <= set(sd) and set(sd) - set(want) <= {"lm_head.weight"}
        for name, value in want.items():
            assert sd[name].dtype == torch.bfloat16
            assert torch.equal(sd[name], value.to(torch.bfloat16)), name
        # ... and loads back into a HF model.
        fresh = transformers.LlamaForCausalLM(hf_config(tied=tied)).to(torch.bfloat16)
        missing, _ = fresh.load_state_dict(sd, strict=False)
        assert not missing
        for name, value in fresh.state_dict().items():
            assert torch.equal(value, want[name].to(torch.bfloat16)), name


def check_forward(loss, logits, r_logits, b_logits, labels, context, r_loss=None):
    """The loss (per token) and the logits against HF fp32, HF bf16 the baseline."""
    targets = models.shift_labels(labels).reshape(-1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    R.check_loss("loss", loss, R.token_losses(flat(r_logits), targets),
                 R.token_losses(flat(b_logits), targets), targets, context=context)
    if r_loss is not None:  # HF's loss is what we think it is
        assert abs(r_loss.item() - R.token_losses(flat(r_logits), targets).sum().item()
                   / (targets != IGNORE).sum().item()) < 1e-4
    R.check_rule("logits", logits, r_logits, b_logits, context)


def chain_kinds(n_layers):
    return ["first"] + ["attention", "middle"] * (n_layers - 1) + ["attention", "last"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["fp32", "bf16"])
@pytest.mark.parametrize("rope_scaling", [None, LLAMA3], ids=["rope", "llama3"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_matches_hf(device, source, rope_scaling, tied, monkeypatch):
    check_matches_hf(device, source, rope_scaling, tied, monkeypatch)


def check_matches_hf(device, source, rope_scaling, tied, monkeypatch):
    """coda.from_hf against HF: the forward end to end, the gradients step by step, and the
    HF-named gradients (to_hf_state_dict) those checked."""
    config = hf_config(tied=tied, rope_scaling=rope_scaling)
    hf32 = hf_model(config, SEED, device)
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    if source == "bf16":  # all three models share the bf16 weights (not the RoPE table, which
        with torch.no_grad():  # .to(bf16) may have rounded in hf16)
            for p32, p16 in zip(hf32.parameters(), hf16.parameters()):
                p32.copy_(p16.float())
    model = coda.from_hf(hf16 if source == "bf16" else hf32)
    assert model.embed_tokens.weight.dtype == torch.bfloat16

    ids, labels = batch(device)
    r_logits, r_loss = hf_forward(hf32, ids, labels)
    b_logits, _ = hf_forward(hf16, ids, labels)
    steps = R.record_chain(monkeypatch, coda.ops, models)
    loss, logits = model(ids, labels=labels, return_logits=True)
    loss.backward()
    assert [s["kind"] for s in steps] == chain_kinds(config.num_hidden_layers)

    context = "(seed %d, %s, %s weights, %s, %s)" % (
        SEED, device, source, "llama3" if rope_scaling else "rope", "tied" if tied else "untied")
    check_forward(loss, logits, r_logits, b_logits, labels, context, r_loss)
    # The gradients step by step, not against HF's end to end: held end to end, the rule
    # compared two independent draws of the rounding error carried back through four layers
    # (seed 1467938813, cuda, tied: layers.3.input_layernorm at 2.2-2.4x), as test_models'
    # comparison did (docs/reliability.md, "The model tests' gradients").
    checked = R.check_chain(steps, model, ids, None, context)
    R.assert_hf_gradients(coda.to_hf_state_dict(model, grads=True), hf32,
                          R.hf_gradients(checked, model.block), context)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_patch_hf_runs_coda(device, tied, monkeypatch):
    hf16 = hf_model(hf_config(tied=tied, rope_scaling=LLAMA3), SEED, device).to(torch.bfloat16)
    model = coda.from_hf(hf16)
    ids, labels = batch(device)
    loss, logits = model(ids, labels=labels, return_logits=True)
    loss.backward()

    patched = coda.patch_hf(copy.deepcopy(hf16))
    R.assert_fused(patched)
    seen = R.watch_coda_weights(monkeypatch, coda.ops)
    out = patched(input_ids=ids, labels=labels)
    R.assert_no_weight_copies(patched, seen)  # w_qkv: the parameters' own memory
    assert isinstance(out, transformers.modeling_outputs.CausalLMOutputWithPast)
    assert torch.equal(out.loss, loss.detach()) and torch.equal(out.logits, logits)
    out.loss.backward()
    want = coda.to_hf_state_dict(model, grads=True)
    for name, p in patched.named_parameters():
        assert torch.equal(p.grad, want[name]), name  # the same kernels on the same weights
    for layer in patched.model.layers:  # views of coda's weight gradients
        for params in R.projection_groups(layer).values():
            R.assert_row_blocks([p.grad for p in params])

    # Hugging Face's gradient-accumulation form: sum / num_items_in_batch.
    n = int((models.shift_labels(labels) != IGNORE).sum())
    out2 = patched(input_ids=ids, labels=labels, num_items_in_batch=n * 2)
    assert abs(out2.loss.item() - loss.item() / 2) < 1e-3 * abs(loss.item())
    # No labels: logits only.
    out3 = patched(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert out3.loss is None and torch.equal(out3.logits, logits)
    # Padding: the coda model's results with the same mask.
    p_ids, p_labels, mask = R.pad_batch(ids, labels)
    p_loss, p_logits = model(p_ids, labels=p_labels, return_logits=True, attention_mask=mask)
    out4 = patched(input_ids=p_ids, labels=p_labels, attention_mask=mask)
    assert torch.equal(out4.loss, p_loss.detach()) and torch.equal(out4.logits, p_logits)
    with pytest.raises(NotImplementedError):
        patched(input_ids=ids, attention_mask=torch.ones(B, 1, S, S, device=device))
    coda.hf.unpatch_hf(patched)
    assert "forward" not in patched.__dict__


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_patch_hf_padded_batch_matches_hf(device, tied, monkeypatch):
    """Left and right padding, labels -100 at the pads (a collator's batch): the patched model
    against HF's own forward on the same attention_mask, fp32 the reference and bf16 the
    baseline. With left padding HF's loss counts the last pad position predicting the first
    token, whose attention reads no key: torch >= 2.5's SDPA gives it a zero output, as coda
    does."""
    check_patched_padded(device, tied, monkeypatch)


@pytest.mark.parametrize("mistake", R.PATCHED_MISTAKES)
def test_patched_check_catches_planted_mistakes(mistake, monkeypatch):
    """The step-by-step check of a patched HF model still fails a wrong gradient: an HF
    gamma's gradient 1/32 off in scale (a parameter coda's step read itself), one middle call
    losing a token's dqkv row (token 20 of row 0, not padding), or one row of k_proj's
    gradient, a view into the fused q/k/v gradient, changed after the backward."""
    plant, match = R.plant_patched_mistake(mistake, monkeypatch, coda.ops, token=20)
    with pytest.raises(AssertionError, match=match):
        check_patched_padded("cpu", False, monkeypatch, plant)


def check_patched_padded(device, tied, monkeypatch, plant=None):
    """A padded batch through coda.patch_hf(HF bf16) against HF's own forward: the loss and
    logits end to end, the gradients step by step (check_chain through the patched
    run_layers), every HF parameter's .grad the rows of the coda gradient checked. plant(model),
    when given, runs after the backward (a planted mistake)."""
    config = hf_config(tied=tied, rope_scaling=LLAMA3)
    hf32 = hf_model(config, SEED, device)
    # transformers' default; its eager path would give the rows with no key uniform weights.
    assert getattr(hf32.config, "_attn_implementation", "sdpa") == "sdpa"
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    ids, labels = batch(device)
    ids, labels, mask = R.pad_batch(ids, labels)
    r_logits, _ = hf_forward(hf32, ids, labels, mask)
    b_logits, _ = hf_forward(hf16, ids, labels, mask)
    assert torch.isfinite(r_logits).all() and torch.isfinite(b_logits).all(), (
        "HF's own forward is not finite on the padded batch (its SDPA on rows with no key)")
    patched = coda.patch_hf(copy.deepcopy(hf16))
    steps = R.record_chain(monkeypatch, coda.ops, models)
    out = patched(input_ids=ids, labels=labels, attention_mask=mask)
    out.loss.backward()
    if plant is not None:
        plant(patched)
    assert [s["kind"] for s in steps] == chain_kinds(config.num_hidden_layers)

    context = "(seed %d, %s, %s, padded, patched)" % (SEED, device,
                                                      "tied" if tied else "untied")
    check_forward(out.loss, out.logits, r_logits, b_logits, labels, context)
    checked = R.check_chain(steps, patched, ids, mask != 0, context)
    R.assert_hf_gradients({n: p.grad for n, p in patched.named_parameters()}, patched,
                          R.hf_gradients(checked, patched._coda_state["block"]), context)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_patch_hf_trains_saves_and_unpatches(device, tied, tmp_path):
    """An optimizer built before the patch (torch's fused AdamW on the GPU: it takes only
    dense parameters) steps the fused memory; save_pretrained (safetensors and .bin) writes
    the HF checkpoint that loads back; unpatch_hf leaves separate memory and HF's forward."""
    hf16 = hf_model(hf_config(tied=tied), SEED, device).to(torch.bfloat16)
    opt = torch.optim.AdamW(hf16.parameters(), lr=1e-2, **(
        {"fused": True} if device == "cuda" else {"foreach": True}))
    patched = coda.patch_hf(hf16)
    fused = R.fused_tensors(patched)
    ids, labels = batch(device)
    patched(input_ids=ids, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad()
    assert R.same_objects(R.fused_tensors(patched), fused)  # stepped in place
    R.assert_fused(patched)
    # coda reads the stepped weights: the same step as a coda model copied from them now.
    model = coda.from_hf(patched)
    loss, logits = model(ids, labels=labels, return_logits=True)
    out = patched(input_ids=ids, labels=labels)
    assert torch.equal(out.loss, loss.detach()) and torch.equal(out.logits, logits)

    want = {n: t.detach().clone() for n, t in patched.state_dict().items()}
    forms = [("safetensors", {})]  # transformers 5 writes safetensors only
    if "safe_serialization" in inspect.signature(patched.save_pretrained).parameters:
        forms.append(("bin", {"safe_serialization": False}))
    for name, kwargs in forms:
        patched.save_pretrained(tmp_path / name, **kwargs)
        R.assert_fused(patched)  # saving copies what it needs; the fusion stays
        loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / name).to(torch.bfloat16)
        got = loaded.state_dict()
        for n, value in want.items():
            assert torch.equal(got[n].to(value.device), value), (name, n)

    params = dict(patched.named_parameters())
    coda.hf.unpatch_hf(patched)
    assert "forward" not in patched.__dict__ and dict(patched.named_parameters()) == params
    assert len({R.storage_address(p) for p in params.values()}) == len(params)
    for n, p in patched.state_dict().items():
        assert torch.equal(p, want[n]), n
    out = patched(input_ids=ids, labels=labels)  # HF's own forward again
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize(
    "overrides",
    [dict(attention_bias=True), dict(mlp_bias=True), dict(hidden_act="gelu"),
     dict(rope_scaling={"rope_type": "linear", "factor": 2.0})],
    ids=["attention_bias", "mlp_bias", "gelu", "linear_rope"],
)
def test_unsupported_configs_raise(overrides):
    hf = transformers.LlamaForCausalLM(hf_config(**overrides))
    with pytest.raises(NotImplementedError):
        coda.from_hf(hf)
    with pytest.raises(NotImplementedError):
        coda.patch_hf(hf)
