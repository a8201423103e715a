#!/usr/bin/env python3
"""Names and sums the kernels of an `ncu --csv --metrics gpu__time_duration.sum` run of
bench_block --profile 1 (tools/ncu_block.sh): one forward and backward of coda, then of the
GEMM-only side (12 cuBLASLt GEMMs), then of the unfused side. Prints each kernel with its time,
and each side's total.

  python3 tools/ncu_kernels.py block-1b-8192-kernels.csv
"""
import csv
import sys

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "second": 1e6, "s": 1e6}

# Fused kernels by the epilogue ops in their demangled names (first match wins).
FUSED = [("SwigluBackward", "K7 swiglu backward"), ("RmsNormBackward", "K6 rms backward"),
         ("LogSumExp", "K5 lse"), ("Rope", "K4 rope"), ("GatedPairStore", "K2 swiglu"),
         ("ResidualAdd", "K0 residual rms"), ("ScalePerRow", "K1 rms scale"),
         ("LinearEpilogue", "coda GEMM"), ("ScaleByScalar", "coda GEMM (staged)")]


def label(name):
    if "coda::sm90::gemm_kernel" in name:
        layout = next((l for l in ("fwd", "dgrad", "wgrad") if "GemmLayout)" + l in name
                       or "GemmLayout::" + l in name), "")
        for key, text in FUSED:
            if key in name:
                return text + (" " + layout if layout and text.startswith("coda GEMM") else "")
        return "coda GEMM kernel"
    if any(k in name for k in ("nvjet", "sm90_xmma", "cublas", "cutlass")):
        return "cuBLASLt"
    base = name.split("(")[0].split("<")[0]
    return base.split("::")[-1] or name[:60]


def main(path):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", "")) * UNIT.get(r["Metric Unit"], 1.0)
        rows.append((label(r["Kernel Name"]), us))
    # coda's side: up to the first cuBLASLt kernel; GEMM-only: the next 12; unfused: the rest.
    first_cublas = next((i for i, (n, _) in enumerate(rows) if n == "cuBLASLt"), len(rows))
    sides = [("coda", rows[:first_cublas]), ("GEMM-only", rows[first_cublas:first_cublas + 12]),
             ("unfused", rows[first_cublas + 12:])]
    for side, ks in sides:
        print("%s: %d kernels, %.1f us" % (side, len(ks), sum(us for _, us in ks)))
        for i, (n, us) in enumerate(ks):
            print("  %2d %-28s %9.1f" % (i, n, us))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
