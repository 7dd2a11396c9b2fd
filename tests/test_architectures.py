"""Every kind of model plans, applies, verifies and trains (issue 13): encoder, decoder with tied
embeddings and its default cache, Llama-like decoder, encoder-decoder, mixture of experts, vision
CNN with BatchNorm, ViT, and blocks kept in an nn.ModuleDict, all built from configs.

At the least peak any plan reaches and half way to the unplanned peak: gradients bit-equal, extra
FLOPs (FlopCounterMode) equal to the plan's, and the planned step's peak (remat's tracker, real mode)
within the budget + 1%.  Seen 2026-11-23: T5 +0.86% / +1.32% over its prediction (its position bias, a
keyword input, was not counted as held: equal since 2026-11-24), every other model within 0.06%.  The process's own measure of these steps is issue 12's.
"""

from __future__ import annotations

import pytest
import torch

import remat
from architectures import ALL, HAND, least_plan

OVER_BUDGET = 0.01


@pytest.mark.parametrize("name", sorted(ALL))
def test_plans_at_two_budgets_apply_verify_and_train(name):
    model, inputs = ALL[name]()
    prof = remat.profile(model, inputs)
    least = least_plan(prof).peak_bytes
    assert least < prof.peak_bytes
    for budget in (least, (least + prof.peak_bytes) // 2):
        plan = remat.plan(prof, budget)
        report = remat.verify(model, inputs, plan)
        assert report.ok, str(report)
        assert report.measured_peak_bytes <= (1 + OVER_BUDGET) * budget, str(report)
    remat.apply(model, plan)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(2):
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        (out.loss if hasattr(out, "loss") else out.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    remat.remove(model)


@pytest.mark.parametrize("name", sorted(HAND))
def test_no_hand_recipe_goes_below_the_stated_least(name):
    """Checkpointing every layer by hand, with or without an embedder, stem, final norm or head beside
    them: the step's measured peak (remat's tracker) never beats the least-memory plan, measured too."""
    model, inputs = HAND[name]()
    prof = remat.profile(model, inputs)
    least = least_plan(prof)
    planned = remat.verify(model, inputs, least)
    assert planned.ok, str(planned)
    extras = [b.name for b in prof.blocks if b.extra]
    assert extras, "every model here has an embedder or a head beside its layers"
    modules = dict(model.named_modules())
    hand = {}
    for added in [[], *([e] for e in extras), extras]:
        remat.apply(model, "every-block")
        for e in added:
            remat.checkpoint(modules[e])
        hand[" + ".join(["every-block", *added])] = remat.profile(model, inputs).peak_bytes
        remat.remove(model)
    best = min(hand, key=hand.get)
    assert planned.measured_peak_bytes <= hand[best], (best, hand[best], planned.measured_peak_bytes)
    assert least.peak_bytes <= hand[best] * (1 + OVER_BUDGET)


def test_a_hidden_state_the_model_returns_is_not_counted_as_freed():
    """With `output_hidden_states=True` GPT-2 returns every layer's output: a checkpoint over the layers
    frees none of them, and its recomputation makes second copies.  Before, one checkpoint over the three
    layers measured 2.776 MB for 2.743 MB predicted (two hidden states of 16 KiB)."""
    from remat.planner.problem import MAX_SEGMENT, Problem
    from remat.planner.result import make_plan

    model, inputs = ALL["gpt2"]()
    model.config.output_hidden_states = True
    prof = remat.profile(model, inputs)
    held = [b.name for b in prof.blocks if b.output_free_op > b.backward_end_op + 1 and b.output_saved_bytes]
    assert "transformer.h.0" in held
    problem = Problem.from_profile(prof, MAX_SEGMENT, None)
    layers = [b.name for b in prof.blocks if b.name.startswith("transformer.h.")]
    for plan in (make_plan(prof, problem, [problem.unit(*layers)], "ilp", None), least_plan(prof)):
        report = remat.verify(model, inputs, plan)
        assert report.ok, str(report)
        assert abs(report.measured_peak_bytes - plan.peak_bytes) <= 0.001 * plan.peak_bytes, str(report)
