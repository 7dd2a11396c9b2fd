"""torch.compile's activation memory budget and random numbers (NOTE [The compiler's budget as a plan], Rule 5;
NOTE [Plans for a compiled step], Rule 9).

Below 1.0 torch's partitioner may recompute dropout in the backward graph, where it draws other numbers than the
forward did (pytorch/pytorch#190758): the gradients are not those of the loss the step computed, and nothing says so.
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
import torch.nn as nn
import torch.nn.functional as F

import remat
import remat.compiled_plans as compiled_mod
from remat import zoo
from remat._torch_compat.compiler import activation_memory_budget
from remat.applier.apply import applied
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
    gradient is the loss's (1e-9 seen); at budget 0.1 it is 17% off (2026-12-06, torch 2.13 CPU).  If this fails
    at 0.1, torch fixed pytorch/pytorch#190758 for this case: the rule can then be lifted for that torch."""
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


def test_a_compiler_budget_plan_is_refused_for_a_model_with_dropout_in_training():
    """`remat.apply` refuses torch.compile's budget where dropout runs; in eval mode (no random numbers) it applies."""
    model, x = _model()
    compiled = torch.compile(model)
    keep = remat.plan(remat.profile(compiled, x), 1.0)
    knob = dataclasses.replace(keep, compiler_budget=0.5)
    with pytest.raises(
        remat.RematError,
        match=r"^remat: the plan sets torch.compile's activation memory budget \(0\.5\), and Sequential runs "
        r"dropout in training \(0\.drop, 1\.drop\): below 1\.0 .* silently wrong \(pytorch/pytorch#190758\)\. "
        r"Expected a plan without torch.compile's budget for a model with dropout\. Fix: plan again with remat.auto",
    ):
        remat.apply(compiled, knob)
    assert applied(model) is None
    model.eval()
    remat.apply(compiled, knob)
    assert applied(model) is knob
    remat.remove(compiled)


def test_auto_tries_no_compiler_budget_on_a_step_with_dropout(monkeypatch):
    """Rule 9 on stubbed measurements (each candidate 1 MiB under the budget): on a GPT-2 with dropout the search
    measures remat's checkpoints only, and the plan's notes say why; its dropout set to 0, the compiler's budget is
    tried as before."""
    seen: list[float] = []

    def measured(_model, plan, _step):
        seen.append(plan.compiler_budget)
        return ProcessPeak(budget - (1 << 20), 0, 1.0), "counter"

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    for p in (0.1, 0.0):
        model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=4, seq=32, batch=2, vocab=256)
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
        prof = remat.profile(model, x)
        prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes, compiled_step_s=1.0)
        budget = int(prof.peak_bytes * 0.8)
        seen.clear()
        chosen = compiled_mod.plan_for(torch.compile(model), (x, None, None), prof, budget, trials=2)
        said = [n for n in chosen.notes if "activation memory budget was not tried" in n]
        if p:
            assert seen and all(b == 1.0 for b in seen), seen
            assert said == [
                "torch.compile's own activation memory budget was not tried: this step draws random numbers (in "
                "transformer.drop, transformer.h.0, transformer.h.1), which that budget can re-draw in backward, "
                "changing the gradients silently (pytorch/pytorch#190758; docs/compile.md)."
            ], chosen.notes
        else:
            assert any(b < 1.0 for b in seen) and not said, (seen, chosen.notes)
