"""coda.models.Llama under FSDP2 (docs/distributed.md), on one rank: what the single-GPU machine
can run of the multi-GPU issue. Sharded by Llama.fsdp_units (each coda op's weights one unit),
a step gives the plain model's loss and gradients; sharded per decoder layer, the step is
refused with what to write instead. Needs an sm_90 GPU and a torch whose FSDP2 takes a list of
modules per unit (torch >= 2.6); skipped elsewhere."""

import copy

import pytest

torch = pytest.importorskip("torch")

from coda import models  # noqa: E402

import torch_reference as R  # noqa: E402
from conftest import SEED  # noqa: E402
from test_models import batch, randomize, small_config  # noqa: E402


def _fsdp2():
    """(fully_shard, MixedPrecisionPolicy) of this torch, or a skip."""
    if not R.sm90():
        pytest.skip("needs an sm_90 GPU")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        pytest.skip("torch %s has no torch.distributed.fsdp.fully_shard" % torch.__version__)
    return dist, fully_shard, MixedPrecisionPolicy


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank NCCL process group on the current GPU, destroyed after the test."""
    dist, fully_shard, policy = _fsdp2()
    dist.init_process_group("nccl", init_method="file://%s" % (tmp_path / "rendezvous"), rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        yield fully_shard, policy
    finally:
        dist.destroy_process_group()


def _models(config):
    gen = torch.Generator().manual_seed(SEED + 61)
    plain = models.Llama(config, device="cuda")
    randomize(plain, gen)
    return plain, copy.deepcopy(plain)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def test_fsdp2_over_fsdp_units_is_the_plain_model(one_rank):
    """bf16 parameters, fp32 gradient reduction: over one rank the reduction is the identity
    and the upcast exact, so loss and every gradient are the plain model's, bit for bit."""
    fully_shard, policy = one_rank
    config = small_config(num_hidden_layers=3)
    plain, sharded = _models(config)
    mp = policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in sharded.fsdp_units():
        fully_shard(unit, mp_policy=mp)
    fully_shard(sharded, mp_policy=mp)

    gen = torch.Generator().manual_seed(SEED + 62)
    ids, labels = batch(gen, config, "cuda")
    for step in range(2):  # the second step runs on resharded, re-gathered parameters
        losses = []
        for model in (plain, sharded):
            model.zero_grad(set_to_none=True)
            loss = model(ids, labels=labels)
            loss.backward()
            losses.append(loss.detach())
        assert torch.equal(losses[0], _full(losses[1])), "step %d: loss" % step
        for (name, p), (_, q) in zip(plain.named_parameters(), sharded.named_parameters()):
            assert q.grad is not None, "step %d: %s has no gradient under FSDP2" % (step, name)
            assert torch.equal(p.grad, _full(q.grad).to(p.grad.dtype)), \
                "step %d: d %s differs under FSDP2" % (step, name)


def test_fsdp2_per_decoder_layer_is_refused_with_what_to_write(one_rank):
    """fully_shard per decoder layer leaves the weights of a coda op sharded while it runs (its
    ops cross the layers): the step raises, naming a weight and model.fsdp_units()."""
    fully_shard, policy = one_rank
    config = small_config(num_hidden_layers=2)
    _, sharded = _models(config)
    for layer in sharded.layers:
        fully_shard(layer)
    fully_shard(sharded)
    ids, labels = batch(torch.Generator().manual_seed(SEED + 63), config, "cuda")
    with pytest.raises(TypeError, match=r"is a DTensor.*fsdp_units"):
        sharded(ids, labels=labels)
