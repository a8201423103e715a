#!/usr/bin/env python3
"""Compares two soak runs of examples/train_llama.py --soak (same seed, same commit):
  * no NaN or Inf in either run's losses or gradient norms;
  * the loss curves bitwise identical (float32 bits of every step's loss);
  * no growth of allocated CUDA memory after the first steps: max over steps >= --settle of
    allocated bytes, minus the value at step --settle, at most --growth bytes (default 0).

Usage: tools/soak_compare.py RUN1/soak.json RUN2/soak.json [--settle 10] [--growth 0]
                             [--markdown FILE]
Prints the numbers (and writes them as a Markdown table with --markdown); exits 1 on a failure.
"""
import argparse
import json
import math
import sys


def memory_growth(allocated, settle):
    if len(allocated) <= settle:
        return None, None
    base = allocated[settle - 1]
    return base, max(allocated[settle - 1:]) - base


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs=2)
    p.add_argument("--settle", type=int, default=10, help="steps before memory must be flat")
    p.add_argument("--growth", type=int, default=0, help="allowed growth in bytes")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    runs = [json.load(open(path)) for path in args.runs]
    failures, rows = [], []
    for name, r in zip(("run 1", "run 2"), runs):
        bad = [i + 1 for i, (x, g) in enumerate(zip(r["loss"], r["grad_norm"]))
               if not (math.isfinite(x) and math.isfinite(g))]
        base, growth = memory_growth(r["allocated"], args.settle)
        rows.append((name, r["steps"], r["loss"][0], r["loss"][-1], len(bad), base, growth,
                     r.get("max_allocated"), r.get("seconds")))
        if bad:
            failures.append("%s: NaN or Inf at steps %s" % (name, bad[:10]))
        if growth is None:
            failures.append("%s: fewer than %d steps" % (name, args.settle))
        elif growth > args.growth:
            failures.append("%s: allocated memory grew by %d bytes after step %d"
                            % (name, growth, args.settle))
    a, b = runs[0]["loss_bits"], runs[1]["loss_bits"]
    differ = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b):
        failures.append("the runs have %d and %d steps" % (len(a), len(b)))
    if differ:
        i = differ[0] - 1
        failures.append("loss curves differ at %d steps, first at step %d (%s vs %s)"
                        % (len(differ), differ[0], runs[0]["loss"][i], runs[1]["loss"][i]))
    for key in ("commit", "seed", "gpu", "torch"):
        if runs[0].get(key) != runs[1].get(key):
            failures.append("the runs differ in %s: %s vs %s" % (key, runs[0].get(key),
                                                                 runs[1].get(key)))

    lines = ["Soak: commit `%s`, %s, torch %s, seed %s, %d steps each." % (
        runs[0].get("commit"), runs[0].get("gpu"), runs[0].get("torch"), runs[0].get("seed"),
        runs[0]["steps"]), "",
        "| run | steps | first loss | last loss | NaN/Inf steps | allocated at step %d (bytes) |"
        " growth after (bytes) | peak allocated (bytes) | seconds |" % args.settle,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, steps, first, last, bad, base, growth, peak, seconds in rows:
        lines.append("| %s | %d | %.6f | %.6f | %d | %s | %s | %s | %s |" % (
            name, steps, first, last, bad, base, growth, peak,
            "%.1f" % seconds if seconds is not None else "-"))
    lines += ["", "Loss curves: %s (%d of %d steps with different float32 bits)." % (
        "bitwise identical" if not differ and len(a) == len(b) else "DIFFERENT", len(differ),
        len(a))]
    lines += ["", "Result: %s" % ("PASS" if not failures else "FAIL: " + "; ".join(failures))]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
