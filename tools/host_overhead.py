"""Host time coda.ops.llama_middle spends issuing a pass, measured without a GPU.

The Python work around coda's C calls (the dispatcher or the eager bypass, autograd, the
descriptors, the workspace queries, the allocations) is the same on the CPU backend as on CUDA,
only the kernels differ. So this runs the benchmark's coda and native block sides
(coda.bench.sides: the same forward / backward code the GPU numbers come from) on CPU tensors
with libcoda's two llama_middle entry points replaced by no-ops (--stub, the default), and
reports the median wall time of fwd, bwd and fwd+bwd per side: coda's minus native's is the
integration's own host time. --real calls the CPU kernels instead (then the kernels dominate);
--cprofile prints where coda's fwd+bwd spends it.

--timeline says where in a pass the host time goes, on the device the tensors are on (--device
cuda on the GPU machine: the real kernels, each repetition starting from an idle, synchronized
GPU as the benchmark's timing does): for each side and pass, the median microseconds from the
pass's start to each C call's entry and exit, and to the pass's return. What precedes the first
C call's entry is host latency the GPU waits for; native's is the floor.

    python3 tools/host_overhead.py [--shape tiny|1b] [--tokens 128] [--iters 2000]
    python3 tools/host_overhead.py --device cuda --shape 1b --tokens 8192 --iters 20 --timeline
"""
import argparse
import cProfile
import ctypes
import importlib
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import torch  # noqa: E402

from coda import _lib as L  # noqa: E402
from coda.bench import runner, sides  # noqa: E402

STUBBED = ("coda_llama_middle_forward", "coda_llama_middle_backward",
           "coda_llama_middle_backward_part")


class _Stubbed:
    """The loaded library, but the stubbed entry points return CODA_OK without running."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        if name in STUBBED:
            return lambda *args: L.OK
        return getattr(self._lib, name)


def _reset(side):
    """Before each repetition, as the benchmark's timing does: gradients dropped, and the native
    side's seed gradient written where its C backward reads it."""
    side.zero_grad()
    prepare = getattr(side, "prepare", None)
    if prepare is not None:
        prepare()


def _median_ms(fn, side, iters):
    times = []
    for _ in range(iters):
        _reset(side)
        times.append(fn())
    return statistics.median(times) * 1e3


def _passes(side, iters):
    def fwd():
        t0 = time.perf_counter()
        side.forward()
        return time.perf_counter() - t0

    def bwd():
        state = side.forward()
        t0 = time.perf_counter()
        side.backward(state)
        return time.perf_counter() - t0

    def both():
        t0 = time.perf_counter()
        side.backward(side.forward())
        return time.perf_counter() - t0

    return {name: _median_ms(fn, side, iters) for name, fn in
            (("fwd", fwd), ("bwd", bwd), ("fwd+bwd", both))}


# --steps: the coda.ops and coda._torch functions between a pass's start and its C calls (each
# looked up as a module global when called; the op's backward, which autograd reaches through
# its spec, is marked by the _middle_backward_in_parts it calls).
STEPS = (("coda.ops", ("_run", "_middle_forward_fake", "_c_config", "_middle_tensors",
                       "_run_layer", "_middle_backward_in_parts")),
         ("coda._torch", ("device_guard", "llama_workspace_bytes", "workspace", "stream")))


def _timeline(side, pass_name, iters, device, steps=False):
    """[(event, median us from the pass's start)]: each C call's entry ("> name") and exit
    ("< name"), with `steps` those of STEPS' functions too, then the pass's return; every
    repetition starts from a synchronized device."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    marks = []
    wrapped = [(L, "call")]
    if steps:
        for module_name, names in STEPS:
            module = importlib.import_module(module_name)
            wrapped += [(module, name) for name in names]
    originals = [(module, name, getattr(module, name)) for module, name in wrapped]

    def timed(name, fn):
        def call(*args, **kwargs):
            label = args[0][len("coda_"):] if name == "call" else name
            marks.append(("> " + label, time.perf_counter()))
            try:
                return fn(*args, **kwargs)
            finally:
                marks.append(("< " + label, time.perf_counter()))
        return call

    for module, name, fn in originals:
        setattr(module, name, timed(name, fn))
    try:
        runs = []
        for _ in range(iters + 3):
            _reset(side)
            state = side.forward() if pass_name == "bwd" else None
            sync()
            del marks[:]
            t0 = time.perf_counter()
            if pass_name == "fwd":
                state = side.forward()
            else:
                side.backward(state)
            marks.append(("return", time.perf_counter()))
            sync()
            runs.append([(event, (t - t0) * 1e6) for event, t in marks])
            del state
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    runs = runs[3:]  # warm-up
    return [(runs[0][i][0], statistics.median(r[i][1] for r in runs))
            for i in range(len(runs[0]))]


def _noop_library():
    """A library whose coda_noop takes any arguments and returns CODA_OK: what the C++ host
    path calls instead of libcoda's llama entry points when they are stubbed."""
    import subprocess
    import tempfile
    directory = tempfile.mkdtemp(prefix="coda_noop_")
    source, library = os.path.join(directory, "noop.c"), os.path.join(directory, "libnoop.so")
    with open(source, "w") as f:
        f.write("int coda_noop(void) { return 0; }\n")
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", source, "-o", library])
    return ctypes.CDLL(library)


def _use_host_path(stubbed):
    """coda.ops' middle calls through the C++ host path, its llama entry points no-ops when
    `stubbed` (the workspace size and the error message stay libcoda's)."""
    from coda import _host_path as H
    from coda import ops
    module = H.build()
    lib = L.load()
    if stubbed:
        noop = _noop_library().coda_noop

        class Bound:
            def __getattr__(self, name):
                return noop if name in STUBBED else getattr(lib, name)

        H.bind(module, Bound())
    else:
        H.bind(module, lib)
    ops._HOST_PATH[:] = [module]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny", choices=sorted(runner.SHAPES))
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--real", action="store_true", help="run the CPU kernels (no stub)")
    p.add_argument("--dispatcher", action="store_true",
                   help="coda's calls through the torch dispatcher, not the eager bypass they take "
                        "by default (coda.ops.set_eager_bypass(False); torch >= 2.4)")
    p.add_argument("--cprofile", action="store_true", help="profile coda's fwd+bwd")
    p.add_argument("--timeline", action="store_true",
                   help="each C call's entry and exit in a pass (median us from its start)")
    p.add_argument("--steps", action="store_true",
                   help="with --timeline: coda.ops' and coda._torch's steps before each C call too")
    p.add_argument("--host-path", action="store_true",
                   help="coda's middle calls through the C++ host path (coda._host_path, built "
                        "on first use); its C calls are not seen by --timeline, whose 'return' "
                        "then compares")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: the GPU machine's real kernels (implies no stub)")
    args = p.parse_args()
    if args.device == "cuda" and not args.timeline:
        p.error("--device cuda times the timeline only (--timeline)")

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = runner.RefConfig(num_hidden_layers=1, **runner.SHAPES[args.shape])
    ref = sides.build_reference_block(cfg, attention=False, device=args.device)
    inputs = sides.BlockInputs(cfg, args.tokens, 1, attention=False, device=args.device)
    coda_side = sides.CodaBlockSide(ref, inputs)
    native_side = sides.NativeBlockSide(coda_side)
    if args.dispatcher:
        import coda.ops

        coda.ops.set_eager_bypass(False)
    real = args.real or args.device == "cuda"
    if args.host_path:
        _use_host_path(stubbed=not real)
    if not real:
        L._lib = _Stubbed(L.load())

    print("torch %s, shape %s, %d tokens, %s, %d iterations (median %s)"
          % (torch.__version__, args.shape, args.tokens,
             ("%s kernels" % args.device) if real else "C calls stubbed", args.iters,
             "us from the pass's start" if args.timeline else "ms"))
    if args.timeline:
        for name, side in (("coda", coda_side), ("native", native_side)):
            for pass_name in ("fwd", "bwd"):
                print("  %-7s %-4s %s" % (name, pass_name, "  ".join(
                    "%s %.0f" % kv
                    for kv in _timeline(side, pass_name, args.iters, args.device, args.steps))))
        return

    results = {}
    for name, side in (("coda", coda_side), ("native", native_side)):
        _passes(side, max(10, args.iters // 10))  # warm-up
        results[name] = _passes(side, args.iters)
        print("  %-7s %s" % (name, "  ".join("%s %.4f" % kv for kv in results[name].items())))
    print("  coda - native: %s" % "  ".join(
        "%s %+.4f" % (k, results["coda"][k] - results["native"][k]) for k in results["coda"]))

    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            coda_side.zero_grad()
            coda_side.backward(coda_side.forward())
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
