"""coda._lib without torch or a GPU: the ctypes mirrors of the C structs, and calls on the CPU
backend with host buffers (the standard library's `array`; no numpy needed).

Struct layouts are the #1 risk of a ctypes binding: a field in the wrong place corrupts a call
silently. The Structures are generated from the headers (coda._abi, by tools/gen_abi.py; ctest
`abi_bindings_are_generated` fails when that file is stale), and here every struct's size and
every field's offset and size are held to what a C compiler makes of the same headers.
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
MAIN_HEADER = os.path.join(REPO, "include", "coda", "coda.h")

# ---------------------------------------------------------------------------------------------
# Layouts: ctypes against sizeof / offsetof from a C compiler.


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """{struct: {"sizeof": n, field: (offset, size)}} printed by a C program over coda/coda.h."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not os.path.exists(MAIN_HEADER):
        pytest.skip("no C compiler or headers")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "coda/coda.h"',
             "int main(void) {"]
    for name, cls in L.STRUCTS.items():
        lines.append('printf("%s sizeof %%zu 0\\n", sizeof(%s));' % (name, name))
        for field, _ in cls._fields_:
            lines.append('printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s*)0)->%s));'
                         % (name, field, name, field, name, field))
    lines.append("return 0; }")
    tmp = tmp_path_factory.mktemp("layout")
    src, exe = tmp / "layout.c", tmp / "layout"
    src.write_text("\n".join(lines))
    subprocess.run([cc, "-std=c99", "-I", os.path.join(REPO, "include"), str(src), "-o", str(exe)],
                   check=True)
    layout = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        name, field, offset, size = line.split()
        layout.setdefault(name, {})[field] = int(offset) if field == "sizeof" else (int(offset),
                                                                                    int(size))
    return layout


@pytest.mark.parametrize("name", sorted(L.STRUCTS))
def test_struct_layout_matches_c_compiler(c_layout, name):
    cls, c = L.STRUCTS[name], c_layout[name]
    assert ctypes.sizeof(cls) == c["sizeof"], name
    assert [f for f, _ in cls._fields_] == [f for f in c if f != "sizeof"]
    for field, ctype in cls._fields_:
        got = (getattr(cls, field).offset, ctypes.sizeof(ctype))
        assert got == c[field], "%s.%s: ctypes (offset, size) %s, C %s" % (name, field, got,
                                                                           c[field])


def _c_headers():
    """The text of every C header (.h) under include/coda (none where the tree is not beside this
    test)."""
    for root, _, files in os.walk(os.path.join(REPO, "include", "coda")):
        for f in sorted(files):
            if f.endswith(".h"):
                with open(os.path.join(root, f)) as h:
                    yield h.read()


def test_every_header_struct_is_bound():
    """Each `typedef struct` of the headers coda.h pulls in has a Structure (the generator's
    parser aside: read here from the headers' text)."""
    found = set()
    for text in _c_headers():
        found |= set(re.findall(r"typedef\s+struct\s+(\w+)\s*\{", text))
    if not found:
        pytest.skip("the C headers are not beside this test")
    assert found == set(L.STRUCTS)


def test_every_function_is_declared():
    """Each CODA_API function of the headers has a signature, and the kernels a wrapper."""
    names = set()
    for text in _c_headers():
        names |= set(re.findall(r"CODA_API\s+[^;(]*?\b(coda_\w+)\s*\(", text))
    if not names:
        pytest.skip("the C headers are not beside this test")
    assert names == set(L._SIGNATURES)
    for c_name in L._KERNELS:
        assert callable(getattr(L, c_name[len("coda_"):]))
    assert "coda_gemm_rms_scale" in L._KERNELS and "coda_cross_entropy" in L._KERNELS


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
    """A row-major host buffer (array) and its coda_tensor. E4M3 and E8M0 tensors hold their
    bytes: `values` are codes and scale bytes, not numbers."""

    CODES = {L.BF16: "H", L.F32: "f", L.I32: "i", L.E4M3: "B", L.E8M0: "B"}

    def __init__(self, dtype, shape, values=None):
        n = 1
        for s in shape:
            n *= s
        self.dtype, self.shape = dtype, tuple(shape)
        if values is None:  # NaN-poisoned (0xFF is NaN in E4M3 and in E8M0)
            values = {L.I32: [0] * n, L.E4M3: [0xFF] * n, L.E8M0: [0xFF] * n}.get(
                dtype, [float("nan")] * n)
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


def test_gemm_rms_geglu_matches_gelu_times_up():
    """K2g through ctypes: preact = rstd * (a · wᵀ), exact on small integers with rstd = 1/2;
    act = gelu(gate) * up (erf form) within bf16 rounding of an fp64 computation here."""
    library_or_skip()
    M, F, K = 3, 8, 16
    rng = [11]
    a = Host(L.BF16, (M, K), small_ints(rng, M * K, -2, 2))
    w = Host(L.BF16, (2 * F, K), small_ints(rng, 2 * F * K, -2, 2))
    partials = Host(L.F32, (M, 1), [4.0 * K] * M)  # sum(x^2) / K = 4, eps 0: rstd = 1/2
    preact, act, rstd = Host(L.BF16, (M, 2 * F)), Host(L.BF16, (M, F)), Host(L.F32, (M,))
    args = L.RmsGegluArgs()
    args.a, args.w, args.sumsq_partials, args.eps = a.view, w.view, partials.view, 0.0
    args.preact, args.act, args.rstd_out = preact.view, act.view, rstd.view
    L.gemm_rms_geglu(args)
    z = [[0.5 * v for v in row] for row in matmul(a.rows(), w.rows())]
    assert preact.rows() == z
    assert rstd.values() == [0.5] * M
    for row_z, row_act in zip(z, act.rows()):
        for j in range(F):
            gate, up = row_z[2 * j], row_z[2 * j + 1]
            want = 0.5 * gate * (1 + math.erf(gate / math.sqrt(2))) * up
            assert abs(row_act[j] - want) <= 2.0 ** -8 * abs(want) + 1e-6 * abs(gate * up)


def e4m3_code(x):
    """The E4M3 byte of x, a normal E4M3 value or 0 (sign, 4 exponent bits of bias 7, 3 mantissa
    bits); asserts that x is one."""
    if x == 0:
        return 0
    e = math.floor(math.log2(abs(x)))
    mantissa = (abs(x) / 2.0 ** e - 1) * 8
    assert -6 <= e <= 8 and mantissa == int(mantissa), x
    return (0x80 if x < 0 else 0) | (e + 7) << 3 | int(mantissa)


def e4m3_value(code):
    """The value of an E4M3 byte from the format's definition (0x7F and 0xFF, NaN, excluded)."""
    e, m = code >> 3 & 15, code & 7
    magnitude = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -magnitude if code & 0x80 else magnitude


def fp8_problem(M=3, N=8, K=144):
    """a_fp8 [M, K] of small integers times a weight whose row n holds 1 at k = n, -1 at k = 8 + n
    and 2 at k = 128 + n (the second, short K block), with power-of-two scales 2^(byte - 127)
    that differ per row and K block of a and per K block of b. So, by hand,
      D[m, n] = (a[m, n] - a[m, 8 + n]) sa[m, 0] sb[0] + 2 a[m, 128 + n] sa[m, 1] sb[1],
    small numbers times powers of two: exact in fp32 and in bf16."""
    rng = [13]
    a_vals = small_ints(rng, M * K)
    b_vals = [0.0] * (N * K)
    for n in range(N):
        b_vals[n * K + n], b_vals[n * K + 8 + n], b_vals[n * K + 128 + n] = 1.0, -1.0, 2.0
    a_scale_bytes = [127 + (m + kb) % 3 - 1 for m in range(M) for kb in range(2)]  # 1/2, 1, 2
    b_scale_bytes = [128, 125]  # 2 and 1/4 (one row: ceil(N/128) = 1)
    tensors = {
        "a": Host(L.E4M3, (M, K), [e4m3_code(v) for v in a_vals]),
        "a_scales": Host(L.E8M0, (M, 2), a_scale_bytes),
        "b": Host(L.E4M3, (N, K), [e4m3_code(v) for v in b_vals]),
        "b_scales": Host(L.E8M0, (1, 2), b_scale_bytes),
        "d": Host(L.BF16, (M, N)),
    }
    scale = [2.0 ** (b - 127) for b in a_scale_bytes]
    sb = [2.0 ** (b - 127) for b in b_scale_bytes]
    want = [[(a_vals[m * K + n] - a_vals[m * K + 8 + n]) * scale[2 * m] * sb[0]
             + 2 * a_vals[m * K + 128 + n] * scale[2 * m + 1] * sb[1] for n in range(N)]
            for m in range(M)]
    return tensors, want


def fp8_args(t):
    args = L.Fp8GemmArgs()
    for name in ("a", "a_scales", "b", "b_scales", "d"):
        setattr(args, name, t[name].view)
    return args


def test_gemm_fp8_exact_by_hand():
    """coda_gemm_fp8 through ctypes on the CPU backend: E4M3 codes and E8M0 scale bytes in
    `array('B')` buffers, D as worked out by hand (fp8_problem), bit for bit."""
    library_or_skip()
    assert L.DTYPE_SIZE[L.E4M3] == L.DTYPE_SIZE[L.E8M0] == 1
    t, want = fp8_problem()
    assert all(bf16_value(bf16_bits(v)) == v for row in want for v in row)  # exact in bf16
    assert any(v != 0 for row in want for v in row)
    L.gemm_fp8(fp8_args(t))
    assert t["d"].rows() == want


def test_gemm_fp8_weight_gradient_form_by_hand():
    """The weight gradient's form of coda_gemm_fp8: b scaled per row (FP8_B_ROWS, b_scales
    [N, ceil(K/128)] like a_scales) and an f32 d accumulated into (d += product), worked out by
    hand on fp8_problem's operands with a scale per row of b, bit for bit."""
    library_or_skip()
    t, _ = fp8_problem()
    M, N, K = 3, 8, 144
    a_vals = [e4m3_value(c) for c in t["a"].buf]
    sa = [2.0 ** (b - 127) for b in t["a_scales"].buf]
    b_scale_bytes = [127 + (n + kb) % 4 - 2 for n in range(N) for kb in range(2)]  # 1/4 .. 2
    sb = [2.0 ** (b - 127) for b in b_scale_bytes]
    old = [float(m * N + n) / 4 for m in range(M) for n in range(N)]  # exact in f32
    t["b_scales"] = Host(L.E8M0, (N, 2), b_scale_bytes)
    t["d"] = Host(L.F32, (M, N), old)
    args = fp8_args(t)
    args.b_scaling = L.FP8_B_ROWS
    args.accumulate = 1
    L.gemm_fp8(args)
    want = [[old[m * N + n]
             + (a_vals[m * K + n] - a_vals[m * K + 8 + n]) * sa[2 * m] * sb[2 * n]
             + 2 * a_vals[m * K + 128 + n] * sa[2 * m + 1] * sb[2 * n + 1] for n in range(N)]
            for m in range(M)]
    assert any(want[m][n] != old[m * N + n] for m in range(M) for n in range(N))
    assert t["d"].rows() == want


def test_gemm_fp8_bad_input_raises_the_validators_message():
    """A bad call raises the validator's message as the mapped exception and writes nothing."""
    library_or_skip()
    t, _ = fp8_problem()
    args = fp8_args(t)
    args.a_scales = L.tensor(t["a_scales"].buf.buffer_info()[0], L.E8M0, (3, 1))  # floor(K/128)
    with pytest.raises(ValueError) as e:
        L.gemm_fp8(args)
    assert isinstance(e.value, L.InvalidArgument)
    assert "gemm_fp8: a_scales must have shape [M, ceil(K/128)] = [3, 2]; got [3, 1]" in str(
        e.value)

    args = fp8_args(t)
    args.b_scales = L.tensor(t["b_scales"].buf.buffer_info()[0], L.F32, (1, 2))
    with pytest.raises(TypeError) as e:
        L.gemm_fp8(args)
    assert "gemm_fp8: b_scales must be e8m0; got f32" in str(e.value)

    args = fp8_args(t)
    args.b_scaling = L.FP8_B_ROWS  # b_scales still one row per 128 x 128 block
    with pytest.raises(ValueError) as e:
        L.gemm_fp8(args)
    assert "gemm_fp8: b_scales must have shape [N, ceil(K/128)] = [8, 2]; got [1, 2]" in str(
        e.value)

    args = fp8_args(t)  # K = 136 of rows 144 bytes apart: aligned, valid, not supported
    args.a = L.tensor(t["a"].buf.buffer_info()[0], L.E4M3, (3, 136), (144, 1))
    args.b = L.tensor(t["b"].buf.buffer_info()[0], L.E4M3, (8, 136), (144, 1))
    with pytest.raises(NotImplementedError) as e:
        L.gemm_fp8(args)
    assert "K must be a multiple of 16" in str(e.value)
    assert all(math.isnan(v) for v in t["d"].values())  # nothing written on failure


# A weight [N, K] = [144, 144] of 2 x 2 blocks of 128 x 128 (the last row and column of blocks
# 16 wide), f32, zero except where written here, and its codes and scales worked out by hand.
# A block's scale byte is k + 127 for the smallest k with amax <= 448 2^k (at least -126), its
# codes w 2^-k rounded to the nearest E4M3 value (ties to the even code).
QW_N = QW_K = 144
QW_VALUES = {
    # block (0, 0): amax 3, so k = -7 (448 2^-8 = 1.75 < 3 <= 3.5), scale byte 120; codes of w 2^7:
    (0, 0): (3.0, 0x7C),  # 384 = 1.5 2^8: exponent field 8 + 7, mantissa 4
    (1, 2): (1.0, 0x70),  # 128 = 2^7
    (5, 127): (-0.5, 0xE8),  # -64 = -2^6: sign, exponent field 13
    (127, 64): (0.01, 0x3A),  # 1.28 (in f32, just under): nearest 1.25 = 1 + 2/8
    (10, 10): (1.0625 / 128, 0x38),  # 1.0625, halfway from 1 to 1.125: the even code, 1
    (11, 11): (1.1875 / 128, 0x3A),  # 1.1875, halfway from 1.125 to 1.25: the even code, 1.25
    (64, 3): (2.0 ** -14, 0x04),  # 2^-7 = 4 2^-9: a subnormal
    # block (0, 1): an infinity: scale byte 0xFF (NaN), every code 0x7F (NaN), the 1.0 included
    (3, 130): (float("inf"), 0x7F),
    (4, 140): (1.0, 0x7F),
    # block (1, 0): zeros only: k = -126, scale byte 1, codes 0
    # block (1, 1): amax 1000, so k = 2 (896 < 1000 <= 1792), scale byte 129; codes of w 2^-2:
    (128, 128): (1000.0, 0x78),  # 250 = 1.953 2^7 rounds up to 256 = 2^8 (the carry)
    (143, 143): (-1.0, 0xA8),  # -0.25 = -2^-2
    (140, 129): (0.001, 0x00),  # 0.00025, under half of 2^-9: zero
}
QW_SCALES = [[120, 0xFF], [1, 129]]  # [ceil(N/128), ceil(K/128)]


def quantize_weight_problem():
    w = [0.0] * (QW_N * QW_K)
    codes = [[0x7F if (n < 128 and k >= 128) else 0 for k in range(QW_K)] for n in range(QW_N)]
    for (n, k), (value, code) in QW_VALUES.items():
        w[n * QW_K + k], codes[n][k] = value, code
    tensors = {
        "w": Host(L.F32, (QW_N, QW_K), w),
        "codes": Host(L.E4M3, (QW_N, QW_K)),  # 0xFF: bytes the quantizer never writes
        "scales": Host(L.E8M0, (2, 2)),  # 0xFF: written only for the infinity's block
        "codes_t": Host(L.E4M3, (QW_K, QW_N)),
        "scales_t": Host(L.E8M0, (2, 2)),
    }
    return tensors, codes


def quantize_weight_args(t, transposed=True):
    args = L.QuantizeWeightFp8Args()
    for name in ("w", "codes", "scales") + (("codes_t", "scales_t") if transposed else ()):
        setattr(args, name, t[name].view)
    return args


def test_quantize_weight_fp8_by_hand():
    """coda_quantize_weight_fp8 through ctypes on the CPU backend: an f32 weight in an array('f'),
    its E4M3 codes and E8M0 scale bytes in array('B') buffers, as worked out by hand
    (QW_VALUES), bit for bit; the transposed copy is the same bytes transposed; without it,
    codes_t and scales_t are absent and stay as they were."""
    library_or_skip()
    t, codes = quantize_weight_problem()
    L.quantize_weight_fp8(quantize_weight_args(t))
    assert t["codes"].rows() == codes
    assert t["scales"].rows() == QW_SCALES
    assert t["codes_t"].rows() == transpose(codes)
    assert t["scales_t"].rows() == transpose(QW_SCALES)

    t, codes = quantize_weight_problem()
    args = quantize_weight_args(t, transposed=False)
    assert args.codes_t.data is None and args.scales_t.data is None  # absent
    L.quantize_weight_fp8(args)
    assert t["codes"].rows() == codes
    assert t["scales"].rows() == QW_SCALES
    assert set(t["codes_t"].values()) == set(t["scales_t"].values()) == {0xFF}


def test_quantize_weight_fp8_bad_input_raises_the_validators_message():
    """A bad call raises the validator's message as the mapped exception and writes nothing."""
    library_or_skip()
    t, _ = quantize_weight_problem()
    args = quantize_weight_args(t)
    args.codes_t = L.absent()  # scales_t alone
    with pytest.raises(ValueError) as e:
        L.quantize_weight_fp8(args)
    assert isinstance(e.value, L.InvalidArgument)
    assert ("quantize_weight_fp8: scales_t is given but codes_t is absent; pass both or neither"
            in str(e.value))

    args = quantize_weight_args(t)
    args.w = L.tensor(t["w"].buf.buffer_info()[0], L.I32, (QW_N, QW_K))
    with pytest.raises(TypeError) as e:
        L.quantize_weight_fp8(args)
    assert "quantize_weight_fp8: w must be bf16, f16 or f32; got i32" in str(e.value)

    args = quantize_weight_args(t)  # K = 136 of rows 144 elements apart: not supported
    args.w = L.tensor(t["w"].buf.buffer_info()[0], L.F32, (QW_N, 136), (QW_K, 1))
    with pytest.raises(NotImplementedError) as e:
        L.quantize_weight_fp8(args)
    assert "quantize_weight_fp8: K must be a multiple of 16" in str(e.value)
    for name in ("codes", "scales", "codes_t", "scales_t"):  # nothing written on failure
        assert set(t[name].values()) == {0xFF}, name


# An activation x [M, K] = [16, 144], f32, zero except where written here: two blocks per row for
# codes (columns 0..127 and the short 128..143), one block of 16 rows per column for codes_t, with
# codes and scales of both copies worked out by hand. Each block's scale byte is k + 127 for the
# smallest k with amax <= 448 2^k (at least -126; a block of zeros: byte 1), its codes x 2^-k
# rounded to the nearest E4M3 value (ties to the even code). The copies' blocks differ, so one
# value can get two codes.
QA_M, QA_K = 16, 144
QA_X = {(0, 0): 3.0, (0, 5): 0.01, (0, 130): 1000.0, (1, 0): 1.0, (1, 140): float("-inf"),
        (2, 5): 1.0625 / 128, (3, 7): 2.0 ** -14, (4, 7): 2.0, (5, 9): -0.5, (5, 10): 1e-6}
QA_CODES = {  # by rows: {(m, k): code}, the rest 0 (or 0x7F in a NaN block)
    # row 0, block 0: amax 3, k = -7 (1.75 < 3 <= 3.5), byte 120; block 1: amax 1000, k = 2, 129
    (0, 0): 0x7C,  # 384 = 1.5 2^8: exponent field 8 + 7, mantissa 4
    (0, 5): 0x3A,  # 1.28 (in f32, just under): nearest 1.25 = 1 + 2/8
    (0, 130): 0x78,  # 250 rounds up to 256 = 2^8 (the carry into the exponent)
    (1, 0): 0x78,  # row 1, block 0: amax 1, k = -8, byte 119: 1 2^8 = 256
    # row 1, block 1: an infinity: byte 0xFF, all 16 codes 0x7F
    (2, 5): 0x78,  # amax 1.0625 2^-7, k = -15, byte 112: 272, halfway 256 / 288: the even, 256
    (3, 7): 0x78,  # amax 2^-14, k = -22, byte 105: 2^8
    (4, 7): 0x78,  # amax 2, k = -7, byte 120: 2^8
    (5, 9): 0xF8,  # amax 0.5, k = -9, byte 118: -256
    (5, 10): 0x00,  # 1e-6 2^9 = 5.1e-4, under half of 2^-9: zero
}
QA_SCALES = [[120, 129], [119, 0xFF], [112, 1], [105, 1], [120, 1], [118, 1]] + [[1, 1]] * 10
QA_CODES_T = {  # by columns of x: {(k, m): code} of codes_t [K, M]
    (0, 0): 0x7C, (0, 1): 0x70,  # column 0: amax 3, k = -7, byte 120: 3 -> 384, 1 -> 128 = 2^7
    (5, 0): 0x7A, (5, 2): 0x78,  # column 5: amax 0.01, k = -15, byte 112: 327.68 -> 320 =
    #                              1.25 2^8; 272 -> 256 (the tie to even, as by rows)
    (7, 3): 0x04, (7, 4): 0x78,  # column 7: amax 2, k = -7, byte 120: 2^-7 = 4 2^-9 (subnormal)
    (9, 5): 0xF8,  # column 9: amax 0.5, k = -9, byte 118
    (10, 5): 0x78,  # column 10: amax 1e-6 = 1.05 2^-20, k = -28, byte 99: 268.4 -> 256 (not 0)
    (130, 0): 0x78,  # column 130: amax 1000, k = 2, byte 129
    # column 140: the infinity: byte 0xFF, all 16 codes 0x7F
}
QA_SCALES_T = {0: 120, 5: 112, 7: 120, 9: 118, 10: 99, 130: 129, 140: 0xFF}  # the rest 1


def quantize_activation_problem():
    x = [0.0] * (QA_M * QA_K)
    for (m, k), value in QA_X.items():
        x[m * QA_K + k] = value
    codes = [[0x7F if (m == 1 and k >= 128) else QA_CODES.get((m, k), 0) for k in range(QA_K)]
             for m in range(QA_M)]
    codes_t = [[0x7F if k == 140 else QA_CODES_T.get((k, m), 0) for m in range(QA_M)]
               for k in range(QA_K)]
    scales_t = [[QA_SCALES_T.get(k, 1)] for k in range(QA_K)]
    tensors = {
        "x": Host(L.F32, (QA_M, QA_K), x),
        "codes": Host(L.E4M3, (QA_M, QA_K)),  # 0xFF: bytes the quantizer never writes
        "scales": Host(L.E8M0, (QA_M, 2)),  # 0xFF: written only for the infinity's blocks
        "codes_t": Host(L.E4M3, (QA_K, QA_M)),
        "scales_t": Host(L.E8M0, (QA_K, 1)),
    }
    return tensors, codes, codes_t, scales_t


def quantize_activation_args(t, transposed=True):
    args = L.QuantizeActivationFp8Args()
    for name in ("x", "codes", "scales") + (("codes_t", "scales_t") if transposed else ()):
        setattr(args, name, t[name].view)
    return args


def test_quantize_activation_fp8_by_hand():
    """coda_quantize_activation_fp8 through ctypes on the CPU backend: an f32 activation in an
    array('f'), the E4M3 codes and E8M0 scale bytes of both copies in array('B') buffers, as
    worked out by hand (QA_*), bit for bit; the transposed copy is not the codes transposed;
    without it, codes_t and scales_t are absent and stay as they were."""
    library_or_skip()
    t, codes, codes_t, scales_t = quantize_activation_problem()
    L.quantize_activation_fp8(quantize_activation_args(t))
    assert t["codes"].rows() == codes
    assert t["scales"].rows() == QA_SCALES
    assert t["codes_t"].rows() == codes_t
    assert t["scales_t"].rows() == scales_t
    assert t["codes_t"].rows() != transpose(codes)

    t, codes, _, _ = quantize_activation_problem()
    args = quantize_activation_args(t, transposed=False)
    assert args.codes_t.data is None and args.scales_t.data is None  # absent
    L.quantize_activation_fp8(args)
    assert t["codes"].rows() == codes
    assert t["scales"].rows() == QA_SCALES
    assert set(t["codes_t"].values()) == set(t["scales_t"].values()) == {0xFF}


def test_quantize_activation_fp8_bad_input_raises_the_validators_message():
    """A bad call raises the validator's message as the mapped exception and writes nothing."""
    library_or_skip()
    t, _, _, _ = quantize_activation_problem()
    args = quantize_activation_args(t)
    args.codes_t = L.absent()  # scales_t alone
    with pytest.raises(ValueError) as e:
        L.quantize_activation_fp8(args)
    assert isinstance(e.value, L.InvalidArgument)
    assert ("quantize_activation_fp8: scales_t is given but codes_t is absent; pass both or "
            "neither" in str(e.value))

    args = quantize_activation_args(t)
    args.x = L.tensor(t["x"].buf.buffer_info()[0], L.I32, (QA_M, QA_K))
    with pytest.raises(TypeError) as e:
        L.quantize_activation_fp8(args)
    assert "quantize_activation_fp8: x must be bf16, f16 or f32; got i32" in str(e.value)

    args = quantize_activation_args(t)  # K = 136 of rows 144 elements apart: not supported
    args.x = L.tensor(t["x"].buf.buffer_info()[0], L.F32, (QA_M, 136), (QA_K, 1))
    with pytest.raises(NotImplementedError) as e:
        L.quantize_activation_fp8(args)
    assert "quantize_activation_fp8: K must be a multiple of 16" in str(e.value)

    args = quantize_activation_args(t)  # the first 8 rows: M = 8, with codes_t
    args.x = L.tensor(t["x"].buf.buffer_info()[0], L.F32, (8, QA_K))
    args.codes = L.tensor(t["codes"].buf.buffer_info()[0], L.E4M3, (8, QA_K))
    args.scales = L.tensor(t["scales"].buf.buffer_info()[0], L.E8M0, (8, 2))
    args.codes_t = L.tensor(t["codes_t"].buf.buffer_info()[0], L.E4M3, (QA_K, 8), (QA_M, 1))
    with pytest.raises(NotImplementedError) as e:
        L.quantize_activation_fp8(args)
    assert ("quantize_activation_fp8: M must be a multiple of 16 when codes_t is given"
            in str(e.value))
    for name in ("codes", "scales", "codes_t", "scales_t"):  # nothing written on failure
        assert set(t[name].values()) == {0xFF}, name


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
