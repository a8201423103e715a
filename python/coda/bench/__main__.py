"""python -m coda.bench: see coda/bench/__init__.py."""
import argparse
import json
import os
import sys
import time

from . import report


def _host_path_used():
    """What coda.ops' middle calls ran on: "built" (the C++ host path) or why not."""
    import coda._host_path

    return coda._host_path.reason()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m coda.bench",
                                description=sys.modules[__package__].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=None,
                   help="comma-separated: block-1b, block-8b, model-1b (default: all); with "
                        "--fp8: fp8-1b, fp8-8b (default: both)")
    p.add_argument("--fp8", action="store_true",
                   help="run the FP8 block comparison instead (issue 13): coda's middle block "
                        "in FP8 and in bf16, a plain-PyTorch FP8 block in torchao's tensorwise "
                        "recipe and the bf16 one, both under torch.compile, at the Llama-1B and "
                        "-8B shapes; writes bench/results/fp8_block.json unless --out says "
                        "otherwise (coda/bench/torch_fp8.py, docs/fp8.md)")
    p.add_argument("--torch-fp8-grad", default="e4m3", choices=("e4m3", "e5m2"),
                   help="--fp8: the torch FP8 side's gradient format (default e4m3, coda's; "
                        "e5m2 is torchao's default for grad_output)")
    p.add_argument("--out", default=None,
                   help="results JSON (default: bench/results/torch.json of the repository; "
                        "with --fp8, bench/results/fp8_block.json)")
    p.add_argument("--plot", default=None,
                   help="plot PNG (default: the --out path with .png; 'none' for no plot; "
                        "none with --fp8)")
    p.add_argument("--quick", action="store_true",
                   help="fwd+bwd only, 2 warm-up and 10 timed repetitions (about half the time; "
                        "compilation dominates what is left)")
    p.add_argument("--passes", default=None, help="comma-separated subset of fwd,bwd,fwd+bwd")
    p.add_argument("--sides", default=None,
                   help="comma-separated subset of eager,compile,coda,native (default: all; "
                        "native: block cases only; coda's layer through its C ABI, timed in "
                        "turn with coda); with --fp8, of coda,coda_fp8,coda_fp8_once,"
                        "torch_fp8,compile "
                        "(default: all)")
    p.add_argument("--profile", action="store_true",
                   help="after timing, run one fwd+bwd of the coda and native sides under "
                        "torch.profiler: print kernels, copies, launches, allocations, host vs "
                        "GPU time and the top operators, and record the counts (fwd+bwd "
                        "records' 'profile')")
    p.add_argument("--warmup", type=int, default=None, help="untimed repetitions (default 3)")
    p.add_argument("--iters", type=int, default=None, help="timed repetitions (default 20)")
    p.add_argument("--tokens", type=int, default=None, help="override every case's token count")
    p.add_argument("--layers", type=int, default=None, help="override model-1b's 16 layers")
    p.add_argument("--shape", default=None, choices=("1b", "8b", "tiny"),
                   help="override every case's shape (tiny: a smoke run of a few ms)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: torch's default mode)")
    p.add_argument("--coda-dispatcher", action="store_true",
                   help="coda's eager calls through the torch dispatcher, not the eager bypass "
                        "they take by default (coda.ops.set_eager_bypass(False))")
    p.add_argument("--host-ahead", action="store_true",
                   help="keep the GPU busy (filler GEMMs) while the host issues each timed "
                        "pass, so that the times are the GPU's work alone, as in a training "
                        "loop whose host runs ahead (coda/bench/timing.py)")
    p.add_argument("--merge", action="store_true",
                   help="keep the records of other cases already in --out (same commit only): run "
                        "the cases in several commands, one results file")
    p.add_argument("--no-check", action="store_true",
                   help="skip comparing coda's and compile's outputs and gradients with eager's "
                        "(with --fp8: the FP8 sides' with their bf16 counterparts')")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from .runner import (ALL_PASSES, CASES, FP8_CASES, FP8_SIDE_ORDER, SIDE_ORDER, Opts,
                         run_case)
    from .timing import L2Flush

    if not torch.cuda.is_available():
        print("coda.bench: no CUDA device; the benchmark needs one", file=sys.stderr)
        return 2
    known, side_order = (FP8_CASES, FP8_SIDE_ORDER) if args.fp8 else (CASES, SIDE_ORDER)
    cases = [c.strip() for c in (args.cases or ",".join(known)).split(",") if c.strip()]
    for c in cases:
        if c not in known:
            hint = (" (%s needs --fp8)" % c if c in FP8_CASES
                    else " (%s is not an --fp8 case)" % c if c in CASES else "")
            print("coda.bench: unknown case %r; choose from %s%s" % (c, ", ".join(known), hint),
                  file=sys.stderr)
            return 2
    passes = ("fwd+bwd",) if args.quick else ALL_PASSES
    if args.passes:
        passes = tuple(p.strip() for p in args.passes.split(","))
        bad = [p for p in passes if p not in ALL_PASSES]
        if bad:
            print("coda.bench: unknown pass %s; choose from %s" % (bad, ", ".join(ALL_PASSES)),
                  file=sys.stderr)
            return 2
    sides = tuple(s.strip() for s in (args.sides or ",".join(side_order)).split(",")
                  if s.strip())
    if not sides or any(s not in side_order for s in sides):
        print("coda.bench: --sides takes %s%s; got %r" % (", ".join(side_order),
                                                         " with --fp8" if args.fp8 else "",
                                                         args.sides), file=sys.stderr)
        return 2
    if args.fp8 and args.profile:
        print("coda.bench: --profile profiles the bf16 block cases, not --fp8", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    iters = args.iters if args.iters is not None else (10 if args.quick else 20)
    opts = Opts(warmup=warmup, iters=iters, passes=passes, sides=sides,
                check=not args.no_check, compile_mode=args.compile_mode,
                log=lambda s: print(s, flush=True), profile=args.profile,
                host_ahead=args.host_ahead, torch_fp8_grad=args.torch_fp8_grad)
    # Each case compiles new graphs; keep torch.compile from giving up on recompiles (the
    # setting's name changed across releases).
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))

    # coda's eager calls: the eager bypass (coda.ops' default) unless --coda-dispatcher.
    args.coda_eager_bypass = not args.coda_dispatcher
    if {"coda", "coda_fp8"} & set(sides):
        from . import coda_adapter

        coda_adapter.set_eager_bypass(args.coda_eager_bypass)
    if args.fp8:
        return main_fp8(args, cases, opts)
    out = args.out or report.default_out()
    meta = report.metadata()
    old = results_to_merge(args, out, meta["commit"], "cases")
    if old is False:
        return 2
    print("coda.bench on %s, torch %s, commit %s: warm-up %d, %d timed, passes %s"
          % (meta["gpu"], meta["torch"], meta["commit"], warmup, iters, ",".join(passes)),
          flush=True)
    flush = L2Flush(host_ahead=args.host_ahead)
    t0 = time.perf_counter()
    records = []
    for c in cases:
        records += run_case(c, opts, flush, tokens=args.tokens, shape=args.shape,
                            layers=args.layers if c.startswith("model") else None)
    if old is not None:
        records = [r for r in old["cases"] if r.get("case") not in set(cases)] + records
        order = {c: i for i, c in enumerate(CASES)}
        records.sort(key=lambda r: order.get(r["case"], len(order)))
    results = dict(meta)
    results.update({
        "quick": bool(args.quick), "warmup": warmup, "iters": iters,
        "coda_eager_bypass": bool(args.coda_eager_bypass),
        "coda_host_path": _host_path_used(),
        "host_ahead": bool(args.host_ahead),
        "timing": report.TIMING_DEFINITION + (report.HOST_AHEAD_DEFINITION
                                              if args.host_ahead else ""), "memory": report.MEMORY_DEFINITION,
        "native": report.NATIVE_DEFINITION,
        "cases": records,
    })
    report.write(results, out)
    print("wrote %s (%.0f s)" % (out, time.perf_counter() - t0))
    plot_path = args.plot or os.path.splitext(out)[0] + ".png"
    if plot_path.lower() != "none":
        done = report.plot(results, plot_path)
        print("wrote %s" % done if done else "no plot (matplotlib missing or no numbers)")
    print()
    print(summary(results))
    return 0


def results_to_merge(args, out, commit, key):
    """--merge: the results already at `out`, whose `key` list this run adds to; None without
    --merge or without the file; False, after saying why, when they are another commit's (or
    lack `key`)."""
    if not (args.merge and os.path.exists(out)):
        return None
    with open(out) as f:
        old = json.load(f)
    if old.get("commit") != commit or key not in old:
        print("coda.bench: --merge: %s holds commit %s, not %s; not merging"
              % (out, old.get("commit"), commit), file=sys.stderr)
        return False
    return old


def main_fp8(args, cases, opts):
    """--fp8: the FP8 block cases, written as issue 13 asks (report.validate_fp8_block)."""
    from .runner import run_fp8_case
    from .timing import L2Flush

    out = args.out or report.default_out("fp8_block.json")
    meta = report.metadata()
    meta.pop("torch")  # after issue 13's four keys (below)
    old = results_to_merge(args, out, meta["commit"], "block")
    if old is False:
        return 2
    import torch

    print("coda.bench --fp8 on %s, torch %s, commit %s: warm-up %d, %d timed, passes %s, "
          "sides %s" % (meta["gpu"], torch.__version__, meta["commit"], opts.warmup, opts.iters,
                        ",".join(opts.passes), ",".join(opts.sides)), flush=True)
    flush = L2Flush(host_ahead=args.host_ahead)
    t0 = time.perf_counter()
    records = []
    for c in cases:
        records += run_fp8_case(c, opts, flush, tokens=args.tokens, shape=args.shape)
    if old is not None:
        ran = {r["case"] for r in records}
        records = [r for r in old["block"] if r.get("case") not in ran] + records
    results = dict(meta, block=records)
    results.update({
        "torch": torch.__version__, "quick": bool(args.quick), "warmup": opts.warmup,
        "iters": opts.iters, "host_ahead": bool(args.host_ahead),
        "coda_eager_bypass": bool(args.coda_eager_bypass),
        "coda_host_path": _host_path_used(),
        "torch_fp8_grad": opts.torch_fp8_grad,
        "definition": report.FP8_BLOCK_DEFINITION, "torch_fp8": report.TORCH_FP8_DEFINITION,
        "check": report.FP8_CHECK_DEFINITION if opts.check else "skipped (--no-check)",
        "timing": report.TIMING_DEFINITION + (report.HOST_AHEAD_DEFINITION
                                              if args.host_ahead else ""),
        "memory": report.MEMORY_DEFINITION,
    })
    report.write_fp8_block(results, out)
    print("wrote %s (%.0f s)" % (out, time.perf_counter() - t0))
    print()
    print(summary_fp8(results))
    return 0


def summary_fp8(results):
    """The --fp8 table: the four times, coda FP8's speed-up over coda bf16 and over torch FP8,
    torch FP8's over torch bf16."""
    lines = ["%-9s %6s %-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s" % (
        "model", "tokens", "pass", "fp8 ms", "once ms", "bf16 ms", "t.fp8 ms", "t.bf16 ms",
        "bf16/fp8", "t.fp8/fp8", "fp8/once", "t.bf16/t.fp8")]

    def f(v, fmt):
        return fmt % v if v is not None else "-"

    def ratio(a, b):
        return a / b if a and b else None

    for r in results["block"]:
        fp8, bf16, tfp8, tbf16 = r["fp8_ms"], r["bf16_ms"], r["torch_fp8_ms"], r.get(
            "torch_bf16_ms")
        once = r.get("fp8_once_ms")
        lines.append("%-9s %6d %-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s" % (
            r["model"], r["tokens"], r["pass"], f(fp8, "%.3f"), f(once, "%.3f"), f(bf16, "%.3f"),
            f(tfp8, "%.3f"), f(tbf16, "%.3f"), f(ratio(bf16, fp8), "%.3fx"),
            f(ratio(tfp8, fp8), "%.3fx"), f(ratio(fp8, once), "%.3fx"),
            f(ratio(tbf16, tfp8), "%.3fx")))
    # Every pass's record carries its case's warnings and errors: say each once.
    said = []
    for r in results["block"]:
        for w in r.get("warnings", ()):
            said.append("WARNING %s: %s" % (r["model"], w))
        for side, e in sorted(r.get("errors", {}).items()):
            said.append("error %s, %s: %s" % (r["model"], side, e))
    lines += sorted(set(said), key=said.index)
    return "\n".join(lines)


def summary(results):
    lines = ["%-16s %-8s %10s %10s %10s %8s %8s %10s %8s %9s %9s %9s" % (
        "case", "pass", "coda ms", "eager ms", "compile ms", "vs eag", "vs comp", "native ms",
        "coda/nat", "coda MiB", "eager MiB", "comp MiB")]

    def f(v, fmt):
        return fmt % v if v is not None else "-"

    for r in results["cases"]:
        c, e, t, n = r["coda_ms"], r["eager_ms"], r["compile_ms"], r.get("native_ms")
        lines.append("%-16s %-8s %10s %10s %10s %8s %8s %10s %8s %9s %9s %9s" % (
            report.label(r), r["pass"], f(c, "%.3f"), f(e, "%.3f"), f(t, "%.3f"),
            f(e / c if c and e else None, "%.2fx"), f(t / c if c and t else None, "%.2fx"),
            f(n, "%.3f"), f(c / n if c and n else None, "%.3f"),
            f(r["coda_peak_mib"], "%.0f"), f(r["eager_peak_mib"], "%.0f"),
            f(r["compile_peak_mib"], "%.0f")))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
