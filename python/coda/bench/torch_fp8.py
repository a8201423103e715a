"""The plain-PyTorch FP8 side of the FP8 block comparison (``python -m coda.bench --fp8``):
the reference middle block (reference.py) with every linear in the recipe of torchao's float8
training, "tensorwise" (``torchao.float8``'s default, ``Float8LinearConfig()``), written out
in plain torch ops so that torch.compile traces it whole, as it traces torchao's:

  forward   Y  = X Wᵀ    X and W cast to E4M3, each with one fp32 scale per tensor,
                          s = 448 / max(amax, 1e-12), saturated; ``torch._scaled_mm(X8, W8ᵀ,
                          1/s_x, 1/s_w)``, bf16 out, fast accumulation (torchao's
                          ``gemm_config_output``)
  backward  dX = dY W    dY cast with its own per-tensor scale, W cast again; W's codes copied
                          transposed (``_scaled_mm``'s second operand is column-major)
            dW = dYᵀ X   dYᵀ's and X's codes copied transposed; neither gradient GEMM uses fast
                          accumulation (torchao's ``gemm_config_grad_input`` / ``_grad_weight``)

As torchao's ``matmul_with_hp_or_float8_args`` does, the forward saves the 16-bit X and W and
the backward casts them again (amax included), leaving torch.compile's partitioner to decide
what to keep. Under torch.compile the amaxes, scales, casts and transposed copies become a few
Triton kernels around cuBLAS's FP8 GEMMs, which is how torchao's float8 training is meant to
run (its README: "enable torch.compile to generate fused kernels for float8 scaling and
casting").

One deliberate difference: dY is cast to E4M3 by default, as coda's recipe casts every operand
(docs/fp8.md, "The format"); torchao's tensorwise default casts grad_output to E5M2
(``Float8LinearConfig.__post_init__``'s default dtypes), which ``grad_format="e5m2"``
(``--torch-fp8-grad e5m2``) reproduces. Both are one byte a value and cuBLAS's FP8 GEMM takes
either with E4M3, so the time should not depend on the choice (not measured); the gradients'
error does (E5M2 keeps 2 mantissa bits, E4M3 3).

Everything else (RMSNorm, SwiGLU, RoPE, the residuals, in bf16) is the reference's own code:
the FP8 block subclasses ReferenceMiddle, keeps its forward, and shares its Parameters and
RMSNorm modules, so both blocks hold the same weights and allocate nothing of their own.
Nothing here imports coda, and nothing here needs float8 dtypes until it runs (torch before 2.1
has none, and coda.bench must import there).
"""
import torch
from torch import nn

from .reference import MLP, ReferenceMiddle

# format -> (torch dtype attribute, largest finite value). E4M3 is torch.float8_e4m3fn (no
# infinities, 448), the format torchao and coda cast to.
FORMATS = {"e4m3": ("float8_e4m3fn", 448.0), "e5m2": ("float8_e5m2", 57344.0)}
# torchao's floor on amax (float8_utils.EPS): an all-zero tensor still gets a finite scale.
AMAX_EPS = 1e-12
# _scaled_mm (cuBLASLt) wants K and N multiples of 16 (16-byte rows of codes); dW = dYᵀ X
# reduces over the tokens, so they must be too.
ALIGN = 16


def unavailable(device="cuda"):
    """None when this torch can run the FP8 side on `device`, else why not (a sentence)."""
    if not all(hasattr(torch, FORMATS[f][0]) for f in FORMATS) or not hasattr(torch,
                                                                            "_scaled_mm"):
        return "torch %s has no float8 dtypes or no torch._scaled_mm" % torch.__version__
    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device"
        if torch.cuda.get_device_capability() < (8, 9):
            return "torch._scaled_mm's FP8 GEMM needs sm_89 or later; this GPU is sm_%d%d" % (
                torch.cuda.get_device_capability())
    return None


def _cast(t, fmt):
    """t (fp32, inside the format's range) in the FP8 format, rounded to nearest even."""
    return t.to(getattr(torch, FORMATS[fmt][0]))


def _quantize(t, fmt):
    """(codes, dequantization scale) of t with one scale for the whole tensor: s = fmax /
    amax(|t|) in fp32, codes = t s saturated to +-fmax (torchao's to_fp8_saturated: an eager
    cast does not saturate on every torch release), scale 1 / s for _scaled_mm."""
    fmax = FORMATS[fmt][1]
    s = fmax / torch.clamp(t.abs().max().float(), min=AMAX_EPS)
    return _cast((t.float() * s).clamp(-fmax, fmax), fmt), s.reciprocal()


def _mm(a, b, scale_a, scale_b, out_dtype, fast_accum):
    """(a scale_a)(b scale_b): a [M, K] row-major, b [K, N] column-major (the only FP8 layout
    cuBLASLt has, which _scaled_mm checks), fp32 0-dim scales, out_dtype out."""
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                            use_fast_accum=fast_accum)


def _forward(x, w):
    """Y = X Wᵀ: x [M, K] row-major, w [N, K] row-major, which as Wᵀ [K, N] is the column-major
    second operand as it stands (no copy)."""
    x8, x_scale = _quantize(x, "e4m3")
    w8, w_scale = _quantize(w, "e4m3")
    return _mm(x8, w8.t(), x_scale, w_scale, x.dtype, fast_accum=True)


def _backward(x, w, dy, grad_format):
    """(dX, dW) of Y = X Wᵀ, each one _scaled_mm; .t().contiguous() is the transposed copy of
    codes that the operand's required layout asks for."""
    dy8, dy_scale = _quantize(dy.contiguous(), grad_format)
    w8, w_scale = _quantize(w, "e4m3")
    # dX [M, K] = dY [M, N] W [N, K]: dY row-major as it is; W's codes column-major: a copy.
    dx = _mm(dy8, w8.t().contiguous().t(), dy_scale, w_scale, x.dtype, fast_accum=False)
    x8, x_scale = _quantize(x, "e4m3")
    # dW [N, K] = dYᵀ [N, M] X [M, K]: dYᵀ row-major and X column-major: two copies.
    dw = _mm(dy8.t().contiguous(), x8.t().contiguous().t(), dy_scale, x_scale, w.dtype,
             fast_accum=False)
    return dx, dw


# One Function per gradient format, the format a literal in each: no non-tensor argument
# through apply() and no state on ctx but the saved tensors, the plainest thing for Dynamo to
# trace (it traces forward and backward like any other torch code; nothing is marked).
class _MatmulE4M3Grad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return _forward(x, w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return _backward(x, w, dy, "e4m3")


class _MatmulE5M2Grad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return _forward(x, w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return _backward(x, w, dy, "e5m2")


class Fp8Linear(nn.Module):
    """nn.Linear(bias=False)'s forward in the recipe above, on `linear`'s own Parameter (the
    same object: gradients land on it)."""

    def __init__(self, linear, grad_format="e4m3"):
        super().__init__()
        if getattr(linear, "bias", None) is not None:
            raise ValueError("Fp8Linear: the reference's linears have no bias")
        if grad_format not in FORMATS:
            raise ValueError("grad_format must be one of %s; got %r"
                             % (", ".join(FORMATS), grad_format))
        self.weight = linear.weight
        self.grad_format = grad_format

    def forward(self, x):
        n, k = self.weight.shape
        m = x.numel() // k
        if k % ALIGN or n % ALIGN or m % ALIGN:
            raise ValueError("Fp8Linear: torch._scaled_mm needs the width (%d), the output "
                             "width (%d) and the tokens (%d) to be multiples of %d"
                             % (k, n, m, ALIGN))
        fn = _MatmulE5M2Grad if self.grad_format == "e5m2" else _MatmulE4M3Grad
        # 2-D and row-major for _scaled_mm (a view of the contiguous activations here).
        y = fn.apply(x.reshape(m, k).contiguous(), self.weight)
        return y.view(*x.shape[:-1], n)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, grad_format=%s" % (
            self.weight.shape[1], self.weight.shape[0], self.grad_format)


class Fp8MLP(MLP):
    """MLP's forward (down(silu(gate(x)) * up(x)), SwiGLU in bf16) on Fp8Linear projections."""

    def __init__(self, mlp, grad_format="e4m3"):
        nn.Module.__init__(self)
        self.gate_proj = Fp8Linear(mlp.gate_proj, grad_format)
        self.up_proj = Fp8Linear(mlp.up_proj, grad_format)
        self.down_proj = Fp8Linear(mlp.down_proj, grad_format)


class Fp8ReferenceMiddle(ReferenceMiddle):
    """ReferenceMiddle's forward with its seven linears (o_proj, gate, up, down, and layer
    l+1's q, k, v) in FP8, on `ref`'s Parameters; the RMSNorm modules are `ref`'s own."""

    def __init__(self, ref, grad_format="e4m3"):
        nn.Module.__init__(self)
        self.attention = ref.attention
        self.n_heads, self.n_kv, self.head_dim = ref.n_heads, ref.n_kv, ref.head_dim
        self.grad_format = grad_format
        self.o_proj = Fp8Linear(ref.o_proj, grad_format)
        self.post_attention_layernorm = ref.post_attention_layernorm
        self.mlp = Fp8MLP(ref.mlp, grad_format)
        self.next_input_layernorm = ref.next_input_layernorm
        self.next_q_proj = Fp8Linear(ref.next_q_proj, grad_format)
        self.next_k_proj = Fp8Linear(ref.next_k_proj, grad_format)
        self.next_v_proj = Fp8Linear(ref.next_v_proj, grad_format)


__all__ = ["FORMATS", "Fp8Linear", "Fp8MLP", "Fp8ReferenceMiddle", "unavailable"]
