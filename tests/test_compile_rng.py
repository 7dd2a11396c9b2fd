"""torch.compile's activation memory budget and random numbers (NOTE [The compiler's budget as a plan], Rule 5;
NOTE [Plans for a compiled step], Rule 9).

Below 1.0 torch's partitioner may recompute dropout in the backward graph, where it draws other numbers than the
forward did (pytorch/pytorch#190758): the gradients are not those of the loss the step computed, and nothing says so.
remat's plans that set that budget keep what each random op drew.
A gradient is checked against the loss itself (`benchmarks/compile_rng.py`'s `gradient_error`): its product with a
random direction against the loss's central finite difference along it, in float64 with the same random numbers in
every forward (the seed set before each).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F

import remat
import remat.compiled_plans as compiled_mod
from remat import zoo
import remat._torch_compat.compiler as compiler_mod
from remat._torch_compat.compiler import activation_memory_budget
from remat.verifier.process import ProcessPeak


def _benchmark(name: str):
    """A module of benchmarks/, imported with that folder on sys.path for the import only."""
    saved = list(sys.path)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


gradient_error = _benchmark("compile_rng").gradient_error  # the check benchmarks/compile_rng.py runs on GPT-2


class _Inner(nn.Module):
    """A residual MLP block with dropout between its two matmuls (the shape of Hugging Face's MLPs)."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.down(self.drop(F.gelu(self.up(self.norm(x)))))


def _loss_of(x: torch.Tensor):
    return lambda step: step(x).pow(2).mean()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(_Inner(), _Inner()).double(), torch.randn(64, 64, dtype=torch.float64)


def test_torchs_memory_budget_redraws_dropout_in_backward_and_remats_checkpoints_do_not():
    """The premise of Rule 5, on the installed torch: at budget 1.0 and with remat's checkpoints compiled the
    gradient is the loss's (1e-9 seen); at torch's own budget 0.1 it is 17% off (2026-12-06, torch 2.13 CPU).  If
    this fails at 0.1, torch fixed pytorch/pytorch#190758 for this case: remat's keeping is then no longer needed
    for that torch (keeping costs little: dropout's bool masks)."""
    torch._dynamo.reset()
    model, x = _model()
    assert gradient_error(model, torch.compile(model), _loss_of(x)) < 1e-6
    torch._dynamo.reset()
    model, x = _model()
    with activation_memory_budget(0.1):
        assert gradient_error(model, torch.compile(model), _loss_of(x)) > 1e-2
    torch._dynamo.reset()
    model, x = _model()
    compiled = torch.compile(model)
    plan = remat.plan(remat.profile(compiled, x), 1.0)  # keep-everything, then both blocks checkpointed
    remat.apply(compiled, dataclasses.replace(plan, segments=[["0"], ["1"]]))
    assert gradient_error(model, compiled, _loss_of(x)) < 1e-6


def _gradient_error_with(plan_of, monkeypatch) -> tuple[float, list[list[torch.dtype]]]:
    """The gradient's error of `_model()` compiled with the plan `plan_of(keep-everything plan)` applied by remat,
    and the dtypes of the nodes each joint graph kept for its random numbers."""
    kept: list[list[torch.dtype]] = []

    def spy(graph):
        nodes = real(graph)
        kept.append([n.meta["val"].dtype for n in nodes])
        return nodes

    real = compiler_mod.kept_random_nodes
    monkeypatch.setattr(compiler_mod, "kept_random_nodes", spy)
    monkeypatch.setattr(inductor_config, "force_disable_caches", True)  # a graph from the cache runs no pass
    torch._dynamo.reset()
    model, x = _model()
    compiled = torch.compile(model)
    remat.apply(compiled, plan_of(remat.plan(remat.profile(compiled, x), 1.0)))
    try:
        return gradient_error(model, compiled, _loss_of(x)), kept
    finally:
        remat.remove(compiled)


@pytest.mark.parametrize("segments", [[], [["0"]]], ids=["budget alone", "budget and a checkpoint"])
def test_remats_compiler_budget_keeps_dropouts_random_numbers(segments, monkeypatch):
    """Where torch's own budget 0.1 is 17% off (the test above), remat's plan of that budget gives the loss's
    gradient, alone and over remat's checkpoint of a block (with those left to the checkpoint: 120% off on a GPT-2,
    2026-12-06); what the step keeps is dropout's bool mask, one per dropout module, not the float drawn."""
    error, kept = _gradient_error_with(
        lambda keep: dataclasses.replace(keep, segments=segments, compiler_budget=0.1), monkeypatch
    )
    assert error < 1e-6, error
    assert kept == [[torch.bool, torch.bool]], kept


def test_a_pass_of_the_users_own_runs_before_remats(monkeypatch):
    """A joint-graph pass the user set in Inductor's config still runs under remat's budget, first, and is set
    again afterwards."""
    seen: list[int] = []

    def own(graph):
        seen.append(len(graph.nodes))

    monkeypatch.setattr(inductor_config, "joint_custom_pre_pass", own)
    error, kept = _gradient_error_with(lambda keep: dataclasses.replace(keep, compiler_budget=0.5), monkeypatch)
    assert error < 1e-6 and kept == [[torch.bool, torch.bool]], (error, kept)
    assert len(seen) == 1 and seen[0] > 10, seen
    assert inductor_config.joint_custom_pre_pass is own


def test_the_settings_around_a_compiled_call_are_the_users_again_after_it_even_when_it_raises(monkeypatch):
    """What a compiler-budget plan sets around each call of the compiled model (the budget, remat's pass) is put
    back to what the user had, also when the call raises (remat sets them itself since 2026-12-07, not through the
    config's `patch`)."""
    import torch._functorch.config as functorch_config

    from remat.applier.compiler_budget import compiling_under

    def own(graph):
        pass

    monkeypatch.setattr(inductor_config, "joint_custom_pre_pass", own)
    monkeypatch.setattr(functorch_config, "activation_memory_budget", 0.8)
    with pytest.raises(RuntimeError, match="the step failed"):
        with compiling_under(0.5):
            assert functorch_config.activation_memory_budget == 0.5
            assert inductor_config.joint_custom_pre_pass is not own
            raise RuntimeError("the step failed")
    assert functorch_config.activation_memory_budget == 0.8
    assert inductor_config.joint_custom_pre_pass is own


def test_auto_tries_the_compilers_budget_on_a_step_with_dropout(monkeypatch):
    """Rule 9 on stubbed measurements (each candidate 1 MiB under the budget): on a GPT-2 with dropout the search
    measures torch.compile's budget too (remat's keeps the random numbers); before 2026-12-06's keeping it measured
    remat's checkpoints only there."""
    seen: list[float] = []

    def measured(_model, plan, _step):
        seen.append(plan.compiler_budget)
        return ProcessPeak(budget - (1 << 20), 0, 1.0), "counter"

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=4, seq=32, batch=2, vocab=256)
    prof = remat.profile(model, x)
    assert any(b.has_dropout for b in prof.blocks)
    prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes, compiled_step_s=1.0)
    budget = int(prof.peak_bytes * 0.8)
    chosen = compiled_mod.plan_for(torch.compile(model), (x, None, None), prof, budget, trials=2)
    assert any(b < 1.0 for b in seen), seen
    assert not any("not tried" in n for n in chosen.notes), chosen.notes
