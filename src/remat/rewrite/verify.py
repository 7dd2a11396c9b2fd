"""`remat.verify`: proof that a plan changed nothing but memory and time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from remat.errors import RematError
from remat.measure.step import StateSnapshot, check_model, compute_loss, normalize_inputs
from remat.planner.plan import Plan
from remat.rewrite.apply import applied, apply, remove
from remat.rewrite.wrapping import offloaded_bytes


@dataclass(frozen=True)
class VerifyReport:
    """The step with and without the plan, from the same RNG state."""

    grad_max_abs_diff: dict[str, float]
    """Per parameter: the largest |grad with plan - grad without|."""
    tolerance: float
    buffers_equal: bool
    """Buffers after the step (BatchNorm running statistics) equal with and without the plan."""
    unplanned_peak_bytes: int
    measured_peak_bytes: int
    """Peak of the planned step, measured by remat's tracker (real mode)."""
    predicted_peak_bytes: int
    measured_recompute_flops: int
    """FlopCounterMode total (forward + backward) with the plan, minus without."""
    predicted_recompute_flops: int
    budget_bytes: int | None = None
    measured_offload_bytes: int = 0
    """Bytes the offloaded modules copied to CPU memory in the planned step."""
    predicted_offload_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def grads_equal(self) -> bool:
        return all(d <= self.tolerance for d in self.grad_max_abs_diff.values())

    @property
    def peak_error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.measured_peak_bytes - self.predicted_peak_bytes) / self.predicted_peak_bytes

    @property
    def ok(self) -> bool:
        """Gradients and buffers equal, FLOPs as predicted, peak within 5% of the prediction."""
        return (
            self.grads_equal
            and self.buffers_equal
            and self.measured_recompute_flops == self.predicted_recompute_flops
            and abs(self.peak_error) <= 0.05
        )

    def __str__(self) -> str:
        from remat.report.plan_text import render_verify

        return render_verify(self)


def verify(
    model: nn.Module,
    inputs: Any,
    plan: Plan,
    loss_fn=None,
    optimizer=None,
    tolerance: float = 0.0,
) -> VerifyReport:
    """Run the step without and with `plan` from the same RNG state and compare.

    Example:
        >>> report = remat.verify(model, batch, plan)
        >>> report.ok, report.grad_max_abs_diff, report.measured_peak_bytes

    The model is left as it was (planned or not).  `tolerance` is the largest gradient
    difference accepted: 0.0 (bit-exact) for deterministic CPU kernels.

    Known limitations: peaks are measured by remat's tracker in real mode on the
    model's device; the optimizer step is part of the peak but not of the gradients.
    """
    from remat.measure import profile

    check_model(model)
    if not isinstance(plan, Plan):
        raise RematError(f"remat: verify expects a remat.Plan, saw {type(plan).__name__}. Fix: pass remat.plan(...).")
    before = applied(model)
    if before is not None and before is not plan:
        raise RematError(
            f"remat: {type(model).__name__} already follows another plan. Fix: remat.remove(model), then verify."
        )
    if before is not None:
        remove(model)
    try:
        base = _run(model, inputs, loss_fn)
        base_prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
        apply(model, plan)
        try:
            planned = _run(model, inputs, loss_fn)
            moved = offloaded_bytes(model)
            planned_prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
        finally:
            remove(model)
    finally:
        if before is not None:
            apply(model, plan)
    diffs = {n: (g1 - g0).abs().max().item() if g0.numel() else 0.0 for n, (g0, g1) in _pairs(base.grads, planned.grads)}
    return VerifyReport(
        grad_max_abs_diff=diffs,
        tolerance=tolerance,
        buffers_equal=all(torch.equal(a, b) for a, b in zip(base.buffers, planned.buffers)),
        unplanned_peak_bytes=base_prof.peak_bytes,
        measured_peak_bytes=planned_prof.peak_bytes,
        predicted_peak_bytes=plan.peak_bytes,
        measured_recompute_flops=planned.flops - base.flops,
        predicted_recompute_flops=plan.recompute_flops,
        budget_bytes=plan.budget_bytes,
        measured_offload_bytes=moved,
        predicted_offload_bytes=plan.offload_bytes,
    )


@dataclass
class _StepResult:
    grads: dict[str, torch.Tensor]
    buffers: list[torch.Tensor]
    flops: int


def _run(model: nn.Module, inputs: Any, loss_fn) -> _StepResult:
    """Forward, loss, backward from a fixed RNG state; the model's state is restored after."""
    step = normalize_inputs(inputs)
    snapshot = StateSnapshot(model, None)
    for p in model.parameters():
        p.grad = None
    try:
        torch.manual_seed(0)
        with FlopCounterMode(display=False) as counter:
            out = model(*step.args, **step.kwargs)
            compute_loss(out, loss_fn).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        buffers = [b.detach().clone() for b in model.buffers()]
        return _StepResult(grads, buffers, counter.get_total_flops())
    finally:
        snapshot.restore()


def _pairs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]):
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise RematError(
            f"remat: with the plan, these parameters got a gradient in one run and not the other: {missing[:5]}. "
            "This is a bug in remat or in the model's use of checkpointing; please report it."
        )
    return [(n, (a[n], b[n])) for n in sorted(a)]
