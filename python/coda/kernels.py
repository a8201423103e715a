"""The named CODA kernels and the auxiliary kernels of the C ABI (``include/coda/coda.h``) as
torch custom ops (namespace ``coda``), to compose a block of one's own.

Each op ``coda::name`` makes one call of the C entry point ``coda_name`` (the C++ ``coda::name``,
whose math ``include/coda/kernels/args.hpp`` gives) on ``torch.cuda.current_stream()`` of its
tensors' device, or synchronously on the CPU backend for CPU tensors, with outputs allocated by
torch; its fake (meta) implementation gives the outputs' exact shapes and dtypes, so
``torch.compile`` traces it. Bad arguments raise coda's own errors (``coda.Error`` subclasses of
ValueError, TypeError, NotImplementedError) before anything is written.

========================  ==========================================  ==========================
op                        outputs                                     autograd
========================  ==========================================  ==========================
``gemm_residual_rms``     out, out_scaled, sumsq_partials             yes (K0)
``gemm_rms_scale``        out, rstd                                   yes (K1)
``gemm_rms_swiglu``       preact, act, rstd                           yes (K2)
``gemm_rms_geglu``        preact, act, rstd                           yes (K2g)
``gemm_rms_rope``         out, rstd                                   yes (K4)
``gemm_rms_lse``          logits, lse_partials, target_logit, rstd    yes (K5)
``gemm_rms_backward``     dx, h_hat, dgamma_partials                  no (K6, a backward)
``gemm_swiglu_backward``  act, dpreact, zeta_partials                 no (K7, a backward)
``rms_stats``             out_scaled, sumsq_partials                  yes
``rstd_from_partials``    rstd                                        yes
``reduce_row_partials``   out                                         yes
``reduce_col_partials``   out                                         yes
``rope_backward``         dz, zeta                                    no (a backward)
``cross_entropy``         loss, dlogits, grad_scale, zeta             the loss only
========================  ==========================================  ==========================

Every op is functional: what the C ABI may write in place (K0's ``out`` over ``residual``,
K6's ``dx +=``, ``reduce_col_partials``' ``out +=``, ``rope_backward``'s ``dz`` over ``dqkv``,
``cross_entropy``'s ``dlogits`` over ``logits``) is a new tensor here; the ``+=`` forms take the
tensor to add to (``dx_in``, ``out_in``) and return the sum.

Autograd: the forward ops' backward formulas are the exact derivatives of args.hpp's formulas
(each rounding taken as the identity, as autograd does for any 16-bit op), computed with coda's
GEMM (``coda.ops.gemm``), ``rope_backward`` and plain torch, so a chain of these ops
differentiates as its unfused textbook counterpart does (e.g. ``rms_stats`` then
``gemm_rms_lse`` then ``cross_entropy``: the RMSNorm, LM head and loss gradients). Statistics
(partials, rstd) are differentiable too: that is how the RMSNorm's gradient reaches x. The
backward kernels (``gemm_rms_backward``, ``gemm_swiglu_backward``, ``rope_backward``) have no
autograd: their outputs are gradients already (no double backward). ``cross_entropy``'s loss is
differentiable in what it reads, ``lse_partials`` and ``target_logit`` (``logits`` only feed
``dlogits`` and ``zeta``); its other outputs carry no gradient.

The functions at the bottom are the Python-friendly entry points (keyword defaults; positions
and targets converted to i32; a number or a [1] f32 device tensor for alpha and scale). Only
16-bit operands: the FP8 (E4M3) forms of K2, K2g and K4 (``a_scales``, ``w_scales``) are not
exposed here.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib as L
from . import _torch as T
from .ops import _define, _f32, _grads_only, _like, _needs_input_grad, _run, gemm

__all__ = [
    "gemm_residual_rms",
    "gemm_rms_scale",
    "gemm_rms_swiglu",
    "gemm_rms_geglu",
    "gemm_rms_rope",
    "gemm_rms_lse",
    "gemm_rms_backward",
    "gemm_swiglu_backward",
    "rms_stats",
    "rstd_from_partials",
    "reduce_row_partials",
    "reduce_col_partials",
    "rope_backward",
    "cross_entropy",
]

REDUCE_BLOCK = L.REDUCE_BLOCK  # columns (rows, for column partials) per partial
STAGED_REDUCE_BLOCK = L.STAGED_REDUCE_BLOCK  # per lse (K5) and zeta (K7) partial
_REDUCTIONS = {"mean": L.LOSS_MEAN, "sum": L.LOSS_SUM}

# ---------------------------------------------------------------------------------------------
# Helpers


def _size(t, dim):
    """t.shape[dim], or 1 where t has no such dimension: outputs can then be allocated for any
    input, and coda's validation names a wrong rank (instead of an IndexError here)."""
    return t.shape[dim] if t.dim() > dim else 1


def _blocks(n, block):
    return (n + block - 1) // block


def _launch(fn, args, like):
    """One C call on like's device and current stream."""
    with T.device_guard(like.device):
        fn(args, T.stream(like))


def _rope_spec(positions, inv_freq, n_heads, n_kv_heads, head_dim):
    return L.RopeSpec(
        positions=T.view(positions, "rope.positions"),
        inv_freq=T.view(inv_freq, "rope.inv_freq"),
        n_q_heads=int(n_heads),
        n_kv_heads=int(n_kv_heads),
        head_dim=int(head_dim),
    )


def _add(total, term):
    """total + term where either may be None (no gradient)."""
    if term is None:
        return total
    return term if total is None else total + term


def _per_column(partials, block, n):
    """Row partials [M, P] spread to the [M, n] columns each reduces (block columns apiece)."""
    return partials.repeat_interleave(block, dim=1)[:, :n]


def _per_partial(ds, p):
    """d/d partials [M, p] of a function of each row's sum: the row's gradient in every column."""
    return ds[:, None].expand(-1, p).contiguous()


def _rstd_slope(rstd, n):
    """d rstd / d S for rstd = (S / n + eps)^(-1/2), S a row's sum of squares: -rstd^3 / (2 n)."""
    return -0.5 * rstd * rstd * rstd / n


def _normed_backward(ctx, dz, d_rstd, a, w, rstd):
    """The gradients (a, w, sumsq_partials) of z = rstd[m] (a . w^T) and of rstd = rsqrt(S / K +
    eps), S = sum_b partials[m, b] (K1, K2, K2g, K4, K5), from dz [M, N] (or None) and d_rstd
    [M] (or None):
        da = rstd dz . w            dw = (rstd dz)^T a
        dS = d rstd/dS (sum_n dz[m, n] acc[m, n] + d_rstd),  sum_n dz acc = sum_k (dz . w) a
    (acc = a . w^T never stored: the second sum reads the GEMM's own operands). dz enters the
    GEMMs in a's 16-bit type, as an unfused backward stores it."""
    needs = _needs_input_grad(ctx)
    da = dw = ds = None
    if dz is not None:
        r = rstd[:, None]
        if needs[0] or needs[2]:
            g = gemm(dz.to(a.dtype).contiguous(), w, "dgrad", out_dtype=torch.float32)  # dz . w
            if needs[0]:
                da = (g * r).to(a.dtype)
            if needs[2]:
                ds = (g * a.float()).sum(1)
        if needs[1]:
            dw = gemm((dz.float() * r).to(a.dtype), a, "wgrad")
    if needs[2]:
        ds = _add(ds, None if d_rstd is None else d_rstd.float())
    dp = None if ds is None else _per_partial(ds * _rstd_slope(rstd, ctx.k), ctx.p)
    return da, dw, dp


def _save_normed(ctx, a, w, sumsq_partials, rstd, *more):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, w, rstd, *more)
    ctx.k, ctx.p = a.shape[1], sumsq_partials.shape[1]


def _sumsq_backward(x, d_scaled, gamma, d_partials):
    """The gradients (x, gamma) of out_scaled = x * gamma and sumsq_partials = the row partials
    of x^2 (rms_stats, and K0 with x its output): dx = d_scaled gamma + 2 x d_partials, in fp32;
    dgamma = sum_m d_scaled x."""
    xf = x.float()
    dx = None if d_scaled is None else d_scaled.float() * gamma.float()
    if d_partials is not None:
        dx = _add(dx, 2 * xf * _per_column(d_partials.float(), REDUCE_BLOCK, x.shape[1]))
    dgamma = None if d_scaled is None else (d_scaled.float() * xf).sum(0).to(gamma.dtype)
    return dx, dgamma


# ---------------------------------------------------------------------------------------------
# K0 gemm_residual_rms: out = a . w^T + residual, out_scaled = out * gamma, row partials of out^2


def _residual_rms_fake(a, w, residual, gamma):
    m, n = _size(a, 0), _size(w, 0)
    return (a.new_empty((m, n)), a.new_empty((m, n)),
            a.new_empty((m, _blocks(n, REDUCE_BLOCK)), dtype=torch.float32))


def _residual_rms_impl(
    a: Tensor, w: Tensor, residual: Tensor, gamma: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    out, out_scaled, partials = _residual_rms_fake(a, w, residual, gamma)
    args = L.ResidualRmsArgs(
        a=T.view(a, "a"), w=T.view(w, "w"), residual=T.view(residual, "residual"),
        gamma=T.view(gamma, "gamma"), out=T.view(out, "out"),
        out_scaled=T.view(out_scaled, "out_scaled"),
        sumsq_partials=T.view(partials, "sumsq_partials"))
    _launch(L.gemm_residual_rms, args, a)
    return out, out_scaled, partials


def _residual_rms_setup(ctx, inputs, output):
    a, w, _, gamma = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, w, gamma, output[0])


def _residual_rms_backward(ctx, d_out, d_scaled, d_partials):
    a, w, gamma, x = ctx.saved_tensors
    needs = _needs_input_grad(ctx)
    dx, dgamma = _sumsq_backward(x, d_scaled, gamma, d_partials)
    dx = _add(dx, None if d_out is None else d_out.float())
    if dx is None:
        return None, None, None, None
    dx = dx.to(a.dtype)  # d out = d residual = d (a . w^T)
    da = gemm(dx, w, "dgrad") if needs[0] else None
    dw = gemm(dx, a, "wgrad") if needs[1] else None
    return da, dw, dx if needs[2] else None, dgamma if needs[3] else None


_K0 = _define("gemm_residual_rms", _residual_rms_impl, _residual_rms_fake, _residual_rms_setup,
              _residual_rms_backward)

# ---------------------------------------------------------------------------------------------
# K1 gemm_rms_scale: out = rstd[m] (a . w^T), rstd = rsqrt(sum_b sumsq_partials[m, b] / K + eps)


def _rms_scale_fake(a, w, sumsq_partials, eps):
    return a.new_empty((_size(a, 0), _size(w, 0))), _f32(a)


def _rms_scale_impl(a: Tensor, w: Tensor, sumsq_partials: Tensor,
                    eps: float) -> Tuple[Tensor, Tensor]:
    out, rstd = _rms_scale_fake(a, w, sumsq_partials, eps)
    args = L.RmsScaleArgs(
        a=T.view(a, "a"), w=T.view(w, "w"),
        sumsq_partials=T.view(sumsq_partials, "sumsq_partials"), eps=float(eps),
        out=T.view(out, "out"), rstd_out=T.view(rstd, "rstd_out"))
    _launch(L.gemm_rms_scale, args, a)
    return out, rstd


def _rms_scale_setup(ctx, inputs, output):
    a, w, sumsq_partials, _ = inputs
    _save_normed(ctx, a, w, sumsq_partials, output[1])


def _rms_scale_backward(ctx, d_out, d_rstd):
    a, w, rstd = ctx.saved_tensors
    return (*_normed_backward(ctx, d_out, d_rstd, a, w, rstd), None)


_K1 = _define("gemm_rms_scale", _rms_scale_impl, _rms_scale_fake, _rms_scale_setup,
              _rms_scale_backward)

# ---------------------------------------------------------------------------------------------
# K2, K2g gemm_rms_swiglu / gemm_rms_geglu: preact z = rstd[m] (a . w^T) [M, 2F] (w's gate and
# up rows interleaved), act[m, j] = act_fn(z[m, 2j]) z[m, 2j + 1] [M, F]


def _gated_fake(a, w, sumsq_partials, eps):
    m, n = _size(a, 0), _size(w, 0)
    return a.new_empty((m, n)), a.new_empty((m, n // 2)), _f32(a)


def _gated_call(fn, struct, a, w, sumsq_partials, eps):
    preact, act, rstd = _gated_fake(a, w, sumsq_partials, eps)
    args = struct(
        a=T.view(a, "a"), w=T.view(w, "w"),
        sumsq_partials=T.view(sumsq_partials, "sumsq_partials"), eps=float(eps),
        preact=T.view(preact, "preact"), act=T.view(act, "act"), rstd_out=T.view(rstd, "rstd_out"))
    _launch(fn, args, a)
    return preact, act, rstd


def _swiglu_impl(a: Tensor, w: Tensor, sumsq_partials: Tensor,
                 eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _gated_call(L.gemm_rms_swiglu, L.RmsSwigluArgs, a, w, sumsq_partials, eps)


def _geglu_impl(a: Tensor, w: Tensor, sumsq_partials: Tensor,
                eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    return _gated_call(L.gemm_rms_geglu, L.RmsGegluArgs, a, w, sumsq_partials, eps)


def _gated_setup(ctx, inputs, output):
    a, w, sumsq_partials, _ = inputs
    preact, _, rstd = output
    _save_normed(ctx, a, w, sumsq_partials, rstd, preact)


def _gated_dpreact(preact, d_act, gelu):
    """d act / d preact, interleaved as preact [M, 2F]: with g = z[:, 2j], u = z[:, 2j + 1]
    (from z as stored) and act = f(g) u,  dg = d_act u f'(g),  du = d_act f(g), where
    silu: f = g sig, f' = sig (1 + g (1 - sig))     (args.hpp's K7)
    gelu: f = g Phi(g), f' = Phi(g) + g phi(g)     (Phi, phi: the normal cdf and pdf)."""
    z = preact.float()
    g, u = z[:, 0::2], z[:, 1::2]
    if gelu:
        cdf = 0.5 * (1 + torch.erf(g * math.sqrt(0.5)))
        f, slope = g * cdf, cdf + g * torch.exp(-0.5 * g * g) / math.sqrt(2 * math.pi)
    else:
        sig = torch.sigmoid(g)
        f, slope = g * sig, sig * (1 + g * (1 - sig))
    d = d_act.float()
    return torch.stack((d * u * slope, d * f), dim=2).reshape(z.shape)


def _gated_backward(gelu):
    def backward(ctx, d_preact, d_act, d_rstd):
        a, w, rstd, preact = ctx.saved_tensors
        dz = None if d_act is None else _gated_dpreact(preact, d_act, gelu)
        dz = _add(dz, None if d_preact is None else d_preact.float())
        return (*_normed_backward(ctx, dz, d_rstd, a, w, rstd), None)

    return backward


_K2 = _define("gemm_rms_swiglu", _swiglu_impl, _gated_fake, _gated_setup, _gated_backward(False))
_K2G = _define("gemm_rms_geglu", _geglu_impl, _gated_fake, _gated_setup, _gated_backward(True))

# ---------------------------------------------------------------------------------------------
# K4 gemm_rms_rope: out = RoPE(rstd[m] (a . w^T)) on the Q and K heads of the fused QKV


def _rms_rope_fake(a, w, sumsq_partials, positions, inv_freq, n_heads, n_kv_heads, head_dim,
                   eps):
    return a.new_empty((_size(a, 0), _size(w, 0))), _f32(a)


def _rms_rope_impl(
    a: Tensor,
    w: Tensor,
    sumsq_partials: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
) -> Tuple[Tensor, Tensor]:
    out, rstd = _rms_rope_fake(a, w, sumsq_partials, positions, inv_freq, n_heads, n_kv_heads,
                               head_dim, eps)
    args = L.RmsRopeArgs(
        a=T.view(a, "a"), w=T.view(w, "w"),
        sumsq_partials=T.view(sumsq_partials, "sumsq_partials"), eps=float(eps),
        rope=_rope_spec(positions, inv_freq, n_heads, n_kv_heads, head_dim),
        out=T.view(out, "out"), rstd_out=T.view(rstd, "rstd_out"))
    _launch(L.gemm_rms_rope, args, a)
    return out, rstd


def _rms_rope_setup(ctx, inputs, output):
    a, w, sumsq_partials, positions, inv_freq, n_heads, n_kv_heads, head_dim, _ = inputs
    out, rstd = output
    _save_normed(ctx, a, w, sumsq_partials, rstd, out, positions, inv_freq)
    ctx.rope = (n_heads, n_kv_heads, head_dim)


def _rms_rope_backward(ctx, d_out, d_rstd):
    a, w, rstd, out, positions, inv_freq = ctx.saved_tensors
    dz = None
    if d_out is not None:  # RoPE is orthogonal: dz = RoPE^T(d_out), coda's rope_backward
        dz, _ = _run(_ROPE_BWD, d_out.to(out.dtype).contiguous(), out, positions, inv_freq,
                     *ctx.rope, 1.0)
    return (*_normed_backward(ctx, dz, d_rstd, a, w, rstd), None, None, None, None, None, None)


_K4 = _define("gemm_rms_rope", _rms_rope_impl, _rms_rope_fake, _rms_rope_setup,
              _rms_rope_backward)


# ---------------------------------------------------------------------------------------------
# K5 gemm_rms_lse: logits l = rstd[m] (a . w^T), the log-sum-exp of each 64-column block of the
# stored logits, and the target's stored logit


def _rms_lse_fake(a, w, sumsq_partials, targets, eps):
    m, v = _size(a, 0), _size(w, 0)
    return (a.new_empty((m, v)),
            a.new_empty((m, _blocks(v, STAGED_REDUCE_BLOCK)), dtype=torch.float32), _f32(a),
            _f32(a))


def _rms_lse_impl(a: Tensor, w: Tensor, sumsq_partials: Tensor, targets: Tensor,
                  eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    logits, lse_partials, target_logit, rstd = _rms_lse_fake(a, w, sumsq_partials, targets, eps)
    args = L.RmsLseArgs(
        a=T.view(a, "a"), w=T.view(w, "w"),
        sumsq_partials=T.view(sumsq_partials, "sumsq_partials"), eps=float(eps),
        targets=T.view(targets, "targets"), logits=T.view(logits, "logits"),
        lse_partials=T.view(lse_partials, "lse_partials"),
        target_logit=T.view(target_logit, "target_logit"), rstd_out=T.view(rstd, "rstd_out"))
    _launch(L.gemm_rms_lse, args, a)
    return logits, lse_partials, target_logit, rstd


def _rms_lse_setup(ctx, inputs, output):
    a, w, sumsq_partials, targets, _ = inputs
    logits, lse_partials, _, rstd = output
    _save_normed(ctx, a, w, sumsq_partials, rstd, logits, lse_partials, targets)


def _rms_lse_backward(ctx, d_logits, d_lse, d_target, d_rstd):
    """dl = d_logits + exp(l - lse_partials[m, b(n)]) d_lse[m, b(n)] (the softmax within each
    block) + d_target at (m, targets[m]) for targets in [0, V), then K5's normalized GEMM."""
    a, w, rstd, logits, lse_partials, targets = ctx.saved_tensors
    v = logits.shape[1]
    dl = None if d_logits is None else d_logits.float()
    if d_lse is not None:
        lse = _per_column(lse_partials, STAGED_REDUCE_BLOCK, v)
        dl = _add(dl, torch.exp(logits.float() - lse)
                  * _per_column(d_lse.float(), STAGED_REDUCE_BLOCK, v))
    if d_target is not None:
        valid = (targets >= 0) & (targets < v)
        base = logits.new_zeros(logits.shape, dtype=torch.float32) if dl is None else dl
        dl = base.scatter_add(1, (targets * valid).long()[:, None],
                              (d_target.float() * valid)[:, None])
    return (*_normed_backward(ctx, dl, d_rstd, a, w, rstd), None, None)


_K5 = _define("gemm_rms_lse", _rms_lse_impl, _rms_lse_fake, _rms_lse_setup, _rms_lse_backward)

# ---------------------------------------------------------------------------------------------
# K6 gemm_rms_backward: dx (+)= rstd (g gamma - x rstd zeta), g = alpha dz . w; h_hat; column
# partials of g x rstd


def _rms_backward_fake(dz, w, x, rstd, zeta, gamma, alpha, alpha_tensor, dx_in):
    n = _size(x, 1)
    return (_like(dx_in) if dx_in is not None else _like(x), _like(x),
            x.new_empty((n, _blocks(_size(x, 0), REDUCE_BLOCK)), dtype=torch.float32))


def _rms_backward_impl(
    dz: Tensor,
    w: Tensor,
    x: Tensor,
    rstd: Tensor,
    zeta: Tensor,
    gamma: Tensor,
    alpha: float,
    alpha_tensor: Optional[Tensor],
    dx_in: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    dx, h_hat, partials = _rms_backward_fake(dz, w, x, rstd, zeta, gamma, alpha, alpha_tensor,
                                             dx_in)
    if dx_in is not None:  # the accumulating form adds to a copy: the op never writes its inputs
        dx.copy_(dx_in)
    args = L.RmsBackwardArgs(
        dz=T.view(dz, "dz"), w=T.view(w, "w"), x=T.view(x, "x"), rstd=T.view(rstd, "rstd"),
        zeta=T.view(zeta, "zeta"), gamma=T.view(gamma, "gamma"),
        alpha=L.scalar(alpha, T.view(alpha_tensor, "alpha.tensor")),
        accumulate=0 if dx_in is None else 1, dx=T.view(dx, "dx"), h_hat=T.view(h_hat, "h_hat"),
        dgamma_partials=T.view(partials, "dgamma_partials"))
    _launch(L.gemm_rms_backward, args, dz)
    return dx, h_hat, partials


_K6 = _define("gemm_rms_backward", _rms_backward_impl, _rms_backward_fake)

# ---------------------------------------------------------------------------------------------
# K7 gemm_swiglu_backward: dy = dx . w, act (recomputed), dpreact, zeta partials over j


def _swiglu_backward_fake(dx, w, preact):
    m, f = _size(dx, 0), _size(w, 1)
    return (preact.new_empty((m, f)), _like(preact),
            preact.new_empty((m, _blocks(f, STAGED_REDUCE_BLOCK)), dtype=torch.float32))


def _swiglu_backward_impl(dx: Tensor, w: Tensor, preact: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    act, dpreact, partials = _swiglu_backward_fake(dx, w, preact)
    args = L.SwigluBackwardArgs(
        dx=T.view(dx, "dx"), w=T.view(w, "w"), preact=T.view(preact, "preact"),
        act=T.view(act, "act"), dpreact=T.view(dpreact, "dpreact"),
        zeta_partials=T.view(partials, "zeta_partials"))
    _launch(L.gemm_swiglu_backward, args, dx)
    return act, dpreact, partials


_K7 = _define("gemm_swiglu_backward", _swiglu_backward_impl, _swiglu_backward_fake)

# ---------------------------------------------------------------------------------------------
# rms_stats: out_scaled = x * gamma and the row partials of x^2 (the first layer's statistics)


def _rms_stats_fake(x, gamma):
    return _like(x), x.new_empty((_size(x, 0), _blocks(_size(x, 1), REDUCE_BLOCK)),
                                 dtype=torch.float32)


def _rms_stats_impl(x: Tensor, gamma: Tensor) -> Tuple[Tensor, Tensor]:
    out_scaled, partials = _rms_stats_fake(x, gamma)
    args = L.RmsStatsArgs(x=T.view(x, "x"), gamma=T.view(gamma, "gamma"),
                          out_scaled=T.view(out_scaled, "out_scaled"),
                          sumsq_partials=T.view(partials, "sumsq_partials"))
    _launch(L.rms_stats, args, x)
    return out_scaled, partials


def _rms_stats_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*inputs)


def _rms_stats_backward(ctx, d_scaled, d_partials):
    x, gamma = ctx.saved_tensors
    dx, dgamma = _sumsq_backward(x, d_scaled, gamma, d_partials)
    return None if dx is None else dx.to(x.dtype), dgamma


_STATS = _define("rms_stats", _rms_stats_impl, _rms_stats_fake, _rms_stats_setup,
                 _rms_stats_backward)

# ---------------------------------------------------------------------------------------------
# rstd_from_partials: rstd[m] = rsqrt(sum_b partials[m, b] / n + eps)


def _rstd_fake(partials, n, eps):
    return _f32(partials)


def _rstd_impl(partials: Tensor, n: int, eps: float) -> Tensor:
    rstd = _rstd_fake(partials, n, eps)
    args = L.RstdArgs(partials=T.view(partials, "partials"), n=int(n), eps=float(eps),
                      rstd=T.view(rstd, "rstd"))
    _launch(L.rstd_from_partials, args, partials)
    return rstd


def _rstd_setup(ctx, inputs, output):
    partials, n, _ = inputs
    ctx.save_for_backward(output)
    ctx.k, ctx.p = n, partials.shape[1]


def _rstd_backward(ctx, d_rstd):
    (rstd,) = ctx.saved_tensors
    return _per_partial(d_rstd * _rstd_slope(rstd, ctx.k), ctx.p), None, None


_RSTD = _define("rstd_from_partials", _rstd_impl, _rstd_fake, _rstd_setup, _rstd_backward)

# ---------------------------------------------------------------------------------------------
# reduce_row_partials: out[m] = scale sum_b partials[m, b], scale = scale (* scale_tensor[0])


def _row_reduce_fake(partials, scale, scale_tensor):
    return _f32(partials)


def _row_reduce_impl(partials: Tensor, scale: float, scale_tensor: Optional[Tensor]) -> Tensor:
    out = _row_reduce_fake(partials, scale, scale_tensor)
    args = L.RowReduceArgs(partials=T.view(partials, "partials"),
                           scale=L.scalar(scale, T.view(scale_tensor, "scale.tensor")),
                           out=T.view(out, "out"))
    _launch(L.reduce_row_partials, args, partials)
    return out


def _row_reduce_setup(ctx, inputs, output):
    partials, scale, scale_tensor = inputs
    ctx.save_for_backward(partials, scale_tensor)
    ctx.scale = scale


def _row_reduce_backward(ctx, d_out):
    partials, scale_tensor = ctx.saved_tensors
    needs = _needs_input_grad(ctx)
    d = d_out * ctx.scale
    dp = d_scale = None
    if needs[0]:
        s = d if scale_tensor is None else d * scale_tensor.reshape(1)
        dp = _per_partial(s, partials.shape[1])
    if scale_tensor is not None and needs[2]:
        d_scale = (d * partials.sum(1)).sum().reshape(scale_tensor.shape)
    return dp, None, d_scale


_ROW = _define("reduce_row_partials", _row_reduce_impl, _row_reduce_fake, _row_reduce_setup,
               _row_reduce_backward)

# ---------------------------------------------------------------------------------------------
# reduce_col_partials: out[n] = (out_in[n] +) sum_b partials[n, b]


def _col_reduce_dtype(out_in, out_dtype):
    if out_dtype is not None:
        return out_dtype
    return out_in.dtype if out_in is not None else torch.float32


def _col_reduce_fake(partials, out_in, out_dtype):
    dtype = _col_reduce_dtype(out_in, out_dtype)
    if out_in is not None:
        return out_in.new_empty(out_in.shape, dtype=dtype)
    return partials.new_empty((_size(partials, 0),), dtype=dtype)


def _col_reduce_impl(partials: Tensor, out_in: Optional[Tensor],
                     out_dtype: Optional[torch.dtype]) -> Tensor:
    out = _col_reduce_fake(partials, out_in, out_dtype)
    if out_in is not None:  # the accumulating form adds to a copy: the op never writes its inputs
        out.copy_(out_in)
    args = L.ColReduceArgs(partials=T.view(partials, "partials"),
                           accumulate=0 if out_in is None else 1, out=T.view(out, "out"))
    _launch(L.reduce_col_partials, args, partials)
    return out


def _col_reduce_setup(ctx, inputs, output):
    partials, out_in, _ = inputs
    ctx.p = partials.shape[1]
    ctx.in_dtype = None if out_in is None else out_in.dtype


def _col_reduce_backward(ctx, d_out):
    needs = _needs_input_grad(ctx)
    dp = _per_partial(d_out.float(), ctx.p) if needs[0] else None
    d_in = d_out.to(ctx.in_dtype) if ctx.in_dtype is not None and needs[1] else None
    return dp, d_in, None


_COL = _define("reduce_col_partials", _col_reduce_impl, _col_reduce_fake, _col_reduce_setup,
               _col_reduce_backward)

# ---------------------------------------------------------------------------------------------
# rope_backward: dz = RoPE^T(dqkv), zeta[m] = scale sum_n qkv[m, n] dqkv[m, n]


def _rope_backward_fake(dqkv, qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim, scale):
    return _like(dqkv), _f32(dqkv)


def _rope_backward_impl(
    dqkv: Tensor,
    qkv: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    scale: float,
) -> Tuple[Tensor, Tensor]:
    dz, zeta = _rope_backward_fake(dqkv, qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim,
                                   scale)
    args = L.RopeBackwardArgs(
        dqkv=T.view(dqkv, "dqkv"), qkv=T.view(qkv, "qkv"),
        rope=_rope_spec(positions, inv_freq, n_heads, n_kv_heads, head_dim), scale=float(scale),
        dz=T.view(dz, "dz"), zeta=T.view(zeta, "zeta"))
    _launch(L.rope_backward, args, dqkv)
    return dz, zeta


_ROPE_BWD = _define("rope_backward", _rope_backward_impl, _rope_backward_fake)

# ---------------------------------------------------------------------------------------------
# cross_entropy: the loss from K5's lse partials and target logits; dlogits = softmax - onehot
# (unscaled), grad_scale, zeta[m] = sum_n logits dlogits


def _cross_entropy_fake(logits, lse_partials, target_logit, targets, ignore_index, reduction):
    one = logits.new_empty((1,), dtype=torch.float32)
    return one, _like(logits), logits.new_empty((1,), dtype=torch.float32), _f32(logits)


_ce_workspace = {}


def _cross_entropy_workspace_bytes(m):
    n = _ce_workspace.get(m)
    if n is None:
        n = _ce_workspace[m] = L.cross_entropy_workspace_size(m)
    return n


def _cross_entropy_impl(
    logits: Tensor,
    lse_partials: Tensor,
    target_logit: Tensor,
    targets: Tensor,
    ignore_index: int,
    reduction: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    loss, dlogits, grad_scale, zeta = _cross_entropy_fake(logits, lse_partials, target_logit,
                                                          targets, ignore_index, reduction)
    nbytes = _cross_entropy_workspace_bytes(int(_size(logits, 0)))
    ws, ws_desc = T.workspace(nbytes, logits.device)  # ws keeps the buffer alive through the call
    args = L.CrossEntropyArgs(
        logits=T.view(logits, "logits"), lse_partials=T.view(lse_partials, "lse_partials"),
        target_logit=T.view(target_logit, "target_logit"), targets=T.view(targets, "targets"),
        ignore_index=int(ignore_index), reduction=int(reduction), loss=T.view(loss, "loss"),
        dlogits=T.view(dlogits, "dlogits"), grad_scale=T.view(grad_scale, "grad_scale"),
        zeta=T.view(zeta, "zeta"), workspace=ws_desc)
    _launch(L.cross_entropy, args, logits)
    return loss, dlogits, grad_scale, zeta


def _cross_entropy_setup(ctx, inputs, output):
    logits, lse_partials, _, targets, ignore_index, _ = inputs
    _, dlogits, grad_scale, zeta = output
    _grads_only(ctx, dlogits, grad_scale, zeta)
    ctx.save_for_backward(lse_partials, targets, grad_scale)
    ctx.ignore_index, ctx.v = ignore_index, logits.shape[1]


def _cross_entropy_backward(ctx, d_loss, *_other_grads):
    """loss = grad_scale sum over valid rows of (lse[m] - target_logit[m]), lse[m] =
    logsumexp_b lse_partials[m, b]; valid: targets[m] != ignore_index and in [0, V) (the GPU
    leaves other targets out, the CPU rejects them). Hence, with c[m] = d_loss grad_scale for a
    valid row and 0 otherwise: d lse_partials = c softmax_b(lse_partials), d target_logit = -c."""
    if d_loss is None:
        return (None,) * 6
    lse_partials, targets, grad_scale = ctx.saved_tensors
    needs = _needs_input_grad(ctx)
    valid = (targets != ctx.ignore_index) & (targets >= 0) & (targets < ctx.v)
    c = (d_loss.reshape(1).float() * grad_scale) * valid
    d_lse = c[:, None] * torch.softmax(lse_partials, dim=1) if needs[1] else None
    return None, d_lse, -c if needs[2] else None, None, None, None


_CE = _define("cross_entropy", _cross_entropy_impl, _cross_entropy_fake, _cross_entropy_setup,
              _cross_entropy_backward)

# ---------------------------------------------------------------------------------------------
# The functional API


def _ints(t, like):
    return t.reshape(-1).to(device=like.device, dtype=torch.int32)


def _scalar(value):
    """(number, optional [1] f32 tensor) of a coda_scalar from a number or a tensor."""
    if isinstance(value, Tensor):
        return 1.0, value.reshape(1).to(torch.float32)
    return float(value), None


def gemm_residual_rms(a, w, residual, gamma):
    """K0: (out, out_scaled, sumsq_partials) with out = a . w^T + residual [M, N] (the new
    residual stream), out_scaled = out * gamma [M, N] (the next normalized GEMM's input) and
    sumsq_partials [M, ceil(N / 128)] f32, the row partials of out^2 (from the unrounded sum).
    a [M, K], w [N, K], residual [M, N], gamma [N]: one 16-bit dtype; N, K multiples of 8."""
    return _run(_K0, a, w, residual, gamma)


def gemm_rms_scale(a, w, sumsq_partials, eps=1e-6):
    """K1: (out, rstd) with out = rstd[m] (a . w^T) [M, N], rstd = rsqrt(sum_b
    sumsq_partials[m, b] / K + eps) [M] f32. a [M, K] is the gamma-scaled un-normalized input
    (out_scaled of K0 or rms_stats), sumsq_partials [M, P >= 1] f32 the row partials of x^2."""
    return _run(_K1, a, w, sumsq_partials, float(eps))


def gemm_rms_swiglu(a, w, sumsq_partials, eps=1e-6):
    """K2: (preact, act, rstd) with preact z = rstd[m] (a . w^T) [M, 2F] and act[m, j] =
    silu(z[m, 2j]) z[m, 2j + 1] [M, F] from z as stored; w [2F, K] the fused gate/up weight,
    rows interleaved (coda.ops.interleave_gate_up)."""
    return _run(_K2, a, w, sumsq_partials, float(eps))


def gemm_rms_geglu(a, w, sumsq_partials, eps=1e-6):
    """K2g: K2 with gelu (the erf form, PyTorch's default) in place of silu."""
    return _run(_K2G, a, w, sumsq_partials, float(eps))


def gemm_rms_rope(a, w, sumsq_partials, positions, inv_freq, n_heads, n_kv_heads, head_dim,
                  eps=1e-6):
    """K4: (out, rstd) with out = RoPE(rstd[m] (a . w^T)) [M, (n_heads + 2 n_kv_heads)
    head_dim]: w the fused [Q; K; V] weight, RoPE (Hugging Face's rotate-half) on the Q and K
    heads at positions [M] (any integer dtype) with inv_freq [head_dim / 2] f32. On the GPU,
    head_dim 64 or 128."""
    return _run(_K4, a, w, sumsq_partials, _ints(positions, a),
                inv_freq.to(device=a.device, dtype=torch.float32), int(n_heads),
                int(n_kv_heads), int(head_dim), float(eps))


def gemm_rms_lse(a, w, sumsq_partials, targets, eps=1e-6):
    """K5: (logits, lse_partials, target_logit, rstd) with logits l = rstd[m] (a . w^T) [M, V],
    lse_partials [M, ceil(V / 64)] f32 the log-sum-exp of each 64-column block of the stored
    logits, target_logit [M] f32 the stored l[m, targets[m]] (0 for targets outside [0, V)).
    targets [M], any integer dtype. Feed them to cross_entropy."""
    return _run(_K5, a, w, sumsq_partials, _ints(targets, a), float(eps))


def gemm_rms_backward(dz, w, x, rstd, zeta, gamma, alpha=1.0, dx_in=None):
    """K6 (no autograd): (dx, h_hat, dgamma_partials), the RMSNorm backward in the input-gradient
    GEMM of its consumer: g = alpha dz . w (dz [M, K] the consumer's output gradient, w [K, N]
    its weight), dx = rstd (g gamma - x rstd zeta) [M, N] (+ dx_in when given), h_hat = x rstd
    gamma [M, N] (for the consumer's weight gradient), dgamma_partials [N, ceil(M / 128)] f32
    the column partials of g x rstd (reduce_col_partials gives dgamma). zeta [M] f32 comes from
    gemm_swiglu_backward (reduce_row_partials), rope_backward or cross_entropy. alpha: a number
    or a [1] f32 tensor on the device (e.g. dloss times grad_scale)."""
    value, tensor = _scalar(alpha)
    return _run(_K6, dz, w, x, rstd, zeta, gamma, value, tensor, dx_in)


def gemm_swiglu_backward(dx, w, preact):
    """K7 (no autograd): (act, dpreact, zeta_partials), the SwiGLU backward in the down
    projection's input-gradient GEMM: dy = dx . w (dx [M, K], w [K, F] the down weight), act
    recomputed from preact [M, 2F] (interleaved), dpreact [M, 2F] and zeta_partials
    [M, ceil(F / 64)] f32 the row partials of g dg + u du (reduce_row_partials with scale
    1 / hidden gives zeta)."""
    return _run(_K7, dx, w, preact)


def rms_stats(x, gamma):
    """The first layer's RMSNorm statistics: (out_scaled, sumsq_partials) with out_scaled = x *
    gamma [M, N] and sumsq_partials [M, ceil(N / 128)] f32 the row partials of x^2."""
    return _run(_STATS, x, gamma)


def rstd_from_partials(partials, n, eps=1e-6):
    """rstd[m] = rsqrt(sum_b partials[m, b] / n + eps) [M] f32 (n: the RMSNorm width)."""
    return _run(_RSTD, partials, int(n), float(eps))


def reduce_row_partials(partials, scale=1.0):
    """out[m] = scale sum_b partials[m, b] [M] f32; scale a number or a [1] f32 device tensor."""
    value, tensor = _scalar(scale)
    return _run(_ROW, partials, value, tensor)


def reduce_col_partials(partials, out_in=None, out_dtype=None):
    """out[n] = sum_b partials[n, b] [N] (+ out_in[n] when given), in out_dtype (f32, bf16 or
    f16; default out_in's dtype, else f32)."""
    return _run(_COL, partials, out_in, out_dtype)


def rope_backward(dqkv, qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim, scale=1.0):
    """(no autograd) (dz, zeta): dz = RoPE^T(dqkv) [M, (n_heads + 2 n_kv_heads) head_dim] (the
    rotation by -theta; V passes through), zeta[m] = scale sum_n qkv[m, n] dqkv[m, n] [M] f32
    from the saved post-RoPE qkv (scale = 1 / hidden for K6)."""
    return _run(_ROPE_BWD, dqkv, qkv, _ints(positions, dqkv),
                inv_freq.to(device=dqkv.device, dtype=torch.float32), int(n_heads),
                int(n_kv_heads), int(head_dim), float(scale))


def cross_entropy(logits, lse_partials, target_logit, targets, ignore_index=-100,
                  reduction="mean"):
    """The cross-entropy from K5's outputs: (loss, dlogits, grad_scale, zeta) with loss a 0-dim
    f32 tensor (the "mean" over rows whose target is not ignore_index, 0 when there are none, or
    the "sum"), dlogits = softmax(logits) - onehot(target) [M, V] (unscaled; 0 on ignored rows),
    grad_scale [1] f32 (1 / #valid or 1: d loss / d logits = grad_scale dlogits) and zeta[m] =
    sum_n logits dlogits [M] f32 (unscaled). The loss is differentiable (through lse_partials
    and target_logit); the GPU leaves a target outside [0, V) out like an ignored one, the CPU
    rejects it."""
    loss, dlogits, grad_scale, zeta = _run(_CE, logits, lse_partials, target_logit,
                                           _ints(targets, logits), int(ignore_index),
                                           _REDUCTIONS[reduction])
    return loss.reshape(()), dlogits, grad_scale, zeta
