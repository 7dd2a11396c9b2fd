"""Runs of nn.ModuleList entries as one checkpoint (NOTE [A run of nn.ModuleList entries as one checkpoint]).

The model's own loop calls the entries; remat opens the checkpoint at the first and closes it at the
last.  Held to: gradients bit-equal to the unplanned step, extra FLOPs (FlopCounterMode) equal to the
plan's, the measured peak equal to the prediction, and a `remat:` error wherever the loop does what a
recomputation cannot repeat.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import architectures
import remat
from remat import zoo
from remat.planner.problem import MAX_SEGMENT, Problem


def _step(model, inputs) -> tuple[int, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks
    with FlopCounterMode(display=False) as fc:
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        (out.loss if hasattr(out, "loss") else out.sum()).backward()
    return fc.get_total_flops(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5"])
def test_chen_over_a_module_list_gives_the_same_gradients_and_the_planned_flops(name):
    model, inputs = architectures.ALL[name]()
    prof = remat.profile(model, inputs)
    plan = remat.plan(prof, prof.peak_bytes - 1, solver="chen")
    assert any(len(seg) > 1 for seg in plan.segments)
    report = remat.verify(model, inputs, plan)
    assert report.ok, str(report)  # gradients bit-equal, FLOPs as planned, peak as predicted
    assert report.measured_peak_bytes <= plan.peak_bytes * 1.01


def test_the_least_plan_of_a_gpt2_is_below_every_hand_recipe():
    """The hand recipe that beat the stated least (Chen's two-layer segments, 326.9 vs 330.9 MiB on the demo
    GPT-2 with Adam; here, smaller, 86.5 vs 87.0 MiB) is now one remat can build, so the least is at or below
    it (86.3 MiB, with the four layers in one checkpoint); measured, too."""
    model, inputs = zoo.gpt2(n_layer=4, n_embd=128, n_head=4, seq=128, batch=4, vocab=8192)
    prof = remat.profile(model, inputs, optimizer=lambda ps: torch.optim.Adam(ps))
    least = remat.frontier(prof)[-1]
    recipes = remat.planner.baseline_plans(prof)
    assert all(least.peak_bytes <= p.peak_bytes for p in recipes.values())
    assert any(len(seg) > 1 for seg in least.segments)
    report = remat.verify(model, inputs, least, optimizer=lambda ps: torch.optim.Adam(ps))
    assert report.ok, str(report)


def test_eval_and_no_grad_run_the_layers_as_they_are_and_remove_restores_them():
    model, inputs = architectures.gpt2()
    model.config.use_cache = False
    flops, grads = _step(model, inputs)

    def forward_flops() -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            model(**inputs)
        return fc.get_total_flops()

    plain_train = forward_flops()
    model.eval()
    plain_eval = forward_flops()
    remat.apply(model, "chen")
    assert forward_flops() == plain_eval  # eval: the layers run as they are
    model.train()
    assert forward_flops() == plain_train  # no grad: the same
    remat.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert _step(model, inputs)[0] == flops


class Loop(nn.Module):
    """Four layers in an nn.ModuleList; `between` is what the loop does between two of them."""

    def __init__(self, between: str = ""):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(4))
        self.between = between
        self.scale = nn.Parameter(torch.ones(32))

    def forward(self, x):
        order = [0, 2, 1, 3] if self.between == "out of turn" else [0, 1, 2, 3]
        for i in order:
            x = self.layers[i](x)
            if self.between == "saves":
                x = x * self.scale  # saves x for the gradient of `scale`
            elif self.between == "makes":
                x = x + 1.0  # a new tensor that needs a gradient, saving nothing
        return x


@pytest.mark.parametrize(
    "between, message",
    [
        ("saves", r"^remat: code between layers.0 and layers.1 saves a tensor for backward"),
        ("makes", r"^remat: layers.1 takes a tensor that needs a gradient and is neither an input of layers.0"),
        (
            "out of turn",
            r"^remat: layers.2 ran while the checkpoint around layers.0 .. layers.1 expected layers.1 next",
        ),
    ],
)
def test_what_a_recomputation_cannot_repeat_is_a_remat_error(between, message):
    model = Loop(between)
    remat.apply(model, "chen")  # segments layers.0..1 and layers.2..3
    with pytest.raises(remat.RematError, match=message):
        model(torch.randn(8, 32, requires_grad=True)).sum().backward()
    remat.remove(model)
    model(torch.randn(8, 32)).sum().backward()  # nothing left open: the step runs again without the plan


class Rung(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Ladder(nn.Module):
    """Eight small layers in an nn.ModuleList (runs of them beat single checkpoints), with `between` after
    the fourth."""

    def __init__(self, between: str = ""):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Rung() for _ in range(8))
        self.between = between
        self.scale = nn.Parameter(torch.ones(256))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == 3:
                x = x * self.scale if self.between == "saves" else x + 1.0 if self.between == "makes" else x
        return x


@pytest.mark.parametrize("between", ["saves", "makes"])
def test_plans_do_not_run_one_checkpoint_across_loop_code_the_profile_saw(between):
    """The loop code of the error cases above is in the profile: no unit the planner could choose runs one
    checkpoint across it (before, every run over layers.3 and layers.4 could be chosen, and raised)."""
    x = torch.randn(512, 256, requires_grad=True)
    prof = remat.profile(Ladder(between), x)
    assert [b.grad_ops_before for b in prof.blocks if b.depth == 0] == [0, 0, 0, 0, 1, 0, 0, 0]
    assert [b.grad_ops_before for b in remat.profile(Ladder(), x).blocks if b.depth == 0] == [0] * 8
    problem = Problem.from_profile(prof, MAX_SEGMENT, None)
    across = [u for u in problem.units if {"layers.3", "layers.4"} <= set(u.blocks)]
    within = [u for u in problem.units if len(u.blocks) > 1 and u not in across]
    assert across and not any(u.appliable for u in across) and all(u.appliable for u in within)
    assert any(len(seg) > 1 for seg in remat.frontier(prof)[-1].segments)  # runs on either side of it
    report = remat.verify(Ladder(between), x, remat.frontier(prof)[-1])
    assert report.ok, str(report)


def test_a_plain_loop_trains_with_runs_and_the_same_gradients():
    model = Loop()
    x = torch.randn(8, 32)
    flops, grads = _step(model, x)
    remat.apply(model, "chen")
    flops_planned, grads_planned = _step(model, x)
    assert all(torch.equal(grads[n], grads_planned[n]) for n in grads)
    forward_layers = 4 * 2 * 8 * (32 * 128 * 2)  # 2 matmuls per layer, multiply-add = 2 FLOPs
    assert flops_planned - flops == forward_layers - forward_layers // 4  # the last layer's output is not recomputed


def test_a_run_keeps_its_checkpoint_while_explain_turns_the_models_own_off():
    """explain profiles remat's plan with the model's own checkpoints off (its interceptor stands in for
    torch's checkpoint generator); a run must still open torch's, or nothing is checkpointed (seen: 201 MiB
    measured for 111 MiB predicted on report 000)."""
    from remat import applier
    from remat.explainer import examples
    from remat.explainer.api import _Step

    model, x = examples.report000()
    step = _Step(model, x, None, None, "real", None)
    plain = step.run(lambda i: False)[0]
    plan = remat.plan(plain, plain.peak_bytes - 1, solver="chen")
    assert any(len(seg) > 1 for seg in plan.segments)
    applier.apply(model, plan)
    try:
        seen = step.run(lambda i: False, as_written=False)[0]
    finally:
        applier.remove(model)
    assert abs(seen.peak_bytes - plan.peak_bytes) <= 0.005 * plan.peak_bytes, (seen.peak_bytes, plan.peak_bytes)


def test_a_run_is_predicted_at_its_recomputation_where_its_peak_is(monkeypatch):
    """The planned peak of a run over layers 0-1 is its recomputation's last op (the second layer's norm, whose
    output nothing saves), after the previous backward node released what the timeline counts before it:
    measured 70,494,740 bytes where the model that gave a run's bytes back at its first backward op said
    69,562,388 (-1.3%).  Held to the tracker's figure to the byte and to the process's within 0.3%.  The kernel
    scratch is measured here, not taken from an earlier test's measurement of the same ops (NOTE [Kernel scratch],
    Rule 5): in a full run in random order (2026-11-29) the plan read 1,164,288 bytes above its figure in a fresh
    process, and 1,065,480 (+1.5%) above this process's counter, the tracker agreeing with the plan: scratch, the
    one measured part, most likely from an earlier test's measurement of the same kernels."""
    from remat.planner.result import make_plan
    from remat.measure import scratch

    monkeypatch.setattr(scratch, "MEASURED", {})
    model, x = architectures.encoder()
    prof = remat.profile(model, x)
    problem = Problem.from_profile(prof)
    for layers in [("layers.0", "layers.1"), ("layers.1", "layers.2", "layers.3"), ("layers.0",)]:
        plan = make_plan(prof, problem, [problem.unit(*layers)], "ilp", None)
        report = remat.verify(model, x, plan, time_rounds=0)
        assert report.ok, str(report)
        assert report.measured_peak_bytes == plan.peak_bytes, (layers, report.measured_peak_bytes, plan.peak_bytes)
        independent = report.independent_peak_bytes or report.measured_peak_bytes
        assert abs(independent - plan.peak_bytes) <= 0.003 * independent, (layers, independent, plan.peak_bytes)


def test_a_run_whose_last_output_the_next_block_also_saves_is_predicted_to_the_byte():
    """Report 001's chain: each ReLU's output is saved by the ReLU and by the next Linear.  Once that Linear's
    backward is over, a checkpoint over Linear, ReLU, Linear, ReLU has dropped its own copy, so the output is
    gone before the recomputation: counted, the moment was one ReLU output (131,072 bytes) too high and the plan's
    peak came out 3,318,280 bytes where the tracker measured 3,285,000."""
    from remat.planner.result import make_plan

    model, x = zoo.chain_report001(64, 32, 512)
    prof = remat.profile(model, x)
    problem = Problem.from_profile(prof)
    units = [problem.unit(*(str(k) for k in range(s, s + 4))) for s in range(0, 60, 4)]
    plan = make_plan(prof, problem, units, "ilp", None)
    report = remat.verify(model, x, plan, time_rounds=0)
    assert report.ok and report.measured_peak_bytes == plan.peak_bytes, (report.measured_peak_bytes, plan.peak_bytes)
