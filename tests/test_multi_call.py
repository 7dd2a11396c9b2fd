"""A module whose forward runs more than once per step is profiled call by call and planned from its calls added up
(NOTE [A module called more than once] in `remat.measure.calls`).  Taken as one block spanning all its calls, an MLP
and a LayerNorm applied 4 times had their least plan predicted at 748 MiB and measured at 556 (found 2026-11-28),
and no checkpoint of them lowered the predicted peak: the planner left ALBERT's shared layer alone."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import remat
from remat import zoo
from test_random_trees import _compatible_sets, assert_predicted_to_the_byte
from remat.planner.problem import Problem
from remat.types import Action


class _Shared(nn.Module):
    """One MLP and one LayerNorm applied `calls` times, then a head called once."""

    def __init__(self, width: int = 64, calls: int = 3):
        super().__init__()
        self.calls = calls
        self.block = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 8)

    def forward(self, x):
        for _ in range(self.calls):
            x = x + self.block(self.norm(x))
        return self.head(x)


def test_each_call_is_profiled_apart_and_the_calls_add_up_to_the_module():
    torch.manual_seed(0)
    prof = remat.profile(_Shared(), torch.randn(256, 64), mode="fake")
    whole = {b.name: b for b in prof.blocks}
    for name in ("block.0", "block.1"):
        calls = [c for c in prof.call_blocks if c.name == name]
        assert [c.call for c in calls] == [0, 1, 2] and whole[name].call == -1
        assert sum(c.forward_flops for c in calls) == whole[name].forward_flops
        assert sum(c.backward_flops for c in calls) == whole[name].backward_flops
        spans = [(c.forward_start_op, c.forward_end_op, c.backward_start_op, c.backward_end_op) for c in calls]
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans  # forwards in turn
        assert all(a[2] > b[3] for a, b in zip(spans, spans[1:])), spans  # backwards in reverse
    assert all(c.output_kept_by == ["block.2"] for c in prof.call_blocks if c.name == "block.1")  # same call's
    assert not any(c.name == "head" for c in prof.call_blocks)  # called once


def test_every_plan_of_a_module_called_three_times_is_predicted_to_the_byte_of_its_step():
    torch.manual_seed(0)
    model, x = _Shared(), torch.randn(256, 64)
    prof = remat.profile(model, x, mode="fake")
    problem = Problem.from_profile(prof)
    units = [u for u in problem.units if u.appliable and u.action != Action.OFFLOAD]
    assert {u.blocks for u in units if u.calls == 3} >= {("block.0", "block.1"), ("block.1", "block.2")}
    assert all(len(u.blocks) == 1 for u in Problem.from_profile(prof, max_segment=1).units)  # max_segment holds too
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))


def test_albert_s_shared_layer_is_checkpointed_and_its_least_plan_fits_by_the_process_counter():
    pytest.importorskip("transformers")
    model, batch = zoo.albert(n_layer=6, hidden=128, seq=128, batch=8)
    adam = lambda ps: torch.optim.Adam(ps)  # noqa: E731
    prof = remat.profile(model, batch, optimizer=adam, timed=False)
    layer = "albert.encoder.albert_layer_groups.0.albert_layers.0"
    calls = [c for c in prof.call_blocks if c.name == layer]
    assert [c.output_kept_by for c in calls] == [["*"]] * 6  # saved by the next call's ops: not this checkpoint's
    with pytest.raises(remat.InfeasibleBudget) as e:
        remat.plan(prof, 1)
    least = remat.plan(prof, e.value.min_bytes)
    assert [layer] in least.segments, least.segments
    assert least.peak_bytes < 0.4 * prof.peak_bytes  # 32%: all 6 calls freed (83% as one block, 2026-11-28)
    remat.apply(model, least)
    try:
        report = remat.verify(model, batch, least, optimizer=adam, time_rounds=0)
    finally:
        remat.remove(model)
    assert report.ok, str(report)  # gradients equal, extra FLOPs as predicted
    assert report.measured_recompute_flops == report.predicted_recompute_flops > 0
    assert report.independent_peak_bytes <= least.budget_bytes * 1.005, str(report)


def test_a_version_10_profile_plans_a_module_called_more_than_once_as_one_block():
    """Version 10 had no `call_blocks`: such a module is planned from all its calls at once (Rule 3), as before."""
    torch.manual_seed(0)
    prof = remat.profile(_Shared(), torch.randn(256, 64), mode="fake")
    data = json.loads(prof.to_json())
    data["version"] = 10
    del data["call_blocks"]
    for b in data["blocks"]:
        del b["call"]
    old = remat.StepProfile.from_json(json.dumps(data))
    assert old.call_blocks == [] and all(b.call == -1 for b in old.blocks)
    assert all(u.calls == 1 for u in Problem.from_profile(old).units)
    assert remat.StepProfile.from_json(prof.to_json()) == prof
