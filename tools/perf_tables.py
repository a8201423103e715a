#!/usr/bin/env python3
"""Regenerate the tables of docs/PERFORMANCE.md and the status table of README.md from
bench/results/*.json.

Usage: tools/perf_tables.py [--check]
Each table lives between <!-- NAME:begin --> and <!-- NAME:end --> markers, so hand-written text
around it survives. --check exits 1 when either file is out of date instead of rewriting it.
Where matplotlib is installed, the block benchmark's plot (bench/results/block.png, next to
block.json) is redrawn too (not with --check); the table links it whenever the file exists.
"""
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "PERFORMANCE.md")
README = os.path.join(ROOT, "README.md")


def tflops(case, ms):
    return 2.0 * case["m"] * case["n"] * case["k"] / (ms * 1e9)


def _figure_link(path, alt):
    """The Markdown lines that show the plot at `path` in docs/PERFORMANCE.md, where it exists."""
    if not os.path.exists(path):
        return []
    return ["", "![%s](%s)" % (alt, os.path.relpath(path, os.path.dirname(DOC)))]


def _pyplot():
    """matplotlib.pyplot on the file-only backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _runs(results):
    """The number of timed runs behind each median: the JSON's "runs"; files written before the
    benchmarks recorded it (bench_gemm, bench_fused until 2026-12-06) ran their default, 50."""
    return results.get("runs", 50)


def gemm_table(results):
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. bf16 inputs and output, fp32 accumulate; median of %s"
        " runs, L2 flushed before each; cuBLASLt runs its heuristic's first algorithm."
        % (results["gpu"], results["date"], results["commit"], _runs(results)),
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
    lines += _figure_link(GEMM_PLOT, "coda and cuBLASLt TFLOP/s per GEMM")
    return "\n".join(lines)


GEMM_PLOT = os.path.join(ROOT, "bench", "results", "gemm.png")


def gemm_plot(results):
    """TFLOP/s of coda and cuBLASLt per case; skipped without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    cases = results["cases"]
    xs = range(len(cases))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(cases)), 4.0))
    ax.bar([x - width / 2 for x in xs], [tflops(c, c["coda_ms"]) for c in cases], width,
           label="coda")
    ax.bar([x + width / 2 for x in xs], [tflops(c, c["cublas_ms"]) for c in cases], width,
           label="cuBLASLt")
    ax.axhline(989, color="black", linewidth=0.8, linestyle="--", label="dense bf16 peak")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([c["name"] for c in cases], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("bf16 GEMM, %s (%s)" % (results["gpu"], results["commit"]))
    ax.legend(fontsize=8, loc="lower right")
    _save(plt, fig, GEMM_PLOT)
    return True


def _is_fp8(case):
    """bench_fused's FP8 cases say "precision": "fp8"; the others are on 16-bit operands."""
    return case.get("precision") == "fp8"


def _bf16_cases(results):
    return [c for c in results["cases"] if not _is_fp8(c)]


def _fp8_cases(results):
    return [c for c in (results or {}).get("cases", []) if _is_fp8(c)]


def fused_fp8_table(cases):
    """bench_fused's FP8 cases: each kernel on E4M3 operands against gemm_fp8 of its shape (its
    floor), the bf16 kernel and the unfused path (gemm_fp8 and the bf16 case's kernels)."""
    # Runs before the staged FP8 tile was the default timed it forced only (no cooperative column).
    staged_default = any("coda_cooperative_ms" in c for c in cases)
    tile = ("its default tile: the staged 128 x 128 where it has one, else the cooperative"
            " 128 x 128" if staged_default else "the FP8 mainloop's cooperative 128 x 128 tile")
    lines = [
        "", "With E4M3 operands (docs/fp8.md; a and w quantized from the bf16 inputs, the input"
        " gradients' w the weight's transposed copy; the fused kernel on %s; the two tiles"
        " forced where a kernel has both):" % tile, "",
        "| kernel | model | layout | M | N | K | FP8 fused ms | fused / gemm_fp8 |"
        " bf16 fused / FP8 fused | unfused / fused | cooperative / gemm_fp8 | staged / gemm_fp8 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def over_gemm(c, key):  # a forced tile's time over gemm_fp8's, "-" where not timed
        return "%.3f" % (c[key] / c["coda_gemm_ms"]) if c.get(key) else "-"

    for c in cases:
        lines.append("| %s | %s | %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f | %s | %s |"
                     % (c["kernel"], c["model"], c.get("layout", "fwd"), c["m"], c["n"], c["k"],
                        c["coda_ms"], c["coda_ms"] / c["coda_gemm_ms"],
                        c["bf16_fused_ms"] / c["coda_ms"], c["unfused_ms"] / c["coda_ms"],
                        over_gemm(c, "coda_cooperative_ms"), over_gemm(c, "coda_staged_ms")))
    over = [c["coda_ms"] / c["coda_gemm_ms"] for c in cases]
    speedup = [c["bf16_fused_ms"] / c["coda_ms"] for c in cases]
    lines += ["", "FP8 fused / gemm_fp8: %.3f to %.3f; the bf16 kernel's time over the FP8"
              " kernel's: %.3f to %.3f." % (min(over), max(over), min(speedup), max(speedup))]
    return lines


def fused_fp8_only_table(results):
    """bench/results/fused_fp8.json: a run of `bench_fused --filter fp8` (the FP8 cases alone)."""
    return "\n".join([
        "GPU: %s. Date: %s. Commit: `%s`. `bench_fused --filter fp8`: M = 8192 tokens; median of %s"
        " runs, L2 flushed before each; every column measured in one process on the same inputs."
        % (results["gpu"], results["date"], results["commit"], _runs(results))]
        + fused_fp8_table(_fp8_cases(results)))


def fused_table(results):
    # The schedule columns: each kernel forced onto each schedule it was timed on (a key missing,
    # e.g. K6 on ping-pong: "-"). K6's staged column is the staged_wide 128 x 256 tile.
    fp8 = _fp8_cases(results)
    results = dict(results, cases=_bf16_cases(results))
    sched = [("coda_cooperative_ms", "cooperative"), ("coda_pingpong_ms", "ping-pong"),
             ("coda_staged_ms", "staged")]
    sched = [(k, n) for k, n in sched if any(k in c for c in results["cases"])]
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. bf16, M = 8192 tokens; median of %s runs, L2 flushed"
        " before each; every column measured in one process on the same inputs. The schedule"
        " columns are the same kernel forced onto each GEMM schedule, over the plain GEMM (K6's"
        " staged column: the staged_wide 128 x 256 tile; -: no such variant)."
        % (results["gpu"], results["date"], results["commit"], _runs(results)),
        "",
        "| kernel | model | layout | M | N | K | fused ms | fused / coda GEMM | fused / cuBLASLt |"
        " unfused / fused |" + "".join(" %s |" % n for _, n in sched),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(sched),
    ]
    for c in results["cases"]:
        lines.append(
            "| %s | %s | %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f |"
            % (c["kernel"], c["model"], c.get("layout", "fwd"), c["m"], c["n"], c["k"],
               c["coda_ms"], c["coda_ms"] / c["coda_gemm_ms"], c["coda_ms"] / c["cublas_ms"],
               c["unfused_ms"] / c["coda_ms"])
            + "".join(" %s |" % ("%.3f" % (c[k] / c["coda_gemm_ms"]) if k in c else "-")
                      for k, _ in sched))
    hidden = [c["coda_ms"] / c["coda_gemm_ms"] for c in results["cases"]]
    faster = sum(1 for c in results["cases"] if c["unfused_ms"] > c["coda_ms"])
    if hidden:
        lines += ["", "Fused / plain GEMM: best %.3f, worst %.3f (target <= 1.05, aim 1.02). Faster"
                  " than the unfused path in %d of %d cases." % (min(hidden), max(hidden), faster,
                                                                len(hidden))]
    if fp8:
        lines += fused_fp8_table(fp8)
    return "\n".join(lines)


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def fp8_table(results):
    """bench/results/fp8.json (bench_gemm_fp8): gemm_fp8 against cuBLASLt's FP8 GEMMs and bf16.
    The other tiles' and forms' times that a result carries get a column each, as that time over
    coda's (gemm_fp8's default tile): above 1 where the default is faster."""
    cases = results["cases"]
    # (key, column title, caption text) of the optional columns, in order.
    optional = [
        ("coda_wgrad_blocks_ms", "wgrad blocks / coda",
         "wgrad blocks: the same f32 D added into with B scaled by 128 x 128 blocks (the"
         " read-modify-write without the per-column promotion)."),
        ("coda_tile128_ms", "cooperative 128 / coda",
         "cooperative 128: the 128 x 128 tile on the cooperative schedule."),
        ("coda_tile192_ms", "192 / coda",
         "192: the 128 x 192 tile (its halves' overlapped promotion)."),
        ("coda_tile192_one_partial_ms", "192 one partial / coda",
         "192 one partial: the same tile promoting each k-block after its batch drains."),
    ]
    optional = [o for o in optional if any(c.get(o[0]) for c in cases)]
    # Since the staged fp32 scales (9371523) gemm_fp8 picks its tile per shape, and the bench
    # reuses the chosen column's time for coda's (equal times tell that choice apart).
    per_shape = any(c.get("coda_tile192_one_partial_ms") == c.get("coda_ms") for c in cases)
    default = ("coda: gemm_fp8's tile for the shape (`choose_fp8_tile`: the staged 128 x 128 tile,"
               " or the one-partial 128 x 192 tile where it saves enough waves; its column then"
               " reads 1.000)." if per_shape else
               "coda: gemm_fp8's default tile (the staged 128 x 128 tile where it applies)."
               if any("coda_staged_ms" in c for c in cases) else "")
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. E4M3 inputs with coda's block scales (1 x 128 for A,"
        " 128 x 128 for B), fp32 accumulation promoted per 128-wide K block, bf16 output; median"
        " of %s runs, L2 flushed before each, all columns in one process on the same inputs."
        " cuBLASLt block-scaled: the same codes and scales (its scale layout found by agreement"
        " with coda's output, `rel err` its distance); per-tensor: `-` where cuBLASLt refused the"
        " call; bf16: cuBLASLt on bf16 operands of the same shape. wgrad form: gemm_fp8 with B"
        " scaled by rows and an f32 D accumulated into (the weight gradient's GEMM)."
        % (results["gpu"], results["date"], results["commit"], _runs(results))
        + "".join(" " + text for text in [default] + [o[2] for o in optional] if text),
        "",
        "| case | M | N | K | coda TFLOP/s | cuBLASLt block-scaled TFLOP/s | cuBLASLt bf16 TFLOP/s |"
        " block-scaled ms / coda ms | bf16 ms / coda ms | wgrad form / coda |"
        + "".join(" %s |" % o[1] for o in optional) + " rel err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(optional) + "---:|",
    ]
    block, bf16, wgrad = [], [], []
    others = {o[0]: [] for o in optional}
    for c in cases:
        b, h = c.get("cublas_blockscaled_ms"), c.get("cublas_bf16_ms")
        w = c.get("coda_wgrad_form_ms")
        block_gemm = not c["name"].startswith("square")
        if b and block_gemm:
            block.append(b / c["coda_ms"])
        if h and block_gemm:
            bf16.append(h / c["coda_ms"])
        if w and block_gemm:
            wgrad.append(w / c["coda_ms"])
        cells = ""
        for key, _, _ in optional:
            t = c.get(key)
            if t and block_gemm:
                others[key].append(t / c["coda_ms"])
            cells += "%s | " % ("%.3f" % (t / c["coda_ms"]) if t else "-")
        lines.append("| %s | %d | %d | %d | %.1f | %s | %s | %s | %s | %s | %s%s |" % (
            c["name"], c["m"], c["n"], c["k"], tflops(c, c["coda_ms"]),
            "%.1f" % tflops(c, b) if b else "-", "%.1f" % tflops(c, h) if h else "-",
            "%.3f" % (b / c["coda_ms"]) if b else "-", "%.3f" % (h / c["coda_ms"]) if h else "-",
            "%.3f" % (w / c["coda_ms"]) if w else "-", cells,
            "%.1e" % c["max_rel_err"] if c.get("max_rel_err") is not None else "-"))
    lines += ["", "Over the %d block GEMMs: cuBLASLt block-scaled / coda %.3f geomean (minimum"
              " %.3f; the target is >= 0.95), cuBLASLt bf16 / coda %.3f, wgrad form / coda %.3f"
              % (len(block), _geomean(block), min(block) if block else float("nan"),
                 _geomean(bf16), _geomean(wgrad))
              + "".join(", %s %.3f" % (title, _geomean(others[key]))
                        for key, title, _ in optional) + "."]
    return "\n".join(lines)


def _fmt(v, fmt):
    return fmt % v if v is not None else "-"


def _ratio(num, den):
    return num / den if num is not None and den else None


def _torch_case(c):
    """The case name, with the shape when it is not the case's own (a smoke run)."""
    shape = c.get("shape")
    return c["case"] if shape in (None, c["case"].split("-")[-1]) else "%s (%s)" % (c["case"], shape)


def torch_table(results):
    """bench/results/torch.json (python -m coda.bench): coda vs PyTorch eager and torch.compile,
    and, where the results have them (the block cases, since the native side came), coda's
    layer through its C ABI alone (native ms) with the overhead target on coda / native."""
    native = any(c.get("native_ms") is not None for c in results["cases"])
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. PyTorch %s. bf16; median of %s timed runs after warm-up"
        " (compilation excluded), CUDA events, L2 flushed before each; peak = highest allocated"
        " memory in the timed pass above the weights and inputs (activations, gradients,"
        " workspaces count)."
        % (results["gpu"], results["date"], results["commit"], results["torch"],
           results.get("iters", "the")),
        "",
        "| case | attention | tokens | pass | coda ms | eager ms | compile ms | eager / coda"
        " | compile / coda |%s coda MiB | eager MiB | compile MiB | coda MiB / compile MiB |"
        % (" native ms | coda / native |" if native else ""),
        "|---|---|---:|---|---:|---:|---:|---:|---:|%s---:|---:|---:|---:|"
        % ("---:|---:|" if native else ""),
    ]
    for c in results["cases"]:
        extra = ""
        if native:
            extra = " %s | %s |" % (_fmt(c.get("native_ms"), "%.3f"),
                                    _fmt(_ratio(c["coda_ms"], c.get("native_ms")), "%.3f"))
        lines.append(
            "| %s | %s | %d | %s | %s | %s | %s | %s | %s |%s %s | %s | %s | %s |"
            % (_torch_case(c), "yes" if c.get("attention") else "no", c["tokens"], c["pass"],
               _fmt(c["coda_ms"], "%.3f"), _fmt(c["eager_ms"], "%.3f"),
               _fmt(c["compile_ms"], "%.3f"),
               _fmt(_ratio(c["eager_ms"], c["coda_ms"]), "%.2f"),
               _fmt(_ratio(c["compile_ms"], c["coda_ms"]), "%.2f"), extra,
               _fmt(c["coda_peak_mib"], "%.0f"), _fmt(c["eager_peak_mib"], "%.0f"),
               _fmt(c["compile_peak_mib"], "%.0f"),
               _fmt(_ratio(c["coda_peak_mib"], c["compile_peak_mib"]), "%.2f")))
    # Issue 12's targets, on the fwd+bwd records: model-1b at >= 1.10x torch.compile's speed
    # with <= 0.8x its peak memory; each block at no more than compile's peak memory.
    verdicts = []
    for c in results["cases"]:
        if c["pass"] != "fwd+bwd":
            continue
        speedup = _ratio(c["compile_ms"], c["coda_ms"])
        memory = _ratio(c["coda_peak_mib"], c["compile_peak_mib"])
        name = "%s%s" % (c["case"], " +attn" if c.get("attention") and c["case"] != "model-1b"
                         else "")
        if c["case"] == "model-1b":
            for what, ok, text in (
                    ("speed", speedup is not None and speedup >= 1.10,
                     "%s x; target >= 1.10 x" % _fmt(speedup, "%.3f")),
                    ("memory", memory is not None and memory <= 0.8,
                     "%s x; target <= 0.80 x" % _fmt(memory, "%.2f"))):
                verdicts.append("%s %s %s (%s)" % (name, what, "met" if ok else "not met", text))
        elif c["case"].startswith("block"):
            ok = memory is not None and memory <= 1.0
            verdicts.append("%s memory %s (%s x; target <= 1.00 x)"
                            % (name, "met" if ok else "not met", _fmt(memory, "%.2f")))
    if verdicts:
        lines += ["", "Targets (fwd+bwd; speed: torch.compile time / coda time; memory: coda peak"
                  " / torch.compile peak): " + "; ".join(verdicts) + "."]
    overhead = []
    for c in results["cases"]:
        ratio = _ratio(c["coda_ms"], c.get("native_ms"))
        if c["pass"] == "fwd+bwd" and ratio is not None:
            overhead.append("%s%s %s (%.3f x)" % (c["case"], " +attn" if c.get("attention") else "",
                                                  "met" if ratio <= 1.03 else "not met", ratio))
    if overhead:
        lines += ["", "Overhead (fwd+bwd, coda time / native time, the same layer through the C"
                  " ABI alone; target <= 1.03 x): " + "; ".join(overhead) + "."]
    errors = sorted({"%s: %s" % (side, msg) for c in results["cases"]
                     for side, msg in (c.get("errors") or {}).items()})
    if errors:
        lines += ["", "Sides that did not run: " + "; ".join(errors) + "."]
    # The bench's plot (python -m coda.bench writes it beside the JSON).
    lines += _figure_link(os.path.join(ROOT, "bench", "results", "torch.png"),
                          "coda and eager relative to torch.compile, fwd+bwd")
    return "\n".join(lines)


def train_table(results):
    """bench/results/train_llama.json (examples/train_llama.py's loss.json): the small Llama
    trained by coda and by PyTorch from the same seed, weights and batches."""
    args, cfg = results["args"], results["config"]
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`.%s %d-layer Llama (hidden %d, MLP %d, %d query"
        " / %d key-value heads), byte tokens of this repository, %d steps of %d x %d tokens, bf16"
        " with fp32 master weights, AdamW; the same initial weights and batches on both sides."
        % (results["gpu"], results["date"], results["commit"],
           " PyTorch %s." % results["torch_version"] if results.get("torch_version") else "",
           cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"],
           cfg["num_attention_heads"], cfg["num_key_value_heads"], args["steps"], args["batch"],
           args["seq"]),
        "",
        "| side | tokens/s | peak MiB | final loss | held-out loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("coda", "torch"):
        c = results.get(name)
        if c:
            lines.append("| %s | %.0f | %s | %.4f | %.4f |"
                         % (name, c["tokens_per_s_per_gpu"], _fmt(c.get("peak_mib"), "%.0f"),
                            c["loss"][-1], c["val_loss"]))
    if "agree" in results:
        lines += ["", "Curves %s (tolerance %.3f, relative): first-step loss difference %.2e,"
                  " smoothed final %.4f, largest over the run %.4f, held-out %.4f."
                  % ("agree" if results["agree"] else "DISAGREE", args["tolerance"],
                     results["first_step_abs_diff"], results["final_smoothed_rel_diff"],
                     results["max_smoothed_rel_diff"], results["held_out_rel_diff"])]
    lines += _figure_link(os.path.join(ROOT, "bench", "results", "train_llama.png"),
                          "training loss of coda and PyTorch")
    return "\n".join(lines)


PASSES = ("fwd", "bwd", "fwd+bwd")
BLOCK_PLOT = os.path.join(ROOT, "bench", "results", "block.png")


def ms_text(ms):
    return "n/a" if ms is None else "%.3f" % ms


def ratio_text(num, den):
    return "n/a" if num is None or den is None else "%.3f" % (num / den)


def block_table(results):
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. bf16, weight gradients in %s; median of %s runs, L2"
        " flushed before each; the three sides measured in one process on the same inputs."
        % (results["gpu"], results["date"], results["commit"], results.get("grad_dtype", "bf16"),
           results.get("runs", "?")),
        "",
        "| model | tokens | pass | coda ms | GEMM-only ms | unfused ms | coda / GEMM-only |"
        " unfused / coda |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c in results["cases"]:
        lines.append(
            "| %s | %d | %s | %s | %s | %s | %s | %s |"
            % (c["model"], c["tokens"], c["pass"], ms_text(c["coda_ms"]),
               ms_text(c["gemm_only_ms"]), ms_text(c["unfused_ms"]),
               ratio_text(c["coda_ms"], c["gemm_only_ms"]),
               ratio_text(c["unfused_ms"], c["coda_ms"])))
    timed = [c for c in results["cases"] if c["coda_ms"] is not None]
    missing = len(results["cases"]) - len(timed)
    if timed:
        over_gemm = [c["coda_ms"] / c["gemm_only_ms"] for c in timed]
        speedup = [c["unfused_ms"] / c["coda_ms"] for c in timed]
        lines += ["", "coda / GEMM-only: %.3f to %.3f. Unfused / coda: %.3f to %.3f (above 1: coda"
                  " is faster). Cases timed: %d." % (min(over_gemm), max(over_gemm), min(speedup),
                                                    max(speedup), len(timed))]
    if missing:
        lines += ["", "n/a: coda could not run %d of the %d cases at this commit (not_supported)."
                  % (missing, len(results["cases"]))]
    lines += _figure_link(BLOCK_PLOT, "block times relative to the GEMMs alone")
    return "\n".join(lines)


def block_plot(results):
    """Time of each side over the GEMM-only time, per case; skipped without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    cases = results["cases"]
    labels = ["%s\n%d %s" % (c["model"], c["tokens"], c["pass"]) for c in cases]
    xs = range(len(cases))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cases)), 4.0))
    for offset, key, name in ((-width / 2, "coda_ms", "coda"), (width / 2, "unfused_ms",
                                                                 "unfused (cuBLASLt + kernels)")):
        values = [c[key] / c["gemm_only_ms"] if c[key] is not None else 0.0 for c in cases]
        ax.bar([x + offset for x in xs], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8, label="GEMMs alone (cuBLASLt)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("time / GEMM-only time")
    ax.set_title("Llama middle block, %s (%s)" % (results["gpu"], results["commit"]))
    ax.legend(fontsize=8)
    _save(plt, fig, BLOCK_PLOT)
    return True


TABLES = {"gemm": ("gemm.json", gemm_table), "fused": ("fused.json", fused_table),
          "block": ("block.json", block_table)}
PLOTS = {"block": block_plot, "gemm": gemm_plot}
TABLES["torch"] = ("torch.json", torch_table)  # python -m coda.bench
TABLES["fp8"] = ("fp8.json", fp8_table)  # bench_gemm_fp8
TABLES["train"] = ("train_llama.json", train_table)  # examples/train_llama.py's loss.json
TABLES["fused_fp8"] = ("fused_fp8.json", fused_fp8_only_table)  # bench_fused --filter fp8


def _short(commit):
    return commit[:7]


def _range(values):
    lo, hi = "%.2f" % min(values), "%.2f" % max(values)
    return lo if lo == hi else "%s-%s" % (lo, hi)


def status_table(results):
    """README.md's status table: every GPU number from bench/results, each with its commit."""
    gemm, fused, block, torch, fp8 = (results.get(n)
                                      for n in ("gemm", "fused", "block", "torch", "fp8"))
    rows = [("capability", "CPU backend", "GPU (sm_90a)"), ("---", "---", "---")]
    if gemm:
        ratios = [c["cublas_ms"] / c["coda_ms"] for c in gemm["cases"] if c["layout"] != "square"]
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        rows.append(("GEMM, fwd / dgrad / wgrad layouts", "yes",
                     "yes: %.2fx cuBLASLt's speed (geomean over the %d Llama block GEMMs, minimum"
                     " %.2f), at `%s`" % (geomean, len(ratios), min(ratios),
                                          _short(gemm["commit"]))))
    backward_text = "yes: K6 and K7 one dgrad GEMM launch each; deterministic (no float atomics)"
    if fused:
        forward, backward = {}, {}
        for c in _bf16_cases(fused):
            kernels = backward if c.get("layout", "fwd") == "dgrad" else forward
            kernels.setdefault(c["kernel"], []).append(c["coda_ms"] / c["coda_gemm_ms"])

        def summary(per_kernel):
            every = [r for v in per_kernel.values() for r in v]
            return "%sx the plain GEMM's time (%s; the target is 1.05x), at `%s`" % (
                _range(every), ", ".join("%s %s" % (k, _range(v))
                                         for k, v in sorted(per_kernel.items())),
                _short(fused["commit"]))
        rows.append(("forward kernels %s, first-layer statistics" % " ".join(sorted(forward)),
                     "yes", "yes: one launch each; " + summary(forward)))
        if backward:
            backward_text = ("yes: K6 and K7 one dgrad GEMM launch each, " + summary(backward) +
                             "; deterministic (no float atomics)")
    rows.append(("backward kernels K6 K7, RoPE backward, cross-entropy, reduces", "yes",
                 backward_text))
    if block:
        both = [c for c in block["cases"] if c["pass"] == "fwd+bwd" and c["coda_ms"] is not None]
        tokens = min(c["tokens"] for c in both)
        at = [c for c in both if c["tokens"] == tokens]
        rows.append(("Llama block, first / middle / last layer, forward + backward", "yes",
                     "yes: checked against the fp64 textbook block and bitwise identical run to"
                     " run; %s the time of its GEMMs alone in cuBLASLt (forward + backward, %d"
                     " tokens, `%s`)" % (" / ".join("%.2fx (%s)" % (c["coda_ms"] / c["gemm_only_ms"],
                                                               c["model"].replace("llama-", "").upper())
                                                    for c in at), tokens,
                                         _short(block["commit"]))))
    if fp8:
        ratios = [c["cublas_blockscaled_ms"] / c["coda_ms"] for c in fp8["cases"]
                  if c.get("cublas_blockscaled_ms") and not c["name"].startswith("square")]
        bf16 = [c["cublas_bf16_ms"] / c["coda_ms"] for c in fp8["cases"]
                if c.get("cublas_bf16_ms") and not c["name"].startswith("square")]
        rows.append(("FP8 GEMM (E4M3, block scales), `gemm_fp8`", "yes",
                     "yes: %.2fx the speed of cuBLASLt's block-scaled FP8 GEMM and %.2fx that of"
                     " its bf16 GEMM (geomeans over the %d Llama block GEMMs), at `%s`"
                     % (_geomean(ratios), _geomean(bf16), len(ratios), _short(fp8["commit"]))))
    fp8_block = results.get("fp8_block")
    if fp8_block:
        both = {r["model"]: r for r in fp8_block["block"] if r["pass"] == "fwd+bwd"}
        if both and all(r.get("fp8_ms") and r.get("bf16_ms") for r in both.values()):
            rows.append(("FP8 Llama block (middle layer, `precision=\"fp8\"`)", "yes",
                         "yes: forward + backward at %s coda's bf16 speed and %s the speed of"
                         " PyTorch's FP8 block (torchao's tensorwise recipe, compiled) at %s"
                         " tokens (%s; docs/fp8.md), at `%s`" % (
                             " / ".join("%.2fx" % (r["bf16_ms"] / r["fp8_ms"]) for r in
                                        both.values()),
                             " / ".join("%.2fx" % (r["torch_fp8_ms"] / r["fp8_ms"]) if
                                        r.get("torch_fp8_ms") else "-" for r in both.values()),
                             "/".join(sorted({str(r["tokens"]) for r in both.values()})),
                             " / ".join(m.replace("llama-", "").upper() for m in both),
                             _short(fp8_block["commit"]))
                         + ("; with the weights' FP8 copies made once per step"
                            " (`fp8_weights_once`) %s and %s" % (
                                " / ".join("%.2fx" % (r["bf16_ms"] / r["fp8_once_ms"]) for r in
                                           both.values()),
                                " / ".join("%.2fx" % (r["torch_fp8_ms"] / r["fp8_once_ms"]) if
                                           r.get("torch_fp8_ms") else "-" for r in
                                           both.values()))
                            if all(r.get("fp8_once_ms") for r in both.values()) else "")))
    fused_fp8 = results.get("fused_fp8")
    fp8_cases = _fp8_cases(fused_fp8)
    if fp8_cases:
        over = [c["coda_ms"] / c["coda_gemm_ms"] for c in fp8_cases]
        slower = sum(1 for c in fp8_cases if c["bf16_fused_ms"] < c["coda_ms"])
        rows.append(("fused kernels on E4M3 operands %s" % " ".join(
                        sorted({c["kernel"] for c in fp8_cases})), "yes",
                     "yes: %s the FP8 GEMM's time, slower than the bf16 kernel in %d of %d cases"
                     " (docs/fp8.md), at `%s`"
                     % (_range(over) + "x", slower, len(fp8_cases), _short(fused_fp8["commit"]))))
    if torch:
        model = [c for c in torch["cases"] if c["case"] == "model-1b" and c["pass"] == "fwd+bwd"]
        if model and all(model[0].get(k) for k in ("coda_ms", "eager_ms", "compile_ms")):
            c = model[0]
            rows.append(("PyTorch package (`import coda`, `docs/python.md`)", "yes",
                         "yes: a %d-layer Llama-1B trains %.2fx faster than PyTorch eager with"
                         " %.2fx torch.compile's peak memory, at %.2fx torch.compile's speed (at"
                         " `%s`)" % (c.get("layers", 16), c["eager_ms"] / c["coda_ms"],
                                     c["coda_peak_mib"] / c["compile_peak_mib"],
                                     c["compile_ms"] / c["coda_ms"], _short(torch["commit"]))))
    gpus = sorted({r["gpu"] for r in (gemm, fused, block, torch, fp8, fp8_block) if r})
    lines = ["| %s |" % " | ".join(r) for r in rows]
    lines += ["", "Generated by `tools/perf_tables.py` from `bench/results/*.json` (%s); tables,"
              " plots and dates in `docs/PERFORMANCE.md`." % ", ".join(gpus)]
    return "\n".join(lines)


def fp8_block_table(results):
    """bench/results/fp8_block.json (python -m coda.bench --fp8): coda's FP8 middle layer against
    coda's bf16 one and the plain-PyTorch FP8 and bf16 blocks under torch.compile, one process."""
    lines = [
        "GPU: %s. Date: %s. Commit: `%s`. torch %s. `python -m coda.bench --fp8`: the middle"
        " Llama layer without attention, %s tokens; median of %s after %s warm-ups, L2 flushed"
        " before each, the four sides pass by pass in turn on the same bf16 weights and inputs."
        " coda FP8: E4M3 with 1 x 128 / 128 x 128 power-of-two block scales, quantized in the"
        " call (docs/fp8.md); weights once: the same given its weights' FP8 copies, made in one"
        " pass at the start of each forward (a training step quantizing each weight once);"
        " torch FP8: torchao's tensorwise recipe in plain torch ops with"
        " `torch._scaled_mm`, dY in %s, compiled; torch bf16: the same block compiled. Error:"
        " the largest relative Frobenius error of an output or gradient against the side's bf16"
        " counterpart." % (results["gpu"], results["date"], results["commit"],
                           results.get("torch", "?"),
                           "/".join(sorted({str(r["tokens"]) for r in results["block"]})),
                           results.get("iters", "?"), results.get("warmup", "?"),
                           results.get("torch_fp8_grad", "e4m3").upper()),
        "",
        "| model | pass | coda FP8 ms | coda FP8, weights once ms | coda bf16 ms | torch FP8 ms |"
        " torch bf16 ms | coda bf16 / coda FP8 | torch FP8 / coda FP8 |"
        " coda FP8 / weights once | torch bf16 / torch FP8 |"
        " coda FP8 error | torch FP8 error | coda FP8 MiB | torch FP8 MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(a, b):
        return _fmt(_ratio(a, b), "%.3f")

    def worst(check):
        return "%.3f" % max(check["outputs"], check["grads"]) if check else "-"

    for r in results["block"]:
        f, o, b, t, c = (r.get(k) for k in ("fp8_ms", "fp8_once_ms", "bf16_ms", "torch_fp8_ms",
                                            "torch_bf16_ms"))
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                     % (r["model"], r["pass"], *(_fmt(v, "%.3f") for v in (f, o, b, t, c)),
                        ratio(b, f), ratio(t, f), ratio(f, o), ratio(c, t),
                        worst(r.get("fp8_vs_bf16")),
                        worst(r.get("torch_fp8_vs_bf16")),
                        *(_fmt(r.get(k), "%.0f") for k in ("fp8_peak_mib",
                                                          "torch_fp8_peak_mib"))))
    return "\n".join(lines)


TABLES["fp8_block"] = ("fp8_block.json", fp8_block_table)  # python -m coda.bench --fp8


def replace_section(text, name, body):
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    block = "%s\n%s\n%s" % (begin, body, end)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def _load(json_name):
    path = os.path.join(ROOT, "bench", "results", json_name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    check = "--check" in sys.argv[1:]
    loaded = {name: _load(json_name) for name, (json_name, _) in TABLES.items()}
    text = open(DOC).read() if os.path.exists(DOC) else "# Performance\n"
    updated = text
    for name, (json_name, render) in TABLES.items():
        results = loaded[name]
        if results is not None:
            if not check and name in PLOTS:
                PLOTS[name](results)
            updated = replace_section(updated, name, render(results))
    readme = open(README).read()
    readme_updated = replace_section(readme, "status", status_table(loaded))
    if check:
        stale = [os.path.relpath(p, ROOT) for p, old, new in
                 ((DOC, text, updated), (README, readme, readme_updated)) if old != new]
        if stale:
            print("perf_tables.py --check: out of date: %s (run tools/perf_tables.py)"
                  % ", ".join(stale))
        return 1 if stale else 0
    with open(DOC, "w") as f:
        f.write(updated)
    with open(README, "w") as f:
        f.write(readme_updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
