"""The C++ host path of llama_middle (coda._host_path, python/coda/csrc/host_path.cpp) against
the Python path it stands in for: the same C calls on the same tensors, so every output and
gradient is equal bit for bit, the same errors for the same bad inputs, and the backward's
guards (run once per forward, qkv not changed in place) as the Python path's.

The extension is built on first use (about 40 s on two cores; cached under
$CODA_HOST_PATH_DIR). Where it cannot be built the tests report themselves skipped with the
reason, unless CODA_TEST_HOST_PATH=required (the CI), where that fails."""

import os

import pytest

torch = pytest.importorskip("torch")

from coda import _host_path as H  # noqa: E402
from coda import ops  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
from test_ops import BLOCK, D, M, QKV, leaves, middle_setup  # noqa: E402

DEVICES = R.device_params()
NAMES = ["x2", "qkv", "dx0", "dy0"] + ["d " + n for n in ops.MIDDLE_WEIGHTS]


@pytest.fixture(scope="module")
def host():
    try:
        module = H.build()
        H.bind(module)
    except Exception as e:  # a missing compiler or torch headers
        if os.environ.get("CODA_TEST_HOST_PATH") == "required":
            raise
        pytest.skip("the C++ host path cannot be built here: %s: %s" % (type(e).__name__, e))
    return module


@pytest.fixture
def paths(host, device):
    """run(path, fn): fn() with llama_middle's calls on `path` ("cpp" or "python"); each call
    checked to have taken it (its node's type)."""
    if device == "cuda" and not host.cuda:
        pytest.skip("this torch build has no CUDA: the host path takes CPU tensors only")
    saved = list(ops._HOST_PATH)

    def run(path, fn):
        ops._HOST_PATH[:] = [host if path == "cpp" else None]
        try:
            return fn()
        finally:
            ops._HOST_PATH[:] = saved

    yield run
    ops._HOST_PATH[:] = saved


def ctx(name):
    return "(seed %d, %s)" % (SEED, name)


def _is_cpp_node(fn):
    """Whether an output's grad_fn is the host path's node (torch names a C++ Function's node
    after its class: ...CppNode<coda_host_path::...::Middle>)."""
    return fn is not None and "coda_host_path" in fn.name()


def _case(device, salt):
    gen = R.generator(SEED, salt)
    x0, y0, w, positions, inv_freq = middle_setup(gen, device)
    dx2 = R.uniform((M, D), -1, 1, gen, device=device)
    dqkv = R.uniform((M, QKV), -1, 1, gen, device=device)
    return [x0, y0] + [w[n] for n in ops.MIDDLE_WEIGHTS], positions, inv_freq, dx2, dqkv


def _run(tensors, positions, inv_freq, block, seeds, path):
    ls = leaves(tensors)
    x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, block)
    assert _is_cpp_node(x2.grad_fn) == (path == "cpp"), type(x2.grad_fn).__name__
    outs = [o for o, s in zip((x2, qkv), seeds) if s is not None]
    grads = torch.autograd.grad(outs, ls, [s for s in seeds if s is not None])
    return [x2.detach(), qkv.detach(), *grads]


def _equal(got, want, what):
    assert len(got) == len(want)
    for name, g, e in zip(NAMES, got, want):
        assert g.dtype == e.dtype and g.shape == e.shape, "%s %s %s" % (what, name, ctx(""))
        assert torch.equal(g, e), "%s: %s differs %s" % (what, name, ctx(""))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["native", "fp8"])
@pytest.mark.parametrize("seeded", ["both", "x2", "qkv"])
def test_matches_the_python_path(paths, device, precision, seeded):
    """Outputs and gradients bit for bit, with both outputs' gradients given or one (the other
    then zeros, as the Python path makes them)."""
    if precision == "fp8" and device == "cpu":
        pytest.skip("FP8 runs on the GPU backend")
    tensors, positions, inv_freq, dx2, dqkv = _case(device, 61)
    if precision == "fp8":  # FP8's GEMMs need every width a multiple of 16, tokens too
        m = M // 16 * 16
        tensors = [tensors[0][:m], tensors[1][:m]] + tensors[2:]
        positions, dx2, dqkv = positions[:m], dx2[:m], dqkv[:m]
    block = ops.BlockConfig(BLOCK.n_heads, BLOCK.n_kv_heads, BLOCK.head_dim, BLOCK.eps,
                            precision=precision)
    seeds = (dx2 if seeded != "qkv" else None, dqkv if seeded != "x2" else None)
    want = paths("python", lambda: _run(tensors, positions, inv_freq, block, seeds, "python"))
    got = paths("cpp", lambda: _run(tensors, positions, inv_freq, block, seeds, "cpp"))
    _equal(got, want, "%s %s, seeded %s" % (device, precision, seeded))


@pytest.mark.parametrize("device", DEVICES)
def test_saved_tensor_hooks_see_what_the_backward_reads(paths, device):
    """Under saved-tensor hooks (activation checkpointing, offloading) qkv is saved through
    them too, as the Python path saves it there; the results stay equal."""
    tensors, positions, inv_freq, dx2, dqkv = _case(device, 62)
    packed = []

    def pack(t):
        packed.append((tuple(t.shape), t.dtype))
        return t

    def run(path):
        del packed[:]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = _run(tensors, positions, inv_freq, BLOCK, (dx2, dqkv), path)
        return out, sorted(packed, key=str)

    want, want_packed = paths("python", lambda: run("python"))
    got, got_packed = paths("cpp", lambda: run("cpp"))
    _equal(got, want, "hooked")
    assert ((M, QKV), want[1].dtype) in got_packed, ctx(str(got_packed))
    assert got_packed == want_packed, ctx("%s != %s" % (got_packed, want_packed))


@pytest.mark.parametrize("device", DEVICES)
def test_without_grad_the_same_outputs_and_no_node(paths, device):
    tensors, positions, inv_freq, _, _ = _case(device, 63)

    def run(mode):
        with mode():
            return ops.llama_middle(tensors[0], tensors[1], tuple(tensors[2:]), positions,
                                    inv_freq, BLOCK)

    for mode in (torch.no_grad, torch.inference_mode):
        want = paths("python", lambda: run(mode))
        got = paths("cpp", lambda: run(mode))
        assert got[0].grad_fn is None and got[1].grad_fn is None
        for g, e in zip(got, want):
            assert torch.equal(g, e), ctx(mode.__name__)


@pytest.mark.parametrize("device", DEVICES)
def test_a_second_backward_raises(paths, device):
    """The backward overwrites the saved z1: a second one through the same graph raises the
    Python path's message instead of reading gradients where the pre-activation was."""
    tensors, positions, inv_freq, dx2, dqkv = _case(device, 64)

    def run():
        ls = leaves(tensors)
        x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
        torch.autograd.backward((x2, qkv), (dx2, dqkv), retain_graph=True)
        with pytest.raises(RuntimeError, match="backward already ran for its forward"):
            torch.autograd.backward((x2, qkv), (dx2, dqkv))

    paths("cpp", run)


@pytest.mark.parametrize("device", DEVICES)
def test_qkv_changed_in_place_is_refused(paths, device):
    """qkv, which the backward reads, changed in place after the forward: the backward raises
    (coda's check where qkv is kept aside, autograd's where it is saved under hooks) instead of
    reading the changed values."""
    tensors, positions, inv_freq, dx2, dqkv = _case(device, 65)

    def run():
        ls = leaves(tensors)
        x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
        with torch.no_grad():
            qkv.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an in.?place operation"):
            torch.autograd.backward((x2, qkv), (dx2, dqkv))

    paths("cpp", run)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e)
    return None, None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", ["w_qkv rows", "y0 width", "x0 dtype", "f64 weight",
                                 "x0 strided", "3-D x0"])
def test_the_same_error_for_the_same_bad_input(paths, device, bad):
    """What coda's C validation rejects raises the exception coda._lib maps its status to,
    with coda_last_error() as the message; what the descriptors cannot name (a float64 tensor)
    is left to the Python path, whose check raises. Either way the same as the Python path; and
    x0 whose rows lie apart in memory (taken as given by both) gives the same results."""
    tensors, positions, inv_freq, _, _ = _case(device, 66)
    tensors = list(tensors)
    names = ["x0", "y0"] + list(ops.MIDDLE_WEIGHTS)
    i = names.index
    if bad == "w_qkv rows":
        tensors[i("w_qkv")] = tensors[i("w_qkv")][:-8]
    elif bad == "y0 width":
        tensors[i("y0")] = tensors[i("y0")][:, :-8]
    elif bad == "x0 dtype":
        tensors[i("x0")] = tensors[i("x0")].half()
    elif bad == "f64 weight":
        tensors[i("w_down")] = tensors[i("w_down")].double()
    elif bad == "x0 strided":  # every other row of a twice-as-tall tensor
        tensors[i("x0")] = torch.cat([tensors[i("x0")]] * 2)[::2]
    else:
        tensors[i("x0")] = tensors[i("x0")][None]

    def run():
        return _error(lambda: ops.llama_middle(tensors[0], tensors[1], tuple(tensors[2:]),
                                               positions, inv_freq, BLOCK))

    want = paths("python", run)
    got = paths("cpp", run)
    if bad == "x0 strided":  # rows apart in memory: coda takes strides as given, both paths too
        assert want == (None, None) and got == (None, None), ctx("%s %s" % (want, got))
        outs = [paths(path, lambda: ops.llama_middle(tensors[0], tensors[1], tuple(tensors[2:]),
                                                     positions, inv_freq, BLOCK))
                for path in ("python", "cpp")]
        assert all(torch.equal(a, b) for a, b in zip(*outs)), ctx(bad)
        return
    assert want[0] is not None, "the Python path accepted %s" % bad
    assert got == want, ctx("%s: %s != %s" % (bad, got, want))


@pytest.mark.parametrize("device", DEVICES)
def test_dispatcher_calls_keep_the_python_path(paths, device):
    """With the eager bypass off every call goes through the torch dispatcher (the custom op),
    as torch.compile and modes need; the C++ path is not taken."""
    if not ops.HAS_CUSTOM_OPS:
        pytest.skip("torch %s has no custom ops" % torch.__version__)
    tensors, positions, inv_freq, _, _ = _case(device, 67)
    previous = ops.set_eager_bypass(False)
    try:
        def run():
            ls = leaves(tensors)
            return ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)

        x2, _ = paths("cpp", run)
        assert not _is_cpp_node(x2.grad_fn), type(x2.grad_fn).__name__
    finally:
        ops.set_eager_bypass(previous)


@pytest.mark.parametrize("device", DEVICES[1:])
def test_peak_memory_is_the_python_paths(paths, device):
    """The same allocations in the same order (the outputs, each part's gradients just before
    it, qkv let go before part 2): forward and backward peak at the Python path's bytes."""
    tensors, positions, inv_freq, dx2, dqkv = _case(device, 68)

    def peak(path):
        ls = leaves(tensors)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        x2, qkv = ops.llama_middle(ls[0], ls[1], tuple(ls[2:]), positions, inv_freq, BLOCK)
        assert _is_cpp_node(x2.grad_fn) == (path == "cpp")
        torch.autograd.backward((x2, qkv), (dx2, dqkv))
        del x2, qkv
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base

    for path in ("python", "cpp"):  # warm-up: the allocator's blocks, the workspace sizes
        paths(path, lambda: peak(path))
    want = paths("python", lambda: peak("python"))
    got = paths("cpp", lambda: peak("cpp"))
    assert got == want, ctx("(peak, after) C++ %s, Python %s" % (got, want))
