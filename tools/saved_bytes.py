#!/usr/bin/env python3
"""What each side of `python -m coda.bench` keeps between forward and backward, and its peaks.

    CODA_LIBRARY=<libcoda.so> PYTHONPATH=python python tools/saved_bytes.py [--cases block-1b,block-8b]
                                                                        [--tokens 8192] [--json out.json]

For each case (the bench's block cases: coda's middle layer, and the same block in PyTorch eager
and through torch.compile, built by coda.bench from the same weights and inputs; optionally
model-1b) and each side, one untimed fwd+bwd first (torch.compile compiles there), then one
measured fwd+bwd on a quiet allocator, gradients None before it:

  kept     torch.cuda.memory_allocated() after the forward minus before it: everything the
           forward left alive for the backward, its outputs included (the robust measure: it
           sees what any partitioner saved, wherever it stashed it)
  outputs  the bytes of the forward's outputs (alive either way: the caller holds them)
  graph    the distinct storages the autograd graph of the outputs holds (every node's saved
           tensors: C++ nodes' _saved_* fields, Python nodes' saved_tensors and the tensors
           stashed on them, as torch.compile's backward does), less the inputs and weights,
           split into outputs and the rest ("saved" below)
  hooks    the same through torch.autograd.graph.saved_tensors_hooks during a forward of its own
           before the measured one (eager and coda; the compiled forward's saving is inside its
           graph, so none for compile)
  fwd pk   the forward's peak (max_memory_allocated) above what was allocated before it
  peak     the fwd+bwd peak above the same: the number python -m coda.bench reports as peak MiB
           (there measured over 20 repetitions, plus construction-time allocations)
  bwd tr   peak - kept: what the backward allocates on top of what the forward kept

--attention runs the block cases with the bench's SDPA after the layer (the "+attn" rows).
--timeline records the measured fwd+bwd's allocations (torch.cuda.memory._record_memory_history)
and prints what is alive at its peak, largest first, each with the Python line that allocated it:
where a peak comes from, not only how high it is.

Each row gives MiB and, after the slash, bytes per token (per layer for the block cases). It
also prints the largest saved tensors per side (shape, dtype, MiB) and, for coda, the block's
backward workspace (coda_llama_workspace_size). Needs a CUDA GPU with torch >= 2.4 for the
compile side (older torch: that side is reported as failed); about 30 s on an H100 for the two
block cases.
"""
import argparse
import gc
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "python"))

import torch  # noqa: E402

MIB = float(1 << 20)


def storage_key(t):
    """(address, bytes) of t's whole storage: the memory that t keeps alive."""
    try:
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()  # torch < 2.0
        return s.data_ptr(), s.nbytes()
    except Exception:  # a tensor without storage (sparse, nested, fake)
        return None


def tensors_in(value, depth=0):
    """The tensors in a value: a tensor, or (nested) lists, tuples and dicts of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v, depth + 1)


def graph_saved(roots):
    """{storage key: (shape, dtype, node name)} of every tensor the autograd graph under `roots`
    keeps for its backward."""
    found, seen, walked = {}, set(), []
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]

    def record(t, node):
        key = storage_key(t)
        if key is not None and key[1] > 0 and key not in found:
            found[key] = (tuple(t.shape), t.dtype, type(node).__name__)

    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        walked.append(node)  # referenced until the walk ends, so that ids stay unique
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except Exception:  # freed, or a field that raises when read
                    continue
                for t in tensors_in(value):
                    record(t, node)
        try:
            for t in tensors_in(tuple(node.saved_tensors)):
                record(t, node)
        except Exception:  # a C++ node, or saved tensors already freed
            pass
        for value in getattr(node, "__dict__", {}).values():
            for t in tensors_in(value):
                record(t, node)
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    return found


def resident_keys(tensors):
    keys = set()
    for t in tensors:
        k = storage_key(t)
        if k is not None:
            keys.add(k)
    return keys


def split(found, resident, outputs):
    """(bytes in outputs, bytes elsewhere, the elsewhere entries) of found storages that are not
    resident (inputs, weights)."""
    out_b = other_b = 0
    other = []
    for key, info in found.items():
        if key in resident:
            continue
        if key in outputs:
            out_b += key[1]
        else:
            other_b += key[1]
            other.append((key[1], info))
    other.sort(key=lambda e: -e[0])
    return out_b, other_b, other


DEVICE = "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free():
    gc.collect()
    if DEVICE == "cuda":
        sync()
        torch.cuda.empty_cache()


def allocated():
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def max_allocated():
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


def reset_peak():
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _allocation_site(frames):
    """The innermost Python frame of an allocation that is not torch's own: the line of coda,
    of the bench or of this tool that asked for the memory."""
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and "/torch/" not in name:
            return "%s:%d %s" % (os.path.basename(name), f.get("line", 0), f.get("name", ""))
    return "(no Python frame)"


def alive_at_peak(snapshot, top=14):
    """Replays the recorded allocations (alloc / free_requested, the events memory_allocated()
    follows) and returns (peak bytes above the recording's start, [(bytes, count, site)]) of
    what was alive at that peak, grouped by allocation site, largest first."""
    alive, used, peak, at_peak = {}, 0, 0, {}
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] == "alloc":
                alive[e["addr"]] = (e["size"], _allocation_site(e.get("frames", [])))
                used += e["size"]
            elif e["action"] == "free_requested" and e["addr"] in alive:
                used -= alive.pop(e["addr"])[0]
            else:
                continue
            if used > peak:
                peak, at_peak = used, dict(alive)
    sites = {}
    for size, site in at_peak.values():
        b, n = sites.get(site, (0, 0))
        sites[site] = (b + size, n + 1)
    rows = sorted(((b, n, site) for site, (b, n) in sites.items()), reverse=True)
    return peak, rows[:top]


def measure(side, resident_tensors, use_hooks, timeline=False):
    """One warm-up fwd+bwd, then the measured one. Returns a dict of bytes."""
    side.zero_grad()
    outs = side.forward()
    side.backward(outs)
    del outs
    side.zero_grad()
    free()

    packed = {}

    def pack(t):
        k = storage_key(t)
        if k is not None and k[1] > 0:
            packed.setdefault(k, (tuple(t.shape), t.dtype))
        return t

    resident = resident_keys(resident_tensors)
    if use_hooks:
        # What the forward saves, in a pass of its own: under saved-tensor hooks a layer may save
        # differently (coda's middle op keeps qkv as a saved tensor there and lets it go early
        # without them: coda.ops._middle_setup), and the measured pass below runs as training does.
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs = side.forward()
        hooked = split({k: (s, d, "") for k, (s, d) in packed.items()}, resident,
                       resident_keys(tensors_in(outs if isinstance(outs, (list, tuple))
                                                else (outs,))) - resident)
        side.backward(outs)
        del outs
        side.zero_grad()
        free()
    base = allocated()
    reset_peak()
    if timeline:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    outs = side.forward()
    sync()
    kept = allocated() - base
    fwd_peak = max_allocated() - base
    out_list = [t for t in tensors_in(outs if isinstance(outs, (list, tuple)) else (outs,))]
    outputs = resident_keys(out_list) - resident
    out_bytes = sum(k[1] for k in outputs)
    g_out, g_other, g_list = split(graph_saved(out_list), resident, outputs)
    rec = {"kept": kept, "outputs": out_bytes, "fwd_peak": fwd_peak,
           "graph_saved_outputs": g_out, "graph_saved": g_other,
           "largest": [(b, list(s), str(d), n) for b, (s, d, n) in g_list[:8]]}
    if use_hooks:
        rec["hooks_saved_outputs"], rec["hooks_saved"] = hooked[0], hooked[1]
    side.backward(outs)
    sync()
    rec["peak"] = max_allocated() - base
    if timeline:
        traced_peak, rows = alive_at_peak(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
        rec["timeline"] = {"peak": traced_peak,
                           "alive": [{"bytes": b, "count": n, "site": s} for b, n, s in rows]}
    del outs
    side.zero_grad()
    free()
    return rec


def block_case(case, tokens, shape_override=None, attention=False):
    from coda import _lib as L
    from coda import ops
    from coda.bench.runner import CASES, make_config
    from coda.bench.sides import (BlockInputs, CodaBlockSide, TorchBlockSide,
                                  build_reference_block)

    _, shape, default_tokens, batch, _, _ = CASES[case]
    tokens = tokens or default_tokens
    cfg = make_config(shape_override or shape)
    inputs = BlockInputs(cfg, tokens, batch, attention=attention, device=DEVICE, seed=0)
    ref = build_reference_block(cfg, attention, seed=1, device=DEVICE)
    seeds = ["g_y1"] if attention else ["g_qkv", "g_q", "g_k", "g_v"]
    inputs_t = [inputs.x0, inputs.y0, inputs.positions, inputs.inv_freq, inputs.cos, inputs.sin,
                inputs.g_x2] + [getattr(inputs, name) for name in seeds]
    sides = {}
    sides["eager"] = lambda: (TorchBlockSide(ref, inputs), list(ref.parameters()), True)
    sides["compile"] = lambda: (TorchBlockSide(ref, inputs, torch.compile(ref, dynamic=False)),
                                list(ref.parameters()), False)

    def coda_side():
        side = CodaBlockSide(ref, inputs)
        return side, side.param_tensors(), True

    sides["coda"] = coda_side
    extra = {}
    try:
        c = ops._c_config(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                          cfg.num_key_value_heads, cfg.head_dim, 0, cfg.rms_norm_eps)
        # The backward's size depends on the current CUDA device (stream-K scratch).
        extra["coda_workspace_bwd"] = L.llama_workspace_size(L.LLAMA_MIDDLE, L.LLAMA_BACKWARD,
                                                             c, tokens)
        # coda.ops runs the backward in two parts, each with its own workspace.
        for key, part in (("part1", L.LLAMA_BACKWARD_PART1), ("part2", L.LLAMA_BACKWARD_PART2)):
            extra["coda_workspace_bwd_" + key] = L.llama_workspace_size(L.LLAMA_MIDDLE, part, c,
                                                                         tokens)
        extra["coda_workspace_fwd"] = L.llama_workspace_size(L.LLAMA_MIDDLE, L.LLAMA_FORWARD,
                                                             c, tokens)
    except Exception as e:
        extra["workspace_error"] = str(e)
    return tokens, sides, inputs_t, extra


def model_case(case, tokens, shape_override=None, attention=True):
    from coda.bench import coda_adapter
    from coda.bench.runner import CASES, make_config
    from coda.bench.sides import ModelInputs, ModelSide, build_reference_model

    _, shape, default_tokens, batch, layers, _ = CASES[case]
    tokens = tokens or default_tokens
    cfg = make_config(shape_override or shape, layers=layers)
    inputs = ModelInputs(cfg, tokens, batch, device=DEVICE, seed=0)
    ref = build_reference_model(cfg, seed=1, device=DEVICE)
    sides = {
        "eager": lambda: (ModelSide(ref, inputs), list(ref.parameters()), True),
        "compile": lambda: (ModelSide(ref, inputs, torch.compile(ref, dynamic=False)),
                            list(ref.parameters()), False),
    }

    def coda_side():
        model = coda_adapter.model_from_reference(ref)
        return ModelSide(model, inputs), list(model.parameters()) + list(model.buffers()), True

    sides["coda"] = coda_side
    return tokens, sides, [inputs.input_ids], {}


def fmt(b, tokens):
    if b is None:
        return "-"
    return "%7.1f/%6d" % (b / MIB, round(b / tokens))


def main(argv=None):
    # The Python path's middle calls: a C++ host path node (coda._host_path) shows Python none
    # of its saved tensors; test_host_path.py checks that it saves what the Python path saves
    # and peaks at its bytes.
    from coda import ops

    ops._HOST_PATH[:] = [None]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="block-1b,block-8b",
                   help="comma-separated: block-1b, block-8b, model-1b (default: the blocks)")
    p.add_argument("--sides", default="eager,compile,coda")
    p.add_argument("--tokens", type=int, default=None, help="default: the bench's (8192)")
    p.add_argument("--json", default=None, help="also write the records here")
    p.add_argument("--device", default="cuda",
                   help="cpu: a smoke run of the code paths (no memory numbers; with --shape tiny)")
    p.add_argument("--shape", default=None, help="override the cases' shape (1b, 8b, tiny)")
    p.add_argument("--attention", action="store_true",
                   help="block cases with the bench's SDPA after the layer (+attn)")
    p.add_argument("--timeline", action="store_true",
                   help="print what is alive at each side's fwd+bwd peak and where it was allocated")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("saved_bytes: needs a CUDA GPU (or --device cpu --shape tiny for a smoke run)")
        return 2
    if DEVICE == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    records = []
    t_start = time.perf_counter()
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print("torch %s, %s; coda library %s" % (torch.__version__, gpu,
                                            os.environ.get("CODA_LIBRARY", "(search path)")))
    for case in [c for c in args.cases.split(",") if c]:
        build = model_case if case.startswith("model") else block_case
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()
        free()
        try:
            tokens, sides, inputs_t, extra = build(case, args.tokens, args.shape, args.attention)
        except Exception as e:
            print("%s: cannot build: %s" % (case, e))
            traceback.print_exc()
            continue
        print("\n%s%s, %d tokens  (MiB / bytes per token%s)" % (
            case, " +attn" if args.attention and case.startswith("block") else "", tokens,
            " per layer" if case.startswith("block") else ""))
        print("%-8s %15s %15s %15s %15s %15s %15s %15s" % (
            "side", "kept", "outputs", "saved(graph)", "saved(hooks)", "fwd pk", "peak",
            "bwd tr"))
        for name in [s for s in args.sides.split(",") if s]:
            t0 = time.perf_counter()
            try:
                side, weights, hooks = sides[name]()
                rec = measure(side, list(weights) + list(inputs_t), hooks,
                              args.timeline and DEVICE == "cuda")
            except Exception as e:
                print("%-8s failed: %s: %s" % (name, type(e).__name__, str(e).splitlines()[0]
                                               if str(e) else ""))
                traceback.print_exc()
                side = None
                free()
                continue
            rec.update(case=case, side=name, tokens=tokens, attention=args.attention,
                       seconds=time.perf_counter() - t0)
            rec["bwd_transient"] = rec["peak"] - rec["kept"]
            if name == "coda":
                rec.update(extra)
            records.append(rec)
            print("%-8s %15s %15s %15s %15s %15s %15s %15s" % (
                name, fmt(rec["kept"], tokens), fmt(rec["outputs"], tokens),
                fmt(rec["graph_saved"], tokens), fmt(rec.get("hooks_saved"), tokens),
                fmt(rec["fwd_peak"], tokens), fmt(rec["peak"], tokens),
                fmt(rec["bwd_transient"], tokens)))
            del side
            free()
        for rec in records:
            if rec["case"] != case:
                continue
            print("  %s saved (besides inputs, weights, outputs), largest first:" % rec["side"])
            for b, shape, dtype, node in rec["largest"]:
                print("    %8.1f MiB  %-22s %-15s %s" % (b / MIB, shape, dtype, node))
            if "timeline" in rec:
                print("  %s alive at its traced peak (%.1f MiB above the measured pass's start):"
                      % (rec["side"], rec["timeline"]["peak"] / MIB))
                for row in rec["timeline"]["alive"]:
                    print("    %8.1f MiB  x%-3d %s" % (row["bytes"] / MIB, row["count"],
                                                     row["site"]))
            if "coda_workspace_bwd" in rec:
                print("  coda workspace: forward %.1f MiB, backward %.1f MiB" % (
                    rec["coda_workspace_fwd"] / MIB, rec["coda_workspace_bwd"] / MIB))
    print("\n%.1f s" % (time.perf_counter() - t_start))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": gpu, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
