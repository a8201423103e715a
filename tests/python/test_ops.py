"""coda.ops against plain torch, under ARCHITECTURE.md section 7's rule: for every output and
every gradient, coda's max error against an fp32 reference is at most twice torch's own bf16
error plus 1e-6. CPU tensors run coda's CPU backend; CUDA tensors (sm_90) the GPU backend."""

import pytest

torch = pytest.importorskip("torch")

import coda  # noqa: E402
from coda import models, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402

DEVICES = R.device_params()

# M ragged (not a multiple of a tile), F and V multiples of 8 but not of 128; head_dim 64 (the
# GPU RoPE epilogue supports 64 and 128).
M, D, F, H, KV, HD, V = 100, 256, 352, 4, 2, 64, 520
BLOCK = ops.BlockConfig(H, KV, HD, eps=1e-5)
QKV = (H + 2 * KV) * HD
IGNORE = -100


def ctx(name):
    return "(seed %d, %s)" % (SEED, name)


def rope_inputs(gen, device, m=M):
    positions = torch.randint(0, 4096, (m,), generator=gen).to(device)
    cfg = models.LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                             num_key_value_heads=KV, head_dim=HD, vocab_size=V,
                             num_hidden_layers=2, rope_theta=500000.0)
    return positions, models.rope_inv_freq(cfg).to(device)


def leaves(tensors, dtype=None):
    """Fresh leaf copies that require grad (in `dtype` when given)."""
    out = []
    for t in tensors:
        t = t.detach().clone()
        if dtype is not None:
            t = t.to(dtype)
        out.append(t.requires_grad_())
    return out


def check_all(names, got, ref, base, context):
    for name, g, r, b in zip(names, got, ref, base):
        R.check_rule(name, g, r, b, context)


# ---------------------------------------------------------------------------------------------
# gemm


def gemm_operands(layout, gen, device, m=37, n=48, k=64):
    if layout == "fwd":
        a, b = (m, k), (n, k)
    elif layout == "dgrad":
        a, b = (m, k), (k, n)
    else:  # wgrad: A [K, M] needs M % 8 == 0
        m = 40
        a, b = (k, m), (k, n)
    return (R.uniform(a, -1, 1, gen, device=device), R.uniform(b, -1, 1, gen, device=device),
            (m, n))


def torch_gemm(a, b, layout):
    if layout == "fwd":
        return a @ b.t()
    if layout == "dgrad":
        return a @ b
    return a.t() @ b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm(device, layout, out_dtype):
    gen = R.generator(SEED, hash((layout, str(out_dtype))) % 1000)
    a, b, (m, n) = gemm_operands(layout, gen, device)
    c = R.uniform((m, n), -1, 1, gen, dtype=out_dtype, device=device)
    alpha, beta = 0.75, 0.5
    la, lb, lc = leaves([a, b, c])
    d = ops.gemm(la, lb, layout, c=lc, alpha=alpha, beta=beta, out_dtype=out_dtype)
    assert d.dtype == out_dtype and d.shape == (m, n)
    dd = R.uniform((m, n), -1, 1, gen, dtype=out_dtype, device=device)
    grads = torch.autograd.grad(d, [la, lb, lc], dd)

    def reference(ta, tb, tc, dtype):
        return (alpha * torch_gemm(ta, tb, layout)).to(dtype) + beta * tc

    ra, rb, rc = leaves([a, b, c], torch.float32)
    ref = reference(ra, rb, rc, torch.float32)
    ref_grads = torch.autograd.grad(ref, [ra, rb, rc], dd.float())
    ba, bb, bc = leaves([a, b, c])
    base = reference(ba, bb, bc, out_dtype)
    base_grads = torch.autograd.grad(base, [ba, bb, bc], dd)
    check_all(["d", "da", "db", "dc"], [d, *grads], [ref, *ref_grads], [base, *base_grads],
              ctx("gemm %s" % layout))


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_rejects_bad_input(device):
    a = torch.zeros(4, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError):  # inner dimensions differ
        ops.gemm(a, torch.zeros(8, 24, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError):  # A and B of different dtypes
        ops.gemm(a, torch.zeros(8, 16, dtype=torch.float16, device=device))
    with pytest.raises(NotImplementedError) as e:  # K = 12: not a multiple of 8
        ops.gemm(torch.zeros(4, 16, dtype=torch.bfloat16, device=device)[:, :12],
                 torch.zeros(8, 16, dtype=torch.bfloat16, device=device)[:, :12])
    assert isinstance(e.value, coda.Error) and "multiple of 8" in str(e.value)
    with pytest.raises(TypeError):  # torch dtype coda does not take
        ops.gemm(a.double(), a.double())


# ---------------------------------------------------------------------------------------------
# gate/up converters


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gate_up_converters(device, dtype):
    gen = R.generator(SEED, 7)
    stacked = R.uniform((2 * 24, 16), -1, 1, gen, dtype=dtype, device=device).requires_grad_()
    fused = ops.interleave_gate_up(stacked)
    gate, up = stacked.detach().chunk(2)
    assert torch.equal(fused, torch.stack((gate, up), dim=1).reshape(48, 16))
    back = ops.deinterleave_gate_up(fused)
    assert torch.equal(back, stacked.detach())
    g = torch.randn(48, 16, generator=gen).to(dtype=dtype, device=device)
    (grad,) = torch.autograd.grad(fused, stacked, g)
    assert torch.equal(grad, ops.deinterleave_gate_up(g))


# ---------------------------------------------------------------------------------------------
# The block layers


def first_inputs(gen, device):
    x = R.uniform((M, D), -1, 1, gen, device=device)
    weights = {"attn_norm": R.norm_weight(D, gen, device=device),
               "w_qkv": R.weight(QKV, D, gen, device=device)}
    return x, weights


def mlp_weights(gen, device):
    return {
        "w_out": R.weight(D, H * HD, gen, device=device),
        "ffn_norm": R.norm_weight(D, gen, device=device),
        "w_gate_up": R.weight(2 * F, D, gen, device=device),
        "w_down": R.weight(D, F, gen, device=device),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_llama_first(device):
    gen = R.generator(SEED, 11)
    x, w = first_inputs(gen, device)
    positions, inv_freq = rope_inputs(gen, device)
    dqkv = R.uniform((M, QKV), -1, 1, gen, device=device)

    lx, *lw = leaves([x, *w.values()])
    qkv = ops.llama_first(lx, dict(zip(ops.FIRST_WEIGHTS, lw)), positions, inv_freq, BLOCK)
    grads = torch.autograd.grad(qkv, [lx, *lw], dqkv)

    def run(dtype):
        ls = leaves([x, *w.values()], dtype)
        out = R.first(*ls, positions, inv_freq, BLOCK)
        return out, torch.autograd.grad(out, ls, dqkv.to(out.dtype))

    ref, ref_grads = run(torch.float32)
    base, base_grads = run(None)
    check_all(["qkv", "dx", "d attn_norm", "d w_qkv"], [qkv, *grads], [ref, *ref_grads],
              [base, *base_grads], ctx("first layer"))


def middle_setup(gen, device):
    """A middle layer's inputs and weights: x0, y0, the weights by name, positions, inv_freq."""
    x0 = R.uniform((M, D), -1, 1, gen, device=device)
    y0 = R.uniform((M, H * HD), -1, 1, gen, device=device)
    w = mlp_weights(gen, device)
    w["attn_norm"] = R.norm_weight(D, gen, device=device)
    w["w_qkv"] = R.weight(QKV, D, gen, device=device)
    positions, inv_freq = rope_inputs(gen, device)
    return x0, y0, w, positions, inv_freq


@pytest.mark.parametrize("device", DEVICES)
def test_llama_middle(device):
    gen = R.generator(SEED, 12)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    dx2 = R.uniform((M, D), -1, 1, gen, device=device)
    dqkv = R.uniform((M, QKV), -1, 1, gen, device=device)
    tensors = [x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS]

    ls = leaves(tensors)
    x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
    grads = torch.autograd.grad((x2, qkv), ls, (dx2, dqkv))

    def run(dtype):
        ls = leaves(tensors, dtype)
        outs = R.middle(*ls, positions, inv_freq, BLOCK)
        dt = outs[0].dtype
        return outs, torch.autograd.grad(outs, ls, (dx2.to(dt), dqkv.to(dt)))

    (r_x2, r_qkv), ref_grads = run(torch.float32)
    (b_x2, b_qkv), base_grads = run(None)
    names = ["x2", "qkv", "dx0", "dy0"] + ["d " + n for n in ops.MIDDLE_WEIGHTS]
    check_all(names, [x2, qkv, *grads], [r_x2, r_qkv, *ref_grads], [b_x2, b_qkv, *base_grads],
              ctx("middle layer"))




@pytest.mark.parametrize("device", DEVICES)
def test_llama_middle_reads_the_tensors_of_each_call(device):
    """Nothing a call is given is remembered by the next one (descriptors are cached by address,
    shape, stride, dtype and device, and int32 positions and f32 inv_freq are passed as they
    are, with no copy): tensors of the same shapes give their own results, and an in-place
    change between calls is seen by the next call."""
    gen = R.generator(SEED, 18)
    def int32_positions(x0, y0, w, positions, inv_freq):  # the form coda passes on, no copy
        return x0, y0, w, positions.to(torch.int32), inv_freq

    a = int32_positions(*middle_setup(gen, device))
    b = int32_positions(*middle_setup(gen, device))
    dx2 = R.uniform((M, D), -1, 1, gen, device=device)
    dqkv = R.uniform((M, QKV), -1, 1, gen, device=device)

    def run(x0, y0, w, positions, inv_freq):
        ls = leaves([x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS])
        outs = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
        return [*outs, *torch.autograd.grad(outs, ls, (dx2, dqkv))]

    def fresh(x0, y0, w, positions, inv_freq):  # the same values in memory of their own
        return run(x0.clone(), y0.clone(), {k: v.clone() for k, v in w.items()},
                   positions.clone(), inv_freq.clone())

    def same(got, want, what):
        assert len(got) == len(want)
        for i, (g, e) in enumerate(zip(got, want)):
            assert torch.equal(g, e), "%s: output %d differs %s" % (what, i, ctx(""))

    first_a, first_b = run(*a), run(*b)
    assert not torch.equal(first_a[0], first_b[0])
    same(first_b, fresh(*b), "b after a")
    same(run(*a), first_a, "a again")
    x0, y0, w, positions, inv_freq = a
    w["w_down"].mul_(-0.5)
    x0.add_(0.25)
    positions.add_(7)
    inv_freq.mul_(0.5)
    changed = run(*a)
    assert not torch.equal(changed[0], first_a[0])
    same(changed, fresh(*a), "a changed in place")


def test_descriptors_match_field_by_field():
    """coda._torch packs descriptors with struct: the bytes ctypes builds field by field."""
    from coda import _lib as L
    from coda import _torch as T

    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float16).reshape(2, 3, 4, 5)
    cases = [torch.tensor(3.0), torch.zeros(5, dtype=torch.int32),
             torch.zeros(3, 4, dtype=torch.bfloat16).t(), base[:, 1], base, torch.zeros(0, 8)]
    codes = {torch.float32: L.F32, torch.float16: L.F16, torch.bfloat16: L.BF16,
             torch.int32: L.I32}

    def by_fields(t):
        if t.dim() == 0:
            return L.tensor(t.data_ptr(), codes[t.dtype], (1,), (1,))
        return L.tensor(t.data_ptr(), codes[t.dtype], t.shape, t.stride())

    for t in cases:
        assert bytes(T.view(t)) == bytes(by_fields(t)), t.shape
    # Packed descriptors are cached by (data_ptr, shape, stride, dtype, device): one address
    # seen with other shapes, strides or dtypes gets its own, and the cache stays bounded.
    for t in (base.reshape(-1), base.transpose(0, 3), base.view(torch.bfloat16), base):
        assert bytes(T.view(t)) == bytes(by_fields(t)), (t.shape, t.stride(), t.dtype)
    for i in range(T._PACKS_MAX + 10):
        T.view(base[: 1 + i % 2, :, :, : 1 + i % 5].reshape(-1)[i % 7:])
        assert len(T._packs) <= T._PACKS_MAX
    assert bytes(T.view(None)) == bytes(L.absent())
    x0, y0, pos, inv = cases[3], cases[4], cases[1], None
    nested = L.LlamaMiddleInputs(x0=by_fields(x0), y0=by_fields(y0),
                                 rope=L.LlamaRope(positions=by_fields(pos), inv_freq=L.absent()))
    assert bytes(T.pack_inputs(L.LlamaMiddleInputs, [], x0, y0, pos, inv)) == bytes(nested)
    # The FP8 weight copies (uint8 tensors) as E4M3 codes and E8M0 scales, in their fields.
    copies = [torch.empty(s, dtype=torch.uint8) for s in ((32, 48), (1, 1), (48, 32), (1, 1))]
    nested.fp8_weights.w_down = L.LlamaFp8Weight(*(
        L.tensor(t.data_ptr(), L.E8M0 if i % 2 else L.E4M3, t.shape, t.stride())
        for i, t in enumerate(copies)))
    four = [None] * 4
    assert bytes(T.pack_inputs(L.LlamaMiddleInputs, four + four + copies + four,
                               x0, y0, pos, inv)) == bytes(nested)
    with pytest.raises(TypeError, match="fp8_weights.w_out.codes.*uint8"):
        T.pack_fp8_weights(L.LlamaMiddleFp8Weights, [x0] * 16)
    buf = torch.empty(64, dtype=torch.uint8)
    assert bytes(T.workspace_view(buf, 37)) == bytes(L.tensor(buf.data_ptr(), L.I32, (10,)))
    with pytest.raises(TypeError, match="rope.positions"):
        T.pack_inputs(L.LlamaMiddleInputs, [], x0, y0, pos.double(), inv)
    with pytest.raises(ValueError, match="dweights.w_qkv: rank 5"):
        T.pack(L.LlamaMiddleGrads, *(cases * 2)[:8], torch.zeros(1, 1, 1, 1, 1))
    with pytest.raises(TypeError):  # not a struct of coda_tensors
        T.pack(L.LlamaLastGrads, *(cases * 2)[:9])


def last_setup(gen, device):
    x0 = R.uniform((M, D), -1, 1, gen, device=device)
    y0 = R.uniform((M, H * HD), -1, 1, gen, device=device)
    w = mlp_weights(gen, device)
    w["final_norm"] = R.norm_weight(D, gen, device=device)
    w["lm_head"] = R.weight(V, D, gen, device=device)
    targets = torch.randint(0, V, (M,), generator=gen)
    targets[torch.rand(M, generator=gen) < 0.1] = IGNORE
    return x0, y0, w, targets.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_llama_last(device, reduction):
    gen = R.generator(SEED, 13 if reduction == "mean" else 14)
    x0, y0, w, targets = last_setup(gen, device)
    tensors = [x0, y0] + [w[n] for n in ops.LAST_WEIGHTS]
    dloss = 0.7  # d(outer loss) / d loss: reaches the op as a device tensor

    ls = leaves(tensors)
    loss, logits = ops.llama_last(ls[0], ls[1], targets, tuple(ls[2:]), BLOCK,
                                  return_logits=True, reduction=reduction)
    assert loss.shape == () and loss.dtype == torch.float32
    assert logits.shape == (M, V) and not logits.requires_grad
    grads = torch.autograd.grad(loss * dloss, ls)

    def run(dtype):
        ls = leaves(tensors, dtype)
        logits = R.last_logits(*ls, BLOCK)
        loss = R.cross_entropy(logits, targets, IGNORE, reduction)
        return logits, loss, torch.autograd.grad(loss * dloss, ls)

    r_logits, r_loss, ref_grads = run(torch.float32)
    b_logits, b_loss, base_grads = run(None)
    R.check_loss("loss", loss, R.token_losses(r_logits, targets), R.token_losses(b_logits, targets),
                 targets, IGNORE, reduction, ctx("last layer"))
    names = ["logits", "dx0", "dy0"] + ["d " + n for n in ops.LAST_WEIGHTS]
    check_all(names, [logits, *grads], [r_logits, *ref_grads], [b_logits, *base_grads],
              ctx("last layer " + reduction))

    # Without logits: the same loss, bit for bit.
    loss2, none = ops.llama_last(x0, y0, targets, w, BLOCK, reduction=reduction)
    assert none is None and torch.equal(loss2, loss.detach())


@pytest.mark.parametrize("device", DEVICES)
def test_llama_last_all_ignored(device):
    gen = R.generator(SEED, 15)
    x0, y0, w, targets = last_setup(gen, device)
    targets = torch.full_like(targets, IGNORE)
    x0 = x0.requires_grad_()
    loss, _ = ops.llama_last(x0, y0, targets, w, BLOCK)
    assert loss.item() == 0.0  # coda's convention: a mean over no target is 0
    (dx,) = torch.autograd.grad(loss, x0)
    assert torch.count_nonzero(dx) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_block_errors(device):
    gen = R.generator(SEED, 16)
    x, w = first_inputs(gen, device)
    positions, inv_freq = rope_inputs(gen, device)
    with pytest.raises(TypeError):  # an f32 weight among bf16 tensors
        ops.llama_first(x, {"attn_norm": w["attn_norm"], "w_qkv": w["w_qkv"].float()}, positions,
                        inv_freq, BLOCK)
    with pytest.raises(ValueError) as e:  # w_qkv for 3 heads instead of 4
        ops.llama_first(x, (w["attn_norm"], w["w_qkv"][: QKV - HD]), positions, inv_freq, BLOCK)
    assert "w_qkv" in str(e.value)
    with pytest.raises(ValueError):
        ops.llama_first(x, (w["attn_norm"],), positions, inv_freq, BLOCK)


class DTensor(torch.Tensor):
    """Stands in for torch.distributed.tensor.DTensor where torch has none (coda tells it by
    its type's name); test_sharded_weight_from_a_real_dtensor uses the real one."""


def test_sharded_weight_is_named_with_what_to_do():
    """A DTensor weight (FSDP2's sharded parameters) is refused before any kernel runs, by an
    error that names the weight and says how to give coda whole tensors."""
    gen = R.generator(SEED, 17)
    x0, y0, w, positions, inv_freq = middle_setup(gen, "cpu")
    w["w_down"] = torch.Tensor._make_subclass(DTensor, w["w_down"])
    with pytest.raises(TypeError, match=r"weights\.w_down is a DTensor.*full_tensor"):
        ops.llama_middle(x0, y0, w, positions, inv_freq, BLOCK)


def test_sharded_weight_from_a_real_dtensor(tmp_path):
    """The same with torch's DTensor, sharded over a one-rank gloo group on the CPU."""
    dist = pytest.importorskip("torch.distributed")
    tensor_api = pytest.importorskip("torch.distributed.tensor")
    if not dist.is_available() or not hasattr(tensor_api, "distribute_tensor"):
        pytest.skip("torch %s has no public DTensor" % torch.__version__)
    from torch.distributed.device_mesh import init_device_mesh

    gen = R.generator(SEED, 18)
    x0, y0, w, positions, inv_freq = middle_setup(gen, "cpu")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "rendezvous"), rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        w["w_qkv"] = tensor_api.distribute_tensor(w["w_qkv"], mesh, [tensor_api.Shard(0)])
        with pytest.raises(TypeError, match=r"weights\.w_qkv is a DTensor"):
            ops.llama_middle(x0, y0, w, positions, inv_freq, BLOCK)
    finally:
        dist.destroy_process_group()


def test_gpu_head_dim_96_is_not_supported():
    if not R.sm90():
        pytest.skip("needs an sm_90 GPU")
    heads, hd = 2, 96
    block = ops.BlockConfig(heads, heads, hd)
    x = torch.randn(16, 256, device="cuda").bfloat16()
    w = (torch.ones(256, device="cuda").bfloat16(),
         torch.randn(3 * heads * hd, 256, device="cuda").bfloat16())
    with pytest.raises(NotImplementedError):
        ops.llama_first(x, w, torch.arange(16, device="cuda"), torch.ones(hd // 2, device="cuda"),
                        block)


# ---------------------------------------------------------------------------------------------
# The eager bypass runs the same implementation: bitwise the same results.


@pytest.mark.parametrize("device", DEVICES)
def test_plain_eager_calls_skip_the_dispatcher_and_the_rest_take_it(device, monkeypatch):
    """By default a plain eager call runs the bypass; under a dispatch or function mode, with a
    tensor subclass among the arguments, or with the bypass turned off, the same call goes
    through the custom op (a dispatch mode sees it as one op), with the same result."""
    if not ops.HAS_CUSTOM_OPS:
        pytest.skip("torch without custom ops always runs the bypass")
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    gen = R.generator(SEED, 18)
    a = R.uniform((32, 64), -1, 1, gen, device=device)
    b = R.uniform((48, 64), -1, 1, gen, device=device)
    through = []
    real = ops._GEMM.op

    def counted(*args):
        through.append(len(args))
        return real(*args)

    monkeypatch.setattr(ops._GEMM, "op", counted)
    plain = ops.gemm(a, b)
    assert through == [], "a plain eager call went through the dispatcher"
    assert ops._bypassing((a, [b], torch.nn.Parameter(b)))

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen() as seen:
        under_mode = ops.gemm(a, b)
    assert through == [7] and "coda.gemm.default" in seen.ops, seen.ops  # the 7 arguments
    with Passing():
        assert torch.equal(ops.gemm(a, b), plain)
    assert len(through) == 2

    class Sub(torch.Tensor):
        pass

    assert not ops._bypassing((a.as_subclass(Sub),))
    assert not ops._bypassing(([a, b.as_subclass(Sub)],))
    previous = ops.set_eager_bypass(False)
    try:
        assert torch.equal(ops.gemm(a, b), plain)
    finally:
        ops.set_eager_bypass(previous)
    assert len(through) == 3
    assert torch.equal(under_mode, plain)


def test_a_bypassed_call_is_named_in_the_profiler():
    """Under the torch profiler a bypassed call records a range named as its op (coda::gemm), as
    a dispatcher call records the op itself."""
    gen = R.generator(SEED, 19)
    a = R.uniform((32, 64), -1, 1, gen)
    b = R.uniform((48, 64), -1, 1, gen)
    previous = ops.set_eager_bypass(True)
    try:
        with torch.profiler.profile() as prof:
            ops.gemm(a, b)
    finally:
        ops.set_eager_bypass(previous)
    names = [e.key for e in prof.key_averages()]
    assert any(n.startswith("coda::gemm") for n in names), names


@pytest.mark.parametrize("device", DEVICES)
def test_eager_bypass_is_bitwise_equal(device):
    if not ops.HAS_CUSTOM_OPS:
        pytest.skip("torch without custom ops always runs the bypass")
    gen = R.generator(SEED, 17)
    x0, y0, w, targets = last_setup(gen, device)
    tensors = [x0, y0] + [w[n] for n in ops.LAST_WEIGHTS]

    def run():
        ls = leaves(tensors)
        loss, logits = ops.llama_last(ls[0], ls[1], targets, tuple(ls[2:]), BLOCK,
                                      return_logits=True)
        return [loss, logits, *torch.autograd.grad(loss, ls)]

    R.expect_bypass_bitwise_equal(ops, run)
