#!/usr/bin/env python3
"""Names and sums the kernels of an `ncu --csv --metrics gpu__time_duration.sum` run of
bench_block --profile 1 (tools/ncu_block.sh): one forward and backward of coda, then of the
GEMM-only side (12 cuBLASLt GEMMs), then of the unfused side, then of coda's FP8 side (from its
first quantizer on; absent where bench_block could not run it). Prints each kernel with its time,
and each side's total with its GEMMs', quantizers' and other kernels' shares.

  python3 tools/ncu_kernels.py block-1b-8192-kernels.csv
  python3 tools/ncu_kernels.py --json OUT.json --commit C --date D DIR
      writes the kernels of DIR/block-{1b,8b}-8192-kernels.csv (ncu_block.sh's output folder,
      its GPU from DIR/block-1b-bench.json) as bench/results/experiments' ncu-block-kernels-*
      files hold them: each kernel's full name (cut to 200 characters) and time in us.
"""
import csv
import json
import os
import sys

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "second": 1e6, "s": 1e6}

# Fused kernels by the epilogue ops in their demangled names (first match wins).
FUSED = [("SwigluBackward", "K7 swiglu backward"), ("RmsNormBackward", "K6 rms backward"),
         ("LogSumExp", "K5 lse"), ("Rope", "K4 rope"), ("GatedPairStore", "K2 swiglu"),
         ("ResidualAdd", "K0 residual rms"), ("ScalePerRow", "K1 rms scale"),
         ("LinearEpilogue", "coda GEMM"), ("ScaleByScalar", "coda GEMM (staged)")]


def label(name):
    if "quantize_activation_kernel" in name:
        return "quantize activation"
    if "quantize_weight_kernel" in name:  # (also the weight gradient's X in 128 x 128 blocks)
        return "quantize weight"
    if "sm90::gemm_kernel" in name and "Fp8Mainloop" in name:  # a fused kernel's, or gemm_fp8's
        for key, text in FUSED:
            if key in name and not text.startswith("coda GEMM"):
                return text + " (FP8)"
        return "gemm_fp8"
    if "sm90::gemm_kernel" in name:  # (ncu prints it with or without coda::)
        layout = next((l for l in ("fwd", "dgrad", "wgrad") if "GemmLayout)" + l in name
                       or "GemmLayout::" + l in name), "")
        for key, text in FUSED:
            if key in name:
                return text + (" " + layout if layout and text.startswith("coda GEMM") else "")
        return "coda GEMM kernel"
    if any(k in name for k in ("nvjet", "sm90_xmma", "cublas", "cutlass")):
        return "cuBLASLt"
    for anonymous in ("<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(anonymous, "")
    base = name.split("(")[0].split("<")[0]
    if base.startswith("void "):
        base = base[len("void "):]
    return base.split("::")[-1] or name[:60]


def category(text):
    """GEMM, quantizer or other, for a side's summary."""
    if text.startswith("quantize"):
        return "quantizers"
    if text == "cuBLASLt" or text.startswith(("K", "coda GEMM", "gemm_fp8")):
        return "GEMMs"
    return "other"


def kernels(path):
    """(full kernel name, us) of each kernel of an ncu CSV, in launch order."""
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", "")) * UNIT.get(r["Metric Unit"], 1.0)
        rows.append((r["Kernel Name"], us))
    return rows


def write_json(out, commit, date, folder):
    with open(os.path.join(folder, "block-1b-bench.json")) as f:
        gpu = json.load(f)["gpu"]
    models = {}
    for m in ("1b", "8b"):
        path = os.path.join(folder, "block-%s-8192-kernels.csv" % m)
        if os.path.exists(path):
            models["llama-" + m] = [{"kernel": n[:200], "us": round(us, 3)}
                                    for n, us in kernels(path)]
    doc = {"gpu": gpu, "date": date, "commit": commit,
           "how": "tools/ncu_block.sh MODEL 8192 (ncu --cache-control all --clock-control none, "
                  "gpu__time_duration.sum, bench_block --profile 1: one forward and backward of "
                  "each side in order coda, GEMM-only, unfused, coda FP8), kernel names cut to "
                  "200 characters; written by tools/ncu_kernels.py --json from the CSV",
           "models": models}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0


def main(path):
    rows = [(label(n), us) for n, us in kernels(path)]
    # coda's side: up to the first cuBLASLt kernel; GEMM-only: the next 12; unfused: up to the
    # first quantizer after them (the unfused side has none); coda FP8: the rest.
    first_cublas = next((i for i, (n, _) in enumerate(rows) if n == "cuBLASLt"), len(rows))
    unfused = first_cublas + 12
    fp8 = next((i for i in range(unfused, len(rows)) if rows[i][0].startswith("quantize")),
               len(rows))
    sides = [("coda", rows[:first_cublas]), ("GEMM-only", rows[first_cublas:unfused]),
             ("unfused", rows[unfused:fp8]), ("coda FP8", rows[fp8:])]
    for side, ks in sides:
        if not ks:
            continue
        total = sum(us for _, us in ks)
        parts = {}
        for n, us in ks:
            parts[category(n)] = parts.get(category(n), 0.0) + us
        print("%s: %d kernels, %.1f us (%s)" % (
            side, len(ks), total, ", ".join("%s %.1f" % (c, parts[c]) for c in
                                            ("GEMMs", "quantizers", "other") if c in parts)))
        for i, (n, us) in enumerate(ks):
            print("  %2d %-28s %9.1f" % (i, n, us))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--json":
        opts = dict(zip(sys.argv[1:-1:2], sys.argv[2:-1:2]))
        sys.exit(write_json(opts["--json"], opts["--commit"], opts["--date"], sys.argv[-1]))
    sys.exit(main(sys.argv[1]))
