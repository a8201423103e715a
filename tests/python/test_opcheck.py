"""torch.library.opcheck on every coda custom op: schema (no undeclared input mutation, no
output aliasing an input; the layer backward ops declare theirs: z1, overwritten with its
gradient), autograd registration, fake tensors (shapes, dtypes, strides as the real kernel's)
and AOT dispatch with dynamic shapes (which also runs the backward formulas)."""

import pytest

torch = pytest.importorskip("torch")

from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402

if not ops.HAS_CUSTOM_OPS:
    pytest.skip("torch.library.custom_op needs torch >= 2.4", allow_module_level=True)

DEVICES = R.device_params()
M, D, F, H, KV, HD, V = 24, 128, 96, 2, 1, 64, 72
QKV = (H + 2 * KV) * HD
EPS = 1e-5
coda_ops = torch.ops.coda
# The layer ops' precision argument (0 native, 1 fp8; FP8's backward runs other C calls: the
# middle layer's in one call instead of two parts). FP8 needs the tokens a multiple of 16 for
# its backward, and every width here is one.
PRECISIONS = [pytest.param(0, id="native"), pytest.param(1, id="fp8")]
# The same with the FP8 copies not given (the ops quantize their own).
PRECISIONS_GIVEN = [pytest.param(0, False, id="native"), pytest.param(1, False, id="fp8")]


def cfg(precision):
    """The layer ops' arguments after the tensors: n_heads, n_kv_heads, head_dim, eps,
    precision."""
    return (H, KV, HD, EPS, precision)


def tokens(precision):
    return 32 if precision else M


def opcheck(op, args):
    torch.library.opcheck(op, args)


def opcheck_consuming_saved(op, args):
    """opcheck for the layers' forward ops, whose backward overwrites tensors the forward
    returned for it (z1, and the middle layer's r2; docs/python.md, "K7 in place"). opcheck's
    aot_dispatch test runs the backward and then compares the forward's outputs, eager (where
    the backward consumed them) against a traced graph (where it works on a copy): they differ
    by design (the H100, 57f4a19). So that test runs without gradients (the forward traced), and
    every other test with them; test_compile compares a compiled model's gradients with eager's."""
    torch.library.opcheck(op, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor"))
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(op, detached, test_utils="test_aot_dispatch_dynamic")


def rope(gen, device, m=M):
    positions = torch.randint(0, 512, (m,), generator=gen).to(device=device, dtype=torch.int32)
    config = models.LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                                num_key_value_heads=KV, head_dim=HD, vocab_size=V,
                                num_hidden_layers=2)
    return positions, models.rope_inv_freq(config).to(device)


def act(gen, device, *shape, grad=False):
    return R.uniform(shape, -1, 1, gen, device=device).requires_grad_(grad)


def w(gen, device, out_features, in_features, grad=True):
    return R.weight(out_features, in_features, gen, device=device).requires_grad_(grad)


def g(gen, device, n, grad=True):
    return R.norm_weight(n, gen, device=device).requires_grad_(grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [0, 1, 2])
def test_gemm(device, layout):
    gen = R.generator(SEED, 31 + layout)
    shapes = {0: ((40, 64), (48, 64)), 1: ((40, 64), (64, 48)), 2: ((64, 40), (64, 48))}[layout]
    a = act(gen, device, *shapes[0], grad=True)
    b = act(gen, device, *shapes[1], grad=True)
    c = R.uniform((40, 48), -1, 1, gen, dtype=torch.float32, device=device).requires_grad_()
    opcheck(coda_ops.gemm.default, (a, b, layout, None, 1.0, 0.0, None))
    opcheck(coda_ops.gemm.default, (a, b, layout, c, 0.5, 2.0, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_gate_up(device):
    gen = R.generator(SEED, 34)
    t = act(gen, device, 2 * F, D, grad=True)
    opcheck(coda_ops.interleave_gate_up.default, (t,))
    opcheck(coda_ops.deinterleave_gate_up.default, (t,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_llama_first(device, precision):
    gen = R.generator(SEED, 35)
    m, c = tokens(precision), cfg(precision)
    positions, inv_freq = rope(gen, device, m)
    x = act(gen, device, m, D, grad=True)
    attn_norm, w_qkv = g(gen, device, D), w(gen, device, QKV, D)
    opcheck(coda_ops.llama_first_forward.default,
            (x, attn_norm, w_qkv, positions, inv_freq, *c, []))
    with torch.no_grad():
        qkv, rstd = coda_ops.llama_first_forward(x, attn_norm, w_qkv, positions, inv_freq, *c,
                                                 [])
    dqkv = act(gen, device, m, QKV)
    opcheck(coda_ops.llama_first_backward.default,
            (dqkv, x.detach(), attn_norm.detach(), w_qkv.detach(), positions, inv_freq, qkv,
             rstd, *c, []))


def mlp(gen, device):
    return [w(gen, device, D, H * HD), g(gen, device, D), w(gen, device, 2 * F, D),
            w(gen, device, D, F)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision, given",
                         PRECISIONS_GIVEN + [pytest.param(1, True, id="fp8-given")])
def test_llama_middle(device, precision, given):
    """given: the ops handed their weights' FP8 copies (ops.llama_fp8_weights: a Tensor[] of
    uint8 codes and scales, read, never written), under the same schema, autograd and
    fake-tensor checks as without them."""
    gen = R.generator(SEED, 39 if given else 36)
    m, c = tokens(precision), cfg(precision)
    positions, inv_freq = rope(gen, device, m)
    x0, y0 = act(gen, device, m, D, grad=True), act(gen, device, m, H * HD, grad=True)
    weights = mlp(gen, device) + [g(gen, device, D), w(gen, device, QKV, D)]
    fp8 = (ops.llama_fp8_weights("middle", [t.detach() for t in weights],
                                 ops.BlockConfig(H, KV, HD, EPS, precision="fp8"))
           if given else [])
    args = (x0, y0, *weights, positions, inv_freq, *c, fp8)
    opcheck_consuming_saved(coda_ops.llama_middle_forward.default, args)
    with torch.no_grad():
        outs = coda_ops.llama_middle_forward(*args)
    plain = [t.detach() for t in (x0, y0, *weights)]
    opcheck(coda_ops.llama_middle_backward.default,
            (act(gen, device, m, D), act(gen, device, m, QKV), *plain, positions, inv_freq,
             *outs, *c, fp8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("return_logits", [False, True])
def test_llama_last(device, return_logits, precision):
    gen = R.generator(SEED, 37 + return_logits)
    m, c = tokens(precision), cfg(precision)
    x0, y0 = act(gen, device, m, D, grad=True), act(gen, device, m, H * HD, grad=True)
    weights = mlp(gen, device) + [g(gen, device, D), w(gen, device, V, D)]
    targets = torch.randint(0, V, (m,), generator=gen).to(device=device, dtype=torch.int32)
    targets[::5] = -100
    args = (x0, y0, targets, *weights, *c, -100, 0, return_logits, [])
    opcheck_consuming_saved(coda_ops.llama_last_forward.default, args)
    with torch.no_grad():
        loss, logits, *saved = coda_ops.llama_last_forward(*args)
    plain = [t.detach() for t in (x0, y0)] + [targets] + [t.detach() for t in weights]
    dloss = torch.full((1,), 0.5, device=device)
    opcheck(coda_ops.llama_last_backward.default,
            (dloss, *plain, *saved, *c, -100, 0, []))
