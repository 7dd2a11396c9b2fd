"""One rank of N predicted from one process (`remat.profile(..., mode="fake", world_size=N)`, issue 14), and the
`remat:` errors of distributed profiling.  The 2-rank runs these predictions are checked against are in
tests/test_distributed.py."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import remat
from remat import zoo
from remat._torch_compat.distributed import fake_process_group
from remat.applier.apply import applied


def _gpt2(batch=4):
    return zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=batch, vocab=256)


def _adam(ps):
    return torch.optim.AdamW(ps)


def _bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_fsdp_prediction_holds_one_shard_of_everything_and_plans_one_module_per_checkpoint():
    model, inputs = _gpt2()
    bare = remat.profile(model, {k: v[:1].clone() for k, v in inputs.items()}, optimizer=_adam, mode="fake")
    prof = remat.profile(model, inputs, optimizer=_adam, mode="fake", world_size=4)
    assert (prof.parallel, prof.world_size, prof.model) == ("fsdp", 4, "GPT2LMHeadModel")
    # each rank holds a quarter of the parameters, gradients and Adam's two moments (GPT-2's dims divide by 4)
    assert prof.param_bytes == _bytes(model) // 4 == prof.grad_bytes
    assert prof.optimizer_bytes == 2 * _bytes(model) // 4 + 4 * len(list(model.parameters()))  # + fp32 step counts
    assert prof.at_peak.gathered_bytes > 0 and prof.input_bytes == bare.input_bytes  # one row of four per rank
    assert [(b.name, b.type) for b in prof.blocks] == [(b.name, b.type) for b in bare.blocks]  # not FSDPGPT2Block
    assert any("predicted for one rank of 4: FSDP2 per block" in n for n in prof.notes)
    assert not dist.is_initialized()  # the fake process group is gone
    assert all(p.device.type == "cpu" and type(p) is torch.nn.Parameter for p in model.parameters())  # untouched
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    assert plan.segments + plan.selective and all(len(s) == 1 for s in plan.segments)
    assert any("sharded with FSDP2" in n for n in plan.notes)
    remat.apply(model, plan)  # plan on a laptop, apply before fully_shard: the bare classes match
    assert applied(model) is plan


def test_ddp_prediction_adds_the_gradient_buckets_to_the_bare_step():
    model, inputs = _gpt2()
    bare = remat.profile(model, {k: v[:2].clone() for k, v in inputs.items()}, optimizer=_adam, mode="fake")
    prof = remat.profile(
        model, inputs, optimizer=torch.optim.AdamW(model.parameters()), mode="fake", world_size=2, wrap="ddp"
    )
    assert (prof.parallel, prof.world_size) == ("ddp", 2)
    assert prof.peak_bytes == bare.peak_bytes + _bytes(model)  # the buckets are live through the step
    assert prof.at_peak.grads_bytes == bare.at_peak.grads_bytes + _bytes(model)
    spans = [(b.name, b.forward_start_op, b.backward_end_op) for b in prof.blocks]
    assert spans == [(b.name, b.forward_start_op, b.backward_end_op) for b in bare.blocks]  # the blocks were seen
    assert remat.frontier(prof)[-1].peak_bytes == remat.frontier(bare)[-1].peak_bytes + _bytes(model)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (
            {"world_size": 2},
            "remat: world_size=2 predicts one rank of 2 in fake mode; saw mode='real'. Fix: pass mode='fake'",
        ),
        (
            {"world_size": 3, "mode": "fake"},
            "remat: world_size=3 does not divide the batch: an input of shape (4, 32) has "
            "4 rows; expected the global batch",
        ),
        (
            {"world_size": 0, "mode": "fake"},
            "remat: world_size is how many ranks train the model: a whole number of at least 1; saw 0.",
        ),
        (
            {"world_size": 2, "mode": "fake", "wrap": "zero3"},
            "remat: wrap says how the 2 ranks share the model: 'fsdp'",
        ),
        (
            {"world_size": 2, "mode": "fake", "wrap": lambda m, mesh: m},
            "remat: the wrap callable returned GPT2LMHeadModel, expected the model sharded",
        ),
    ],
)
def test_a_prediction_that_cannot_be_made_as_asked_says_why(kwargs, expected):
    model, inputs = _gpt2()
    with pytest.raises(remat.RematError) as e:
        remat.profile(model, inputs, **kwargs)
    assert str(e.value).startswith(expected) and "Fix:" in str(e.value)
    assert not dist.is_initialized()


def test_a_prediction_from_a_process_with_a_process_group_is_refused():
    model, inputs = _gpt2()
    with fake_process_group(2, "cpu"):
        with pytest.raises(
            remat.RematError,
            match=r"^remat: world_size=2 predicts from one process with a fake "
            r"process group of its own, but this process has one already "
            r"\(rank 0 of 2\)",
        ):
            remat.profile(model, inputs, mode="fake", world_size=2)


def test_a_wrapped_model_without_a_process_group_and_a_2d_mesh_are_refused():
    model, inputs = _gpt2()
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
    finally:
        dist.destroy_process_group()
    with pytest.raises(remat.RematError) as e:
        remat.profile(ddp, inputs)
    assert str(e.value).startswith(
        "remat: GPT2LMHeadModel is wrapped in DistributedDataParallel, but this process has no process group"
    ) and "Fix: call torch.distributed.init_process_group" in str(e.value)
    model, inputs = _gpt2()
    with fake_process_group(4, "cpu"):
        fully_shard(model, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
        with pytest.raises(remat.RematError) as e:
            remat.profile(model, inputs)
    assert str(e.value).startswith(
        "remat: the model is sharded over a 2-D mesh (2, 2); remat follows FSDP2 over a 1-D mesh"
    ) and "Fix:" in str(e.value)


def test_a_plan_applied_inside_wrap_predicts_the_peak_the_plan_promised_and_an_applied_model_is_refused():
    """The prediction of the planned step (the plan applied to the copy before sharding, as torchtitan applies its
    checkpointing) peaks where the plan said, or up to 1% under it.  A model remat.apply wrapped cannot be copied for a prediction (its
    checkpoints call the original modules): a `remat:` error, not a step run on the wrong modules."""
    from remat.measure.ranks import _shard_per_block

    model, inputs = _gpt2()
    prof = remat.profile(model, inputs, optimizer=_adam, mode="fake", world_size=2)
    plan = remat.frontier(prof)[-1]
    assert plan.peak_bytes < prof.peak_bytes
    planned = remat.profile(
        model,
        inputs,
        optimizer=_adam,
        mode="fake",
        world_size=2,
        wrap=lambda copy, mesh: _shard_per_block(remat.apply(copy, plan), mesh),
    )
    assert 0.99 * plan.peak_bytes <= planned.peak_bytes <= plan.peak_bytes  # seen: 0.9% under it, 2 layers
    assert applied(model) is None  # the plan went to the copy
    remat.apply(model, plan)
    with pytest.raises(
        remat.RematError,
        match=r"^remat: world_size=2 predicts from a copy of the model, but "
        r"remat.apply has wrapped modules of this one",
    ):
        remat.profile(model, inputs, mode="fake", world_size=2)
