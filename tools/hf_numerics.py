#!/usr/bin/env python3
"""Why is Hugging Face bf16's attention-RMSNorm weight gradient more accurate than coda's?

For tests/python/test_hf.py::test_matches_hf (docs/python.md, "Known limits"): per seed, the
models as that test builds them (hf32: the fp32 reference; hf16 = deepcopy(hf32).to(bf16): the
baseline (a); coda.from_hf), then hf16 rerun with HF rounding choices changed (monkey-patched on
a deep copy, undone after each run); printed: err(x) = max|grad_x - grad_ref| as ratios, on the
norm weights and, as a control, a few linear weights. The variants:
  a2  plain HF bf16 again, on a deep copy through the patch machinery (noise / sanity control)
  b   RMSNorm: weight.float() * normalized fp32, cast to bf16 once (HF: cast, then bf16 multiply)
  c   RoPE: cos/sin returned in fp32, q and k rotated in fp32 and rounded to bf16 once
  d   b + c
  e   q/k/v as one GEMM on cat([Wq; Wk; Wv]): one input-gradient GEMM (as coda), not three
      bf16 GEMM results summed in bf16
  f   inv_freq buffer kept fp32 (hf16's .to(bf16) rounds it; hf32 and coda use the fp32 table)
  g   c + f (RoPE entirely in fp32)
  h   b + c + e + f
usage: python3 tools/hf_numerics.py [--seeds N | --seed S ...] [--device cuda] [--untied]
       [--rope llama3|rope] [--source fp32|bf16]   (needs torch, transformers, pytest, coda)
"""

import argparse, collections, contextlib, copy, inspect, os, random, re, statistics, sys  # noqa
import time
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.append(os.path.join(ROOT, "python"))  # after an installed coda, as conftest.py does

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import coda  # noqa: E402
import test_hf as T  # noqa: E402  (hf_config, hf_model, batch, hf_run, LLAMA3; imports pytest)
import torch_reference as R  # noqa: E402

VARIANTS = [("a2", ()), ("b", ("norm",)), ("c", ("rope",)), ("d", ("norm", "rope")),
            ("e", ("fused",)), ("f", ("invfreq",)), ("g", ("rope", "invfreq")),
            ("h", ("norm", "rope", "fused", "invfreq"))]
CONTROLS = ["model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.v_proj.weight",
            "model.layers.3.mlp.down_proj.weight"]


# ---- patching (each on a throwaway bf16 copy, inside an ExitStack that undoes it) ------------

def parts(model):
    """(RMSNorm class, rotary-embedding class, attention class, the module in which the
    attention forward looks up apply_rotary_pos_emb and rotate_half)"""
    layer = model.model.layers[0]
    rot = getattr(model.model, "rotary_emb", None)  # transformers >= 4.45: one per model
    rot = rot if rot is not None else layer.self_attn.rotary_emb
    attn = type(layer.self_attn)
    module = sys.modules[inspect.unwrap(attn.forward).__module__]
    return type(layer.input_layernorm), type(rot), attn, module


def source_problems(model):
    """{patch: why it does not fit this transformers version}, from the installed source."""
    src = lambda f: inspect.getsource(inspect.unwrap(f))  # noqa: E731
    why = {}
    try:
        norm_cls, rot_cls, attn_cls, module = parts(model)
        s = src(norm_cls.forward)
        if not ("variance_epsilon" in s and re.search(
                r"self\.weight\s*\*\s*hidden_states\.to\(input_dtype\)", s)):
            why["norm"] = "unexpected %s.forward:\n%s" % (norm_cls.__name__, s)
        a, r = src(attn_cls.forward), src(rot_cls.forward)
        if "x.dtype" not in r:  # we get fp32 cos/sin by handing the rotary forward an fp32 x
            why["rope"] = "the rotary forward does not cast to x.dtype:\n" + r
        elif "apply_rotary_pos_emb(" not in a:
            why["rope"] = "the attention forward does not call apply_rotary_pos_emb"
        elif not all(callable(getattr(module, f, None))
                     for f in ("apply_rotary_pos_emb", "rotate_half")):
            why["rope"] = "no apply_rotary_pos_emb / rotate_half in %s" % module.__name__
        q_proj = model.model.layers[0].self_attn.q_proj
        if q_proj.bias is not None or not all(p + "_proj(hidden_states)" in a for p in "qkv"):
            why["fused"] = "the attention forward does not call q/k/v_proj(hidden_states)"
    except (OSError, TypeError, AttributeError) as e:
        for flag in ("norm", "rope", "fused"):
            why.setdefault(flag, "cannot read the source: %r" % e)
    if not any(n.endswith("inv_freq") for n, _ in model.named_buffers()):
        why["invfreq"] = "no inv_freq buffer"
    return why


def apply_patches(model, flags, stack, calls):
    """Patch the classes / module globals / instances that `model` actually uses."""
    layers, (norm_cls, rot_cls, _, module) = model.model.layers, parts(model)

    def patch(target, name, new):  # undone when the stack closes
        stack.enter_context(mock.patch.object(target, name, new))
    if "norm" in flags:
        def norm_forward(self, hidden_states):
            calls["norm"] += 1
            dtype = hidden_states.dtype
            h = hidden_states.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (self.weight.float() * h).to(dtype)  # one rounding, after the weight
        patch(norm_cls, "forward", norm_forward)
    if "rope" in flags:
        rot_orig = rot_cls.forward

        def rot_forward(self, x, *args, **kwargs):  # x only gives dtype/device: ask for fp32
            cos, sin = rot_orig(self, x.detach().float(), *args, **kwargs)
            calls["rot"] += 1
            calls["cos_fp32"] += int(cos.dtype == sin.dtype == torch.float32)
            return cos, sin
        patch(rot_cls, "forward", rot_forward)
        rotate_half = module.rotate_half

        # HF's signature (4.4x; 5.x drops position_ids, which Llama never passes); q, k are
        # [B, heads, S, d], cos/sin [B, S, d] (a wrong unsqueeze_dim would fail to broadcast).
        def apply32(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            calls["apply"] += 1
            cos, sin = cos.float().unsqueeze(unsqueeze_dim), sin.float().unsqueeze(unsqueeze_dim)
            rope = lambda t: (t.float() * cos + rotate_half(t.float()) * sin).to(t.dtype)  # noqa
            return rope(q), rope(k)
        # The attention forward looks it up as a module global (in 5.x that global may be a
        # kernels "Func" module, which only kernelize() would swap; the calls count checks it).
        patch(module, "apply_rotary_pos_emb", apply32)
    if "fused" in flags:
        for layer in layers:
            projs = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
            sizes, state = [p.out_features for p in projs], {}

            def make(i, projs=projs, sizes=sizes, state=state):
                def forward(x):  # q, k, v are called on the same tensor: one GEMM for all
                    if state.get("x") is not x:
                        calls["fused"] += 1
                        w = torch.cat([p.weight for p in projs], 0)
                        state["x"], state["y"] = x, F.linear(x, w).split(sizes, dim=-1)
                    return state["y"][i]
                return forward
            for i, p in enumerate(projs):
                patch(p, "forward", make(i))


def run_variant(hf16, hf32, flags, ids, labels, n_layers):
    """HF's gradients on a patched deep copy of hf16, and '' or why the patches did not act."""
    model = copy.deepcopy(hf16)
    if "invfreq" in flags:  # hf32's fp32 inv_freq buffers back into the bf16 copy
        ref = dict(hf32.named_buffers())
        for prefix, mod in model.named_modules():
            for name in [n for n in mod._buffers if n.endswith("inv_freq")]:
                setattr(mod, name, ref[prefix + "." + name if prefix else name].detach().clone())
    calls = collections.Counter()
    with contextlib.ExitStack() as stack:
        apply_patches(model, flags, stack, calls)
        grads = T.hf_run(model, ids, labels)[2]
    bad = []  # every patch must have been used by the forward
    if "norm" in flags and calls["norm"] == 0:
        bad.append("the patched RMSNorm forward was never called")
    if "rope" in flags and not (
            calls["apply"] == n_layers and 0 < calls["cos_fp32"] == calls["rot"]):
        bad.append("rope: %d fp32 rotations (want %d), %d/%d fp32 cos/sin tables"
                   % (calls["apply"], n_layers, calls["cos_fp32"], calls["rot"]))
    if "fused" in flags and calls["fused"] != n_layers:
        bad.append("fused q/k/v: %d GEMMs (want %d)" % (calls["fused"], n_layers))
    return grads, "; ".join(bad)


# ---- measuring ------------------------------------------------------------------------------

@torch.no_grad()
def errors(grads, ref, names):
    """{name: (max|x - ref|, rms(x - ref))}"""
    diff = lambda n: grads[n].detach().double() - ref[n].detach().double()  # noqa: E731
    return {n: (R.max_err(grads[n], ref[n]), diff(n).pow(2).mean().sqrt().item()) for n in names}


def one_seed(seed, args, skip):
    """{parameter: {'coda' | 'a' | variant: (max err, rms err)}} for one seed."""
    T.SEED = seed  # T.batch() draws the batch from test_hf's global SEED (conftest's)
    rope = T.LLAMA3 if args.rope == "llama3" else None
    config = T.hf_config(tied=not args.untied, rope_scaling=rope)
    # ---- as test_matches_hf does:
    hf32 = T.hf_model(config, seed, args.device)
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    if args.source == "bf16":
        with torch.no_grad():
            for p32, p16 in zip(hf32.parameters(), hf16.parameters()):
                p32.copy_(p16.float())
    model = coda.from_hf(hf16 if args.source == "bf16" else hf32)
    ids, labels = T.batch(args.device)
    ref = T.hf_run(hf32, ids, labels)[2]
    base = T.hf_run(hf16, ids, labels)[2]
    loss, _ = model(ids, labels=labels, return_logits=True)
    loss.backward()
    ours = coda.to_hf_state_dict(model, grads=True)
    # ----
    names = [n for n, _ in hf32.named_parameters() if "norm" in n]
    names += [c for c in CONTROLS if c in ref]
    res = {"coda": errors(ours, ref, names), "a": errors(base, ref, names)}
    for v, flags in VARIANTS:
        if not any(f in skip for f in flags):
            grads, bad = run_variant(hf16, hf32, flags, ids, labels, config.num_hidden_layers)
            if bad:
                print("  variant %s dropped (seed %d): %s" % (v, seed, bad))
            else:
                res[v] = errors(grads, ref, names)
    return {n: {v: e[n] for v, e in res.items()} for n in names}


def ratio(x, y):
    return x / y if y > 0 else float("inf")


def print_seed(seed, r, seconds):
    cols = ["coda"] + [v for v, _ in VARIANTS]
    print("\nseed %d (%.2f s): max|x - ref| / max|a - ref|, a = plain HF bf16" % (seed, seconds))
    print("%-30s %9s " % ("parameter", "err(a)") + "".join("%7s" % (c + "/a") for c in cols)
          + "%8s%8s" % ("coda/d", "coda/h"))
    for n, e in r.items():
        cell = lambda x, y: ("%7.2f" % ratio(e[x][0], e[y][0])  # noqa: E731
                             if x in e and y in e else "%7s" % "-")
        name = n.replace("model.layers.", "L").replace(".weight", "").replace("self_attn.", "")
        print("%-30s %9.2e " % (name, e["a"][0]) + "".join(cell(c, "a") for c in cols)
              + " " + cell("coda", "d") + " " + cell("coda", "h"))


def summary(results):
    seeds = list(results)
    for title, key in [("attention norms (input_layernorm)", "input_layernorm"),
                       ("MLP norms (post_attention_layernorm)", "post_attention_layernorm"),
                       ("controls (linear weights)", "proj")]:
        for m, metric in enumerate(("max|err|", "rms(err)")):
            per_seed = {s: [e for n, e in results[s].items() if key in n] for s in seeds}
            print("\n%s, %s: pooled over %d seeds x %d tensors" % (
                title, metric, len(seeds), len(per_seed[seeds[0]])))
            print("%-6s %9s %7s %10s %8s   %s" % ("x", "x/a med", "max", "coda/x med", "max",
                                                 "seeds where coda > 2x + 1e-6 vs x"))
            for v in ["coda", "a"] + [v for v, _ in VARIANTS]:
                have = [e for s in seeds for e in per_seed[s] if v in e]
                if not have:
                    print("%-6s (skipped)" % v)
                    continue
                xa = [ratio(e[v][m], e["a"][m]) for e in have]
                cx = [ratio(e["coda"][m], e[v][m]) for e in have]
                fails = sum(any(e["coda"][m] > 2 * e[v][m] + 1e-6 for e in per_seed[s] if v in e)
                            for s in seeds)
                print("%-6s %9.2f %7.2f %10.2f %8.2f   %d/%d" % (
                    v, statistics.median(xa), max(xa), statistics.median(cx), max(cx), fails,
                    len(seeds)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=16, help="how many of the fixed seeds")
    p.add_argument("--seed", type=int, action="append", help="explicit seed(s) instead")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--untied", action="store_true", help="untied embeddings (default: tied)")
    p.add_argument("--rope", choices=["llama3", "rope"], default="llama3")
    p.add_argument("--source", choices=["fp32", "bf16"], default="fp32")
    args = p.parse_args()
    seeds = args.seed or ([1467938813, 397260774] + random.Random(20261130).sample(
        range(1, 1 << 31), max(args.seeds - 2, 0)))[:args.seeds]
    # As conftest.py's autouse fixture: the fp32 references are fp32 (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    t0 = time.perf_counter()
    probe = T.hf_model(T.hf_config(), seeds[0], "cpu")
    skip = {f: w for f, w in source_problems(probe).items() if w}
    print("torch %s, transformers %s, coda from %s, device %s%s" % (
        torch.__version__, T.transformers.__version__, os.path.dirname(coda.__file__),
        args.device, " (%s)" % torch.cuda.get_device_name() if args.device == "cuda" else ""))
    print("case: %s, rope %s, %s source weights; attention %s; inv_freq after .to(bf16): %s" % (
        "untied" if args.untied else "tied", args.rope, args.source,
        getattr(probe.config, "_attn_implementation", "?"),
        [b.dtype for n, b in probe.to(torch.bfloat16).named_buffers() if "inv_freq" in n]))
    for f, w in skip.items():
        print("SKIPPING the variants with patch %r: %s" % (f, w))
    print(__doc__[__doc__.index("  a2"):__doc__.index("usage:")].rstrip())

    results = {}
    for seed in seeds:
        t = time.perf_counter()
        results[seed] = one_seed(seed, args, skip)
        if args.device == "cuda":
            torch.cuda.synchronize()
        print_seed(seed, results[seed], time.perf_counter() - t)
    summary(results)
    print("\ntotal %.1f s (%d seeds)" % (time.perf_counter() - t0, len(seeds)))


if __name__ == "__main__":
    main()
