#!/usr/bin/env python3
"""Regenerate the tables of docs/PERFORMANCE.md from bench/results/*.json.

Usage: tools/perf_tables.py [--check]
Each table lives between <!-- NAME:begin --> and <!-- NAME:end --> markers, so hand-written text
around it survives. --check exits 1 when the file is out of date instead of rewriting it.
"""
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "PERFORMANCE.md")


def tflops(case, ms):
    return 2.0 * case["m"] * case["n"] * case["k"] / (ms * 1e9)


def gemm_table(results):
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. bf16 inputs and output, fp32 accumulate; median of 50 runs,"
        " L2 flushed before each; cuBLASLt runs its heuristic's first algorithm."
        % (results["gpu"], results["date"], results["commit"]),
        "",
        "| case | layout | M | N | K | coda TFLOP/s | cuBLASLt TFLOP/s | cuBLASLt ms / coda ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for c in results["cases"]:
        ratio = c["cublas_ms"] / c["coda_ms"]
        if c["layout"] != "square":
            ratios.append(ratio)
        lines.append(
            "| %s | %s | %d | %d | %d | %.0f | %.0f | %.3f |"
            % (c["name"], c["layout"], c["m"], c["n"], c["k"], tflops(c, c["coda_ms"]),
               tflops(c, c["cublas_ms"]), ratio))
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines += ["", "Over the %d Llama block GEMMs: geometric mean %.3f, minimum %.3f."
                  % (len(ratios), geomean, min(ratios))]
    return "\n".join(lines)


def fused_table(results):
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. bf16, M = 8192 tokens; median of 50 runs, L2 flushed"
        " before each; every column measured in one process on the same inputs."
        % (results["gpu"], results["date"], results["commit"]),
        "",
        "| kernel | model | M | N | K | fused ms | fused / coda GEMM | fused / cuBLASLt | unfused / fused |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["cases"]:
        lines.append(
            "| %s | %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f |"
            % (c["kernel"], c["model"], c["m"], c["n"], c["k"], c["coda_ms"],
               c["coda_ms"] / c["coda_gemm_ms"], c["coda_ms"] / c["cublas_ms"],
               c["unfused_ms"] / c["coda_ms"]))
    hidden = [c["coda_ms"] / c["coda_gemm_ms"] for c in results["cases"]]
    faster = sum(1 for c in results["cases"] if c["unfused_ms"] > c["coda_ms"])
    if hidden:
        lines += ["", "Fused / plain GEMM: best %.3f, worst %.3f (target <= 1.02). Faster than the"
                  " unfused path in %d of %d cases." % (min(hidden), max(hidden), faster,
                                                       len(hidden))]
    return "\n".join(lines)


TABLES = {"gemm": ("gemm.json", gemm_table), "fused": ("fused.json", fused_table)}


def replace_section(text, name, body):
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    block = "%s\n%s\n%s" % (begin, body, end)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main():
    check = "--check" in sys.argv[1:]
    text = open(DOC).read() if os.path.exists(DOC) else "# Performance\n"
    updated = text
    for name, (json_name, render) in TABLES.items():
        path = os.path.join(ROOT, "bench", "results", json_name)
        if os.path.exists(path):
            with open(path) as f:
                updated = replace_section(updated, name, render(json.load(f)))
    if check:
        return 0 if updated == text else 1
    with open(DOC, "w") as f:
        f.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
