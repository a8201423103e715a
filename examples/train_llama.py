#!/usr/bin/env python3
"""Train a small Llama from scratch on this repository's own text, twice from the same seed:
once with coda (coda.models through coda.from_hf) and once in plain PyTorch, on the same
initial weights and the same batches, then plot both loss curves and check that they agree.

    python examples/train_llama.py [--steps 400] [--out train_llama_out]

Tokens are bytes (vocabulary 256) of the tracked *.md, *.cpp, *.cu, *.cuh, *.hpp, *.h, *.c and
*.py files as they are in the working tree; the last 5% is held out. (So runs compare only on
one tree: an edit to any of those files changes the batches and every loss.) The model is a 4-layer Llama (hidden 512, MLP 1536, 8
query / 4 key-value heads of 64; coda's GPU RoPE needs head_dim 64 or 128 and every width a
multiple of 8). Both sides train in bf16 with fp32 master weights and the same AdamW, warm-up
and cosine schedule, and gradient clipping; there is no dropout, so the only difference is the
arithmetic. Writes OUT/loss.png and OUT/loss.json and exits 1 when the smoothed final losses
differ by more than --tolerance (relative).

    python examples/train_llama.py --soak [--steps 2000] [--out soak_out/run1]

--soak trains coda alone (2000 steps unless --steps says otherwise) with PyTorch's deterministic
algorithms on, and records every step's loss (and its float32 bits), gradient norm and allocated
CUDA memory in OUT/soak.json; it exits 1 on a NaN or Inf. tools/soak.sh runs it twice from the same
seed and compares the runs (tools/soak_compare.py: bitwise-identical losses, no growth of
allocated memory after the first steps).

    torchrun --nproc-per-node N examples/train_llama.py --fsdp   # or --ddp

--fsdp and --ddp train data-parallel over torchrun's ranks (docs/distributed.md): each rank takes
its own --batch rows of every step (the ranks' rows together are one seeded stream), the
gradients are reduced in fp32, and rank 0 prints each side's tokens/s per GPU and the largest
peak memory of any rank. --fsdp shards coda's model by Llama.fsdp_units() (each coda op's
weights one unit) and the PyTorch model per decoder layer, with FSDP2's fully_shard (bf16
parameters, fp32 reduce-scatter); --ddp wraps both in DistributedDataParallel. The logged loss
is the mean over the ranks, the loss of the whole step's batch.

    python examples/train_llama.py --precision fp8

--precision fp8 trains coda's model with its decoder layers' GEMMs on block-scaled E4M3
operands (coda.from_hf(..., precision="fp8"); docs/python.md, "FP8"), against the same PyTorch
bf16 run; the widths and each rank's batch * seq tokens must be multiples of 16. loss.json
(and soak.json) record the precision.

    python examples/train_llama.py --plot-runs [LABEL=]a/loss.json [LABEL=]b/loss.json ...

--plot-runs trains nothing: it draws earlier runs' loss.json files in one figure, OUT/runs.png
(each run's coda curve over its own torch curve, smoothed, and their relative difference), for
comparing seeds or recipes (docs/fp8.md's FP8 runs over seeds).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:  # the installed package, else this source tree's python/
    import coda  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "python"))

SUFFIXES = (".md", ".cpp", ".cu", ".cuh", ".hpp", ".h", ".c", ".py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="default 400, 2000 with --soak")
    p.add_argument("--soak", action="store_true",
                   help="coda alone, deterministic, per-step loss bits and memory in OUT/soak.json")
    p.add_argument("--out", default="train_llama_out", help="folder for loss.png and loss.json")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--mlp", type=int, default=1536)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sides", default="torch,coda", help="comma-separated: torch, coda")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--smooth", type=int, default=25, help="moving-average window (steps)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="largest relative difference of the smoothed final losses")
    p.add_argument("--fsdp", action="store_true",
                   help="FSDP2 over torchrun's ranks (coda's model sharded by fsdp_units())")
    p.add_argument("--ddp", action="store_true",
                   help="DistributedDataParallel over torchrun's ranks")
    p.add_argument("--precision", choices=("native", "fp8"), default="native",
                   help="coda's layer GEMMs: native (bf16) or fp8 (block-scaled E4M3 operands)")
    p.add_argument("--plot-runs", nargs="+", metavar="[LABEL=]LOSS_JSON",
                   help="train nothing: draw earlier runs' loss.json files (each run's coda and "
                        "torch curves smoothed, and their relative difference) into OUT/runs.png; "
                        "LABEL names a run in the legend (default: its precision, seed, commit)")
    args = p.parse_args(argv)
    if args.fsdp and args.ddp:
        p.error("--fsdp and --ddp exclude each other: choose one way to spread the model")
    if args.precision == "fp8":
        # Checked here, before the PyTorch side trains: coda refuses these only at its first
        # forward (the widths) or backward (the tokens).
        widths = {"--hidden": args.hidden, "--mlp": args.mlp,
                  "--heads * --head-dim": args.heads * args.head_dim,
                  "(--heads + 2 --kv-heads) * --head-dim":
                      (args.heads + 2 * args.kv_heads) * args.head_dim,
                  "--batch * --seq (tokens a step)": args.batch * args.seq}
        bad = ["%s = %d" % (k, v) for k, v in widths.items() if v % 16]
        if bad:
            p.error("--precision fp8 needs multiples of 16: %s" % ", ".join(bad))
    if args.soak and (args.fsdp or args.ddp):
        p.error("--soak runs in one process: drop --fsdp / --ddp")
    if args.steps is None:
        args.steps = 2000 if args.soak else 400
    if args.soak:
        args.sides = "coda"
    return args


# ---- data


def corpus_files(root=ROOT):
    try:
        out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             timeout=30, check=True).stdout.split("\n")
        files = [f for f in out if f.endswith(SUFFIXES)]
    except (OSError, subprocess.SubprocessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "__pycache__"]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names
                      if n.endswith(SUFFIXES)]
    return sorted(files)


def load_corpus(root=ROOT):
    parts = []
    for f in corpus_files(root):
        try:
            with open(os.path.join(root, f), "rb") as fh:
                parts.append(fh.read())
        except OSError:
            continue
    return b"\n\n".join(parts)


class Batches:
    """Fixed batches: the same windows, in the same order, for every side."""

    def __init__(self, data, steps, batch, seq, seed, val_batches=8, rank=0, world=1):
        n_val = len(data) // 20
        self.train, self.val = data[:-n_val], data[-n_val:]
        if len(self.val) <= seq + 1 or len(self.train) <= seq + 1:
            raise SystemExit("corpus too small (%d bytes) for --seq %d" % (len(data), seq))
        g = torch.Generator().manual_seed(seed)
        # One stream of world * batch rows a step; this rank trains on its own `batch` of them
        # (with one rank, the same windows as ever).
        starts = torch.randint(0, len(self.train) - seq - 1, (steps, world * batch), generator=g)
        self.starts = starts[:, rank * batch:(rank + 1) * batch]
        self.val_starts = torch.randint(0, len(self.val) - seq - 1, (val_batches, batch),
                                        generator=g)
        self.seq = seq

    def _windows(self, data, starts, device):
        idx = starts[:, None] + torch.arange(self.seq)[None, :]
        return data[idx].to(device, non_blocking=True)

    def train_batch(self, step, device):
        return self._windows(self.train, self.starts[step], device)

    def val_batches(self, device):
        return [self._windows(self.val, s, device) for s in self.val_starts]


# ---- training


def _local(t):
    """A plain tensor of a DTensor result (FSDP2's gradient norm), else `t`."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class MasterAdamW:
    """AdamW on fp32 master copies of bf16 parameters (elementwise, so fused and separate
    weight layouts take identical steps), with global-norm gradient clipping."""

    def __init__(self, params, lr, warmup, steps, betas=(0.9, 0.95), weight_decay=0.1, clip=1.0):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=lr, betas=betas, weight_decay=weight_decay)

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            t = (step - warmup) / max(1, steps - warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)
        self.clip = clip

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        norm = _local(torch.nn.utils.clip_grad_norm_(self.master, self.clip))
        self.opt.step()
        self.sched.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)
            for m in self.master:
                m.grad = None
        return norm


def progress(iterable, total, desc):
    try:
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, dynamic_ncols=True)
    except ImportError:
        return _SimpleBar(iterable, total, desc)


class _SimpleBar:
    def __init__(self, iterable, total, desc):
        self.iterable, self.total, self.desc, self.post = iterable, total, desc, ""

    def set_postfix_str(self, s):
        self.post = s

    def __iter__(self):
        t0 = time.time()
        for i, x in enumerate(self.iterable):
            yield x
            if (i + 1) % max(1, self.total // 50) == 0 or i + 1 == self.total:
                done = int(30 * (i + 1) / self.total)
                sys.stderr.write("\r%s [%s%s] %d/%d %.0fs %s" % (
                    self.desc, "#" * done, "." * (30 - done), i + 1, self.total,
                    time.time() - t0, self.post))
                sys.stderr.flush()
        sys.stderr.write("\n")

    def close(self):
        pass


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(name, model, batches, args, ranks):
    device = ranks.device
    opt = MasterAdamW(model.parameters(), args.lr, args.warmup, args.steps)
    # Each step's loss and gradient norm stay on the device (no sync per step) in buffers
    # allocated once: appended as tensors they were two new 512-byte blocks a step, which the
    # soak's flat-memory check counted as growth (1024 bytes a step on the H200, 4bde581).
    losses = torch.empty(args.steps, device=device, dtype=torch.float32)
    norms = torch.empty(args.steps, device=device, dtype=torch.float32)
    allocated = []
    cuda = device.type == "cuda"
    steps = range(args.steps)
    bar = progress(steps, args.steps, "%-5s" % name) if ranks.main else steps
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    for step in bar:
        ids = batches.train_batch(step, device)
        loss = model(ids, labels=ids)
        loss.backward()
        norms[step] = opt.step().detach()
        losses[step] = loss.detach()
        if cuda:  # the caching allocator's count of live tensor bytes, after the step
            allocated.append(torch.cuda.memory_allocated(device))
        if ranks.main and (step % 10 == 0 or step == args.steps - 1):
            bar.set_postfix_str("loss %.4f" % losses[step].item())
    _sync(device)
    seconds = time.perf_counter() - t0
    if hasattr(bar, "close"):
        bar.close()
    with torch.no_grad():
        val = [model(ids, labels=ids).float().item() for ids in batches.val_batches(device)]
    peak = ranks.max(torch.cuda.max_memory_allocated(device) if cuda else 0)
    loss32 = ranks.mean(losses).cpu()  # the whole step's loss: every rank's rows weigh alike
    losses = [float(x) for x in loss32]
    tokens = args.steps * args.batch * args.seq  # this rank's
    if ranks.main:
        per_gpu = " per GPU over %d ranks" % ranks.world if ranks.distributed else ""
        print("%-5s %d steps in %.1f s (%.0f tokens/s%s), final loss %.4f, held-out loss %.4f%s"
              % (name, args.steps, seconds, tokens / seconds, per_gpu, losses[-1],
                 sum(val) / len(val),
                 ", peak memory %.0f MiB%s" % (peak / 2**20, " (largest rank)" if per_gpu else "")
                 if cuda else ""))
    out = {"loss": losses, "val_loss": sum(val) / len(val), "seconds": seconds,
           "tokens_per_s_per_gpu": tokens / seconds, "peak_mib": peak / 2**20 if cuda else None,
           "world_size": ranks.world}
    if args.soak:
        out.update(
            loss_bits=["%08x" % (int(b) & 0xFFFFFFFF) for b in loss32.view(torch.int32).tolist()],
            grad_norm=[float(x) for x in norms.cpu()],
            allocated=allocated,
            max_allocated=torch.cuda.max_memory_allocated(device) if cuda else None,
            reserved=torch.cuda.memory_reserved(device) if cuda else None)
    return out


def provenance(device):
    """Where a result comes from: commit, date, versions and the device, for its JSON."""
    try:
        # CODA_COMMIT names the commit where the tree has no git (the GPU machine's copy).
        commit = os.environ.get("CODA_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, text=True, capture_output=True,
            timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    import coda
    return dict(commit=commit, date=time.strftime("%Y-%m-%d", time.gmtime()),
                torch=torch.__version__, coda=coda.__version__,
                gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else str(device))


def soak_report(curve, args, device, cfg):
    """OUT/soak.json for tools/soak_compare.py; False when a loss or gradient norm is not finite."""
    nonfinite = [i + 1 for i, (x, g) in enumerate(zip(curve["loss"], curve["grad_norm"]))
                 if not (math.isfinite(x) and math.isfinite(g))]
    report = dict(curve, nonfinite_steps=nonfinite, steps=args.steps, seed=args.seed,
                  **provenance(device), config=cfg.to_dict(), args=vars(args),
                  precision=args.precision)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "soak.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    alloc = curve["allocated"]
    print("soak: %d steps, %d with a NaN or Inf loss or gradient norm; allocated memory %s;"
          " wrote %s" % (args.steps, len(nonfinite),
                         "%d -> %d bytes (step 10 -> last)" % (alloc[min(9, len(alloc) - 1)],
                                                               alloc[-1]) if alloc else "n/a",
                         path))
    return not nonfinite


def smooth(xs, window):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _difference_axis(ax, smooth_window):
    """The right panel's frame: the zero line and the (coda - torch) / torch title."""
    ax.axhline(0, color="#9a9a9a", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_title("(coda - torch) / torch, smoothed over %d steps" % smooth_window, fontsize=9)


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(curves, smooth_window, path, title):
    plt = _pyplot()
    if plt is None:
        print("matplotlib missing: no plot")
        return None
    colors = {"torch": "#9a9a9a", "coda": "#2a6fdb"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name in ("coda", "torch"):  # torch dashed on top, so both show where they coincide
        if name not in curves:
            continue
        c, style = curves[name], "--" if name == "torch" else "-"
        steps = range(1, len(c["loss"]) + 1)
        axes[0].plot(steps, c["loss"], color=colors[name], alpha=0.25, linewidth=0.8)
        axes[0].plot(steps, smooth(c["loss"], smooth_window), color=colors[name], linestyle=style,
                     linewidth=1.8, label="%s (held-out %.3f)" % (name, c["val_loss"]))
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (nats / byte)")
    axes[0].legend()
    axes[0].set_title(title, fontsize=9)
    if "torch" in curves and "coda" in curves:
        a = smooth(curves["coda"]["loss"], smooth_window)
        b = smooth(curves["torch"]["loss"], smooth_window)
        axes[1].plot(range(1, len(a) + 1), [(x - y) / y for x, y in zip(a, b)], color="#2a6fdb")
        _difference_axis(axes[1], smooth_window)
    _save(plt, fig, path)
    return path


def plot_runs(paths, smooth_window, path):
    """Several runs' loss.json in one figure: each run's coda curve (a color per run) over its
    torch curve (grey, dashed), smoothed, and each run's (coda - torch) / torch. Exit status 1,
    nothing drawn, when a file is not a run of both sides (or matplotlib is missing)."""
    runs = []
    for spec in paths:
        label, _, run_path = spec.rpartition("=")
        with open(run_path) as f:
            run = json.load(f)
        if not all(isinstance(run.get(side), dict) and run[side].get("loss")
                   for side in ("coda", "torch")):
            print("%s: not a loss.json with both sides' curves" % run_path, file=sys.stderr)
            return 1
        runs.append((label or "coda %s, seed %s (%s)" % (
            run.get("precision", "native"), run.get("args", {}).get("seed", "?"),
            str(run.get("commit", "?"))[:7]), run))
    plt = _pyplot()
    if plt is None:
        print("matplotlib missing: no plot", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, run) in enumerate(runs):
        a = smooth(run["coda"]["loss"], smooth_window)
        b = smooth(run["torch"]["loss"], smooth_window)
        steps = range(1, len(a) + 1)
        color = palette[i % len(palette)]
        axes[0].plot(steps, b, color="#9a9a9a", linestyle="--", linewidth=1.0)
        axes[0].plot(steps, a, color=color, linewidth=1.4, label=label)
        axes[1].plot(steps, [(x - y) / y for x, y in zip(a, b)], color=color, linewidth=1.2)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (nats / byte), smoothed over %d steps" % smooth_window)
    axes[0].set_title("coda (colors) against its run's torch bf16 side (grey, dashed)", fontsize=9)
    axes[0].legend(fontsize=7)
    _difference_axis(axes[1], smooth_window)
    _save(plt, fig, path)
    print("wrote %s" % path)
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.plot_runs:
        os.makedirs(args.out, exist_ok=True)
        return plot_runs(args.plot_runs, args.smooth, os.path.join(args.out, "runs.png"))
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("train_llama: no CUDA device (coda's GPU kernels need an H100/H200)", file=sys.stderr)
        return 2
    from coda.bench.distributed import Ranks

    ranks = Ranks(args.device, distributed=args.fsdp or args.ddp)
    try:
        return run(args, ranks)
    finally:
        ranks.close()


def run(args, ranks):
    device = ranks.device
    mode = "fsdp2" if args.fsdp else "ddp" if args.ddp else None
    say = print if ranks.main else (lambda *a, **k: None)
    from coda.bench import coda_adapter
    from coda.bench.distributed import spread
    from coda.bench.reference import RefConfig, ReferenceLlama, init_weights

    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.soak:
        # Two runs from one seed must match bit for bit: no nondeterministic PyTorch kernel
        # (attention's backward among them) and a fixed cuBLAS workspace.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        # Attention is PyTorch's, and its cuDNN backward is not deterministic (only a warning
        # under warn_only: the first soak on the H200, 4bde581, diverged at step 42 by 3 ulp):
        # the soak runs SDPA's math backend, plain matmuls and softmax.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa = sdpa_kernel(SDPBackend.MATH)
        sdpa.__enter__()
    data = load_corpus()
    corpus = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    say("corpus: %d files, %d bytes (%.1f epochs of the training split over %d steps)"
          % (len(corpus_files()), len(data),
             args.steps * args.batch * args.seq / (len(data) * 0.95), args.steps))
    batches = Batches(corpus, args.steps, args.batch, args.seq, args.seed, rank=ranks.rank,
                      world=ranks.world)

    cfg = RefConfig(hidden_size=args.hidden, intermediate_size=args.mlp,
                    num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                    head_dim=args.head_dim, vocab_size=256, num_hidden_layers=args.layers,
                    rms_norm_eps=1e-5, rope_theta=10000.0)
    torch.manual_seed(args.seed)
    reference = init_weights(ReferenceLlama(cfg, device=device, dtype=torch.bfloat16), args.seed)
    n_params = sum(p.numel() for p in reference.parameters())
    say("model: %d layers, hidden %d, MLP %d, %d/%d heads of %d, vocab 256: %.1fM parameters;"
          " batch %d x %d bytes%s, %d steps"
          % (args.layers, args.hidden, args.mlp, args.heads, args.kv_heads, args.head_dim,
             n_params / 1e6, args.batch, args.seq,
             " per rank, %d ranks (%s)" % (ranks.world, "FSDP2" if args.fsdp else "DDP")
             if ranks.distributed else "", args.steps))

    # Both models start from the reference's initial weights: coda's converted from them
    # before any training step, PyTorch's the reference itself.
    models = {}
    if "coda" in sides:
        models["coda"] = coda_adapter.model_from_reference(reference)  # a converted copy
        models["coda"].precision = args.precision  # its layer GEMMs: native or fp8
        # FP8: each op's weight copies made once a step (after the optimizer's step moves the
        # weights), not in each call: the same results bit for bit (docs/fp8.md, "The weights
        # quantized once per step").
        models["coda"].fp8_weights_once = args.precision == "fp8"
    if "torch" in sides:
        models["torch"] = reference
    curves = {}
    for name in ("torch", "coda"):
        if name in models:
            # FSDP2: coda's model by its fsdp_units(), PyTorch's per decoder layer.
            model = spread(models[name], mode, device)
            curves[name] = train(name, model, batches, args, ranks)

    if args.soak:
        return 0 if soak_report(curves["coda"], args, device, cfg) else 1
    return compare(curves, args, cfg, device, say, ranks.main)


def compare(curves, args, cfg, device, say, write):
    """Checks that the sides' curves agree; rank 0 writes OUT/loss.json and OUT/loss.png."""
    summary = dict(provenance(device), config=cfg.to_dict(), args=vars(args),
                   precision=args.precision)  # coda's side's; the torch side is bf16
    # (the curves take the sides' names below, so the versions go by theirs)
    summary["torch_version"], summary["coda_version"] = summary.pop("torch"), summary.pop("coda")
    agree = True
    if "torch" in curves and "coda" in curves:
        a = smooth(curves["coda"]["loss"], args.smooth)
        b = smooth(curves["torch"]["loss"], args.smooth)
        rel = [abs(x - y) / y for x, y in zip(a, b)]
        first = abs(curves["coda"]["loss"][0] - curves["torch"]["loss"][0])
        final = rel[-1]
        val_rel = abs(curves["coda"]["val_loss"] - curves["torch"]["val_loss"]) / \
            curves["torch"]["val_loss"]
        agree = final <= args.tolerance and val_rel <= args.tolerance
        summary.update(first_step_abs_diff=first, final_smoothed_rel_diff=final,
                       max_smoothed_rel_diff=max(rel), held_out_rel_diff=val_rel, agree=agree)
        say("first-step loss: torch %.5f, coda %.5f (difference %.2e: same weights, same batch)"
            % (curves["torch"]["loss"][0], curves["coda"]["loss"][0], first))
        say("smoothed loss (window %d): final torch %.4f, coda %.4f, relative difference %.3f;"
            " largest over the run %.3f (at step %d)"
            % (args.smooth, b[-1], a[-1], final, max(rel), rel.index(max(rel)) + 1))
        say("held-out loss: torch %.4f, coda %.4f, relative difference %.3f"
            % (curves["torch"]["val_loss"], curves["coda"]["val_loss"], val_rel))
        say("curves %s (tolerance %.3f)" % ("AGREE" if agree else "DISAGREE", args.tolerance))
    summary.update({name: c for name, c in curves.items()})
    if not write:
        return 0 if agree else 1
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "loss.json"), "w") as f:
        json.dump(summary, f, indent=1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    title = "byte-level Llama on the coda repository: %d layers, hidden %d, %d steps, %s%s" % (
        args.layers, args.hidden, args.steps, where,
        ", coda in FP8" if args.precision == "fp8" else "")
    png = plot(curves, args.smooth, os.path.join(args.out, "loss.png"), title)
    print("wrote %s%s" % (os.path.join(args.out, "loss.json"), " and " + png if png else ""))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
