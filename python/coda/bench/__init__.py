"""coda against PyTorch eager and torch.compile on the same Llama modules, weights and inputs.

    python -m coda.bench [--cases block-1b,block-8b,model-1b] [--out bench/results/torch.json]
                         [--quick]

Cases (bf16, on one GPU):
  block-1b, block-8b  coda's middle Llama layer (attention output of layer l -> out-proj +
                      residual -> RMSNorm -> gate/up -> SwiGLU -> down + residual -> RMSNorm ->
                      QKV of layer l+1 with RoPE) at Llama-3.2-1B / Llama-3.1-8B shapes, 8192
                      tokens; once without attention and once with causal GQA SDPA after it.
  model-1b            a 16-layer Llama-1B-like causal LM (hidden 2048, MLP 8192, 32/8 heads of
                      64, vocab 128256), one sequence of 8192 tokens, mean cross-entropy loss.
Sides: ``eager`` (reference.py, Hugging Face-style PyTorch), ``compile`` (torch.compile of that
same module), ``coda`` (coda.ops / coda.models on weights converted from it) and, for the
blocks, ``native`` (the same coda layer through its C ABI alone, buffers allocated once: what
coda's PyTorch integration costs is coda_ms / native_ms; --profile says where it goes). Passes:
fwd, bwd (backward alone after an untimed forward) and fwd+bwd. timing.py defines the time and
the peak memory; report.py the JSON; docs/PERFORMANCE.md shows the tables (tools/perf_tables.py).

    python -m coda.bench --fp8 [--cases fp8-1b,fp8-8b] [--out bench/results/fp8_block.json]

FP8 (issue 13): coda's middle block with precision "fp8" against the same op in bf16, against
the reference block with every linear in torchao's tensorwise float8 recipe (torch_fp8.py) and
against the bf16 reference, both under torch.compile, at the Llama-1B and -8B shapes, 8192
tokens, no attention, all four timed pass by pass in turn; the JSON is issue 13's
{"gpu", "date", "commit", "block": [{"model", "tokens", "pass", "fp8_ms", "bf16_ms",
"torch_fp8_ms", ...}]} (docs/fp8.md, "The FP8 block against PyTorch's FP8").
"""
from .runner import ALL_PASSES, CASES, SHAPES, Opts, run_case  # noqa: F401
