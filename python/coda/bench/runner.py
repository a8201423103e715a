"""One benchmark case end to end: build the inputs and the reference module, build coda's
side from the same weights (and, for a block, the native side: the same layer through coda's C
ABI alone, on coda's weights), then for each side in turn (eager, compile, coda with native):
record the quiescent memory, run one untimed forward+backward (torch.compile compiles here; its
outputs and gradients go to the agreement checks), then time every pass (timing.py; coda and
native alternate pass by pass).

The FP8 block cases (--fp8: run_fp8_case) follow the same steps with their own sides: coda's
middle layer in bf16 and in FP8, the reference block with FP8 linears (torch_fp8.py) and the
bf16 reference, both under torch.compile, all four timed pass by pass in turn."""
import gc
import math
import sys
import time
import traceback

import torch

from . import coda_adapter, overhead, timing, torch_fp8
from .reference import RefConfig
from .sides import (BlockInputs, CodaBlockSide, ModelInputs, ModelSide, NativeBlockSide,
                    TorchBlockSide, build_reference_block, build_reference_model)

SHAPES = {
    # Llama-3.2-1B and Llama-3.1-8B (without rope scaling; it changes no cost).
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=128256),
    # A few-millisecond shape for the smoke test.
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=512),
}

# name -> (kind, shape, tokens, batch, layers, attention variants)
CASES = {
    "block-1b": ("block", "1b", 8192, 1, 1, (False, True)),
    "block-8b": ("block", "8b", 8192, 1, 1, (False, True)),
    "model-1b": ("model", "1b", 8192, 1, 16, (True,)),
}

SIDE_ORDER = ("eager", "compile", "coda", "native")
# Timed in turn, pass by pass (_groups); native exists for the block cases only.
PAIRED = ("coda", "native")

# The FP8 block comparison (--fp8; issue 13): name -> (shape, tokens, batch). The middle block
# without attention: SDPA would be the same bf16 call on every side.
FP8_CASES = {"fp8-1b": ("1b", 8192, 1), "fp8-8b": ("8b", 8192, 1)}
# Its sides, every one timed pass by pass in turn with the others (one _groups group): coda's
# block in bf16 and in FP8 (each call quantizing the weights it reads), coda's FP8 block given
# its weights' FP8 copies made in one pass at the start of each forward (fp8_once: a training
# step with the copies made once per step, docs/fp8.md "The weights quantized once per step"),
# the reference block with FP8 linears (torch_fp8.py) and the bf16 reference, both under
# torch.compile.
FP8_SIDE_ORDER = ("coda", "coda_fp8", "coda_fp8_once", "torch_fp8", "compile")
# side -> its name in the results (issue 13's bf16_ms, fp8_ms and torch_fp8_ms, then the rest).
FP8_KEYS = {"coda": "bf16", "coda_fp8": "fp8", "coda_fp8_once": "fp8_once",
            "torch_fp8": "torch_fp8", "compile": "torch_bf16"}
FP8_MODELS = {"1b": "llama-1b", "8b": "llama-8b"}
# The agreement check: each FP8 side against its own bf16 counterpart (the other bf16 side where
# that one did not run), relative Frobenius error per tensor (report.FP8_CHECK_DEFINITION).
FP8_COUNTERPART = {"coda_fp8": "coda", "coda_fp8_once": "coda", "torch_fp8": "compile"}
FP8_OUTPUTS = ("x2", "qkv")
# FP8 rounding of random Llama-init data gives 1-7% (tiny shape, 64-256 tokens, on the CPU:
# coda's block-scaled recipe on its CPU backend x2 0.9%, qkv 3.9%, the gradients 1.6-7.1%; the
# torch recipe with the cast and _scaled_mm emulated, E4M3 gradients 0.9%, 3.8%, 1.6-7.3%, E5M2
# ones up to 9.6%); a wrong layout, scale or operand gives errors of order 1. The gradients pass
# through two or three quantized GEMMs, hence their room.
FP8_BOUND_OUTPUTS = 0.10
FP8_BOUND_GRADS = 0.20
# Below this on the outputs, an "FP8" side shows no FP8 rounding at all: it ran 16-bit GEMMs.
FP8_NOISE_FLOOR = 1e-3
ALL_PASSES = ("fwd", "bwd", "fwd+bwd")
LIGHT_ELEMENTS = 1 << 24


def make_config(shape, layers=1, eps=1e-5, theta=500000.0):
    return RefConfig(num_hidden_layers=layers, rms_norm_eps=eps, rope_theta=theta, **SHAPES[shape])


def _light(t):
    """A bounded CPU copy for the agreement check (the first rows of a huge gradient)."""
    t = t.detach()
    if t.numel() > LIGHT_ELEMENTS and t.dim() >= 2:
        t = t.flatten(0, -2)[: max(1, LIGHT_ELEMENTS // t.shape[-1])]
    return t.float().cpu()


def _rel_diff(results, truth):
    """max over shared keys of max|a - b| / max|b| (0 when a key set is empty)."""
    worst, where = 0.0, None
    for k, b in truth.items():
        if k not in results:
            continue
        a = results[k]
        if a.shape != b.shape:
            return float("inf"), "%s shape %s vs %s" % (k, tuple(a.shape), tuple(b.shape))
        r = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        if r != r:  # NaN
            return float("inf"), k + " is NaN"
        if r > worst:
            worst, where = r, k
    return worst, where


def _free():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _error_text(e):
    return "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")


class Opts:
    def __init__(self, warmup=3, iters=20, passes=ALL_PASSES, sides=SIDE_ORDER, check=True,
                 compile_mode=None, log=print, device="cuda", profile=False, host_ahead=False,
                 torch_fp8_grad="e4m3"):
        self.warmup, self.iters, self.passes, self.sides = warmup, iters, tuple(passes), tuple(sides)
        self.check, self.compile_mode, self.log = check, compile_mode, log
        self.device, self.profile, self.host_ahead = device, profile, host_ahead
        # The torch FP8 side's gradient format (torch_fp8.py: e4m3, or torchao's default e5m2).
        self.torch_fp8_grad = torch_fp8_grad


def _compile(module, opts):
    kwargs = {"dynamic": False}
    if opts.compile_mode:
        kwargs["mode"] = opts.compile_mode
    return torch.compile(module, **kwargs)


def _groups(sides, paired=PAIRED):
    """The sides in measuring order, in groups: each side alone, except that coda and native
    (the sides in `paired`) form one group, timed pass by pass in turn, so that coda_ms /
    native_ms compares runs seconds apart on the same warm GPU."""
    groups = []
    for name in sides:
        pair = next((g for g in groups if name in paired and g[0] in paired), None)
        if pair is not None:
            pair.append(name)
        else:
            groups.append([name])
    return groups


def _failed(name, side, entry, e, opts):
    entry["error"] = _error_text(e)
    opts.log("  %-8s failed: %s" % (name, entry["error"]))
    traceback.print_exc(file=sys.stderr)
    side.zero_grad()
    _free()


def _first_call(name, side, extra, builders, entry, opts):
    """Quiescent memory, then one untimed fwd+bwd (torch.compile compiles here) whose outputs
    and gradients go to the agreement check. Returns the quiescent bytes, or None on failure
    (recorded in entry)."""
    for other in builders.values():
        if not isinstance(other, BaseException) and other is not None:
            other[0].zero_grad()
    try:
        quiescent = timing.quiescent_bytes(extra)
        prepare = getattr(side, "prepare", None)
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        outs = side.forward()
        side.backward(outs)
        torch.cuda.synchronize()
        entry["first_call_s"] = time.perf_counter() - t0
        if opts.check:
            entry["results"] = {k: _light(v) for k, v in side.results(outs).items()}
        del outs
        side.zero_grad()
        return quiescent
    except Exception as e:  # an unsupported shape, a missing kernel, out of memory
        outs = None  # drop the outputs (and their graph) before _failed frees the cache
        _failed(name, side, entry, e, opts)
        return None


def _measure(builders, opts, flush, paired=PAIRED):
    """builders: side name -> (side, extra construction bytes) or an exception; paired: the
    sides timed in turn (_groups).
    Returns {side: {"pass": (ms, mib), "first_call_s", "results", "profile", "error"}}."""
    out = {}
    for group in _groups(opts.sides, paired):
        started = []
        for name in group:
            entry = out.setdefault(name, {})
            built = builders.get(name)
            if built is None:
                continue
            if isinstance(built, BaseException):
                entry["error"] = _error_text(built)
                opts.log("  %-8s unavailable: %s" % (name, entry["error"]))
                continue
            side, extra = built
            quiescent = _first_call(name, side, extra, builders, entry, opts)
            if quiescent is not None:
                started.append((name, side, entry, quiescent))
        for p in opts.passes:
            for name, side, entry, quiescent in started:
                if "error" in entry:
                    continue
                try:
                    entry[p] = timing.time_pass(side, p, warmup=opts.warmup, iters=opts.iters,
                                                flush=flush, quiescent=quiescent,
                                                host_ahead=opts.host_ahead)
                    opts.log("  %-8s %-8s %9.3f ms %10.0f MiB"
                             % (name, p, entry[p][0], entry[p][1]))
                except Exception as e:
                    _failed(name, side, entry, e, opts)
        if opts.profile:
            _profile(started, opts, flush)
    return out


def _profile(started, opts, flush):
    """--profile: coda's and native's fwd+bwd under torch.profiler (overhead.py)."""
    done = {}
    for name, side, entry, _ in started:
        if name not in PAIRED or "error" in entry:
            continue
        try:
            entry["profile"] = done[name] = overhead.profile_pass(side, flush, name, opts.log)
        except Exception as e:  # a torch without CUPTI, a profiler that cannot start
            entry["profile_error"] = _error_text(e)
            opts.log("  profile  %-8s failed: %s" % (name, entry["profile_error"]))
    if len(done) == 2:
        opts.log("  profile  " + overhead.compare(done["coda"], done["native"]))


def _native_check(measured, attention, opts):
    """The native side's outputs and gradients against the coda side's (the same C calls on
    the same tensors): record fields and a warning, or ({}, None) when either is missing.
    coda's kernels are deterministic, so without attention everything must match bit for bit;
    with attention, the SDPA backward (torch's, nondeterministic on some backends) sits
    between, so only the forward outputs must, and the gradients are held to 0.05 as usual."""
    native = measured.get("native", {}).get("results")
    coda = measured.get("coda", {}).get("results")
    if native is None or coda is None:
        return {}, None
    differs = sorted(k for k in coda if k not in native or not torch.equal(native[k], coda[k]))
    rel, where = _rel_diff(native, coda)
    exact = [k for k in differs if not attention or k in ("x2", "y1")]
    bad = exact or rel > 0.05
    opts.log("  check    native   vs coda:  %s%s"
             % ("bitwise equal" if not differs else "differs in %s (max relative difference "
                "%.3g, %s)" % (", ".join(differs), rel, where), "  WARNING" if bad else ""))
    fields = {"native_vs_coda": rel if rel != float("inf") else None,
              "native_bitwise": not differs}
    if differs:
        fields["native_differs"] = differs
    warning = None
    if bad:
        warning = "native differs from coda in %s (max relative difference %.3g)" % (
            ", ".join(differs), rel)
    return fields, warning


def _records(case, shape, tokens, batch, layers, attention, measured, opts, native=False):
    """One record per pass; native: the case has a native side (a block), whose fields the
    records then carry (null where it did not run)."""
    truth = measured.get("eager", {}).get("results")
    checks = {}
    if truth is not None:
        for name in ("compile", "coda"):
            res = measured.get(name, {}).get("results")
            if res is not None:
                rel, where = _rel_diff(res, truth)
                checks[name] = (rel, where)
                opts.log("  check    %-8s vs eager: max relative difference %.3g (%s)%s"
                         % (name, rel, where, "  WARNING: above 0.05" if rel > 0.05 else ""))
    native_fields, native_warning = {}, None
    if native:
        native_fields, native_warning = _native_check(measured, attention, opts)
    recs = []
    for p in opts.passes:
        rec = {"case": case, "tokens": tokens, "pass": p, "attention": attention,
               "shape": shape, "batch": batch, "layers": layers}
        for name in ("coda", "eager", "compile") + (("native",) if native else ()):
            v = measured.get(name, {}).get(p)
            rec[name + "_ms"] = round(v[0], 4) if v else None
            rec[name + "_peak_mib"] = round(v[1], 1) if v else None
        for name, (rel, where) in checks.items():
            rec[name + "_vs_eager"] = rel if rel != float("inf") else None
            if rel > 0.05:
                rec.setdefault("warnings", []).append(
                    "%s differs from eager by %.3g (%s)" % (name, rel, where))
        rec.update(native_fields)
        if native_warning:
            rec.setdefault("warnings", []).append(native_warning)
        first = {n: round(m["first_call_s"], 2) for n, m in measured.items() if "first_call_s" in m}
        if first:
            rec["first_call_s"] = first
        errors = {n: m["error"] for n, m in measured.items() if "error" in m}
        if errors:
            rec["errors"] = errors
        # --profile profiles fwd+bwd: its summary goes with that record.
        profiles = {n: m["profile"] for n, m in measured.items() if "profile" in m}
        if profiles and p == "fwd+bwd":
            rec["profile"] = profiles
        recs.append(rec)
    return recs


def _measure_sides(ref, ref_extra, side_of, coda_side, opts, flush, native_of=None):
    """The reference eagerly and through torch.compile (side_of(fn): the side that runs fn, None
    for the module itself) and, when opts.sides asks for them, coda's side and the native one:
    coda_side() returns (side, what holds its weights), native_of(coda's side) the native side
    on the same weights, each built under its own Construction count (the native side's
    buffers all count: it has no weights of its own). A side that fails to build is recorded
    as its result, not raised."""
    builders = {"eager": (side_of(None), ref_extra),
                "compile": (side_of(_compile(ref, opts)), ref_extra)}
    native = native_of is not None and "native" in opts.sides
    if "coda" in opts.sides or native:
        try:
            with timing.Construction() as c:
                side, weights = coda_side()
            builders["coda"] = (side, c.extra(timing.param_bytes(weights)))
        except Exception as e:
            builders["coda"] = e
    if native:
        built = builders["coda"]
        if isinstance(built, BaseException):
            builders["native"] = built
        else:
            try:
                with timing.Construction() as c:
                    nside = native_of(built[0])
                builders["native"] = (nside, c.extra(0))
            except Exception as e:
                builders["native"] = e
    return _measure(builders, opts, flush)


def _inputs_and_reference(cfg, tokens, batch, attention, opts, seed):
    """A block case's inputs (seed) and the bf16 reference block whose weights every side
    starts from (seed + 1), with what building the reference costs beyond its parameters
    (timing.Construction: the sides that run it count it)."""
    inputs = BlockInputs(cfg, tokens, batch, attention, device=opts.device, seed=seed)
    with timing.Construction() as c:
        ref = build_reference_block(cfg, attention, seed=seed + 1, device=opts.device)
    return inputs, ref, c.extra(timing.param_bytes(ref))


def run_block(case, shape, tokens, batch, attention, opts, flush, seed=0):
    cfg = make_config(shape)
    opts.log("%s%s: %d tokens (batch %d), hidden %d, MLP %d, %d/%d heads of %d"
             % (case, " +attn" if attention else "", tokens, batch, cfg.hidden_size,
                cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.head_dim))
    inputs, ref, ref_extra = _inputs_and_reference(cfg, tokens, batch, attention, opts, seed)

    def coda_side():
        side = CodaBlockSide(ref, inputs)
        return side, side.param_tensors()

    measured = _measure_sides(ref, ref_extra, lambda fn: TorchBlockSide(ref, inputs, fn),
                              coda_side, opts, flush, native_of=NativeBlockSide)
    return _records(case, shape, tokens, batch, 1, attention, measured, opts, native=True)


def run_model(case, shape, tokens, batch, layers, opts, flush, seed=0):
    cfg = make_config(shape, layers=layers)
    opts.log("%s: %d layers, %d tokens (batch %d), hidden %d, MLP %d, %d/%d heads of %d, vocab %d"
             % (case, layers, tokens, batch, cfg.hidden_size, cfg.intermediate_size,
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size))
    inputs = ModelInputs(cfg, tokens, batch, device=opts.device, seed=seed)
    with timing.Construction() as c:
        ref = build_reference_model(cfg, seed=seed + 1, device=opts.device)
    ref_extra = c.extra(timing.param_bytes(ref))

    def coda_side():
        cmodel = coda_adapter.model_from_reference(ref)
        return ModelSide(cmodel, inputs), cmodel

    measured = _measure_sides(ref, ref_extra, lambda fn: ModelSide(ref, inputs, fn), coda_side,
                              opts, flush)
    return _records(case, shape, tokens, batch, layers, True, measured, opts)


def run_case(case, opts, flush, tokens=None, batch=None, layers=None, shape=None, seed=0):
    """Every record of one named case (or a custom one: shape/tokens/batch/layers override)."""
    kind, default_shape, default_tokens, default_batch, default_layers, variants = CASES[case]
    shape, tokens = shape or default_shape, tokens or default_tokens
    batch, layers = batch or default_batch, layers or default_layers
    recs = []
    for attention in variants:
        torch._dynamo.reset()
        _free()
        if kind == "block":
            recs += run_block(case, shape, tokens, batch, attention, opts, flush, seed)
        else:
            recs += run_model(case, shape, tokens, batch, layers, opts, flush, seed)
        torch._dynamo.reset()
        _free()
    return recs


def _frobenius(a, b):
    """||a - b||_F / ||b||_F in fp64; inf where the shapes differ or the result is not finite."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    r = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    return r if math.isfinite(r) else float("inf")


def _json_number(v, digits=5):
    return round(v, digits) if v is not None and math.isfinite(v) else None


def _fp8_check(measured, log):
    """The FP8 block's agreement check: each FP8 side's outputs (x2, qkv) and gradients (dx0,
    dy0, the six weights') against its bf16 counterpart's (FP8_COUNTERPART), relative Frobenius
    error per tensor; and the two bf16 sides against each other. Returns (record fields,
    warnings); a side or counterpart that did not run is left out."""
    def results(name):
        return measured.get(name, {}).get("results")

    fields, warnings = {}, []
    if results("coda") is not None and results("compile") is not None:
        worst, where = max(((_frobenius(v, results("compile")[k]), k)
                            for k, v in results("coda").items() if k in results("compile")),
                           default=(0.0, None))
        fields["bf16_vs_torch_bf16"] = _json_number(worst)
        log("  check    coda bf16 vs torch bf16: relative Frobenius error %.3g (%s)%s"
            % (worst, where, "  WARNING: above 0.05" if worst > 0.05 else ""))
        if worst > 0.05:
            warnings.append("coda bf16 differs from torch bf16 by %.3g (%s)" % (worst, where))
    for name, own in FP8_COUNTERPART.items():
        res = results(name)
        if res is None:
            continue
        against = own if results(own) is not None else next(
            (s for s in ("coda", "compile") if results(s) is not None), None)
        if against is None:
            continue
        truth = results(against)
        errors = {k: _frobenius(res[k], b) for k, b in truth.items() if k in res}
        missing = sorted(k for k in truth if k not in res)
        outs = {k: v for k, v in errors.items() if k in FP8_OUTPUTS}
        grads = {k: v for k, v in errors.items() if k not in FP8_OUTPUTS}
        out_max = max(outs.values()) if outs else None
        grad_max = max(grads.values()) if grads else None
        key = FP8_KEYS[name]
        fields[key + "_vs_bf16"] = {
            "against": FP8_KEYS[against], "outputs": _json_number(out_max),
            "grads": _json_number(grad_max),
            "tensors": {k: _json_number(v) for k, v in sorted(errors.items())}}
        problems = []
        if missing:
            problems.append("lacks %s" % ", ".join(missing))
        if out_max is None or out_max > FP8_BOUND_OUTPUTS:
            problems.append("outputs %s above %.2f" % (_worst(outs), FP8_BOUND_OUTPUTS))
        elif out_max < FP8_NOISE_FLOOR:
            problems.append("outputs within %.3g of bf16's: no FP8 rounding (16-bit GEMMs?)"
                            % out_max)
        if grad_max is not None and grad_max > FP8_BOUND_GRADS:
            problems.append("gradients %s above %.2f" % (_worst(grads), FP8_BOUND_GRADS))
        log("  check    %-9s vs %-9s relative Frobenius error: outputs %s, gradients %s%s"
            % (name, against, _worst(outs), _worst(grads),
               "  WARNING: " + "; ".join(problems) if problems else ""))
        if problems:
            warnings.append("%s vs %s: %s" % (key, FP8_KEYS[against], "; ".join(problems)))
    return fields, warnings


def _worst(errors):
    """'0.0391 (qkv)': the largest of {tensor: error}, or '-'."""
    if not errors:
        return "-"
    k = max(errors, key=errors.get)
    return "%.3g (%s)" % (errors[k], k)


def _fp8_records(case, shape, tokens, batch, measured, opts):
    """One record per pass, in report.FP8_BLOCK_KEYS' names (fp8_ms: coda FP8, bf16_ms: coda
    bf16, torch_fp8_ms, torch_bf16_ms: torch.compile's), plus peak memory, the agreement check,
    first-call times, errors and warnings."""
    fields, warnings = _fp8_check(measured, opts.log) if opts.check else ({}, [])
    recs = []
    for p in opts.passes:
        rec = {"model": FP8_MODELS.get(shape, shape), "tokens": tokens, "pass": p}
        for name in FP8_SIDE_ORDER:
            v = measured.get(name, {}).get(p)
            rec[FP8_KEYS[name] + "_ms"] = round(v[0], 4) if v else None
        for name in FP8_SIDE_ORDER:
            v = measured.get(name, {}).get(p)
            rec[FP8_KEYS[name] + "_peak_mib"] = round(v[1], 1) if v else None
        rec.update({"case": case, "shape": shape, "batch": batch})
        rec.update(fields)
        if warnings:
            rec["warnings"] = list(warnings)
        first = {FP8_KEYS[n]: round(m["first_call_s"], 2) for n, m in measured.items()
                 if "first_call_s" in m}
        if first:
            rec["first_call_s"] = first
        errors = {FP8_KEYS[n]: m["error"] for n, m in measured.items() if "error" in m}
        if errors:
            rec["errors"] = errors
        recs.append(rec)
    return recs


def run_fp8_block(case, shape, tokens, batch, opts, flush, seed=0):
    """The FP8 block comparison at one shape: the sides of opts.sides (FP8_SIDE_ORDER) on one
    bf16 reference block's weights and the same inputs, timed in turn, then checked."""
    cfg = make_config(shape)
    opts.log("%s: FP8 middle block, %d tokens (batch %d), hidden %d, MLP %d, %d/%d heads of %d; "
             "torch FP8 gradients %s"
             % (case, tokens, batch, cfg.hidden_size, cfg.intermediate_size,
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                opts.torch_fp8_grad))
    inputs, ref, ref_extra = _inputs_and_reference(cfg, tokens, batch, False, opts, seed)
    builders = {}
    if "compile" in opts.sides:
        builders["compile"] = (TorchBlockSide(ref, inputs, _compile(ref, opts)), ref_extra)
    if "torch_fp8" in opts.sides:
        why = torch_fp8.unavailable(opts.device)
        try:
            if why:
                raise NotImplementedError(why)
            # The FP8 block holds ref's Parameters: nothing to count but what building it
            # allocates (nothing).
            with timing.Construction() as c:
                fp8_ref = torch_fp8.Fp8ReferenceMiddle(ref, opts.torch_fp8_grad)
            builders["torch_fp8"] = (TorchBlockSide(fp8_ref, inputs, _compile(fp8_ref, opts)),
                                     c.extra(0))
        except Exception as e:
            builders["torch_fp8"] = e
    for name, precision, once in (("coda", "native", False), ("coda_fp8", "fp8", False),
                                  ("coda_fp8_once", "fp8", True)):
        if name not in opts.sides:
            continue
        try:
            with timing.Construction() as c:
                side = CodaBlockSide(ref, inputs, precision=precision, fp8_weights_once=once)
            builders[name] = (side, c.extra(timing.param_bytes(side.param_tensors())))
        except Exception as e:
            builders[name] = e
    measured = _measure(builders, opts, flush, paired=FP8_SIDE_ORDER)
    return _fp8_records(case, shape, tokens, batch, measured, opts)


def run_fp8_case(case, opts, flush, tokens=None, batch=None, shape=None, seed=0):
    """Every record of one FP8 block case (shape/tokens/batch override FP8_CASES')."""
    default_shape, default_tokens, default_batch = FP8_CASES[case]
    shape, tokens, batch = shape or default_shape, tokens or default_tokens, batch or default_batch
    torch._dynamo.reset()
    _free()
    try:
        return run_fp8_block(case, shape, tokens, batch, opts, flush, seed)
    finally:
        torch._dynamo.reset()
        _free()
