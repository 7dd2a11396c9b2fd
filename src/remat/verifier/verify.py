"""`remat.verify`: proof that a plan changed nothing but memory and time."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from remat._torch_compat.distributed import is_compiled, uncompiled
from remat.applier.apply import applied, apply, remove
from remat.applier.wrapping import offloaded_bytes
from remat.errors import RematError
from remat.measure import profile
from remat.measure.loop import Loop, clear_grads, optimizer_step_of_loop
from remat.measure.step import (
    RUN_FIX,
    StateSnapshot,
    check_model,
    check_optimizer,
    compute_loss,
    make_optimizer,
    normalize_inputs,
    run_user_code,
)
from remat.verifier.process import ProcessPeak, cuda_peak_bytes, forked_peak_bytes
from remat.types import Plan, VerifyReport


TIME_ROUNDS = 5


def verify(
    model: nn.Module,
    inputs: Any,
    plan: Plan,
    loss_fn=None,
    optimizer=None,
    tolerance: float = 0.0,
    *,
    step: str = "steady",
    accumulate: int = 1,
    time_rounds: int | None = None,
) -> VerifyReport:
    """Run the step without and with `plan` from the same RNG state and compare.

    Example:
        >>> report = remat.verify(model, batch, plan)
        >>> report.ok, report.grad_max_abs_diff, report.independent_peak_bytes

    The model is left as it was (planned or not).  `tolerance` is the largest gradient difference accepted: 0.0
    (bit-exact) for deterministic CPU kernels, plus 10x the step's own noise on CUDA (`_grad_noise`).  The planned
    step's peak is measured twice: by remat's tracker, and by a counter that is not remat's (NOTE [Measuring a step by
    the process]): on CPU the high-water mark of a forked copy of this process running the training loop (`step`,
    `accumulate` as in `remat.profile`), on CUDA `torch.cuda.max_memory_allocated`.  Of a `torch.compile(model)`, the
    tracker sees the eager model inside; that counter and the times see the compiled step (usually keeping less).

    The step's time is measured too: `time_rounds` rounds of one step of the loop without the plan and one
    with it, after a warm-up of each; the overhead is the median of the rounds' ratios, beside the plan's
    prediction `plan.extra_fraction` (None: TIME_ROUNDS, 5; 0: not timed).

    Known limitations: the process's counter is read on Linux only (elsewhere the report has the tracker's
    figure alone); the optimizer step is part of the peak but not of the gradients.
    """
    compiled, model = model, uncompiled(check_model(model))  # the tracker runs the model inside (see uncompiled)
    if not isinstance(plan, Plan):
        raise RematError(f"remat: verify expects a remat.Plan, saw {type(plan).__name__}. Fix: pass remat.plan(...).")
    loop = Loop.of(step, accumulate)
    check_optimizer(optimizer, model)
    with _unplanned(compiled, plan):  # applied through the wrapper: a `compiler_budget` plan sets the compiled call
        base = _Measured.of(model, inputs, loss_fn, optimizer, loop)
        noise = _grad_noise(model, inputs, loss_fn, base.step.grads)
        apply(compiled, plan)
        try:
            planned = _Measured.of(model, inputs, loss_fn, optimizer, loop)
            independent, counter = independent_peak(compiled, inputs, loss_fn, optimizer, loop)
        finally:
            remove(compiled)
        rounds = TIME_ROUNDS if time_rounds is None else time_rounds
        times = interleaved_times(compiled, (inputs, loss_fn, optimizer), plan, loop, rounds)
    report = _report(plan, tolerance, base, planned, (independent, counter), loop, times=times)
    return replace(report, compiled=is_compiled(compiled), grad_noise=noise)


def _grad_noise(model: nn.Module, inputs: Any, loss_fn, grads: dict[str, torch.Tensor]) -> float:
    """On CUDA, the largest |difference| between `grads` and those of the unplanned step run again from the same
    RNG state: what non-deterministic kernels alone change (`VerifyReport.grad_noise`).  0.0 on CPU."""
    if not any(p.is_cuda for p in model.parameters()):
        return 0.0
    again = _run(model, inputs, loss_fn).grads
    return max(((again[n] - g).abs().max().item() for n, g in grads.items() if n in again and g.numel()), default=0.0)


def _report(plan: Plan, tolerance: float, base: "_Measured", planned: "_Measured", independent, loop, *, times) -> VerifyReport:
    """The comparison of the unplanned and planned steps; `independent` = (peak bytes or None, counter);
    `times` = `interleaved_times`."""
    grads = _pairs(base.step.grads, planned.step.grads)
    return VerifyReport(
        grad_max_abs_diff={n: (g1 - g0).abs().max().item() if g0.numel() else 0.0 for n, (g0, g1) in grads},
        tolerance=tolerance,
        buffers_equal=all(torch.equal(a, b) for a, b in zip(base.step.buffers, planned.step.buffers)),
        unplanned_peak_bytes=base.peak_bytes,
        measured_peak_bytes=planned.peak_bytes,
        predicted_peak_bytes=plan.peak_bytes,
        measured_recompute_flops=planned.step.flops - base.step.flops,
        predicted_recompute_flops=plan.recompute_flops,
        budget_bytes=plan.budget_bytes,
        measured_offload_bytes=planned.offload_bytes,
        predicted_offload_bytes=plan.offload_bytes,
        independent_peak_bytes=independent[0],
        independent_counter=independent[1],
        step=str(loop.step),
        unplanned_step_s=times[0],
        planned_step_s=times[1],
        measured_overhead=times[2],
        predicted_overhead=plan.extra_fraction,
    )


def interleaved_times(model: nn.Module, step_args: tuple, plan: Plan, loop: Loop, rounds: int) -> tuple[float, float, float]:
    """(seconds of a step without `plan`, with it, median of the rounds' ratios with/without - 1): `rounds`
    rounds of one step of each in turn, after a warm-up of each (../shared/MEASURING.md); the model is left
    without the plan, and its state (parameters, optimizer, RNG) as before."""
    if rounds <= 0:
        return 0.0, 0.0, 0.0
    inputs, loss_fn, optimizer = step_args
    step = normalize_inputs(inputs)
    opt = make_optimizer(optimizer, model)
    snapshot = StateSnapshot(model, opt, step.tensors())
    cuda = any(p.is_cuda for p in model.parameters())
    held: list = []

    def one(planned: bool) -> float:
        if planned:
            apply(model, plan)
        try:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            optimizer_step_of_loop(model, step, loss_fn, opt, loop, held)
            clear_grads(model, opt)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        finally:
            if planned:
                remove(model)

    try:
        one(False), one(True)  # warm-up
        pairs = [(one(False), one(True)) for _ in range(rounds)]
    finally:
        snapshot.restore()
    base, planned = [b for b, _ in pairs], [p for _, p in pairs]
    return statistics.median(base), statistics.median(planned), statistics.median(p / b - 1 for b, p in pairs)


PROCESS_COUNTER = "process's high-water mark"
CUDA_COUNTER = "CUDA allocator's max_memory_allocated"
COMPILED_STEP = " (compiled)"


def independent_peak(model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop) -> tuple[int | None, str]:
    """The step's peak in the training loop by a counter that is not remat's tracker, and its name."""
    measured, counter = independent_step(model, inputs, loss_fn, optimizer, loop)
    return (measured.peak_bytes if measured else None), counter


def independent_step(model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop,
                     timed_steps: int = 0) -> tuple[ProcessPeak | None, str]:
    """`independent_peak` with the rest of what the counter saw: the resident bytes and the step's seconds, the
    fastest of the steps after the first, `timed_steps` more of them included."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    compiled = COMPILED_STEP if is_compiled(model) else ""
    if device.type == "cuda":
        opt = make_optimizer(optimizer, model)
        snapshot = StateSnapshot(model, opt, normalize_inputs(inputs).tensors())
        try:
            return cuda_peak_bytes(model, inputs, loss_fn, opt, loop, timed_steps), CUDA_COUNTER + compiled
        finally:
            snapshot.restore()
    if device.type == "cpu" and os.path.exists("/proc/self/clear_refs") and hasattr(os, "fork"):
        return forked_peak_bytes(model, inputs, loss_fn, optimizer, loop, timed_steps), PROCESS_COUNTER + compiled
    return None, ""


PLANNED_FIX = (
    "The step runs without the plan, so the plan broke it: a forward that changes state outside its "
    "tensors (a cache, a counter) cannot be recomputed. Fix: remat.remove(model), and report the model to remat."
)


@contextlib.contextmanager
def _unplanned(model: nn.Module, plan: Plan) -> Iterator[None]:
    """The model without `plan` meanwhile (if it follows it), as it was afterwards."""
    before = applied(model)
    if before is not None and before is not plan:
        raise RematError(
            f"remat: {type(model).__name__} already follows another plan. Fix: remat.remove(model), then verify."
        )
    if before is not None:
        remove(model)
    try:
        yield
    finally:
        if before is not None:
            apply(model, plan)


@dataclass
class _StepResult:
    grads: dict[str, torch.Tensor]
    buffers: list[torch.Tensor]
    flops: int


@dataclass
class _Measured:
    """The step of the model as it is now: gradients, buffers and FLOPs, and the tracked peak."""

    step: _StepResult
    peak_bytes: int
    offload_bytes: int
    """Bytes offloaded modules copied to CPU memory in the gradient run."""

    @classmethod
    def of(cls, model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop) -> "_Measured":
        step = _run(model, inputs, loss_fn)
        moved = offloaded_bytes(model)
        prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer, step=loop.step, accumulate=loop.accumulate)
        return cls(step, prof.peak_bytes, moved)


@torch.compiler.set_stance("force_eager")  # under FlopCounterMode: see _torch_compat.distributed.uncompiled
def _run(model: nn.Module, inputs: Any, loss_fn) -> _StepResult:
    """Forward, loss, backward from a fixed RNG state; the model's state is restored after."""
    step = normalize_inputs(inputs)
    snapshot = StateSnapshot(model, None)
    for p in model.parameters():
        p.grad = None
    try:
        torch.manual_seed(0)
        planned, fix = (" with the plan applied", PLANNED_FIX) if applied(model) is not None else ("", RUN_FIX)
        with FlopCounterMode(display=False) as counter:
            out = run_user_code(f"the model's forward{planned}", lambda: model(*step.args, **step.kwargs), fix)
            loss = run_user_code(f"the loss{planned}", lambda: compute_loss(out, loss_fn), fix)
            run_user_code(f"backward{planned}", loss.backward, fix)
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
