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

Peak memory (MiB): the highest ``torch.cuda.max_memory_allocated`` inside the timed window,
minus ``quiescent``: what was allocated just before the side's very first call, when every
model of the case held only its weights (and every gradient was None) and the inputs were
resident, plus whatever the side allocated at construction beyond its weights. So activations,
gradients, logits, workspaces, and caches a side keeps between calls all count against it; the
weights and the inputs, the same on every side, do not. The caching allocator's reserve is not
counted (it is not allocated memory).
"""
import statistics

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


def time_pass(side, pass_name, *, warmup, iters, flush, quiescent):
    """Returns (median ms, peak MiB above `quiescent`) of one pass of one side."""
    if pass_name not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError("pass must be fwd, bwd or fwd+bwd; got %r" % (pass_name,))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, peak = [], 0
    prepare = getattr(side, "prepare", None)
    for i in range(warmup + iters):
        side.zero_grad()
        if prepare is not None:
            prepare()
        state = side.forward() if pass_name == "bwd" else None
        flush()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start.record()
        if pass_name == "fwd":
            state = side.forward()
        elif pass_name == "bwd":
            side.backward(state)
        else:
            side.backward(side.forward())
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
            peak = max(peak, torch.cuda.max_memory_allocated())
        del state
    side.zero_grad()
    return statistics.median(times), (peak - quiescent) / MIB
