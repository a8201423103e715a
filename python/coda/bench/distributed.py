"""Data-parallel training throughput of model-1b under FSDP2 and DDP (docs/distributed.md):

    torchrun --nproc-per-node 2 -m coda.bench.distributed [--modes fsdp2,ddp]
                                                          [--out bench/results/distributed.json]

Every rank builds the same model-1b (16 layers, Llama-3.2-1B's widths; the weights from one seed)
and times forward+backward on its own 8192 tokens (a seed per rank), the collectives included:
FSDP2's all-gathers and reduce-scatters (bf16 parameters, fp32 reduction; coda's model sharded by
`Llama.fsdp_units()`, PyTorch's per decoder layer) or DDP's all-reduce (an fp32 hook). Sides:
coda's `Llama`, and the same model in plain PyTorch under torch.compile, wrapped the same way.
Before the modes, rank 0 alone times coda's unwrapped model (the single-GPU baseline) while the
other ranks wait.

Timing per repetition: the L2 flushed, the ranks lined up at a barrier, CUDA events around the
step on each rank; a side's time is the slowest rank's median. Peak memory: the largest
`torch.cuda.max_memory_allocated` of any rank over the timed steps, weights included (sharding
the weights is what FSDP2 saves), with only that side's model resident.

Writes {"gpu", "date", "commit", "torch", "world_size", "cases": [{"mode", "model",
"tokens_per_gpu", "coda_tokens_per_s_per_gpu", "single_gpu_tokens_per_s",
"torch_compile_tokens_per_s_per_gpu", "peak_mib_per_gpu", "single_gpu_peak_mib", ...}]}.
"""
import argparse
import gc
import json
import os
import statistics
import sys

MODES = ("fsdp2", "ddp")
MIB = float(1 << 20)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="torchrun ... -m coda.bench.distributed",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="fsdp2,ddp", help="comma-separated: fsdp2, ddp")
    p.add_argument("--sides", default="coda,compile", help="comma-separated: coda, compile")
    p.add_argument("--out", default=None,
                   help="results JSON (default: bench/results/distributed.json of the repository)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per GPU and step")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--shape", default="1b", choices=("1b", "tiny"),
                   help="tiny: a smoke run of a few ms")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-single", action="store_true", help="skip the single-GPU baseline")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for m in args.modes:
        if m not in MODES:
            p.error("--modes: %r is not one of %s" % (m, ", ".join(MODES)))
    for s in args.sides:
        if s not in ("coda", "compile"):
            p.error("--sides: %r is not coda or compile" % s)
    if args.warmup < 1 or args.iters < 1:
        p.error("--warmup and --iters must be at least 1 (the warm-up compiles)")
    return args


class Ranks:
    """This process among torchrun's (RANK, WORLD_SIZE, LOCAL_RANK; one rank of its own without
    them), its device, and the process group when `distributed` (NCCL on a GPU, gloo on the
    CPU). examples/train_llama.py and this benchmark share it."""

    def __init__(self, device, distributed=True):
        import torch

        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = distributed
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        self.device = device
        if not distributed:
            if self.world > 1:
                raise SystemExit("%d ranks but no data-parallel mode (--fsdp or --ddp): every "
                                 "rank would train the same model alone" % self.world)
            return
        import torch.distributed as dist

        if self.world == 1:  # a process group of one without torchrun's rendezvous variables
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29511")
        kwargs = {}
        if device.type == "cuda":
            torch.cuda.set_device(device)
            kwargs["device_id"] = device  # binds NCCL's communicator to this GPU up front
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=self.rank,
                                world_size=self.world, **kwargs)

    @property
    def main(self):
        return self.rank == 0

    def _many(self):
        return self.distributed and self.world > 1

    def barrier(self):
        if self._many():
            import torch.distributed as dist

            ids = [self.device.index] if self.device.type == "cuda" else None
            dist.barrier(device_ids=ids)

    def mean(self, t):
        """The mean of `t` over the ranks (gloo has no AVG: a sum, then the division)."""
        if not self._many():
            return t
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t)
        return t.div_(self.world)

    def max(self, value):
        if not self._many():
            return float(value)
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def close(self):
        if self.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


class Alone:
    """Rank 0 timing by itself while the other ranks wait: no barrier, its own numbers."""

    def barrier(self):
        pass

    def max(self, value):
        return float(value)


def fp32_mean(_state, bucket):
    """A DDP communication hook: the gradient all-reduce in fp32, as FSDP2's
    reduce_dtype=fp32 (the bucket's 16-bit gradients upcast, summed, divided by the world size,
    rounded back once)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    work = dist.all_reduce(buffer.float().div_(dist.get_world_size()), async_op=True)
    return work.get_future().then(lambda f: buffer.copy_(f.value()[0]))


def spread(model, mode, device):
    """The model for data-parallel training: unchanged (mode None), wrapped in DDP with the fp32
    hook ("ddp"), or sharded by FSDP2 ("fsdp2": bf16 parameters, fp32 reduce-scatter). FSDP2
    units: coda's Llama.fsdp_units(), because a coda op reads weights of two decoder layers
    (docs/distributed.md); a PyTorch Llama one unit per decoder layer, as usual."""
    import torch

    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
        model.register_comm_hook(None, fp32_mean)
    elif mode == "fsdp2":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            raise ImportError("torch %s has no FSDP2 (torch.distributed.fsdp.fully_shard, "
                              "torch >= 2.6)" % torch.__version__) from None
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if hasattr(model, "fsdp_units"):
            units = model.fsdp_units()
        else:
            units = [[layer] for layer in model.model.layers]
        for unit in units:
            fully_shard(unit, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    elif mode is not None:
        raise ValueError("mode must be None, 'ddp' or 'fsdp2'; got %r" % (mode,))
    return model


def build(side, cfg, device):
    """The side's model on `device` from seed 0: coda's Llama converted from the reference's
    weights (the reference then freed), or the reference itself."""
    import torch

    from .coda_adapter import model_from_reference
    from .sides import build_reference_model

    ref = build_reference_model(cfg, seed=0, device=device)
    if side == "compile":
        return ref
    model = model_from_reference(ref)
    del ref
    gc.collect()
    torch.cuda.empty_cache()
    return model


def time_steps(group, model, fn, inputs, warmup, iters, flush):
    """(slowest rank's median step ms, largest rank's peak MiB, this rank's last loss);
    `group` lines the ranks up and takes the maxima (Ranks, or Alone)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, loss = [], None
    for i in range(warmup + iters):
        model.zero_grad(set_to_none=True)
        flush()
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        group.barrier()
        start.record()
        loss = fn(inputs.input_ids, labels=inputs.labels)
        loss.backward()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    loss = loss.detach().float().item()
    peak = torch.cuda.max_memory_allocated()
    model.zero_grad(set_to_none=True)
    return group.max(statistics.median(times)), group.max(peak) / MIB, loss


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():
        print("coda.bench.distributed: no CUDA device (coda's GPU kernels need an H100/H200)",
              file=sys.stderr)
        return 2
    from . import report
    from .runner import make_config
    from .sides import ModelInputs
    from .timing import L2Flush

    group = Ranks("cuda")
    try:
        cfg = make_config(args.shape, layers=args.layers)
        inputs = ModelInputs(cfg, args.tokens, 1, device=group.device, seed=1 + group.rank)
        flush = L2Flush(device=group.device)
        say = print if group.rank == 0 else (lambda *a, **k: None)
        say("model-%s, %d layers, %d tokens per GPU and step, %d ranks"
            % (args.shape, args.layers, args.tokens, group.world))

        def measure(side, mode, ranks=group):
            model = build(side, cfg, group.device)
            module = spread(model, mode, group.device)
            fn = torch.compile(module) if side == "compile" else module
            ms, peak, loss = time_steps(ranks, module, fn, inputs, args.warmup, args.iters, flush)
            del model, module, fn
            gc.collect()
            torch.cuda.empty_cache()
            say("  %-7s %-6s %8.2f ms a step, %9.0f tokens/s per GPU, peak %7.0f MiB, loss %.4f"
                % (mode or "single", side, ms, args.tokens / ms * 1e3, peak, loss))
            return {"ms": ms, "tokens_per_s": args.tokens / ms * 1e3, "peak_mib": peak,
                    "loss": loss}

        single = None
        if not args.no_single:
            # Rank 0 alone, the others waiting: the GPU's own throughput, no collectives.
            if group.rank == 0:
                single = measure("coda", None, ranks=Alone())
            group.barrier()
        cases = []
        for mode in args.modes:
            sides = {side: measure(side, mode) for side in args.sides}
            coda, comp = sides.get("coda"), sides.get("compile")
            case = {
                "mode": mode, "model": "model-%s" % args.shape, "layers": args.layers,
                "tokens_per_gpu": args.tokens,
                "coda_tokens_per_s_per_gpu": coda and coda["tokens_per_s"],
                "single_gpu_tokens_per_s": single and single["tokens_per_s"],
                "torch_compile_tokens_per_s_per_gpu": comp and comp["tokens_per_s"],
                "peak_mib_per_gpu": coda and coda["peak_mib"],
                "single_gpu_peak_mib": single and single["peak_mib"],
                "torch_compile_peak_mib_per_gpu": comp and comp["peak_mib"],
                "coda_ms": coda and coda["ms"], "torch_compile_ms": comp and comp["ms"],
                "single_gpu_ms": single and single["ms"],
                "coda_loss": coda and coda["loss"], "torch_compile_loss": comp and comp["loss"],
            }
            cases.append(case)
        if group.rank == 0:
            results = dict(report.metadata(), world_size=group.world, warmup=args.warmup,
                           iters=args.iters, cases=cases)
            out = args.out or os.path.join(report.repo_root(), "bench", "results",
                                           "distributed.json")
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out, "w") as f:
                json.dump(results, f, indent=1)
                f.write("\n")
            for c in cases:
                say(summary(c))
            say("wrote %s" % out)
        return 0
    finally:
        group.close()


def summary(case):
    """One line per mode: the issue's three ratios."""
    def ratio(a, b):
        return "%.3f" % (a / b) if a and b else "-"

    return ("%s: coda %s tokens/s per GPU; / single GPU %s (target >= 0.90), / torch.compile %s"
            " (target >= 1.05); peak %s MiB per GPU against %s on one GPU"
            % (case["mode"],
               "%.0f" % case["coda_tokens_per_s_per_gpu"] if case["coda_tokens_per_s_per_gpu"]
               else "-",
               ratio(case["coda_tokens_per_s_per_gpu"], case["single_gpu_tokens_per_s"]),
               ratio(case["coda_tokens_per_s_per_gpu"],
                     case["torch_compile_tokens_per_s_per_gpu"]),
               "%.0f" % case["peak_mib_per_gpu"] if case["peak_mib_per_gpu"] else "-",
               "%.0f" % case["single_gpu_peak_mib"] if case["single_gpu_peak_mib"] else "-"))


if __name__ == "__main__":
    sys.exit(main())
