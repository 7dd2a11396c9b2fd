"""A checkpoint holds its inputs, also those autograd keeps for ops outside it (NOTE [The memory model of a plan],
Rule 2: `BlockProfile.kept_inputs`).  A ReLU saves its own output, and a Dropout after it reads that output without
saving it: the ReLU checkpointed frees it, and the Dropout checkpointed holds it on.  The planner took both savings
(found 2026-11-28 on a stack of Conv1d, BatchNorm1d, ReLU and Dropout: the least plan was predicted at 353.5 MiB
and measured 385.4 by the process, over its budget)."""

from __future__ import annotations

import torch
import torch.nn as nn

import remat
from remat import zoo
from test_random_trees import _compatible_sets, _stated_min, assert_predicted_to_the_byte
from remat.planner import ilp
from remat.planner.problem import Problem
from remat.types import Action


def _stack(blocks: int, width: int, hidden: int) -> nn.Sequential:
    layers = [nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(0.1)) for _ in range(blocks)]
    return nn.Sequential(*layers, nn.Linear(hidden, 8) if blocks == 1 else nn.Identity())


def test_every_plan_of_a_relu_then_dropout_is_predicted_to_the_byte_of_its_step():
    torch.manual_seed(0)
    model, x = _stack(1, 64, 256), torch.randn(512, 64)
    prof = remat.profile(model, x, mode="fake")
    problem = Problem.from_profile(prof)
    (dropout,) = [b for b in prof.blocks if b.name == "0.2"]
    assert [n for _, n, _ in dropout.kept_inputs] == [512 * 256 * 4]  # the ReLU's output, saved by the ReLU
    units = [u for u in problem.units if u.appliable and u.action != Action.OFFLOAD]
    sets = _compatible_sets(units)
    both = [s for s in sets if any(u.kept for u in s) and any(u.frees for u in s)]
    assert both, "no plan checkpoints the ReLU and the Dropout apart"
    assert_predicted_to_the_byte(model, x, prof, problem, sets)


def test_the_least_plan_of_relu_dropout_blocks_fits_its_budget_by_the_process():
    torch.manual_seed(0)
    model, x = _stack(4, 512, 512), torch.randn(4096, 512)
    adam = lambda ps: torch.optim.Adam(ps)  # noqa: E731
    prof = remat.profile(model, x, optimizer=adam)
    try:
        remat.plan(prof, 1)
    except remat.InfeasibleBudget as e:
        least = remat.plan(prof, e.min_bytes)
    remat.apply(model, least)
    report = remat.verify(model, x, least, optimizer=adam)
    assert report.ok, str(report)
    assert report.independent_peak_bytes <= least.budget_bytes * 1.005, str(report)


def test_dp_plans_a_chain_with_a_kept_input_at_the_cheapest_without_the_ilp(monkeypatch):
    """Report 001's chain ends in a Sigmoid, whose input the last ReLU keeps: that one hold sent the whole chain
    from dp to the ilp, 35 s and 184 s a plan at 50% and 70% on the chain of its benchmark (65 blocks; dp: 0.5 s;
    found 2026-11-28).  dp plans it in two passes, without the hold and with it (`remat.planner.chain`): at every budget
    a plan reaches, the cheapest plan, and the least peak of all."""
    model, x = zoo.chain_report001(width=32, blocks=3, batch=256)
    prof = remat.profile(model, x, mode="fake")
    problem = Problem.from_profile(prof)
    assert [u.blocks for u in problem.units if u.kept] == [("6",)]  # the Sigmoid, on its own
    sets = _compatible_sets([u for u in problem.units if problem.is_useful(u)])
    peaks = [problem.peak(s) for s in sets]
    solved = []
    monkeypatch.setattr(ilp, "solve", lambda *a, **k: solved.append(a) or [])
    monkeypatch.setattr(ilp, "min_peak", lambda *a, **k: solved.append(a) or 0)
    assert _stated_min(prof, "dp") == min(peaks)
    for budget in sorted({p for p in peaks if p < prof.peak_bytes}):
        chosen = remat.plan(prof, budget, solver="dp")
        assert chosen.peak_bytes <= budget
        cheapest = min(problem.cost(s) for s, p in zip(sets, peaks) if p <= budget)  # ns: the profile is timed
        assert abs(round(chosen.recompute_s * 1e9) - cheapest) <= len(chosen.segments) + len(chosen.selective)
    assert not solved, "the ilp was asked"
