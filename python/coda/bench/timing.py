"""CUDA-event timing and peak-memory accounting shared by every side of the benchmark.

A *side* is an object with three methods:
  forward()        -> state   the training forward (autograd recording), e.g. the loss
  backward(state)             the backward of that forward
  zero_grad()                 drop every gradient (set to None), as a training loop would
and optionally
  prepare()                   untimed set-up before each repetition (the native side writes
                              its seed gradient where the C backward reads and overwrites it)

Timing: ``warmup`` untimed repetitions, then ``iters`` timed ones; each repetition writes a
256 MiB buffer first (flushes the 60 MB L2 of an H200) and is bracketed by CUDA events on the
current stream; the result is the median in milliseconds. Passes:
  fwd      forward() alone
  bwd      backward() alone, after an untimed forward() of the same repetition
  fwd+bwd  forward() then backward()

With ``host_ahead``, the GPU is kept busy while the host issues the pass: a sleep kernel
(``torch.cuda._sleep``) is queued after the flush and before the start event, long enough (twice
the longest host issue time of the warm-up repetitions, plus 1 ms) for the host to queue the
whole pass behind it, so the events bracket only the GPU's work. That is a training loop's
regime when the GPU is the bottleneck (the host runs ahead); without it, the host's latency to
the pass's first launch and any point where the host falls behind the GPU count too. A timed
repetition whose host issue time exceeds its sleep raises (the protocol did not hold).

Peak memory (MiB): the highest ``torch.cuda.max_memory_allocated`` inside the timed window,
minus ``quiescent``: what was allocated just before the side's very first call, when every
model of the case held only its weights (and every gradient was None) and the inputs were
resident, plus whatever the side allocated at construction beyond its weights. So activations,
gradients, logits, workspaces, and caches a side keeps between calls all count against it; the
weights and the inputs, the same on every side, do not. The caching allocator's reserve is not
counted (it is not allocated memory).
"""
import statistics
import time

import torch

MIB = float(1 << 20)


class L2Flush:
    def __init__(self, device="cuda", mib=256):
        self.buf = torch.empty(int(mib) << 20, dtype=torch.uint8, device=device)

    def __call__(self):
        self.buf.zero_()


def param_bytes(module_or_tensors):
    """Bytes of the distinct tensors (parameters and buffers of a module, or a list)."""
    if isinstance(module_or_tensors, torch.nn.Module):
        tensors = list(module_or_tensors.parameters()) + list(module_or_tensors.buffers())
    else:
        tensors = list(module_or_tensors)
    seen, total = set(), 0
    for t in tensors:
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key in seen or t.device.type != "cuda":
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


class Construction:
    """Measures what building a side allocates beyond its weights:
        with Construction() as c: side = build()
        c.finish(weights_bytes) -> extra bytes (clamped at 0)."""

    def __enter__(self):
        torch.cuda.synchronize()
        self.before = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.after = torch.cuda.memory_allocated()
        return False

    def extra(self, weights_bytes):
        return max(0, self.after - self.before - weights_bytes)


def quiescent_bytes(extra_construction=0):
    """Call right before a side's first call (gradients None, no outputs alive)."""
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - extra_construction


_cycles_per_ms = None


def sleep_cycles_per_ms():
    """The GPU clock as torch.cuda._sleep counts it (cycles per millisecond), measured once."""
    global _cycles_per_ms
    if _cycles_per_ms is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        torch.cuda._sleep(cycles // 10)  # the first launch's start-up outside the measurement
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_ms = cycles / start.elapsed_time(end)
    return _cycles_per_ms


def time_pass(side, pass_name, *, warmup, iters, flush, quiescent, host_ahead=False):
    """Returns (median ms, peak MiB above `quiescent`) of one pass of one side. host_ahead:
    the GPU sleeps while the host issues the pass (the module docstring)."""
    if pass_name not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError("pass must be fwd, bwd or fwd+bwd; got %r" % (pass_name,))
    if host_ahead and warmup < 1:
        raise ValueError("host_ahead needs a warm-up repetition to size its sleep")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, peak, host_ms = [], 0, 0.0
    sleep_ms = None  # sized from the warm-up's host issue times
    prepare = getattr(side, "prepare", None)
    for i in range(warmup + iters):
        side.zero_grad()
        if prepare is not None:
            prepare()
        state = side.forward() if pass_name == "bwd" else None
        flush()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        if host_ahead and i >= warmup:
            if sleep_ms is None:
                sleep_ms = 2 * host_ms + 1.0
            torch.cuda._sleep(int(sleep_ms * sleep_cycles_per_ms()))
        start.record()
        t0 = time.perf_counter()
        if pass_name == "fwd":
            state = side.forward()
        elif pass_name == "bwd":
            side.backward(state)
        else:
            side.backward(side.forward())
        issued_ms = (time.perf_counter() - t0) * 1e3
        end.record()
        end.synchronize()
        if i < warmup:
            host_ms = max(host_ms, issued_ms)
        else:
            if sleep_ms is not None and issued_ms > sleep_ms:
                raise RuntimeError(
                    "host_ahead: the host took %.2f ms to issue the pass, longer than the GPU's "
                    "%.2f ms sleep: the timing would include host time" % (issued_ms, sleep_ms))
            times.append(start.elapsed_time(end))
            peak = max(peak, torch.cuda.max_memory_allocated())
        del state
    side.zero_grad()
    return statistics.median(times), (peak - quiescent) / MIB
