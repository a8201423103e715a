"""coda.kernels (the named CODA kernels and the auxiliary kernels as torch ops) against plain
torch: CPU tensors run coda's CPU backend, CUDA tensors (sm_90) the GPU backend.

Each kernel's math is written here from include/coda/kernels/args.hpp, rounding where
reference/kernels.cpp rounds, and evaluated in three precisions (Prec):
  REF    fp64, nothing rounded: the reference;
  LOWP   fp32 with the 16-bit results rounded where reference/kernels.cpp's unfused path rounds
         them: the baseline of the forward outputs (as tests/cpu/test_kernels_*.cpp);
  TORCH  the 16-bit tensors as torch computes with them, statistics in fp32: the baseline of the
         gradients (torch's own bf16 autograd, as test_ops.py).
Every output and every gradient passes ARCHITECTURE.md section 7's rule,
max|coda - REF| <= 2 max|baseline - REF| + 1e-6, except the two statistics whose bound
tests/cpu/test_kernels_backward.cpp derives otherwise (K7's zeta partials, cross_entropy's zeta;
see there). Then torch.library.opcheck on every op.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from coda import kernels, ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402

DEVICES = R.device_params()
DTYPE = torch.bfloat16

# M ragged against the 128-row partial blocks and the tiles; widths multiples of 8, not of 128.
M, K, N, F_, V = 200, 256, 264, 136, 520
H, KV, HD = 3, 1, 64  # the fused QKV is 320 wide; the GPU's RoPE epilogue takes head_dim 64, 128
QKV = (H + 2 * KV) * HD
EPS = 1e-5
IGNORE = -100
BLOCK, STAGED = kernels.REDUCE_BLOCK, kernels.STAGED_REDUCE_BLOCK


def ctx(name):
    return "(seed %d, %s)" % (SEED, name)


# ---------------------------------------------------------------------------------------------
# Precisions


class Prec:
    def __init__(self, name, dtype, stats, rnd, stat, exact=False):
        self.name, self.dtype, self.stats = name, dtype, stats
        self.rnd = rnd  # a result stored in the 16-bit type
        self.stat = stat  # a 16-bit tensor read as a statistic
        self.exact = exact


REF = Prec("fp64", torch.float64, torch.float64, lambda t: t, lambda t: t, exact=True)
LOWP = Prec("lowp", torch.float32, torch.float32, lambda t: t.to(DTYPE).float(), lambda t: t)
TORCH = Prec("torch", DTYPE, torch.float32, lambda t: t.to(DTYPE), lambda t: t.float())


# ---------------------------------------------------------------------------------------------
# The kernels' math (args.hpp), at reference/kernels.cpp's rounding points


def block_sum(t, block):
    """Row partials [M, ceil(N / block)] of t [M, N]."""
    m, n = t.shape
    return F.pad(t, (0, -n % block)).reshape(m, -1, block).sum(2)


def block_logsumexp(t, block):
    m, n = t.shape
    return F.pad(t, (0, -n % block), value=float("-inf")).reshape(m, -1, block).logsumexp(2)


def normed(P, a, w, partials, eps):
    """z = rstd[m] (a . w^T), rounded once from the fp32 accumulator (reference/kernels.cpp's
    normed_gemm); rstd = rsqrt(sum_b partials / K + eps)."""
    rstd = torch.rsqrt(partials.sum(1) / a.shape[1] + eps)
    return P.rnd(P.stat(a @ w.t()) * rstd[:, None]), rstd


def residual_rms(P, a, w, residual, gamma):
    x = P.rnd(P.rnd(a @ w.t()) + residual)
    xs = P.stat(x)
    return x, P.rnd(x * gamma), block_sum(xs * xs, BLOCK)


def rms_scale(P, a, w, partials, eps):
    return normed(P, a, w, partials, eps)


def gated(activation):
    def fn(P, a, w, partials, eps):
        z, rstd = normed(P, a, w, partials, eps)
        zs = P.stat(z)
        return z, P.rnd(activation(zs[:, 0::2]) * zs[:, 1::2]), rstd

    return fn


def rope(t, positions, inv_freq, sign):
    """Hugging Face's rotate-half RoPE by sign * theta on the Q and K heads of t [M, QKV]."""
    m, half, rotated = t.shape[0], HD // 2, (H + KV) * HD
    theta = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = theta.cos().to(t.dtype)[:, None, :], (sign * theta.sin()).to(t.dtype)[:, None, :]
    x = t[:, :rotated].reshape(m, H + KV, HD)
    lo, hi = x[..., :half], x[..., half:]
    y = torch.cat((lo * cos - hi * sin, hi * cos + lo * sin), dim=-1).reshape(m, rotated)
    return torch.cat((y, t[:, rotated:]), dim=1)


def rms_rope(P, a, w, partials, positions, inv_freq, eps):
    z, rstd = normed(P, a, w, partials, eps)
    return P.rnd(rope(P.stat(z), positions, inv_freq, 1)), rstd


def rms_lse(P, a, w, partials, targets, eps):
    logits, rstd = normed(P, a, w, partials, eps)
    ls = P.stat(logits)
    valid = (targets >= 0) & (targets < logits.shape[1])
    target_logit = ls.gather(1, (targets * valid).long()[:, None])[:, 0] * valid
    return logits, block_logsumexp(ls, STAGED), target_logit, rstd


def rms_backward(alpha, accumulate):
    def fn(P, dz, w, x, rstd, zeta, gamma, *dx_in):
        g = P.rnd(alpha * (dz @ w))  # fp32-accumulated, scaled, rounded (reference)
        xh = x * rstd[:, None]
        result = P.rnd(rstd[:, None] * (g * gamma - xh * zeta[:, None]))
        dx = P.rnd(dx_in[0] + result) if accumulate else result
        return dx, P.rnd(xh * gamma), block_sum((g * xh).t(), BLOCK)

    return fn


def swiglu_backward(P, dx, w, preact):
    dy = P.rnd(dx @ w)
    g, u = preact[:, 0::2], preact[:, 1::2]
    sig = torch.sigmoid(g)
    s = g * sig
    dg, du = P.rnd(dy * u * sig * (1 + g * (1 - sig))), P.rnd(dy * s)
    dpreact = torch.stack((dg, du), dim=2).reshape(preact.shape)
    return P.rnd(s * u), dpreact, block_sum(g * dg + u * du, STAGED)


def rope_backward(scale):
    def fn(P, dqkv, qkv, positions, inv_freq):
        dz = P.rnd(rope(dqkv, positions, inv_freq, -1))
        return dz, scale * (qkv * dqkv).sum(1)

    return fn


def rms_stats(P, x, gamma):
    xs = P.stat(x)
    return P.rnd(x * gamma), block_sum(xs * xs, BLOCK)


def ce_loss(lse_partials, target_logit, targets, reduction):
    """cross_entropy's loss from K5's statistics, and grad_scale (a mean over no row is 0)."""
    valid = targets != IGNORE
    losses = (lse_partials.logsumexp(1) - target_logit) * valid
    count = valid.sum()
    scale = (1.0 / count.clamp(min=1).to(losses.dtype)) * (count > 0)
    if reduction == "sum":
        scale = torch.ones_like(scale)
    return losses.sum() * scale, scale


def cross_entropy(reduction):
    """reference/kernels.cpp: the exact path reads lse and the target logit from K5's statistics,
    the unfused one from the (rounded) logits it has."""

    def fn(P, logits, lse_partials, target_logit, targets):
        valid = (targets != IGNORE)[:, None]
        if P.exact:
            loss, scale = ce_loss(lse_partials, target_logit, targets, reduction)
            lse = lse_partials.logsumexp(1)
        else:
            lse = logits.logsumexp(1)
            target = logits.gather(1, (targets * valid[:, 0]).long()[:, None])[:, 0]
            loss, scale = ce_loss(lse[:, None], target, targets, reduction)
        onehot = F.one_hot((targets * valid[:, 0]).long(), logits.shape[1]).to(logits.dtype)
        dlogits = P.rnd(torch.exp(logits - lse[:, None]) - onehot) * valid
        return loss.reshape(1), dlogits, scale.reshape(1), (logits * dlogits).sum(1)

    return fn


# ---------------------------------------------------------------------------------------------
# The comparison: inputs are (name, kind, value) with kind "h" (a 16-bit tensor), "s" (an f32
# statistic), "i" (an integer tensor) or "c" (a number); h and s are differentiable.


def cast(P, specs, grad):
    args, leaves = [], []
    for _, kind, t in specs:
        if kind in ("h", "s"):
            t = t.detach().to(P.dtype if kind == "h" else P.stats)
            if grad:
                t.requires_grad_()
                leaves.append(t)
        args.append(t)
    return args, leaves


def evaluate(P, fn, specs, douts=None):
    """fn's outputs in precision P and, given output gradients, the inputs' gradients."""
    args, leaves = cast(P, specs, douts is not None)
    with torch.set_grad_enabled(douts is not None):
        outs = fn(P, *args)
        if douts is None:
            return outs, None
        return outs, torch.autograd.grad(outs, leaves, [d.to(o.dtype) for d, o in zip(douts, outs)])


def coda_call(op, specs, grad):
    args, leaves = [], []
    for _, kind, t in specs:
        if kind in ("h", "s") and grad:
            t = t.detach().clone().requires_grad_()
            leaves.append(t)
        args.append(t)
    out = op(*args)
    return (out if isinstance(out, tuple) else (out,)), leaves


def check_op(name, op, fn, specs, out_names, gen, grad=True, skip=()):
    """op's outputs (except those named in skip) and, with grad, the gradients of all its 16-bit
    and statistic inputs, against fn's. Returns coda's outputs and fn's REF outputs."""
    got, leaves = coda_call(op, specs, grad)
    ref, _ = evaluate(REF, fn, specs)
    base, _ = evaluate(LOWP, fn, specs)
    for out_name, g, r, b in zip(out_names, got, ref, base):
        if out_name not in skip:
            R.check_rule(out_name, g, r, b, ctx(name))
    if not grad:
        return got, ref
    douts = [R.uniform(g.shape, -1, 1, gen, dtype=g.dtype, device=g.device) for g in got]
    grads = torch.autograd.grad(got, leaves, douts)
    _, ref_grads = evaluate(REF, fn, specs, douts)
    _, base_grads = evaluate(TORCH, fn, specs, douts)
    names = ["d " + n for n, kind, _ in specs if kind in ("h", "s")]
    for g_name, g, r, b in zip(names, grads, ref_grads, base_grads):
        R.check_rule(g_name, g, r, b, ctx(name + " backward"))
    return got, ref


# ---------------------------------------------------------------------------------------------
# Inputs


def act(gen, device, *shape, lo=-1.0, hi=1.0):
    return R.uniform(shape, lo, hi, gen, device=device)


def f32(gen, device, *shape, lo=-1.0, hi=1.0):
    return R.uniform(shape, lo, hi, gen, dtype=torch.float32, device=device)


def sumsq_partials(gen, device, width=K):
    """Row partials of x^2 for a random x [M, width]: what K0 or rms_stats would hand over."""
    x = R.uniform((M, width), -1, 1, gen, dtype=torch.float64)
    return block_sum(x * x, BLOCK).float().to(device)


def rms_of(x):
    """rstd of each row of x, in f32 (K6's rstd input)."""
    return torch.rsqrt(x.double().pow(2).mean(1) + 1e-6).float()


def rope_tables(device):
    """Packed sequences of 29 tokens, the first continued from position 517 (as the C++ tests);
    inv_freq = 10000^(-2i / head_dim) in f32."""
    m = torch.arange(M)
    positions = (m % 29 + (m < 29) * 517).to(device=device, dtype=torch.int32)
    inv_freq = (10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)).float()
    return positions, inv_freq.to(device)


def targets_of(gen, device, v=V):
    """Targets in [0, V) with every 4th row (from row 1) ignored and row 2 the last class."""
    t = torch.randint(0, v, (M,), generator=gen)
    t[2] = v - 1
    t[1::4] = IGNORE
    return t.to(device=device, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# The forward kernels (autograd)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_residual_rms(device):
    gen = R.generator(SEED, 101)
    specs = [("a", "h", act(gen, device, M, F_)), ("w", "h", R.weight(N, F_, gen, device=device)),
             ("residual", "h", act(gen, device, M, N)),
             ("gamma", "h", R.norm_weight(N, gen, device=device))]
    check_op("gemm_residual_rms", kernels.gemm_residual_rms, residual_rms, specs,
             ["out", "out_scaled", "sumsq_partials"], gen)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_rms_scale(device):
    gen = R.generator(SEED, 102)
    specs = [("a", "h", act(gen, device, M, K)), ("w", "h", R.weight(N, K, gen, device=device)),
             ("sumsq_partials", "s", sumsq_partials(gen, device)), ("eps", "c", EPS)]
    check_op("gemm_rms_scale", kernels.gemm_rms_scale, rms_scale, specs, ["out", "rstd"], gen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_gemm_rms_gated(device, activation):
    gen = R.generator(SEED, 103 if activation == "swiglu" else 104)
    specs = [("a", "h", act(gen, device, M, K)),
             ("w", "h", R.weight(2 * F_, K, gen, device=device)),
             ("sumsq_partials", "s", sumsq_partials(gen, device)), ("eps", "c", EPS)]
    op = kernels.gemm_rms_swiglu if activation == "swiglu" else kernels.gemm_rms_geglu
    fn = gated(F.silu if activation == "swiglu" else F.gelu)
    check_op("gemm_rms_" + activation, op, fn, specs, ["preact", "act", "rstd"], gen)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_rms_rope(device):
    gen = R.generator(SEED, 105)
    positions, inv_freq = rope_tables(device)
    specs = [("a", "h", act(gen, device, M, K)), ("w", "h", R.weight(QKV, K, gen, device=device)),
             ("sumsq_partials", "s", sumsq_partials(gen, device)),
             ("positions", "i", positions), ("inv_freq", "i", inv_freq), ("eps", "c", EPS)]

    def op(a, w, partials, positions, inv_freq, eps):
        return kernels.gemm_rms_rope(a, w, partials, positions, inv_freq, H, KV, HD, eps)

    check_op("gemm_rms_rope", op, rms_rope, specs, ["out", "rstd"], gen)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_rms_lse(device):
    gen = R.generator(SEED, 106)
    specs = [("a", "h", act(gen, device, M, K)), ("w", "h", R.weight(V, K, gen, device=device)),
             ("sumsq_partials", "s", sumsq_partials(gen, device)),
             ("targets", "i", targets_of(gen, device)), ("eps", "c", EPS)]
    got, _ = check_op("gemm_rms_lse", kernels.gemm_rms_lse, rms_lse, specs,
                      ["logits", "lse_partials", "target_logit", "rstd"], gen)
    assert got[1].shape == (M, (V + STAGED - 1) // STAGED)
    assert torch.count_nonzero(got[2][1::4]) == 0  # ignored rows (target -100): 0


@pytest.mark.parametrize("device", DEVICES)
def test_rms_stats(device):
    gen = R.generator(SEED, 107)
    specs = [("x", "h", act(gen, device, M, N)),
             ("gamma", "h", R.norm_weight(N, gen, device=device))]
    check_op("rms_stats", kernels.rms_stats, rms_stats, specs, ["out_scaled", "sumsq_partials"],
             gen)


@pytest.mark.parametrize("device", DEVICES)
def test_rstd_from_partials(device):
    gen = R.generator(SEED, 108)
    n = 128 * 3 - 40  # the RMSNorm width behind 3 partials

    def fn(P, partials):
        return (torch.rsqrt(partials.sum(1) / n + EPS),)

    specs = [("partials", "s", f32(gen, device, M, 3, lo=10.0, hi=50.0))]
    check_op("rstd_from_partials", lambda p: kernels.rstd_from_partials(p, n, EPS), fn, specs,
             ["rstd"], gen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_tensor", [False, True])
def test_reduce_row_partials(device, scale_tensor):
    gen = R.generator(SEED, 109 + scale_tensor)
    specs = [("partials", "s", f32(gen, device, M, 3))]
    if scale_tensor:  # 1 / 384 = 0.5 * [1 / 192], read on the device
        specs.append(("scale", "s", torch.full((1,), 1 / 192, device=device)))

    def fn(P, partials, *scale):
        return ((0.5 * scale[0] if scale else 1 / 384) * partials.sum(1),)

    def op(partials, *scale):
        return kernels.reduce_row_partials(partials, scale[0] * 0.5 if scale else 1 / 384)

    check_op("reduce_row_partials", op, fn, specs, ["out"], gen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, DTYPE])
@pytest.mark.parametrize("accumulate", [False, True])
def test_reduce_col_partials(device, out_dtype, accumulate):
    gen = R.generator(SEED, 111 + 2 * accumulate + (out_dtype == DTYPE))
    kind = "h" if out_dtype == DTYPE else "s"
    specs = [("partials", "s", f32(gen, device, N, 2))]
    if accumulate:
        specs.append(("out_in", kind, R.uniform((N,), -1, 1, gen, dtype=out_dtype,
                                                device=device)))

    def fn(P, partials, *out_in):  # reference/kernels.cpp: r(out_in + r(sum)) or r(sum)
        rnd = P.rnd if kind == "h" else (lambda t: t)
        total = rnd(partials.sum(1))
        return (rnd(out_in[0] + total) if out_in else total,)

    def op(partials, *out_in):
        return kernels.reduce_col_partials(partials, out_in[0] if out_in else None, out_dtype)

    check_op("reduce_col_partials", op, fn, specs, ["out"], gen)


# ---------------------------------------------------------------------------------------------
# The backward kernels (no autograd)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("alpha_tensor", [False, True])
def test_gemm_rms_backward(device, accumulate, alpha_tensor):
    gen = R.generator(SEED, 115 + 2 * accumulate + alpha_tensor)
    x = act(gen, device, M, N)
    specs = [("dz", "h", act(gen, device, M, F_)), ("w", "h", R.weight(F_, N, gen, device=device)),
             ("x", "h", x), ("rstd", "s", rms_of(x)),
             ("zeta", "s", f32(gen, device, M, lo=-0.5, hi=0.5)),
             ("gamma", "h", R.norm_weight(N, gen, device=device))]
    if accumulate:
        specs.append(("dx_in", "h", act(gen, device, M, N)))
    # alpha = 0.46875, as a number or as a [1] tensor read on the device (dloss, e.g.)
    alpha = torch.full((1,), 0.46875, device=device) if alpha_tensor else 0.46875

    def op(dz, w, x, rstd, zeta, gamma, *dx_in):
        return kernels.gemm_rms_backward(dz, w, x, rstd, zeta, gamma, alpha,
                                         dx_in[0] if dx_in else None)

    got, _ = check_op("gemm_rms_backward", op, rms_backward(0.46875, accumulate), specs,
                      ["dx", "h_hat", "dgamma_partials"], gen, grad=False)
    assert got[2].shape == (N, 2)


def ulp(t):
    """The spacing of DTYPE at |t| (normal numbers), as tests/common ulp_of."""
    bits = {torch.bfloat16: 8, torch.float16: 11}[DTYPE]
    _, exponent = torch.frexp(t.abs().clamp(min=1e-30))
    return torch.ldexp(torch.ones_like(t), exponent - bits)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_swiglu_backward(device):
    gen = R.generator(SEED, 119)
    specs = [("dx", "h", act(gen, device, M, K)), ("w", "h", R.weight(K, F_, gen, device=device)),
             ("preact", "h", act(gen, device, M, 2 * F_, lo=-4.0, hi=4.0))]
    got, ref = check_op("gemm_swiglu_backward", kernels.gemm_swiglu_backward, swiglu_backward,
                        specs, ["act", "dpreact", "zeta_partials"], gen, grad=False,
                        skip=("zeta_partials",))
    # K7 rounds dy = dx . w to the 16-bit type first, and a zeta partial moves with it:
    # within sum_j |d(g dg + u du)/d dy| ulp(dy) / 2 (plus the fp32 sums), as
    # tests/common/kernel_fixtures.cpp's zeta_dy_rounding bounds it; twice the unfused path's
    # error is no bound where its own roundings cancel.
    dx, w, preact = (t.double() for _, _, t in specs)
    dy = dx @ w
    g, u = preact[:, 0::2], preact[:, 1::2]
    sig = torch.sigmoid(g)
    sensitivity = (g * u * sig * (1 + g * (1 - sig)) + u * g * sig).abs()
    bound = (1.02 * block_sum(sensitivity * ulp(dy) / 2, STAGED)
             + 1e-5 * block_sum(sensitivity * dy.abs(), STAGED) + 1e-6)
    excess = (got[2].double() - ref[2]).abs() - bound
    assert excess.max().item() <= 0, "zeta_partials beyond the dy rounding bound by %.3e %s" % (
        excess.max().item(), ctx("gemm_swiglu_backward"))


@pytest.mark.parametrize("device", DEVICES)
def test_rope_backward(device):
    gen = R.generator(SEED, 120)
    positions, inv_freq = rope_tables(device)
    specs = [("dqkv", "h", act(gen, device, M, QKV)), ("qkv", "h", act(gen, device, M, QKV)),
             ("positions", "i", positions), ("inv_freq", "i", inv_freq)]

    def op(dqkv, qkv, positions, inv_freq):
        return kernels.rope_backward(dqkv, qkv, positions, inv_freq, H, KV, HD, 1 / 256)

    check_op("rope_backward", op, rope_backward(1 / 256), specs, ["dz", "zeta"], gen, grad=False)


def ce_inputs(gen, device):
    """K5-style inputs (tests/common make_cross_entropy_inputs): logits the rounded values of an
    fp64 L in [-4, 4), lse_partials and target_logit the f32 statistics of L itself."""
    logits = R.uniform((M, V), -4, 4, gen, dtype=torch.float64)
    targets = targets_of(gen, "cpu")
    valid = targets != IGNORE
    target_logit = logits.gather(1, (targets * valid).long()[:, None])[:, 0] * valid
    return [("logits", "h", logits.to(DTYPE).to(device)),
            ("lse_partials", "s", block_logsumexp(logits, STAGED).float().to(device)),
            ("target_logit", "s", target_logit.float().to(device)),
            ("targets", "i", targets.to(device))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(device, reduction):
    gen = R.generator(SEED, 121 if reduction == "mean" else 122)
    specs = ce_inputs(gen, device)

    def op(logits, lse_partials, target_logit, targets):
        loss, *rest = kernels.cross_entropy(logits, lse_partials, target_logit, targets, IGNORE,
                                            reduction)
        assert loss.shape == ()
        return (loss.reshape(1), *rest)

    got, ref = check_op("cross_entropy", op, cross_entropy(reduction), specs,
                        ["loss", "dlogits", "grad_scale", "zeta"], gen, grad=False,
                        skip=("zeta",))
    # zeta = sum_n l dl is an fp32 sum of V products on every path: its rounding floor,
    # sqrt(V) u sum |l dl| (u = 2^-24), is above the rule's 1e-6 (test_kernels_backward.cpp).
    logits = specs[0][2].double()
    floor = max(1e-6, math.sqrt(V) * 2.0 ** -24 * (logits * ref[1]).abs().sum(1).max().item())
    base_zeta = evaluate(LOWP, cross_entropy(reduction), specs)[0][3]
    R.check_rule("zeta", got[3], ref[3], base_zeta, ctx("cross_entropy"), atol=floor)

    # The loss's gradient (through lse_partials and target_logit), against the fp64 and the fp32
    # evaluations of the same loss.
    ls, tl = (specs[i][2].detach().clone().requires_grad_() for i in (1, 2))
    loss, _, grad_scale, _ = kernels.cross_entropy(specs[0][2], ls, tl, specs[3][2], IGNORE,
                                                   reduction)
    dloss = 0.7
    grads = torch.autograd.grad(loss * dloss, (ls, tl))

    def loss_grads(dtype):
        ls_, tl_ = (specs[i][2].detach().to(dtype).requires_grad_() for i in (1, 2))
        value, _ = ce_loss(ls_, tl_, specs[3][2], reduction)
        return torch.autograd.grad(value * dloss, (ls_, tl_))

    for name, g, r, b in zip(["d lse_partials", "d target_logit"], grads,
                             loss_grads(torch.float64), loss_grads(torch.float32)):
        R.check_rule(name, g, r, b, ctx("cross_entropy backward"))


# ---------------------------------------------------------------------------------------------
# A chain: rms_stats -> gemm_rms_lse -> cross_entropy is RMSNorm -> LM head -> cross-entropy,
# and its gradients (through the ops' autograd) are the textbook ones.


@pytest.mark.parametrize("device", DEVICES)
def test_final_norm_lm_head_loss_chain(device):
    gen = R.generator(SEED, 123)
    x, gamma = act(gen, device, M, K), R.norm_weight(K, gen, device=device)
    w = R.weight(V, K, gen, device=device)
    targets = targets_of(gen, device)
    lx, lg, lw = (t.detach().clone().requires_grad_() for t in (x, gamma, w))
    h, partials = kernels.rms_stats(lx, lg)
    logits, lse_partials, target_logit, _ = kernels.gemm_rms_lse(h, lw, partials, targets, EPS)
    loss, _, _, _ = kernels.cross_entropy(logits, lse_partials, target_logit, targets, IGNORE)
    grads = torch.autograd.grad(loss, (lx, lg, lw))

    def run(dtype):
        ls = [t.detach().to(dtype).requires_grad_() for t in (x, gamma, w)]
        out = R.rms_norm(ls[0], ls[1], EPS) @ ls[2].t()
        value = R.cross_entropy(out, targets, IGNORE)
        return out, value, torch.autograd.grad(value, ls)

    r_logits, r_loss, ref_grads = run(torch.float32)
    b_logits, b_loss, base_grads = run(DTYPE)
    R.check_loss("loss", loss, R.token_losses(r_logits, targets, IGNORE),
                 R.token_losses(b_logits, targets, IGNORE), targets, IGNORE, "mean",
                 ctx("chain"))
    for name, g, r, b in zip(["dx", "d gamma", "d w"], grads, ref_grads, base_grads):
        R.check_rule(name, g, r, b, ctx("chain"))


# ---------------------------------------------------------------------------------------------
# Errors are coda's (ValueError / TypeError / NotImplementedError subclasses of coda.Error).


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    gen = R.generator(SEED, 124)
    a, w = act(gen, device, M, K), R.weight(N, K, gen, device=device)
    partials = sumsq_partials(gen, device)
    with pytest.raises(TypeError) as e:  # bf16 statistics
        kernels.gemm_rms_scale(a, w, partials.to(DTYPE))
    assert "sumsq_partials" in str(e.value)
    with pytest.raises(ValueError) as e:  # a 1-D input: coda names its rank
        kernels.gemm_rms_scale(a[0], w, partials)
    assert "a must be a 2-D tensor" in str(e.value)
    with pytest.raises(ValueError):  # residual of another width
        kernels.gemm_residual_rms(a, w, act(gen, device, M, N - 8), R.norm_weight(N, gen,
                                                                                   device=device))
    with pytest.raises(NotImplementedError):  # F = 12: not a multiple of 8
        kernels.gemm_swiglu_backward(act(gen, device, M, K), R.weight(K, 16, gen,
                                                                       device=device)[:, :12],
                                     act(gen, device, M, 24))
    positions, inv_freq = rope_tables(device)
    with pytest.raises(ValueError):  # w for 2 heads less than the RoPE spec
        kernels.gemm_rms_rope(a, R.weight(QKV - 2 * HD, K, gen, device=device), partials,
                              positions, inv_freq, H, KV, HD)


# ---------------------------------------------------------------------------------------------
# The eager bypass runs the same implementation and backward: bitwise the same.


@pytest.mark.parametrize("device", DEVICES)
def test_eager_bypass_is_bitwise_equal(device):
    if not ops.HAS_CUSTOM_OPS:
        pytest.skip("torch without custom ops always runs the bypass")
    gen = R.generator(SEED, 125)
    a, w = act(gen, device, M, K), R.weight(2 * F_, K, gen, device=device)
    partials = sumsq_partials(gen, device)
    d_act = act(gen, device, M, F_)

    def run():
        la, lw, lp = (t.detach().clone().requires_grad_() for t in (a, w, partials))
        preact, out, rstd = kernels.gemm_rms_swiglu(la, lw, lp, EPS)
        return [preact, out, rstd, *torch.autograd.grad(out, (la, lw, lp), d_act)]

    R.expect_bypass_bitwise_equal(ops, run)


# ---------------------------------------------------------------------------------------------
# torch.library.opcheck: schema, autograd registration, fake tensors, AOT dispatch with dynamic
# shapes (which runs the backward formulas too). Small shapes, ragged M.

OM, OK, ON, OF, OV = 24, 128, 72, 40, 72
coda_ops = torch.ops.coda
needs_custom_ops = pytest.mark.skipif(not ops.HAS_CUSTOM_OPS,
                                      reason="torch.library.custom_op needs torch >= 2.4")


def opcheck(op, args):
    torch.library.opcheck(op, args)


def small(gen, device, *shape, grad=True, dtype=DTYPE, lo=-1.0, hi=1.0):
    return R.uniform(shape, lo, hi, gen, dtype=dtype, device=device).requires_grad_(grad)


def small_partials(gen, device, width=OK, grad=True):
    x = R.uniform((OM, width), -1, 1, gen, dtype=torch.float64)
    return block_sum(x * x, BLOCK).float().to(device).requires_grad_(grad)


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward_kernels(device):
    gen = R.generator(SEED, 131)
    a, p = small(gen, device, OM, OK), small_partials(gen, device)
    opcheck(coda_ops.gemm_residual_rms.default,
            (small(gen, device, OM, OF), small(gen, device, ON, OF), small(gen, device, OM, ON),
             small(gen, device, ON, lo=0.5, hi=1.5)))
    opcheck(coda_ops.gemm_rms_scale.default, (a, small(gen, device, ON, OK), p, EPS))
    opcheck(coda_ops.gemm_rms_swiglu.default, (a, small(gen, device, 2 * OF, OK), p, EPS))
    opcheck(coda_ops.gemm_rms_geglu.default, (a, small(gen, device, 2 * OF, OK), p, EPS))
    positions = torch.randint(0, 512, (OM,), generator=gen).to(device=device, dtype=torch.int32)
    inv_freq = (10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)).float()
    opcheck(coda_ops.gemm_rms_rope.default,
            (a, small(gen, device, QKV, OK), p, positions, inv_freq.to(device), H, KV, HD, EPS))
    targets = torch.randint(0, OV, (OM,), generator=gen).to(device=device, dtype=torch.int32)
    targets[::5] = IGNORE
    opcheck(coda_ops.gemm_rms_lse.default, (a, small(gen, device, OV, OK), p, targets, EPS))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_auxiliary_kernels(device):
    gen = R.generator(SEED, 132)
    opcheck(coda_ops.rms_stats.default,
            (small(gen, device, OM, ON), small(gen, device, ON, lo=0.5, hi=1.5)))
    p = small(gen, device, OM, 3, dtype=torch.float32, lo=10.0, hi=50.0)
    opcheck(coda_ops.rstd_from_partials.default, (p, 344, EPS))
    q = small(gen, device, OM, 3, dtype=torch.float32)
    opcheck(coda_ops.reduce_row_partials.default, (q, 0.25, None))
    opcheck(coda_ops.reduce_row_partials.default,
            (q, 0.5, torch.full((1,), 0.25, device=device, requires_grad=True)))
    c = small(gen, device, ON, 2, dtype=torch.float32)
    opcheck(coda_ops.reduce_col_partials.default, (c, None, None))
    opcheck(coda_ops.reduce_col_partials.default, (c, small(gen, device, ON), None))
    opcheck(coda_ops.reduce_col_partials.default, (c, None, torch.float16))
    logits = small(gen, device, OM, OV, grad=False, lo=-4.0, hi=4.0)
    targets = torch.randint(0, OV, (OM,), generator=gen).to(device=device, dtype=torch.int32)
    targets[1::4] = IGNORE
    lse = block_logsumexp(logits.double(), STAGED).float().requires_grad_()
    valid = targets != IGNORE
    tl = (logits.float().gather(1, (targets * valid).long()[:, None])[:, 0] * valid)
    for reduction in (0, 1):
        opcheck(coda_ops.cross_entropy.default,
                (logits, lse, tl.detach().requires_grad_(), targets, IGNORE, reduction))


@needs_custom_ops
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_kernels(device):
    gen = R.generator(SEED, 133)
    x = small(gen, device, OM, ON, grad=False)
    rstd, zeta = rms_of(x).to(device), small(gen, device, OM, grad=False, dtype=torch.float32)
    gamma = small(gen, device, ON, grad=False, lo=0.5, hi=1.5)
    dz, w = small(gen, device, OM, OF, grad=False), small(gen, device, OF, ON, grad=False)
    opcheck(coda_ops.gemm_rms_backward.default, (dz, w, x, rstd, zeta, gamma, 0.5, None, None))
    opcheck(coda_ops.gemm_rms_backward.default,
            (dz, w, x, rstd, zeta, gamma, 2.0, torch.full((1,), 0.25, device=device),
             small(gen, device, OM, ON, grad=False)))
    opcheck(coda_ops.gemm_swiglu_backward.default,
            (small(gen, device, OM, OK, grad=False), small(gen, device, OK, OF, grad=False),
             small(gen, device, OM, 2 * OF, grad=False, lo=-4.0, hi=4.0)))
    positions = torch.randint(0, 512, (OM,), generator=gen).to(device=device, dtype=torch.int32)
    inv_freq = (10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)).float()
    opcheck(coda_ops.rope_backward.default,
            (small(gen, device, OM, QKV, grad=False), small(gen, device, OM, QKV, grad=False),
             positions, inv_freq.to(device), H, KV, HD, 1 / 256))
