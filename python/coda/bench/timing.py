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

With ``host_ahead``, the GPU is kept busy while the host issues the pass: bf16 GEMMs of
8192 x 8192 x 8192 (the flush object's filler, allocated with it) and then the flush are queued
before the start event, as many as last twice the longest host issue time of the warm-up
repetitions plus 1 ms, so that the host has queued the whole pass behind them and the events
bracket only the GPU's work. That is a training loop's regime when the GPU is the bottleneck
(the host runs ahead); without it, the host's latency to the pass's first launch and any point
where the host falls behind the GPU count too. The filler is real work, not a sleep: after a
sleep kernel (an idle GPU, so likely its boost clocks) the H200 timed the 8B block's fwd+bwd at
14.0 ms against 16.7 without it, and two sides with the same kernels 10% apart. A timed
repetition whose host issue time exceeds the filler's raises (the protocol did not hold).

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
    """flush(): writes `mib` MiB, evicting the L2. With host_ahead, also the filler GEMMs'
    operands (3 x 128 MiB), allocated here so that every side's memory baseline holds them."""

    FILL_N = 8192

    def __init__(self, device="cuda", mib=256, host_ahead=False):
        self.buf = torch.empty(int(mib) << 20, dtype=torch.uint8, device=device)
        self.fill_ops = None
        self.gemm_ms = None
        if host_ahead:
            n = self.FILL_N
            gen = torch.Generator(device=device).manual_seed(0)
            self.fill_ops = [torch.randn(n, n, device=device, dtype=torch.bfloat16,
                                         generator=gen) for _ in range(2)]
            self.fill_ops.append(torch.empty(n, n, device=device, dtype=torch.bfloat16))
            # Timed here, so that cuBLAS's workspace (32 MiB on Hopper, from the caching
            # allocator at its first GEMM) is allocated before any side's memory baseline: made
            # inside a timed repetition, it counted in that repetition's peak.
            self.fill(0.0)

    def __call__(self):
        self.buf.zero_()

    def fill(self, ms):
        """Queues at least `ms` milliseconds of GEMMs (-> the milliseconds queued)."""
        if self.fill_ops is None:
            raise ValueError("host_ahead needs L2Flush(host_ahead=True)")
        a, b, c = self.fill_ops
        if self.gemm_ms is None:
            torch.matmul(a, b, out=c)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            self.gemm_ms = start.elapsed_time(end) / 3
        count = max(1, int(ms / self.gemm_ms) + 1)
        for _ in range(count):
            torch.matmul(a, b, out=c)
        return count * self.gemm_ms


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


def time_pass(side, pass_name, *, warmup, iters, flush, quiescent, host_ahead=False):
    """Returns (median ms, peak MiB above `quiescent`) of one pass of one side. host_ahead:
    the GPU runs filler GEMMs while the host issues the pass (the module docstring)."""
    if pass_name not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError("pass must be fwd, bwd or fwd+bwd; got %r" % (pass_name,))
    if host_ahead and warmup < 1:
        raise ValueError("host_ahead needs a warm-up repetition to size its filler")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, peak, host_ms = [], 0, 0.0
    prepare = getattr(side, "prepare", None)
    for i in range(warmup + iters):
        side.zero_grad()
        if prepare is not None:
            prepare()
        state = side.forward() if pass_name == "bwd" else None
        flush()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ahead_ms = None
        if host_ahead and i >= warmup:
            ahead_ms = flush.fill(2 * host_ms + 1.0)
            flush()
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
            if ahead_ms is not None and issued_ms > ahead_ms:
                raise RuntimeError(
                    "host_ahead: the host took %.2f ms to issue the pass, longer than the "
                    "%.2f ms of GPU work queued ahead of it: the timing would include host time"
                    % (issued_ms, ahead_ms))
            times.append(start.elapsed_time(end))
            peak = max(peak, torch.cuda.max_memory_allocated())
        del state
    side.zero_grad()
    return statistics.median(times), (peak - quiescent) / MIB
