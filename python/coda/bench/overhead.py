"""python -m coda.bench --profile: where the gap between coda_ms and native_ms goes.

One fwd+bwd of a side (already warm) under torch.profiler, CPU and CUDA activities, summarized
in the terms of the overhead target: what ran on the GPU (kernels, copies, fills: count and
time), the CUDA API calls that issued it, by name (launches, copies, allocations,
synchronizations), the caching allocator's requests, and how long the host takes to issue the
pass against how long the GPU takes to run it (unprofiled repetitions: where the host needs
about as long as the GPU, the GPU waits on Python and coda_ms measures the host). Then torch's
own tables of the top operators by self CUDA and by self CPU time.
"""
import collections
import statistics
import time

import torch

TOP = 15
GPU_KINDS = ("kernels", "memcpy", "memset")
# CUPTI's own overhead records (CUpti_ActivityOverheadKind), which the profiler can list among
# the device events: the profiler's cost, not the pass's (an Activity Buffer Request can take
# milliseconds).
PROFILER_OVERHEAD = ("Activity Buffer Request", "Buffer Flush", "Instrumentation", "Resource",
                     "Driver Compiler", "Runtime Triggered Module Loading",
                     "Lazy Function Loading", "Command Buffer Full", "UVM Activity Init")


def _is_api(name):
    """A CUDA runtime or driver API call (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync)."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def _union_us(intervals):
    """Length of the union of [start, end) intervals: the time the GPU ran anything."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarize(events, device_type):
    """Counts and times (us) from profiler events (anything with name, device_type and
    time_range.start / .end in us; events on `device_type` ran on the GPU)."""
    count, busy_us, spans, api = (collections.Counter(), collections.Counter(), [],
                                  collections.Counter())
    for e in events:
        if getattr(e, "is_user_annotation", False) or e.name.startswith(PROFILER_OVERHEAD):
            continue  # a record_function range mirrored on the GPU timeline; CUPTI's overhead
        if e.device_type == device_type:
            kind = ("memcpy" if e.name.startswith("Memcpy") else
                    "memset" if e.name.startswith("Memset") else "kernels")
            count[kind] += 1
            busy_us[kind] += e.time_range.end - e.time_range.start
            spans.append((e.time_range.start, e.time_range.end))
        elif _is_api(e.name):
            api[e.name] += 1
    out = {k: count[k] for k in GPU_KINDS}
    out.update({k + "_us": round(busy_us[k], 1) for k in GPU_KINDS})
    out["gpu_busy_us"] = round(_union_us(spans), 1)
    first, last = min((s for s, _ in spans), default=0.0), max((e for _, e in spans), default=0.0)
    out["gpu_span_us"] = round(last - first, 1)
    out["launches"] = sum(n for name, n in api.items() if "Launch" in name)
    out["api"] = dict(sorted(api.items()))
    return out


def _ready(side, flush):
    side.zero_grad()
    prepare = getattr(side, "prepare", None)
    if prepare is not None:
        prepare()
    flush()
    torch.cuda.synchronize()


def issue_vs_run(side, flush, reps=5):
    """(median host ms to return from forward() + backward(), median CUDA-event ms of the same
    repetitions), L2 flushed before each as in timing.py."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host, gpu = [], []
    for _ in range(reps):
        _ready(side, flush)
        start.record()
        t0 = time.perf_counter()
        side.backward(side.forward())
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    side.zero_grad()
    return statistics.median(host), statistics.median(gpu)


def _allocations():
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


_started = False


def profile_pass(side, flush, name="", log=print, top=TOP):
    """The summary (summarize(), plus allocations, host_ms, gpu_ms) of one fwd+bwd of `side`;
    logs a line and torch's top-`top` tables."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    global _started
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    if not _started:
        # CUPTI's start-up lands in a process's first session: spend it on an empty one.
        with profile(activities=activities):
            torch.cuda.synchronize()
        _started = True
    host_ms, gpu_ms = issue_vs_run(side, flush)
    _ready(side, flush)
    before = _allocations()
    with profile(activities=activities) as prof:
        side.backward(side.forward())
        torch.cuda.synchronize()
    allocations = _allocations() - before
    side.zero_grad()
    s = summarize(prof.events(), DeviceType.CUDA)
    s.update(allocations=allocations, host_ms=round(host_ms, 3), gpu_ms=round(gpu_ms, 3))
    log("  profile  %-8s fwd+bwd: %s" % (name, describe(s)))
    averages = prof.key_averages()
    for key in ("self_cuda_time_total", "self_cpu_time_total"):
        log("  top %d by %s (%s):\n%s"
            % (top, key, name, averages.table(sort_by=key, row_limit=top)))
    return s


def describe(s):
    launches = ", ".join("%s %d" % kv for kv in s["api"].items() if "Launch" in kv[0]) or "none"
    other = ", ".join("%s %d" % kv for kv in s["api"].items() if "Launch" not in kv[0]) or "none"
    return ("%d kernels %.3f ms, %d memcpy %.3f ms, %d memset %.3f ms; GPU busy %.3f ms of %.3f "
            "(CUDA events); host issues the pass in %.3f ms; %d allocator requests; %d launches "
            "(%s); other CUDA API calls: %s"
            % (s["kernels"], s["kernels_us"] / 1e3, s["memcpy"], s["memcpy_us"] / 1e3,
               s["memset"], s["memset_us"] / 1e3, s["gpu_busy_us"] / 1e3, s["gpu_ms"],
               s["host_ms"], s["allocations"], s["launches"], launches, other))


def compare(a, b, names=("coda", "native")):
    """One line: a's summary minus b's, in the terms of summarize()."""
    def d(key, scale=1.0, fmt="%+d"):
        return fmt % ((a[key] - b[key]) * scale)

    idle_a = a["gpu_ms"] - a["gpu_busy_us"] / 1e3
    idle_b = b["gpu_ms"] - b["gpu_busy_us"] / 1e3
    return ("%s - %s: time %s ms (GPU busy %s ms, GPU idle %+.3f ms); kernels %s, memcpy %s "
            "(%s ms), memset %s (%s ms), launches %s, allocator requests %s, host %s ms"
            % (names[0], names[1], d("gpu_ms", fmt="%+.3f"), d("gpu_busy_us", 1e-3, "%+.3f"),
               idle_a - idle_b, d("kernels"), d("memcpy"), d("memcpy_us", 1e-3, "%+.3f"),
               d("memset"), d("memset_us", 1e-3, "%+.3f"), d("launches"), d("allocations"),
               d("host_ms", fmt="%+.3f")))
