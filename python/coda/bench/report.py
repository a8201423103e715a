"""The results files (bench/results/torch.json and its plot; bench/results/fp8_block.json, the
FP8 block comparison of --fp8). Imports no torch at module level except where it asks torch for
the GPU name and version."""
import datetime
import json
import os
import subprocess

CASE_NAMES = ("block-1b", "block-8b", "model-1b")
PASSES = ("fwd", "bwd", "fwd+bwd")
SIDES = ("coda", "eager", "compile")
# Sides some records have: native (block cases; results before it lack the keys).
OPTIONAL_SIDES = ("native",)
RECORD_KEYS = ("case", "tokens", "pass", "coda_ms", "eager_ms", "compile_ms", "coda_peak_mib",
               "eager_peak_mib", "compile_peak_mib")

MEMORY_DEFINITION = (
    "peak MiB = highest torch.cuda.max_memory_allocated inside the timed pass, minus what was "
    "allocated before the side's first call (weights and inputs resident, gradients None), plus "
    "anything the side allocated at construction beyond its weights: activations, gradients, "
    "logits, workspaces and caches count; weights and inputs do not.")
NATIVE_DEFINITION = (
    "block cases: native_ms = the same middle layer called through coda's C ABI directly "
    "(coda._lib: coda_llama_middle_forward / _backward_part, the backward in its two parts as "
    "coda.ops runs it, no torch.library dispatch, no autograd) "
    "on the coda side's weights and the same inputs, in the same process, timed pass by pass in "
    "turn with the coda side; its outputs, saved activations, gradients and workspace are "
    "allocated once, outside the timed region, and the seed gradient of x2 is written where the "
    "C backward reads it before each repetition (untimed). With attention, the same SDPA call "
    "(under autograd) follows on both sides. coda_ms / native_ms is the cost of coda's PyTorch "
    "integration; native_bitwise says the two sides' outputs and gradients agree bit for bit "
    "(with attention, SDPA's backward may differ between runs).")
TIMING_DEFINITION = (
    "median of the timed repetitions after untimed warm-up (torch.compile's compilation is in "
    "the warm-up), CUDA events on the current stream, L2 flushed (256 MiB write) before each; "
    "bwd = backward alone after an untimed forward; gradients set to None before each "
    "repetition.")
# The FP8 block comparison (--fp8): issue 13's schema, {"gpu", "date", "commit", "block": [...]}
# with these keys in every record; the records and the file carry more (peak MiB, the torch.compile
# bf16 time, the agreement check, the definitions below).
FP8_BLOCK_MODELS = ("llama-1b", "llama-8b")
FP8_BLOCK_KEYS = ("model", "tokens", "pass", "fp8_ms", "bf16_ms", "torch_fp8_ms")
FP8_BLOCK_SIDES = ("fp8", "fp8_once", "bf16", "torch_fp8", "torch_bf16")
FP8_BLOCK_DEFINITION = (
    "coda's middle Llama layer (out-proj + residual, RMSNorm, gate/up, SwiGLU, down + residual, "
    "RMSNorm, QKV of layer l+1 with RoPE; no attention), forward, backward and both, on the same "
    "bf16 weights and inputs, in one process, the five sides timed pass by pass in turn: fp8_ms "
    "= coda.ops.llama_middle with BlockConfig(precision='fp8') (E4M3 operands, 1 x 128 and "
    "128 x 128 power-of-two block scales, quantized by coda in the call; docs/fp8.md), "
    "fp8_once_ms = the same op given its weights' FP8 copies, made by coda.ops.llama_fp8_weights "
    "(both copies of each weight in one pass) at the start of each forward, so that a fwd+bwd is "
    "a training step quantizing each weight once (fwd includes the copies, bwd reads them), "
    "bf16_ms = the same op in bf16, torch_fp8_ms = the plain-PyTorch reference block with every linear "
    "(o, gate, up, down, q, k, v) in torchao's tensorwise float8 recipe under torch.compile "
    "(torch_fp8 says how), torch_bf16_ms = the bf16 reference block under torch.compile.")
TORCH_FP8_DEFINITION = (
    "torchao.float8's default 'tensorwise' recipe written out in plain torch ops "
    "(coda/bench/torch_fp8.py): dynamic per-tensor scales s = 448 / max(amax, 1e-12) in fp32, "
    "casts saturated to float8_e4m3fn; Y = X W^T, dX = dY W and dW = dY^T X each one "
    "torch._scaled_mm (bf16 out; fast accumulation in the forward only, as torchao), with the "
    "transposed FP8 copies its column-major second operand and dW's row-major dY^T need; the "
    "backward recasts X and W from the saved bf16 tensors, as torchao does; RMSNorm, SwiGLU, "
    "RoPE and the residuals in bf16, as the reference; torch.compile over the block. dY's "
    "format is torch_fp8_grad: e4m3 (coda's recipe; the default here) or e5m2 (torchao's "
    "default for grad_output).")
FP8_CHECK_DEFINITION = (
    "before timing, one fwd+bwd of each side; each FP8 side's outputs (x2, qkv) and gradients "
    "(dx0, dy0 and the six weights', the largest capped to their first 2^24 elements) against "
    "its bf16 counterpart's (fp8 and fp8_once against bf16, torch_fp8 against torch_bf16, or "
    "the other bf16 "
    "side where that one did not run): relative Frobenius error ||a - b|| / ||b|| per tensor; "
    "'outputs' and 'grads' are the largest of each. A warning when outputs exceed 0.10 or "
    "gradients 0.20 (FP8 rounding gives a few percent; a wrong layout, scale or operand gives "
    "errors of order 1), or when the outputs are within 0.001 of bf16's (no FP8 rounding: 16-bit "
    "GEMMs). bf16_vs_torch_bf16: the largest such error between the two bf16 sides.")
HOST_AHEAD_DEFINITION = (
    " Host ahead (--host-ahead): bf16 GEMMs lasting twice the warm-up's longest host issue time "
    "plus 1 ms, then the flush, are queued before the start event, so the host has queued the "
    "whole pass when the GPU reaches it (busy, at its sustained clocks): the times are the GPU's "
    "work alone.")


def repo_root():
    """The source tree this file sits in (python/coda/bench/ -> the repository root)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


def default_out(name="torch.json"):
    """bench/results/<name> of the source tree, or of the current folder when installed."""
    results = os.path.join(repo_root(), "bench", "results")
    if os.path.isdir(results):
        return os.path.join(results, name)
    return os.path.join("bench", "results", name)


def commit(where=None):
    """$CODA_COMMIT, else the source tree's short HEAD, with "-dirty" when tracked files differ
    from it (the results then are not that commit's: benchmark a clean tree), else "unknown"."""
    env = os.environ.get("CODA_COMMIT")
    if env:
        return env
    if where is None:
        root = repo_root()
        where = root if os.path.isdir(os.path.join(root, "bench", "results")) else os.getcwd()
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where,
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=where, capture_output=True, text=True, timeout=30)
            dirty = status.returncode != 0 or bool(status.stdout.strip())
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def metadata():
    import torch

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "torch": torch.__version__,
    }


def _require(obj, keys, message):
    """ValueError(message % key) for the first of `keys` that `obj` lacks."""
    for key in keys:
        if key not in obj:
            raise ValueError(message % key)


def validate(results):
    """Raises ValueError naming the first field that does not follow the schema."""
    _require(results, ("gpu", "date", "commit", "torch", "cases"), "results lack %r")
    for i, rec in enumerate(results["cases"]):
        _require(rec, RECORD_KEYS, "cases[%d] lacks %%r" % i)
        if rec["case"] not in CASE_NAMES:
            raise ValueError("cases[%d].case must be one of %s; got %r" % (i, CASE_NAMES, rec["case"]))
        if rec["pass"] not in PASSES:
            raise ValueError("cases[%d].pass must be one of %s; got %r" % (i, PASSES, rec["pass"]))
        if not isinstance(rec["tokens"], int):
            raise ValueError("cases[%d].tokens must be an int" % i)
        for side in SIDES + OPTIONAL_SIDES:
            for key in ("%s_ms" % side, "%s_peak_mib" % side):
                v = rec[key] if side in SIDES else rec.get(key)
                if v is not None and not isinstance(v, (int, float)):
                    raise ValueError("cases[%d].%s must be a number or null" % (i, key))
        if not isinstance(rec.get("native_bitwise", False), bool):
            raise ValueError("cases[%d].native_bitwise must be true or false" % i)
    return results


def _dump(results, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


def write(results, path):
    validate(results)
    _dump(results, path)


def validate_fp8_block(results):
    """The --fp8 results (issue 13's schema): raises ValueError naming the first field that
    does not follow it."""
    _require(results, ("gpu", "date", "commit", "block"), "results lack %r")
    for i, rec in enumerate(results["block"]):
        _require(rec, FP8_BLOCK_KEYS, "block[%d] lacks %%r" % i)
        # A custom --shape (tiny) names its model by the shape.
        if rec["model"] not in FP8_BLOCK_MODELS + ((rec["shape"],) if rec.get("shape") else ()):
            raise ValueError("block[%d].model must be one of %s; got %r"
                             % (i, FP8_BLOCK_MODELS, rec["model"]))
        if rec["pass"] not in PASSES:
            raise ValueError("block[%d].pass must be one of %s; got %r" % (i, PASSES, rec["pass"]))
        if not isinstance(rec["tokens"], int):
            raise ValueError("block[%d].tokens must be an int" % i)
        for side in FP8_BLOCK_SIDES:
            for key in ("%s_ms" % side, "%s_peak_mib" % side):
                v = rec.get(key)
                if v is not None and not isinstance(v, (int, float)):
                    raise ValueError("block[%d].%s must be a number or null" % (i, key))
    return results


def write_fp8_block(results, path):
    validate_fp8_block(results)
    _dump(results, path)


def label(rec):
    """'block-1b', 'block-1b +attn', 'model-1b' (the model always has attention)."""
    if rec["case"].startswith("block") and rec.get("attention"):
        return rec["case"] + " +attn"
    return rec["case"]


def plot(results, path):
    """Two panels over the fwd+bwd records: time and peak memory of coda and eager relative to
    torch.compile (= 1, lower is better), each bar labelled with its value. Returns the path,
    or None where matplotlib is missing or nothing has both numbers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    recs = [r for r in results["cases"] if r["pass"] == "fwd+bwd" and r.get("compile_ms")]
    if not recs:
        return None
    colors = {"coda": "#2a6fdb", "eager": "#9a9a9a"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for ax, suffix, title in ((axes[0], "_ms", "fwd+bwd time / torch.compile's"),
                              (axes[1], "_peak_mib", "fwd+bwd peak memory / torch.compile's")):
        for j, side in enumerate(("coda", "eager")):
            xs, ys = [], []
            for i, r in enumerate(recs):
                v, ref = r.get(side + suffix), r.get("compile" + suffix)
                if v is not None and ref:
                    xs.append(i + (j - 0.5) * width)
                    ys.append(v / ref)
            bars = ax.bar(xs, ys, width, label=side, color=colors[side])
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y, "%.2f" % y, ha="center",
                        va="bottom", fontsize=7)
        ax.axhline(1.0, color="#e08a1e", linewidth=1.2, label="torch.compile")
        ax.set_xticks(range(len(recs)))
        ax.set_xticklabels(["%s\n%d tok" % (label(r), r["tokens"]) for r in recs], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.4 * max([1.0] + [b.get_height() for b in ax.patches]))
        ax.legend(fontsize=8, loc="upper center", ncol=3, framealpha=0.95)
    fig.suptitle("coda vs PyTorch, bf16, %s, commit %s, torch %s (lower is better)"
                 % (results["gpu"], results["commit"], results["torch"]), fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
