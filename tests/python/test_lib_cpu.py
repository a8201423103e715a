"""coda._lib without torch or a GPU: the ctypes mirrors of the C structs, and calls on the CPU
backend with host buffers (the standard library's `array`; no numpy needed).

Struct layouts are the #1 risk of a ctypes binding: a field in the wrong place corrupts a call
silently. Three independent checks:
  1. the sizes and offsets below, computed by hand from the headers (LP64: x86-64, aarch64);
  2. the field names, C types and order, parsed from include/coda/coda.h and
     include/coda/block/llama.h, against each Structure's _fields_ (catches a header change that
     the mirror has not followed);
  3. where a C compiler is available, sizeof/offsetof printed by a compiled C program.
"""

import array
import ctypes
import math
import os
import re
import shutil
import struct
import subprocess

import pytest

from coda import _lib as L

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
HEADERS = [
    os.path.join(REPO, "include", "coda", "core", "types.h"),
    os.path.join(REPO, "include", "coda", "coda.h"),
    os.path.join(REPO, "include", "coda", "block", "llama.h"),
]

# ---------------------------------------------------------------------------------------------
# 1. Layout by hand.
#
# coda_tensor (88 bytes, align 8): data @0 (void*), dtype @8, rank @12 (int32), shape @16 and
#   stride @48 (int64[4]), device @80, device_index @84 (int32).
# coda_scalar (96): value @0 (float), 4 bytes padding, tensor @8.
# coda_rope_spec (192): positions @0, inv_freq @88, n_q_heads @176, n_kv_heads @180,
#   head_dim @184, 4 bytes tail padding (align 8).
# A float/int32 followed by a coda_tensor pads 4 bytes, so the tensor starts 8-aligned.
T, S, R = 88, 96, 192
HAND = {
    "coda_tensor": (T, {"data": 0, "dtype": 8, "rank": 12, "shape": 16, "stride": 48,
                        "device": 80, "device_index": 84}),
    "coda_scalar": (S, {"value": 0, "tensor": 8}),
    "coda_rope_spec": (R, {"positions": 0, "inv_freq": T, "n_q_heads": 2 * T,
                           "n_kv_heads": 2 * T + 4, "head_dim": 2 * T + 8}),
    # layout, 4 pad, a b d c, alpha (scalar), beta, 4 pad, workspace
    "coda_gemm_args": (8 + 4 * T + S + 8 + T, {"layout": 0, "a": 8, "b": 8 + T, "d": 8 + 2 * T,
                                               "c": 8 + 3 * T, "alpha": 8 + 4 * T,
                                               "beta": 8 + 4 * T + S,
                                               "workspace": 8 + 4 * T + S + 8}),
    "coda_residual_rms_args": (7 * T, {"a": 0, "sumsq_partials": 6 * T}),
    "coda_rms_scale_args": (5 * T + 8, {"eps": 3 * T, "out": 3 * T + 8, "rstd_out": 4 * T + 8}),
    "coda_rms_swiglu_args": (6 * T + 8, {"eps": 3 * T, "preact": 3 * T + 8,
                                         "act": 4 * T + 8, "rstd_out": 5 * T + 8}),
    "coda_rms_rope_args": (5 * T + 8 + R, {"eps": 3 * T, "rope": 3 * T + 8,
                                           "out": 3 * T + 8 + R, "rstd_out": 4 * T + 8 + R}),
    "coda_rms_lse_args": (8 * T + 8, {"eps": 3 * T, "targets": 3 * T + 8,
                                      "rstd_out": 7 * T + 8}),
    # dz w x rstd zeta gamma, alpha, accumulate + 4 pad, dx h_hat dgamma_partials
    "coda_rms_backward_args": (9 * T + S + 8, {"gamma": 5 * T, "alpha": 6 * T,
                                               "accumulate": 6 * T + S, "dx": 6 * T + S + 8,
                                               "dgamma_partials": 8 * T + S + 8}),
    "coda_swiglu_backward_args": (6 * T, {"zeta_partials": 5 * T}),
    "coda_rms_stats_args": (4 * T, {"sumsq_partials": 3 * T}),
    "coda_rstd_args": (2 * T + 16, {"partials": 0, "n": T, "eps": T + 8, "rstd": T + 16}),
    "coda_row_reduce_args": (2 * T + S, {"partials": 0, "scale": T, "out": T + S}),
    "coda_col_reduce_args": (2 * T + 8, {"partials": 0, "accumulate": T, "out": T + 8}),
    "coda_rope_backward_args": (4 * T + R + 8, {"qkv": T, "rope": 2 * T, "scale": 2 * T + R,
                                                "dz": 2 * T + R + 8, "zeta": 3 * T + R + 8}),
    "coda_cross_entropy_args": (9 * T + 8, {"targets": 3 * T, "ignore_index": 4 * T,
                                            "reduction": 4 * T + 4, "loss": 4 * T + 8,
                                            "workspace": 8 * T + 8}),
    # hidden, intermediate (int64), n_heads, n_kv_heads, head_dim (int32) + 4 pad, vocab (int64),
    # eps, ignore_index, loss_reduction, 4 bytes tail padding
    "coda_llama_config": (56, {"hidden": 0, "intermediate": 8, "n_heads": 16, "n_kv_heads": 20,
                               "head_dim": 24, "vocab": 32, "eps": 40, "ignore_index": 44,
                               "loss_reduction": 48}),
    "coda_llama_rope": (2 * T, {"positions": 0, "inv_freq": T}),
    "coda_llama_first_weights": (2 * T, {"attn_norm": 0, "w_qkv": T}),
    "coda_llama_first_inputs": (3 * T, {"x": 0, "rope": T}),
    "coda_llama_first_outputs": (T, {"qkv": 0}),
    "coda_llama_first_saved": (T, {"rstd": 0}),
    "coda_llama_first_grads": (4 * T, {"dx": 0, "dqkv": T, "dweights": 2 * T}),
    "coda_llama_middle_weights": (6 * T, {"w_out": 0, "ffn_norm": T, "w_gate_up": 2 * T,
                                          "w_down": 3 * T, "attn_norm": 4 * T, "w_qkv": 5 * T}),
    "coda_llama_middle_inputs": (4 * T, {"x0": 0, "y0": T, "rope": 2 * T}),
    "coda_llama_middle_outputs": (2 * T, {"x2": 0, "qkv": T}),
    "coda_llama_middle_saved": (4 * T, {"x1": 0, "z1": T, "r1": 2 * T, "r2": 3 * T}),
    "coda_llama_middle_grads": (9 * T, {"dx": 0, "dqkv": T, "dy0": 2 * T, "dweights": 3 * T}),
    "coda_llama_last_weights": (6 * T, {"final_norm": 4 * T, "lm_head": 5 * T}),
    "coda_llama_last_inputs": (3 * T, {"x0": 0, "y0": T, "targets": 2 * T}),
    "coda_llama_last_outputs": (2 * T, {"loss": 0, "logits": T}),
    "coda_llama_last_saved": (8 * T, {"x1": 0, "dlogits": 5 * T, "zeta": 7 * T}),
    "coda_llama_last_grads": (S + 8 * T, {"dloss": 0, "dx": S, "dy0": S + T,
                                          "dweights": S + 2 * T}),
}


def test_every_struct_has_a_hand_layout():
    assert set(HAND) == set(L.STRUCTS)


@pytest.mark.parametrize("name", sorted(HAND))
def test_struct_layout_by_hand(name):
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("the hand layout is for LP64 platforms")
    size, offsets = HAND[name]
    cls = L.STRUCTS[name]
    assert ctypes.sizeof(cls) == size, name
    for field, offset in offsets.items():
        assert getattr(cls, field).offset == offset, "%s.%s" % (name, field)


# ---------------------------------------------------------------------------------------------
# 2. Field names, types and order, from the headers' text.

C_TYPES = {
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "void*": ctypes.c_void_p,
}


def parse_header_structs():
    """{struct name: [(field, C type, array length or None)]} of every typedef struct."""
    structs = {}
    for path in HEADERS:
        text = open(path).read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
            name, body = m.group(1), m.group(2)
            fields = []
            for decl in body.split(";"):
                decl = " ".join(decl.split())
                if not decl:
                    continue
                dm = re.match(r"([\w]+\s*\*?)\s*(.*)$", decl)
                ctype = dm.group(1).replace(" ", "")
                for part in dm.group(2).split(","):
                    part = part.strip()
                    if part.startswith("*"):
                        ctype, part = ctype + "*", part[1:].strip()
                    am = re.match(r"(\w+)\s*(?:\[(\w+)\])?$", part)
                    fields.append((am.group(1), ctype, am.group(2)))
            structs[name] = fields
    return structs


def test_headers_parse():
    if not all(os.path.exists(h) for h in HEADERS):
        pytest.skip("the C headers are not beside this test")
    structs = parse_header_structs()
    # Every struct of the C ABI is mirrored, and nothing else.
    assert set(structs) == set(L.STRUCTS)


@pytest.mark.parametrize("name", sorted(L.STRUCTS))
def test_struct_fields_match_header(name):
    if not all(os.path.exists(h) for h in HEADERS):
        pytest.skip("the C headers are not beside this test")
    header = parse_header_structs()[name]
    mirror = L.STRUCTS[name]._fields_
    assert [f for f, _, _ in header] == [f for f, _ in mirror], name
    by_c_name = {v: k for k, v in L.STRUCTS.items()}
    for (field, ctype, length), (_, pytype) in zip(header, mirror):
        if length is not None:
            macro = {"CODA_MAX_RANK": L.MAX_RANK}
            n = macro.get(length, None) or int(length)
            assert pytype._length_ == n and pytype._type_ == C_TYPES[ctype], (name, field)
        elif ctype in C_TYPES:
            assert pytype == C_TYPES[ctype], (name, field, ctype)
        else:
            assert by_c_name.get(pytype) == ctype, (name, field, ctype)


# ---------------------------------------------------------------------------------------------
# 3. sizeof / offsetof from a C compiler, where there is one.


def test_struct_layout_by_c_compiler(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not all(os.path.exists(h) for h in HEADERS):
        pytest.skip("no C compiler or headers")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "coda/coda.h"', "int main(void) {"]
    for name, cls in L.STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (name, name))
        for field, _ in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (name, field, name, field))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-I", os.path.join(REPO, "include"), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, field, value = line.split()
        cls = L.STRUCTS[name]
        got = ctypes.sizeof(cls) if field == "sizeof" else getattr(cls, field).offset
        assert got == int(value), "%s.%s: ctypes %d, C %s" % (name, field, got, value)


# ---------------------------------------------------------------------------------------------
# Calls on the CPU backend.


def library_or_skip():
    try:
        return L.load()
    except OSError as e:
        pytest.skip("libcoda.so not found (%s)" % str(e).splitlines()[0])


def bf16_bits(x):
    """float -> bf16 bits, round to nearest even (exact for the small values used here)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


class Host:
    """A row-major host buffer (array) and its coda_tensor."""

    CODES = {L.BF16: "H", L.F32: "f", L.I32: "i"}

    def __init__(self, dtype, shape, values=None):
        n = 1
        for s in shape:
            n *= s
        self.dtype, self.shape = dtype, tuple(shape)
        if values is None:  # NaN-poisoned
            values = [float("nan")] * n if dtype != L.I32 else [0] * n
        if dtype == L.BF16:
            self.buf = array.array("H", [bf16_bits(v) for v in values])
        else:
            self.buf = array.array(self.CODES[dtype], values)
        assert len(self.buf) == n

    @property
    def view(self):
        return L.tensor(self.buf.buffer_info()[0], self.dtype, self.shape)

    def values(self):
        if self.dtype == L.BF16:
            return [bf16_value(b) for b in self.buf]
        return list(self.buf)

    def rows(self):
        v, cols = self.values(), self.shape[-1]
        return [v[i:i + cols] for i in range(0, len(v), cols)]


def small_ints(rng_state, n, lo=-4, hi=4):
    """Deterministic small integers: exact in bf16, and their products' sums exact in f32."""
    out = []
    for _ in range(n):
        rng_state[0] = (rng_state[0] * 1103515245 + 12345) % (1 << 31)
        out.append(float(lo + rng_state[0] % (hi - lo + 1)))
    return out


def matmul(a_rows, b_rows_t):
    """a [M, K] times b^T, b given as [N, K]."""
    return [[sum(x * y for x, y in zip(ar, br)) for br in b_rows_t] for ar in a_rows]


def transpose(rows):
    return [list(c) for c in zip(*rows)]


def test_version_and_no_error_yet():
    library_or_skip()
    assert re.match(r"^\d+\.\d+\.\d+$", L.version())


@pytest.mark.parametrize("layout", [L.GEMM_FWD, L.GEMM_DGRAD, L.GEMM_WGRAD])
def test_gemm_exact_on_small_integers(layout):
    library_or_skip()
    # M ragged where it is a row count; wgrad's A is [K, M], whose rows need 16 bytes.
    M, N, K = (8 if layout == L.GEMM_WGRAD else 5), 16, 24
    rng = [layout + 1]
    if layout == L.GEMM_FWD:
        a = Host(L.BF16, (M, K), small_ints(rng, M * K))
        b = Host(L.BF16, (N, K), small_ints(rng, N * K))
        expect = matmul(a.rows(), b.rows())
    elif layout == L.GEMM_DGRAD:
        a = Host(L.BF16, (M, K), small_ints(rng, M * K))
        b = Host(L.BF16, (K, N), small_ints(rng, K * N))
        expect = matmul(a.rows(), transpose(b.rows()))
    else:
        a = Host(L.BF16, (K, M), small_ints(rng, K * M))
        b = Host(L.BF16, (K, N), small_ints(rng, K * N))
        expect = matmul(transpose(a.rows()), transpose(b.rows()))
    c = Host(L.F32, (M, N), small_ints(rng, M * N))
    d = Host(L.F32, (M, N))
    args = L.GemmArgs()
    args.layout = layout
    args.a, args.b, args.c, args.d = a.view, b.view, c.view, d.view
    args.alpha = L.scalar(0.5)
    args.beta = 2.0
    assert L.gemm_workspace_size(args) == 0  # host tensors: no stream-K scratch
    L.gemm(args)
    c_rows = c.rows()
    want = [[0.5 * expect[i][j] + 2.0 * c_rows[i][j] for j in range(N)] for i in range(M)]
    assert d.rows() == want


def test_gemm_alpha_tensor():
    library_or_skip()
    M, N, K = 3, 8, 8
    rng = [7]
    a = Host(L.BF16, (M, K), small_ints(rng, M * K))
    b = Host(L.BF16, (N, K), small_ints(rng, N * K))
    scale = Host(L.F32, (1,), [0.25])
    d = Host(L.F32, (M, N))
    args = L.GemmArgs()
    args.layout = L.GEMM_FWD
    args.a, args.b, args.d = a.view, b.view, d.view
    args.alpha = L.scalar(2.0, scale.view)
    L.gemm(args)
    expect = matmul(a.rows(), b.rows())
    assert d.rows() == [[0.5 * v for v in row] for row in expect]


def test_errors_map_to_python_exceptions():
    library_or_skip()
    a = Host(L.BF16, (4, 16), [1.0] * 64)
    b = Host(L.BF16, (8, 16), [1.0] * 128)
    d = Host(L.F32, (4, 8))
    args = L.GemmArgs()
    args.layout = L.GEMM_FWD
    args.a, args.b, args.d = a.view, b.view, d.view
    args.alpha = L.scalar(1.0)

    bad_shape = Host(L.F32, (4, 16))  # D must be [M, N] = [4, 8]
    args.d = bad_shape.view
    with pytest.raises(ValueError) as e:
        L.gemm(args)
    assert isinstance(e.value, L.InvalidArgument) and e.value.status == L.INVALID_ARGUMENT
    assert "d" in str(e.value) and str(e.value) == L.last_error()

    bad_dtype = Host(L.I32, (4, 8))
    args.d = bad_dtype.view
    with pytest.raises(TypeError):
        L.gemm(args)

    args.d = d.view
    args.alpha = L.scalar(float("nan"))
    with pytest.raises(ValueError):
        L.gemm(args)

    # K = 12 in rows padded to 16: aligned, valid, but not a multiple of 8 -> not supported.
    a16 = Host(L.BF16, (4, 16), [1.0] * 64)
    b16 = Host(L.BF16, (8, 16), [1.0] * 128)
    args.alpha = L.scalar(1.0)
    args.a = L.tensor(a16.buf.buffer_info()[0], L.BF16, (4, 12), (16, 1))
    args.b = L.tensor(b16.buf.buffer_info()[0], L.BF16, (8, 12), (16, 1))
    with pytest.raises(NotImplementedError) as e:
        L.gemm(args)
    assert "multiple of 8" in str(e.value)
    assert isinstance(e.value, L.Error)


def test_gate_up_round_trip():
    library_or_skip()
    F, K = 3, 8
    stacked = Host(L.BF16, (2 * F, K), [float(i % 61) for i in range(2 * F * K)])
    fused = Host(L.BF16, (2 * F, K))
    back = Host(L.BF16, (2 * F, K))
    L.interleave_gate_up(stacked.view, fused.view)
    s, f = stacked.rows(), fused.rows()
    for j in range(F):
        assert f[2 * j] == s[j] and f[2 * j + 1] == s[F + j]
    L.deinterleave_gate_up(fused.view, back.view)
    assert back.rows() == s


def rope_reference(row, positions_m, inv_freq, heads, head_dim):
    """Hugging Face rotate-half RoPE on `heads` heads of one token's row."""
    out = list(row)
    half = head_dim // 2
    for h in range(heads):
        base = h * head_dim
        for i in range(half):
            angle = positions_m * inv_freq[i]
            c, s = math.cos(angle), math.sin(angle)
            x1, x2 = row[base + i], row[base + half + i]
            out[base + i] = x1 * c - x2 * s
            out[base + half + i] = x2 * c + x1 * s
    return out


def first_layer_setup(M=3, D=16, heads=2, kv_heads=1, head_dim=8):
    rng = [11]
    width = (heads + 2 * kv_heads) * head_dim
    x = Host(L.BF16, (M, D), [v / 4 for v in small_ints(rng, M * D)])
    gamma = Host(L.BF16, (D,), [1 + v / 8 for v in small_ints(rng, D, -2, 2)])
    w = Host(L.BF16, (width, D), [v / 8 for v in small_ints(rng, width * D)])
    positions = Host(L.I32, (M,), [5, 0, 17][:M])
    inv_freq = Host(L.F32, (head_dim // 2,),
                    [1.0 / (10000.0 ** (2 * i / head_dim)) for i in range(head_dim // 2)])
    config = L.LlamaConfig(hidden=D, intermediate=0, n_heads=heads, n_kv_heads=kv_heads,
                           head_dim=head_dim, vocab=0, eps=1e-5, ignore_index=-100,
                           loss_reduction=L.LOSS_MEAN)
    return config, x, gamma, w, positions, inv_freq


def test_llama_first_forward_matches_python():
    library_or_skip()
    M, D, H, KV, HD = 3, 16, 2, 1, 8
    config, x, gamma, w, positions, inv_freq = first_layer_setup(M, D, H, KV, HD)
    width = (H + 2 * KV) * HD
    qkv = Host(L.BF16, (M, width))
    rstd = Host(L.F32, (M,))

    nbytes = L.llama_workspace_size(L.LLAMA_FIRST, L.LLAMA_FORWARD, config, M)
    assert nbytes > 0
    ws = Host(L.I32, ((nbytes + 3) // 4,))
    weights = L.LlamaFirstWeights(attn_norm=gamma.view, w_qkv=w.view)
    inputs = L.LlamaFirstInputs(x=x.view, rope=L.LlamaRope(positions=positions.view,
                                                           inv_freq=inv_freq.view))
    outputs = L.LlamaFirstOutputs(qkv=qkv.view)
    saved = L.LlamaFirstSaved(rstd=rstd.view)
    L.llama_forward("first", config, weights, inputs, outputs, saved, ws.view)

    # Plain Python: RMSNorm (fp64), the QKV projection, RoPE on the q and k heads.
    g, xs, ws_rows = gamma.values(), x.rows(), w.rows()
    freq = inv_freq.values()
    got = qkv.rows()
    got_rstd = rstd.values()
    for m in range(M):
        r = 1 / math.sqrt(sum(v * v for v in xs[m]) / D + config.eps)
        assert abs(got_rstd[m] - r) <= 1e-5 * r
        h = [xs[m][k] * r * g[k] for k in range(D)]
        row = [sum(h[k] * ws_rows[n][k] for k in range(D)) for n in range(width)]
        row = rope_reference(row, positions.values()[m], freq, H + KV, HD)  # q and k heads
        scale = max(abs(v) for v in row)
        for n in range(width):
            # bf16 output (and the bf16 x * gamma the GEMM reads): a few bf16 ulps of the row
            assert abs(got[m][n] - row[n]) <= 2e-2 * scale, (m, n, got[m][n], row[n])


def test_llama_workspace_too_small_is_a_value_error():
    library_or_skip()
    M = 3
    config, x, gamma, w, positions, inv_freq = first_layer_setup(M)
    qkv = Host(L.BF16, (M, 32))
    rstd = Host(L.F32, (M,))
    ws = Host(L.I32, (1,))
    with pytest.raises(ValueError) as e:
        L.llama_forward(
            "first", config,
            L.LlamaFirstWeights(attn_norm=gamma.view, w_qkv=w.view),
            L.LlamaFirstInputs(x=x.view, rope=L.LlamaRope(positions=positions.view,
                                                          inv_freq=inv_freq.view)),
            L.LlamaFirstOutputs(qkv=qkv.view), L.LlamaFirstSaved(rstd=rstd.view), ws.view)
    assert "workspace" in str(e.value)
    assert all(math.isnan(v) for v in qkv.values())  # nothing written on failure


def test_config_errors():
    library_or_skip()
    config = L.LlamaConfig(hidden=16, intermediate=0, n_heads=2, n_kv_heads=1, head_dim=7,
                           vocab=0, eps=1e-5, ignore_index=-100, loss_reduction=L.LOSS_MEAN)
    with pytest.raises(ValueError) as e:
        L.llama_workspace_size(L.LLAMA_FIRST, L.LLAMA_FORWARD, config, 4)
    assert "head_dim" in str(e.value)
