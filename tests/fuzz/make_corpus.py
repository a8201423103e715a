#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_c_abi (tests/fuzz/corpus/): one valid call of every entry
point and sub-case, at a small and a ragged size, plus a few broken ones.

An input is read front to back by the harness: byte 0 picks the entry point, bytes 1-4 seed the
input values, then each entry reads its dimensions and sub-cases, then one or more decision bytes
per argument, where 0 always means "as valid". Missing bytes read as 0, so a short input is a
valid call of small dimensions.

Inputs named regression_* are not written here: each is an input that once found a defect
(kept as found by the fuzzer)."""
import os
import sys

ENTRIES = ["gemm", "residual_rms", "rms_scale", "rms_swiglu", "rms_rope", "rms_lse",
           "rms_backward", "swiglu_backward", "reductions", "rope_backward", "cross_entropy",
           "gate_up", "size_queries", "llama", "rms_geglu", "gemm_fp8", "quantize_weight_fp8",
           "quantize_activation_fp8"]
SEED = bytes([0x12, 0x34, 0x56, 0x78])

# Dimension and sub-case bytes after the seed, per entry (several cases each).
CASES = {
    "gemm": [[layout, m, n, k] for layout in range(3) for (m, n, k) in [(0, 0, 0), (4, 2, 36)]],
    # M, N, K and the form (bit 0: b scaled by rows, bit 1: f32 d, bit 2: accumulating): M 37,
    # N 136, K 304 (K blocks 128, 128, 48) in the forward's form, by rows (the weight gradient's
    # b), by rows into an f32 d accumulated into; M 1, N 8, K 16 by blocks, accumulating in f32
    "gemm_fp8": [[0, 0, 0], [36, 16, 18], [36, 16, 18, 1], [36, 16, 18, 7], [0, 0, 0, 6]],
    # N, K, w's dtype (bf16, f16, f32): N 16, K 16; N 272, K 304 (blocks 128, 128 and 16 by
    # 128, 128 and 48); N 144, K 208 without the transposed copy (the byte after w's three, codes'
    # two and scales' two drops codes_t, and scales_t with it)
    "quantize_weight_fp8": [[0, 0, 0], [16, 18, 2], [8, 12, 1] + [0] * 7 + [3]],
    # K, x's dtype (bf16, f16, f32), M (16 (byte + 1) - the next byte % 16): M 16, K 16 bf16;
    # M 304, K 304 f32 (blocks of 128, 128 and 48 both ways); M 139, K 208 f16 (ragged M) without
    # the transposed copy (the byte after x's three, codes' two and scales' two drops codes_t, and
    # scales_t with it)
    "quantize_activation_fp8": [[0, 0, 0, 0], [18, 2, 18, 0], [12, 1, 8, 5] + [0] * 7 + [3]],
    # K0: the dimensions, the 16-bit type's byte, then the form byte (1: E4M3 operands with
    # block scales)
    "residual_rms": [[0, 0, 0], [36, 17, 3], [36, 17, 3, 0, 1]],
    # K1, K2, K2g, K4: the dimensions, then the form byte
    "rms_scale": [[0, 0, 0], [36, 5, 7], [36, 5, 7, 1]],
    "rms_swiglu": [[0, 0, 0], [36, 3, 5], [36, 3, 5, 1]],
    "rms_geglu": [[0, 0, 0], [36, 3, 5], [36, 3, 5, 1]],
    "rms_rope": [[0, 0, 0, 0, 0, 0], [1, 1, 1, 29, 5, 0], [1, 1, 1, 29, 5, 1]],
    "rms_lse": [[0, 0, 0], [29, 39, 5]],
    # K6: the dimensions, the 16-bit type's byte, then the form byte (1: E4M3, w [N, K])
    "rms_backward": [[0, 0, 0], [36, 7, 5], [36, 7, 5, 0, 1]],
    # K7: the dimensions, the 16-bit type's byte, then the form byte (1: E4M3, w [F, K])
    "swiglu_backward": [[0, 0, 0], [36, 3, 7], [36, 3, 7, 0, 1]],
    "reductions": [[m, p, n, case] for case in range(4) for (m, p, n) in [(0, 0, 0), (59, 4, 19)]],
    "rope_backward": [[0, 0, 3, 0], [1, 1, 7, 29]],
    "cross_entropy": [[0, 0], [29, 39]],
    "gate_up": [[f, k, dtype, direction] for dtype in range(4) for direction in range(2)
                for (f, k) in [(0, 7)]],
    "size_queries": [[0] * 8, [0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                     [0x20, 0, 0, 0, 0, 0, 0, 0]],
    # layer, pass (the middle layer's 2 and 3: the backward's two parts), then the config
    "llama": [[layer, pass_, 1, 1, 1, 3, 3, 5, 0, 23] for layer in range(3) for pass_ in range(2)]
             + [[layer, pass_] for layer in range(3) for pass_ in range(2)]
             + [[1, part, 1, 1, 1, 3, 3, 5, 0, 23] for part in (2, 3)],
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for index, name in enumerate(ENTRIES):
        for i, case in enumerate(CASES[name]):
            with open(os.path.join(out, "%s_%d" % (name, i)), "wb") as f:
                f.write(bytes([index]) + SEED + bytes(case))
    # Broken calls: each kind of break (decision bytes 200-208) on one of the first arguments
    # of a few entries (which one depends on the bytes the entry reads before its tensors).
    for index in (0, 1, 5, 13):
        for kind in range(9):
            dims = [0] * len(CASES[ENTRIES[index]][0])
            with open(os.path.join(out, "%s_broken_%d" % (ENTRIES[index], kind)), "wb") as f:
                f.write(bytes([index]) + SEED + bytes(dims) + bytes([0, 200 + kind, 0x85]))


if __name__ == "__main__":
    main()
