#!/usr/bin/env python3
"""Summarize a kernel's warp-stall samples from the SASS CSV that tools/ncu_epilogue.sh writes
(`ncu --import R --page source --csv --print-source sass`): the total, the share by stall
reason, and the instructions with the most samples, each with its main reasons.

usage: tools/ncu_stalls.py K0-FusedEpilogue-sass.csv [--top 25] [--range FIRST:LAST] [--launch N]
       tools/ncu_stalls.py fp8-sass.csv --launch N --mix   (instructions a k-block, by opcode)

--range restricts everything to SASS lines FIRST..LAST (0-based, as printed), e.g. the epilogue
after the mainloop. Samples at UCGABAR_WAIT (warps parked at the final cluster barrier: the
producer warpgroup's idle warps) are reported apart, since they are no one's stall."""

import argparse
import collections
import csv
import sys


def load(path, launch=0):
    """(kernel row, header, instruction rows) of the `launch`-th kernel in the CSV: each
    profiled launch is a row naming the kernel, a header row, then one row per SASS
    instruction (tools/ncu_fp8.sh's CSV holds every launch of its report)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, row in enumerate(rows) if row and row[0] == "Kernel Name"] or [0]
    if launch >= len(starts):
        raise SystemExit("%s holds %d launches; --launch %d" % (path, len(starts), launch))
    first = starts[launch]
    end = starts[launch + 1] if launch + 1 < len(starts) else len(rows)
    return rows[first], rows[first + 1], rows[first + 2:end]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--range", default="")
    ap.add_argument("--launch", type=int, default=0,
                    help="which profiled launch of a CSV holding several (0: the first)")
    ap.add_argument("--mix", action="store_true",
                    help="instead: the executed instructions by opcode, per k-block and consumer "
                         "warp (an FP8 or 16-bit GEMM's MMAs counted: every k-block issues "
                         "--mmas-per-k-block of them a warp)")
    ap.add_argument("--mmas-per-k-block", type=int, default=4)
    args = ap.parse_args(argv)

    kernel, header, rows = load(args.csv, args.launch)
    if args.mix:
        return print_mix(kernel, header, rows, args.mmas_per_k_block)
    samples = header.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header)
               if h.startswith("stall_") and "Not Issued" not in h]
    first, last = 0, len(rows) - 1
    if args.range:
        a, b = args.range.split(":")
        first, last = int(a), int(b)

    def count(row, i):
        return int(row[i]) if row[i].isdigit() else 0

    total = parked = 0
    by_reason = collections.Counter()
    picked = []
    for n in range(first, last + 1):
        row = rows[n]
        s = count(row, samples)
        if "UCGABAR_WAIT" in row[1]:
            parked += s
            continue
        total += s
        for i, name in reasons:
            by_reason[name] += count(row, i)
        picked.append((s, n, row))

    print(kernel[1][:160] if len(kernel) > 1 else args.csv)
    print("samples: %d (lines %d..%d), plus %d parked at the final cluster barrier"
          % (total, first, last, parked))
    print("by reason: " + ", ".join("%s %.1f%%" % (k, 100.0 * v / max(total, 1))
                                    for k, v in by_reason.most_common(8)))
    for s, n, row in sorted(picked, key=lambda x: -x[0])[:args.top]:
        main_reasons = sorted(((count(row, i), name) for i, name in reasons), reverse=True)[:2]
        print("%6d %5.1f%% %5d  %-58s %s" % (
            s, 100.0 * s / max(total, 1), n, row[1].strip()[:58],
            " ".join("%s:%d" % (name, c) for c, name in main_reasons if c)))


def print_mix(kernel, header, rows, mmas_per_k_block, top=18):
    """Every warp's executed instructions by opcode (predicate and modifiers dropped), divided by
    the k-blocks x consumer warps the MMA count implies: an upper bound of a consumer warp's
    chain a k-block (the producer's and epilogue's instructions are included)."""
    executed = header.index("Instructions Executed")

    def count(row):
        v = row[executed].replace(",", "")
        return int(v) if v.isdigit() else 0

    ops = collections.Counter()
    for row in rows:
        words = [w for w in row[1].split() if not w.startswith("@")]
        if words and count(row):
            ops[words[0].split(".")[0]] += count(row)
    mmas = sum(v for op, v in ops.items() if op.endswith("GMMA"))
    if not mmas:
        raise SystemExit("no HGMMA / QGMMA executed in this launch")
    per = mmas / float(mmas_per_k_block)
    print(kernel[1][:160] if len(kernel) > 1 else "")
    print("%.1f instructions a k-block and consumer warp (%d k-blocks x warps): %s" % (
        sum(ops.values()) / per, per,
        ", ".join("%s %.1f" % (op, v / per) for op, v in ops.most_common(top))))


if __name__ == "__main__":
    main(sys.argv[1:])
