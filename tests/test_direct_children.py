"""Models whose forward calls an nn.Sequential's children itself (issue 37): `x = layer[2](layer[1](layer[0](x)))`,
`for m in self.seq: x = m(x)`, `self.seq[i](x)`.  The Sequential's own forward never runs, so nothing may rest
on it chaining its children (NOTE [How a module is checkpointed in place], Rule 4): remat plans such a
Sequential as one checkpoint over its children, built as a run of entries the model's code calls (NOTE [A run
of nn.ModuleList entries as one checkpoint]), and the plan applies to the model it was made for.

Held to: `remat.verify` ok (gradients bit-equal on CPU, extra FLOPs by FlopCounterMode equal to the plan's, the
peak within the budget by the process's counter); the hand recipes' rows report what applying them does; and
`remat.explain` on such a model with its own checkpoints, and on a model remat already planned.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import remat
from remat.cli import main
from remat.module_tree import CALLED_DIRECTLY
from remat.planner import baseline_plans
from remat.types import BY_HAND, PLAN_FAILED

D, BATCH, LAYERS = 32, 512, 6


def _mlp(d: int = D) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class Nested(nn.Module):
    """An nn.ModuleList of nn.Sequential MLPs whose children the loop calls: the issue's pattern."""

    def __init__(self, layers: int = LAYERS):
        super().__init__()
        self.layers = nn.ModuleList(_mlp() for _ in range(layers))
        self.head = nn.Linear(D, D)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer[2](layer[1](layer[0](x)))
        return self.head(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = _mlp()

    def forward(self, x, scale=None):
        return x + self.mlp(x if scale is None else x * scale)


class Loop(nn.Module):
    """`for m in self.seq: x = m(x, scale=...)`: the Sequential's children called in turn by the model's loop,
    with a tensor that needs no gradient beside the activations (the Sequential's forward could not pass it)."""

    def __init__(self, layers: int = LAYERS):
        super().__init__()
        self.seq = nn.Sequential(*[Block() for _ in range(layers)])

    def forward(self, x):
        scale = torch.full((D,), 0.5)
        for m in self.seq:
            x = m(x, scale=scale)
        return x


class Indexed(Loop):
    """`self.seq[i](x, scale)`."""

    def forward(self, x):
        scale = torch.full((D,), 0.5)
        for i in range(len(self.seq)):
            x = self.seq[i](x, scale)
        return x


def _make(cls):
    torch.manual_seed(0)
    return cls(), torch.randn(BATCH, D)


@pytest.fixture(scope="module", params=[Nested, Loop, Indexed], ids=lambda c: c.__name__)
def planned(request):
    model, x = _make(request.param)
    prof = remat.profile(model, x)
    return model, x, prof, remat.plan(prof, 0.6)


def test_the_profile_sees_the_sequential_never_ran(planned):
    model, _, prof, plan = planned
    kinds = {b.container for b in prof.blocks if b.name.count(".") == (2 if isinstance(model, Nested) else 1)}
    assert kinds == {CALLED_DIRECTLY}
    if isinstance(model, Nested):  # each nn.Sequential MLP is a block: its children ran in turn
        assert [b.name for b in prof.blocks if b.name.count(".") == 1] == [f"layers.{i}" for i in range(LAYERS)]
        assert plan.called_directly == [f"layers.{i}" for i in range(LAYERS)]
    else:
        assert plan.called_directly == ["seq"]


def test_a_plan_at_60_percent_applies_and_verifies(planned):
    model, x, prof, plan = planned
    assert plan.segments and plan.peak_bytes <= 0.6 * prof.peak_bytes
    report = remat.verify(model, x, plan)
    assert report.ok, str(report)  # gradients bit-equal, FLOPs as predicted, the peak within the budget
    assert report.grads_equal and report.measured_recompute_flops == plan.recompute_flops
    assert report.fits_budget and report.independent_peak_bytes is not None
    assert remat.applier.applied(model) is None  # verify leaves the model as it was


def test_runs_of_the_children_the_loop_calls_give_the_same_gradients(planned):
    """Chen's segments of several children: one checkpoint each, whose recomputation calls them as the loop did
    (with `scale`, which a chain of the Sequential's children would not pass).  Nested's residual add between
    two layers joins the graph, so no run spans two of them there: every layer is one run of its children."""
    model, x, prof, _ = planned
    if isinstance(model, Nested):
        plan = baseline_plans(prof)["every-block"]
        assert plan.segments == [[f"layers.{i}"] for i in range(LAYERS)]
        with pytest.raises(remat.RematError, match="solver 'chen'"):
            remat.plan(prof, prof.peak_bytes - 1, solver="chen")
    else:
        plan = remat.plan(prof, prof.peak_bytes - 1, solver="chen")
        assert any(len(seg) > 1 for seg in plan.segments)
    report = remat.verify(model, x, plan)
    assert report.ok, str(report)


def _extra_flops(model, x, plan) -> int:
    """The forward FLOPs `plan` adds to one step of `model`, counted by torch's FlopCounterMode."""

    def step() -> int:
        model.zero_grad(set_to_none=True)
        with FlopCounterMode(display=False) as fc:
            model(x).sum().backward()
        return fc.get_total_flops()

    before = step()
    remat.apply(model, plan)
    try:
        return step() - before
    finally:
        remat.remove(model)


def test_the_hand_recipes_report_what_applying_them_does(planned):
    model, x, prof, _ = planned
    recipes = baseline_plans(prof)
    assert {"every-block", "chen"} <= set(recipes)
    every = recipes["every-block"]
    assert every.recompute_flops > 0 and every.peak_bytes < prof.peak_bytes  # not "0 GFLOP at the unplanned peak"
    assert len(every.segments) == LAYERS
    for name, p in recipes.items():
        if BY_HAND in p.notes or not p.segments:
            continue
        assert _extra_flops(model, x, p) == p.recompute_flops, name


def test_a_sequential_whose_children_run_out_of_turn_is_not_one_checkpoint():
    """`layer[1]` before `layer[0]`: the nn.Sequential is no chain; its children are checkpointed one by one."""

    class Swapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Sequential(Block(), Block()) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer[0](layer[1](x))
            return x

    model, x = _make(Swapped)
    prof = remat.profile(model, x)
    assert not any(b.name.count(".") == 1 for b in prof.blocks)  # layers.N never ran, nor ran as a chain
    plan = remat.plan(prof, 0.7)
    assert all(len(seg) == 1 for seg in plan.segments if seg[0].count(".") == 2)  # (runs inside a Block's mlp are)
    report = remat.verify(model, x, plan)
    assert report.ok, str(report)


MODEL_FILE = textwrap.dedent(
    """
    import torch
    import torch.nn as nn


    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)) for _ in range(6)
            )
            self.head = nn.Linear(128, 128)

        def forward(self, x):
            for layer in self.layers:
                x = x + layer[2](layer[1](layer[0](x)))
            return self.head(x)


    def make():
        torch.manual_seed(0)
        return Nested(), torch.randn(4096, 128)  # a step of ~120 MiB: the process's counter judges it
    """
)


def test_cli_plans_and_verifies_at_60_percent(capsys, tmp_path):
    """The issue's command: the plan applies, and verify is ok, the peak within the budget by the process's
    high-water mark too (a step large enough for it to judge)."""
    path = tmp_path / "direct_children.py"
    path.write_text(MODEL_FILE)
    code = main(["plan", f"{path}:make", "--budget", "60%", "--verify"])
    out, err = capsys.readouterr()
    assert code == 0, out + err  # verify's verdict: exit 1 if not ok
    assert "different model" not in out + err
    every = next(line for line in out.splitlines() if line.strip().startswith("every-block"))
    assert " 0.00 " not in every  # the recipe recomputes something, as applying it does
    process = next(line for line in out.splitlines() if "process's high-water mark" in line)
    assert process.rstrip().endswith("ok"), process
    assert next(line for line in out.splitlines() if line.strip().startswith("budget")).rstrip().endswith("ok")


# -- remat.explain ------------------------------------------------------------------------------------------


class HandCheckpointed(nn.Module):
    """16 Linears checkpointed one by one by the model's own code, each followed by a GELU, in nn.Sequential
    pairs whose children the loop calls: 16 useless checkpoints, and a plan remat can build instead."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.GELU()) for _ in range(16))

    def forward(self, x):
        for layer in self.layers:
            x = layer[1](checkpoint(layer[0], x, use_reentrant=False))
        return x


def test_explain_on_hand_checkpointed_linears_shows_what_remat_would_do_instead():
    model, x = _make(HandCheckpointed)
    expl = remat.explain(model, x)
    assert len(expl.checkpoints) == 16 and "checkpoint-too-small" in expl.codes()
    assert not any(n.startswith(PLAN_FAILED) for n in expl.plan.notes), expl.plan.notes
    assert expl.plan.segments and expl.plan.peak_bytes < expl.profile.peak_bytes
    assert any(n.startswith("seen run") for n in expl.plan.notes)
    text = str(expl)
    assert "What remat would do instead (predicted" in text and "different model" not in text


def test_explain_on_a_model_remat_planned_says_so():
    model, x = _make(Nested)
    plan = remat.plan(remat.profile(model, x), 0.6)
    remat.apply(model, plan)
    expl = remat.explain(model, x)
    assert remat.applier.applied(model) is plan  # explain leaves the plan on
    [f] = [f for f in expl if f.code == "remat-plan"]
    modules = {n for seg in plan.segments for n in seg}
    assert f.figures["checkpoints"] == len(plan.segments) and f.figures["modules"] == len(modules)
    text = str(expl)
    assert "no torch.utils.checkpoint call;" not in text
    assert "remat's own plan" in text and "remat.remove(model)" in text
    assert "The model does no activation checkpointing" not in text
