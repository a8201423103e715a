"""What coda's layer ops keep between forward and backward, and what their backward needs on top
(docs/python.md, "Memory").

- The tensors each op saves for its backward, seen through torch.autograd.graph.saved_tensors_hooks:
  besides its own inputs, weights and outputs, exactly the activations its C backward reads
  (first: rstd; middle: x1, z1, r1, r2; last: x1, z1, r1, x2, r2, dlogits, grad_scale, zeta),
  with their bytes per token.
- The block backward's workspace, whose phases share memory (src/block/scratch.cpp): its size
  against the phases' high-water mark, and the backward's results bit for bit against the same
  kernels called one by one through coda.kernels, each step's tensors in memory of their own (a
  phase that overwrote a tensor still to be read would show here).
"""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from coda import _lib as L  # noqa: E402
from coda import _torch as T  # noqa: E402
from coda import kernels as K  # noqa: E402
from coda import ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
from test_ops import (BLOCK, D, F, H, HD, KV, M, QKV, V, first_inputs, last_setup,  # noqa: E402
                      middle_setup, rope_inputs)

DEVICES = R.device_params()
ALIGN = 256  # the block's scratch alignment (src/block/scratch.cpp)


def ctx(name):
    return "(seed %d, %s)" % (SEED, name)


def nbytes(t):
    return t.numel() * t.element_size()


def saved_by(run, known):
    """The tensors autograd saves while `run()` records its forward, as {data_ptr: (shape, dtype,
    bytes)}, split into those that are among `known` (the op's own inputs, weights and outputs,
    alive anyway) and the rest: what the op alone keeps alive until its backward."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = run()
    known_ptrs = {t.data_ptr() for t in known if t is not None}
    known_ptrs |= {t.data_ptr() for t in outs if isinstance(t, torch.Tensor)}
    own, shared = {}, {}
    for t in packed:
        if t.numel() == 0:
            continue
        (shared if t.data_ptr() in known_ptrs else own)[t.data_ptr()] = (
            tuple(t.shape), t.dtype, nbytes(t))
    return outs, own, shared


def kept(own):
    """The op's own saved tensors as a sorted list of (shape, dtype)."""
    return sorted((shape, str(dtype)) for shape, dtype, _ in own.values())


@pytest.mark.parametrize("device", DEVICES)
def test_first_layer_keeps_rstd(device):
    gen = R.generator(SEED, 41)
    x, w = first_inputs(gen, device)
    positions, inv_freq = rope_inputs(gen, device)
    positions = positions.to(torch.int32)  # what the op passes on as it is (no copy to keep)
    lx, *lw = _leaves([x, *w.values()])
    _, own, shared = saved_by(
        lambda: (ops.llama_first(lx, tuple(lw), positions, inv_freq, BLOCK),),
        [lx, *lw, positions, inv_freq])
    assert kept(own) == [((M,), "torch.float32")], ctx(str(own))
    assert sum(b for *_, b in own.values()) == 4 * M
    # x (the norm's input, K6 reads it) and the output qkv (rope_backward's zeta) are kept too,
    # shared with the caller.
    assert lx.data_ptr() in shared


def _leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
def test_middle_layer_keeps_x1_z1_and_the_rstds(device):
    gen = R.generator(SEED, 42)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    positions = positions.to(torch.int32)
    ls = _leaves([x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS])
    outs, own, shared = saved_by(
        lambda: ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK),
        ls + [positions, inv_freq])
    bf16, f32 = "torch.bfloat16", "torch.float32"
    assert kept(own) == sorted([((M, D), bf16), ((M, 2 * F), bf16), ((M,), f32), ((M,), f32)]), \
        ctx(str(own))
    # 2D + 4F + 8 bytes per token: x1, z1 (the gate/up pre-activation; K7 recomputes the SwiGLU
    # output from it), r1, r2 (the rstds; K6 recomputes the normalized inputs from x and rstd).
    assert sum(b for *_, b in own.values()) == M * (2 * D + 4 * F + 8)
    x2, qkv = outs
    for t in (x2, qkv, ls[1]):  # the norm input x2, qkv for zeta, y0 for dW_out
        assert t.data_ptr() in shared


@pytest.mark.parametrize("device", DEVICES)
def test_last_layer_keeps_the_loss_gradient(device):
    gen = R.generator(SEED, 43)
    x0, y0, w, targets = last_setup(gen, device)
    targets = targets.to(torch.int32)
    ls = _leaves([x0, y0] + [w[n] for n in ops.LAST_WEIGHTS])
    _, own, _ = saved_by(
        lambda: ops.llama_last(ls[0], ls[1], targets, tuple(ls[2:]), BLOCK),
        ls + [targets])
    bf16, f32 = "torch.bfloat16", "torch.float32"
    assert kept(own) == sorted([((M, D), bf16), ((M, 2 * F), bf16), ((M,), f32),
                                ((M, D), bf16), ((M,), f32), ((M, V), bf16), ((1,), f32),
                                ((M,), f32)]), ctx(str(own))
    # x1, z1, r1, x2, r2 as the middle layer, dlogits (the loss gradient, computed in the
    # forward, written over the logits), zeta, and grad_scale (4 bytes in all).
    assert sum(b for *_, b in own.values()) == M * (2 * D + 4 * F + 4 + 2 * D + 4 + 2 * V + 4) + 4


# ---------------------------------------------------------------------------------------------
# The backward's workspace


def _aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _config(vocab=0):
    return ops._c_config(D, F, H, KV, HD, vocab, 1e-5)


def _blocks(n, block):
    return (n + block - 1) // block


def _workspace_sizes_without_a_gpu(m):
    """llama_workspace_size of the middle and last layers, in a child process that sees no CUDA
    device: there the GEMMs take no stream-K scratch (whose size depends on the GPU), so the
    sizes are the carve's alone."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json\n"
        "from coda import _lib as L\n"  # no torch: the child starts in a fraction of a second
        "m, d, f, h, kv, hd, v = %d, %d, %d, %d, %d, %d, %d\n"
        "cfg = lambda vocab: L.LlamaConfig(hidden=d, intermediate=f, n_heads=h, n_kv_heads=kv,\n"
        "                                  head_dim=hd, vocab=vocab, eps=1e-5, ignore_index=-100,\n"
        "                                  loss_reduction=L.LOSS_MEAN)\n"
        "print(json.dumps([L.llama_workspace_size(L.LLAMA_MIDDLE, L.LLAMA_BACKWARD, cfg(0), m),\n"
        "                  L.llama_workspace_size(L.LLAMA_LAST, L.LLAMA_BACKWARD, cfg(v), m),\n"
        "                  L.llama_workspace_size(L.LLAMA_LAST, L.LLAMA_FORWARD, cfg(v), m),\n"
        "                  L.llama_workspace_size(L.LLAMA_MIDDLE, L.LLAMA_BACKWARD_PART1,\n"
        "                                         cfg(0), m),\n"
        "                  L.llama_workspace_size(L.LLAMA_MIDDLE, L.LLAMA_BACKWARD_PART2,\n"
        "                                         cfg(0), m)]))\n"
    ) % (m, D, F, H, KV, HD, V)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_backward_workspace_is_the_high_water_mark_of_its_phases():
    """The middle and last backward's scratch: statistics that live through the call, then one
    region where B0..B2 (dz2 and the attention norm's h_hat; the last layer: the final norm's
    h_hat), B3..B4 (y1) and B5..B6 (the ffn norm's h_hat) follow one another; dz1 [M, 2F], the
    largest, takes none: K7 writes it over the saved z1 (the GEMMs' stream-K scratch left out:
    see _workspace_sizes_without_a_gpu)."""
    m = M
    middle, last, last_fwd, _, _ = _workspace_sizes_without_a_gpu(m)
    stats = (_aligned(D * _blocks(m, L.REDUCE_BLOCK) * 4) + _aligned(m * 4)
             + _aligned(m * _blocks(F, L.STAGED_REDUCE_BLOCK) * 4))
    mlp = max(_aligned(m * F * 2), _aligned(m * D * 2))
    assert middle == stats + max(mlp, _aligned(m * QKV * 2) + _aligned(m * D * 2))
    assert last == _aligned(4) + stats + max(mlp, _aligned(m * D * 2))
    # The last forward: K5's partials and the cross-entropy's workspace over y1.
    h_sumsq = _aligned(m * D * 2) + _aligned(m * _blocks(D, L.REDUCE_BLOCK) * 4)
    assert last_fwd <= h_sumsq + max(_aligned(m * F * 2), _aligned(
        m * _blocks(V, L.STAGED_REDUCE_BLOCK) * 4) + _aligned(m * 4) + 8192)


def test_two_part_backward_workspaces_hold_only_their_phases():
    """The middle backward's two parts (what coda.ops runs): part 1 the one call's workspace
    (its largest phase, y1, is part 1's); part 2 only the ffn norm's dgamma partials and h_hat
    (zeta1 comes over the saved r2, dz1 over z1)."""
    m = M
    middle, _, _, part1, part2 = _workspace_sizes_without_a_gpu(m)
    assert part1 == middle
    assert part2 == _aligned(D * _blocks(m, L.REDUCE_BLOCK) * 4) + _aligned(m * D * 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["native", "fp8"])
def test_middle_backward_calls_its_two_parts(device, precision, monkeypatch):
    """The middle backward op's C calls: the two parts, each part's gradients allocated just
    before it, in both precisions (FP8's memory: docs/python.md, "FP8"). 96 tokens: FP8's
    backward needs a multiple of 16."""
    # The Python path's calls (the C++ host path's are test_host_path.py's: the same peak).
    monkeypatch.setattr(ops, "_HOST_PATH", [None])
    gen = R.generator(SEED, 47)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    m = 96
    calls = []

    def recorded(name):
        real = getattr(L, name)

        def call(which, config, *args):
            calls.append((name, which, config.precision))
            return real(which, config, *args)
        monkeypatch.setattr(L, name, call)

    recorded("llama_backward")
    recorded("llama_middle_backward_part")
    block = ops.BlockConfig(H, KV, HD, eps=1e-5, precision=precision)
    ls = _leaves([x0[:m], y0[:m]] + [w[n] for n in ops.MIDDLE_WEIGHTS])
    outs = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions[:m], inv_freq, block)
    grads = torch.autograd.grad(outs, ls, [torch.ones_like(t) for t in outs])
    code = L.LLAMA_FP8 if precision == "fp8" else L.LLAMA_NATIVE
    assert calls == [("llama_middle_backward_part", L.LLAMA_BACKWARD_PART1, code),
                     ("llama_middle_backward_part", L.LLAMA_BACKWARD_PART2, code)], calls
    for leaf, g in zip(ls, grads):
        assert g.shape == leaf.shape and bool(torch.isfinite(g).all()), ctx(precision)


def _middle_through_qkv(gen, device, hooked):
    """The middle op's leaves, outputs and a loss reading x2 and qkv through ops that save
    neither (a cast; a product with a constant saves only the constant), recorded under
    pass-through saved-tensor hooks when `hooked`."""
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    positions = positions.to(torch.int32)
    ls = _leaves([x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS])
    hooks = (torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooked
             else contextlib.nullcontext())
    with hooks:
        x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
        seed = R.uniform(qkv.shape, -1, 1, gen, dtype=torch.float32, device=device)
        loss = x2.float().sum() + (qkv.float() * seed).sum()
    return ls, x2, qkv, loss


@pytest.mark.parametrize("device", DEVICES)
def test_middle_backward_lets_qkv_go_before_part_2(device, monkeypatch):
    """Eager, the middle op keeps its output qkv outside autograd's saved tensors and drops it
    after the backward's part 1, its only reader, so part 2's gradients can take its memory
    (block-8b +attn's peak held it, docs/PERFORMANCE.md). Under saved-tensor hooks (activation
    checkpointing, offload) qkv is saved, and alive, as every other tensor. The gradients are the
    same bits either way."""
    # The Python path's calls (the C++ host path's are test_host_path.py's: the same peak).
    monkeypatch.setattr(ops, "_HOST_PATH", [None])
    if ops._saved_tensors_hooked():
        pytest.skip("this torch cannot tell whether saved-tensor hooks are active (no "
                    "torch._C._autograd._top_saved_tensors_default_hooks): qkv is always saved")
    from torch.multiprocessing.reductions import StorageWeakRef

    real, alive_at_part_2 = ops._run_layer, []

    def run_layer(layer, pass_, *args):
        if pass_ == L.LLAMA_BACKWARD_PART2:
            alive_at_part_2.append(not qkv_storage.expired())
        return real(layer, pass_, *args)

    monkeypatch.setattr(ops, "_run_layer", run_layer)
    grads = {}
    for hooked in (False, True):
        ls, x2, qkv, loss = _middle_through_qkv(R.generator(SEED, 48), device, hooked)
        qkv_storage = StorageWeakRef(qkv.untyped_storage())
        del x2, qkv  # the caller's references: only the graph's are left
        grads[hooked] = torch.autograd.grad(loss, ls)
        assert alive_at_part_2 == [hooked], ctx("hooked %s: %s" % (hooked, alive_at_part_2))
        alive_at_part_2.clear()
    for a, b in zip(grads[False], grads[True]):
        assert torch.equal(a, b), ctx("gradients with qkv kept aside and saved differ")


@pytest.mark.parametrize("device", DEVICES)
def test_middle_backward_refuses_a_qkv_changed_in_place(device):
    """qkv changed in place after the forward: the backward, which reads it, raises as autograd
    does for a modified saved tensor (qkv kept aside, eager), instead of using the new values."""
    ls, x2, qkv, loss = _middle_through_qkv(R.generator(SEED, 49), device, hooked=False)
    with torch.no_grad():
        qkv.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
        torch.autograd.grad(loss, ls)


def _wgrad(dy, x, alpha=None):
    """dW = alpha dy^T x, as the block's weight_gradient (a device alpha: Scalar{1, alpha})."""
    dw = torch.empty((dy.shape[1], x.shape[1]), dtype=dy.dtype, device=dy.device)
    args = L.GemmArgs()
    args.layout = L.GEMM_WGRAD
    args.a, args.b, args.d = T.view(dy), T.view(x), T.view(dw)
    args.alpha = L.scalar(1.0, T.view(alpha) if alpha is not None else None)
    nbytes = L.gemm_workspace_size(args)
    ws = None
    if nbytes:
        ws, args.workspace = T.workspace(nbytes, dy.device)
    with T.device_guard(dy.device):
        L.gemm(args, T.stream(dy))
    if dy.is_cuda:
        torch.cuda.synchronize(dy.device)
    del ws
    return dw


def _mlp_backward(dx, y0, w, x1, z1, r1):
    """B3..B8 one kernel at a time; dx holds d/d x2 (after the layer's first norm backward).
    Returns d/d x0, dy0 and the MLP's weight gradients by name."""
    y1, dz1, zeta_partials = K.gemm_swiglu_backward(dx, w["w_down"], z1)        # B3
    zeta1 = K.reduce_row_partials(zeta_partials, 1.0 / D)                        # A4
    d = {"w_down": _wgrad(dx, y1)}                                               # B4
    dx, h_hat, partials = K.gemm_rms_backward(dz1, w["w_gate_up"], x1, r1, zeta1,
                                              w["ffn_norm"], dx_in=dx)           # B5
    d["ffn_norm"] = K.reduce_col_partials(partials, out_dtype=w["ffn_norm"].dtype)  # A5
    d["w_gate_up"] = _wgrad(dz1, h_hat)                                          # B6
    dy0 = ops.gemm(dx, w["w_out"], "dgrad")                                      # B7
    d["w_out"] = _wgrad(dx, y0)                                                  # B8
    return dx, dy0, d


def _expect_equal_gradients(got, dx0, dy0, d, weight_names):
    """A layer op's gradients (autograd's order: x0, y0, then the weights) bit for bit those of
    its kernels called one by one (dx0, dy0 and the weight gradients by name)."""
    want = [dx0, dy0] + [d[n] for n in weight_names]
    names = ["dx0", "dy0"] + ["d " + n for n in weight_names]
    for name, g, e in zip(names, got, want):
        assert torch.equal(g, e), "%s differs from the kernels one by one %s" % (name, ctx(""))


@pytest.mark.parametrize("device", DEVICES)
def test_middle_backward_equals_its_kernels_one_by_one(device):
    gen = R.generator(SEED, 44)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    positions = positions.to(torch.int32)
    dx2 = R.uniform((M, D), -1, 1, gen, device=device)
    dqkv = R.uniform((M, QKV), -1, 1, gen, device=device)
    ls = _leaves([x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS])
    outs = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
    got = torch.autograd.grad(outs, ls, (dx2, dqkv))

    with torch.no_grad():
        x2, qkv, x1, z1, r1, r2 = ops._middle_forward_impl(
            x0, y0, *[w[n] for n in ops.MIDDLE_WEIGHTS], positions, inv_freq, H, KV, HD,
            BLOCK.eps, L.LLAMA_NATIVE, [])
        assert torch.equal(x2, outs[0]) and torch.equal(qkv, outs[1])
        dz2, zeta = K.rope_backward(dqkv, qkv, positions, inv_freq, H, KV, HD, 1.0 / D)  # B0
        dx, h_hat, partials = K.gemm_rms_backward(dz2, w["w_qkv"], x2, r2, zeta,
                                                  w["attn_norm"], dx_in=dx2)            # B1
        d_attn_norm = K.reduce_col_partials(partials, out_dtype=w["attn_norm"].dtype)  # A3
        d_w_qkv = _wgrad(dz2, h_hat)                                                   # B2
        dx0, dy0, d = _mlp_backward(dx, y0, w, x1, z1, r1)
    d.update(attn_norm=d_attn_norm, w_qkv=d_w_qkv)
    _expect_equal_gradients(got, dx0, dy0, d, ops.MIDDLE_WEIGHTS)


@pytest.mark.parametrize("device", DEVICES)
def test_last_backward_equals_its_kernels_one_by_one(device):
    gen = R.generator(SEED, 45)
    x0, y0, w, targets = last_setup(gen, device)
    targets = targets.to(torch.int32)
    weights = [w[n] for n in ops.LAST_WEIGHTS]
    dloss = 0.7
    ls = _leaves([x0, y0] + weights)
    loss, _ = ops.llama_last(ls[0], ls[1], targets, tuple(ls[2:]), BLOCK)
    got = torch.autograd.grad(loss * dloss, ls)

    with torch.no_grad():
        out = ops._last_forward_impl(x0, y0, targets, *weights, H, KV, HD, BLOCK.eps,
                                     L.LLAMA_NATIVE, BLOCK.ignore_index, L.LOSS_MEAN, False,
                                     [])
        _, _, x1, z1, r1, x2, r2, dlogits, grad_scale, zeta_loss = out
        # d loss_outer / d loss as autograd hands it to the op: a [1] f32 tensor.
        g = torch.full((1,), dloss, dtype=torch.float32, device=x0.device)
        alpha = K._run(K._ROW, g.view(1, 1), 1.0, grad_scale)  # dloss * grad_scale
        zeta = K._run(K._ROW, zeta_loss.view(M, 1), 1.0 / D, alpha)
        dx, h_hat, partials = K._run(K._K6, dlogits, w["lm_head"], x2, r2, zeta,
                                     w["final_norm"], 1.0, alpha, None)
        d_final = K.reduce_col_partials(partials, out_dtype=w["final_norm"].dtype)
        d_lm = _wgrad(dlogits, h_hat, alpha)
        dx0, dy0, d = _mlp_backward(dx, y0, w, x1, z1, r1)
    d.update(final_norm=d_final, lm_head=d_lm)
    _expect_equal_gradients(got, dx0, dy0, d, ops.LAST_WEIGHTS)


@pytest.mark.parametrize("device", DEVICES)
def test_a_layer_backward_consumes_its_saved_pre_activation(device):
    """The middle and last backward write d loss / d z1 over the saved z1 (no workspace for
    it): the first backward through a retained graph gives the gradients, a second raises
    with what to do instead of reading gradients where the pre-activation was."""
    gen = R.generator(SEED, 46)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    ls = _leaves([x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS])
    outs = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
    seeds = (torch.ones_like(outs[0]), torch.ones_like(outs[1]))
    first = torch.autograd.grad(outs, ls, seeds, retain_graph=True)
    assert all(torch.isfinite(g.float()).all() for g in first)
    with pytest.raises(RuntimeError, match="cannot run twice"):
        torch.autograd.grad(outs, ls, seeds)

    x0, y0, w, targets = last_setup(gen, device)
    ls = _leaves([x0, y0] + [w[n] for n in ops.LAST_WEIGHTS])
    loss, _ = ops.llama_last(ls[0], ls[1], targets.to(torch.int32), tuple(ls[2:]), BLOCK)
    torch.autograd.grad(loss, ls, retain_graph=True)
    with pytest.raises(RuntimeError, match="cannot run twice"):
        torch.autograd.grad(loss, ls)


@pytest.mark.parametrize("device", DEVICES)
def test_model_layers_share_one_copy_of_the_positions(device):
    """Llama's int64 positions become int32 once per forward, not once per layer: the layers
    save the same [M] tensor (and the last layer its targets)."""
    from coda import models

    cfg = models.LlamaConfig(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                             num_key_value_heads=KV, head_dim=HD, vocab_size=V,
                             num_hidden_layers=4, rope_theta=500000.0)
    torch.manual_seed(SEED)
    model = models.Llama(cfg, device=device)
    batch, seq = 2, 24
    ids = torch.randint(0, V, (batch, seq), device=device)
    int32 = {}

    def pack(t):
        if t.dtype == torch.int32 and t.numel() == batch * seq:
            int32[t.data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, labels=ids)
    loss.backward()
    assert len(int32) == 2, ctx("%d int32 [M] tensors saved" % len(int32))


def test_saved_bytes_tool_smoke(tmp_path):
    """tools/saved_bytes.py (the GPU measurement of every bench side) on the CPU backend at the
    bench's tiny shape: its graph walk and its hooks find coda's x1, z1, r1, r2."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "tools",
                        "saved_bytes.py")
    spec = importlib.util.spec_from_file_location("saved_bytes", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "saved.json"
    assert tool.main(["--device", "cpu", "--shape", "tiny", "--tokens", "64", "--cases",
                      "block-1b", "--sides", "eager,coda", "--json", str(out)]) == 0
    records = {r["side"]: r for r in json.loads(out.read_text())["records"]}
    d, f, m = 256, 512, 64  # coda.bench's tiny shape
    coda = records["coda"]
    assert coda["graph_saved"] == coda["hooks_saved"] == m * (2 * d + 4 * f + 8)
    assert coda["outputs"] == m * 2 * (d + (4 + 2 * 2) * 64)  # x2 and qkv
    assert records["eager"]["graph_saved"] > 0 and records["eager"]["hooks_saved"] > 0
