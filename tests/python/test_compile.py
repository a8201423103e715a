"""torch.compile(fullgraph=True) through coda's ops: a block (middle layer, attention, last
layer) and a whole coda.models.Llama trace with no graph break (fullgraph raises on one), and
give eager's results. CUDA compiles with inductor; the CPU backend with aot_eager (no C++
code generation needed)."""

import pytest

torch = pytest.importorskip("torch")

from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402

if not ops.HAS_CUSTOM_OPS or not hasattr(torch, "compile"):
    pytest.skip("needs torch >= 2.4 (custom ops, torch.compile)", allow_module_level=True)

DEVICES = R.device_params()
B, S = 2, 36
M, D, F, H, KV, HD, V = B * S, 256, 352, 4, 2, 64, 520
QKV = (H + 2 * KV) * HD
BLOCK = ops.BlockConfig(H, KV, HD, eps=1e-5)


def backend(device):
    return "inductor" if device == "cuda" else "aot_eager"


def close(name, got, want):
    """Compiled vs eager: coda's kernels are the same, torch's ops around them may be fused
    differently (bf16 rounding)."""
    scale = want.detach().abs().max().item() + 1e-6
    err = R.max_err(got, want)
    assert err <= 2e-2 * scale, "%s: compiled differs from eager by %.3e (max %.3e)" % (
        name, err, scale)


def block_inputs(device):
    gen = R.generator(SEED, 41)
    u = lambda *shape: R.uniform(shape, -1, 1, gen, device=device)  # noqa: E731
    mid = (R.weight(D, H * HD, gen, device=device), R.norm_weight(D, gen, device=device),
           R.weight(2 * F, D, gen, device=device), R.weight(D, F, gen, device=device),
           R.norm_weight(D, gen, device=device), R.weight(QKV, D, gen, device=device))
    last = (R.weight(D, H * HD, gen, device=device), R.norm_weight(D, gen, device=device),
            R.weight(2 * F, D, gen, device=device), R.weight(D, F, gen, device=device),
            R.norm_weight(D, gen, device=device), R.weight(V, D, gen, device=device))
    targets = torch.randint(0, V, (M,), generator=gen).to(device)
    positions = torch.arange(S, device=device).repeat(B)
    config = models.LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                                num_key_value_heads=KV, head_dim=HD, vocab_size=V,
                                num_hidden_layers=2)
    inv_freq = models.rope_inv_freq(config).to(device)
    return u(M, D), u(M, H * HD), targets, mid, last, positions, inv_freq


def block_step(x0, y0, targets, mid, last, positions, inv_freq):
    x2, qkv = ops.llama_middle(x0, y0, mid, positions, inv_freq, BLOCK)
    y = models.attention(qkv, B, S, BLOCK)
    loss, logits = ops.llama_last(x2, y, targets, last, BLOCK, return_logits=True)
    return loss, logits


@pytest.mark.parametrize("device", DEVICES)
def test_block_forward_compiles(device):
    torch._dynamo.reset()
    inputs = block_inputs(device)
    compiled = torch.compile(block_step, fullgraph=True, backend=backend(device))
    with torch.no_grad():
        loss, logits = block_step(*inputs)
        c_loss, c_logits = compiled(*inputs)
    close("loss", c_loss, loss)
    close("logits", c_logits, logits)


@pytest.mark.parametrize("device", DEVICES)
def test_block_forward_backward_compiles(device):
    torch._dynamo.reset()
    x0, y0, targets, mid, last, positions, inv_freq = block_inputs(device)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x0, y0, *mid, *last)]
        loss, _ = fn(leaves[0], leaves[1], targets, tuple(leaves[2:8]), tuple(leaves[8:]),
                     positions, inv_freq)
        loss.backward()
        return loss, [t.grad for t in leaves]

    loss, grads = run(block_step)
    c_loss, c_grads = run(torch.compile(block_step, fullgraph=True, backend=backend(device)))
    close("loss", c_loss, loss)
    for i, (cg, g) in enumerate(zip(c_grads, grads)):
        close("grad %d" % i, cg, g)


def expect_model_compiles(device, precision, stream, batch, seq):
    """A coda.models.Llama of `precision` traces whole (fullgraph) and gives eager's loss and
    gradients on one batch of `batch` x `seq` tokens drawn from generator stream `stream`."""
    torch._dynamo.reset()
    gen = R.generator(SEED, stream)
    config = models.LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                                num_key_value_heads=KV, head_dim=HD, vocab_size=V,
                                num_hidden_layers=3)
    torch.manual_seed(SEED)
    model = models.Llama(config, device=device, precision=precision)
    ids = torch.randint(0, V, (batch, seq), generator=gen).to(device)
    loss = model(ids, labels=ids)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, fullgraph=True, backend=backend(device))
    c_loss = compiled(ids, labels=ids)
    c_loss.backward()
    close("loss", c_loss, loss)
    for n, p in model.named_parameters():
        close("grad " + n, p.grad, grads[n])


@pytest.mark.parametrize("device", DEVICES)
def test_llama_model_compiles(device):
    expect_model_compiles(device, "native", 42, B, S)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_llama_model_compiles(device):
    """precision="fp8" changes only the ops' precision argument: the model still traces whole and
    gives eager's results (coda's FP8 kernels are the same in both; 80 tokens, since an FP8
    backward needs a multiple of 16)."""
    expect_model_compiles(device, "fp8", 43, 2, 40)
