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

from remat._torch_compat import flop_counter
from remat._torch_compat.compiler import compiled_as_compiled
from remat._torch_compat.distributed import is_compiled, uncompiled
from remat.applier.apply import applied, apply, remove, taken_off
from remat.applier.wrapping import offloaded_bytes
from remat.errors import RematError
from remat.measure import profile
from remat.measure.loop import Loop, clear_grads, fresh_cast_cache, optimizer_step_of_loop
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
from remat.progress import resolve, say
from remat.verifier.cuda_cap import cuda_check
from remat.verifier.process import ProcessPeak, cuda_peak_bytes, forked_peak_bytes
from remat.verifier.replay import deterministic_kernels, max_diff, replayed
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
    keep_output: bool = True,
    time_rounds: int | None = None,
    target: str | None = None,
    progress=None,
) -> VerifyReport:
    """Run the step without and with `plan` from the same RNG state and compare.

    Example:
        >>> report = remat.verify(model, batch, plan)
        >>> report.ok, report.grad_max_abs_diff, report.independent_peak_bytes

    The model is left as it was (planned or not).  `tolerance` is the largest gradient difference accepted: 0.0
    (bit-exact, judged again with deterministic kernels on CPU), plus 10x the step's own noise on CUDA.  The planned
    step's peak is measured twice: by remat's tracker, and by a counter that is not remat's
    (NOTE [Measuring a step by the process]): on CPU the high-water mark of a forked copy of this process running
    the loop (`step`, `accumulate`, `keep_output` as in `remat.profile`), on CUDA `max_memory_allocated`.  Of a
    `torch.compile(model)` the tracker sees the eager model inside, that counter and the times the compiled step.
    On CUDA it also runs in a fresh process capped at the budget (`report.cuda`, NOTE [The budget is the GPU's memory]).

    The step's time is measured too: `time_rounds` rounds of one step of the loop without the plan and one
    with it, after a warm-up of each; the overhead is the median of the rounds' ratios, beside the plan's
    prediction `plan.extra_fraction` (None: TIME_ROUNDS, 5; 0: not timed).  `progress=True` writes each phase to
    stderr (or a callable `progress(phase, done)`, `remat.progress`).

    Known limitations: the process's counter is read on Linux only (elsewhere the report has the tracker's
    figure alone); the optimizer step is part of the peak but not of the gradients.
    """
    compiled, model = model, uncompiled(check_model(model))  # the tracker runs the model inside (see uncompiled)
    _check_plan(plan)
    loop = Loop.of(step, accumulate, keep_output)
    check_optimizer(optimizer, model)
    rounds, progress = TIME_ROUNDS if time_rounds is None else time_rounds, resolve(progress, "verify")
    with _unplanned(compiled, plan):  # applied through the wrapper: a `compiler_budget` plan sets the compiled call
        report = _compared(
            compiled, (inputs, loss_fn, optimizer), plan, loop, tolerance=tolerance, rounds=rounds, progress=progress
        )
        if any(p.is_cuda for p in model.parameters()):
            say(progress, "the planned step capped at the budget, in a fresh process")
        report = _with_cuda_check(report, compiled, (inputs, loss_fn, optimizer), plan, loop, target=target)
    return replace(report, compiled=is_compiled(compiled))


def _check_plan(plan) -> None:
    if not isinstance(plan, Plan):
        raise RematError(f"remat: verify expects a remat.Plan, saw {type(plan).__name__}. Fix: pass remat.plan(...).")


def _compared(
    compiled: nn.Module, step_args: tuple, plan: Plan, loop: Loop, *, tolerance: float, rounds: int, progress
) -> VerifyReport:
    """The report of the unplanned and planned steps (without the capped CUDA runs), the gradients' noise in it.
    Their gradients are let go on return: on a GPU they would count against a cap set in this process."""
    model, (inputs, loss_fn, optimizer) = uncompiled(compiled), step_args
    say(progress, "the step without the plan")
    base = _Measured.of(model, inputs, loss_fn, optimizer, loop)
    say(progress, "the step with the plan")
    planned, independent = _planned(compiled, model, step_args, plan, loop, progress)
    noise, replays = _run_to_run(model, inputs, loss_fn, (base.step, planned.step), tolerance, progress)
    if rounds:
        say(progress, f"timing {rounds} round{'s' if rounds > 1 else ''} of a step without and one with the plan")
    times = interleaved_times(compiled, step_args, plan, loop, rounds)
    report = _report(plan, tolerance, base, planned, independent, loop, times=times)
    report = replace(report, unplanned_reproducible=replays, grad_noise=noise)
    if replays and not report.grads_equal and not any(p.is_cuda for p in model.parameters()):
        say(progress, "both steps again, with torch's deterministic kernels")
        report = replace(report, grad_deterministic_diff=_deterministic_diff(compiled, model, inputs, loss_fn, plan))
    return report


def _planned(compiled: nn.Module, model: nn.Module, step_args: tuple, plan: Plan, loop: Loop, progress=None):
    """(the planned step tracked, (its peak by the process's counter, the counter's name)); the plan is applied to
    `compiled` meanwhile.  On CUDA the counter's figure comes later, from the capped run (`_with_cuda_check`)."""
    inputs, loss_fn, optimizer = step_args
    apply(compiled, plan)
    try:
        planned = _Measured.of(model, inputs, loss_fn, optimizer, loop)
        if any(p.is_cuda for p in model.parameters()):
            return planned, (None, "")
        say(progress, "the step with the plan, by the process's counter (a copy of the process)")
        return planned, independent_peak(compiled, inputs, loss_fn, optimizer, loop)
    finally:
        remove(compiled)


def _run_to_run(
    model: nn.Module, inputs: Any, loss_fn, steps: tuple["_StepResult", "_StepResult"], tolerance: float, progress
) -> tuple[float, bool]:
    """(the largest |difference| between the unplanned step's gradients and those of it run again from the same RNG
    state, whether that run replayed the first): NOTE [A step that does not replay itself] in `replay`.  Run on
    CUDA always; on CPU, whose kernels are deterministic, only where the planned step's gradients differ: (0.0,
    True) else."""
    base, planned = steps
    if not any(p.is_cuda for p in model.parameters()) and max_diff(base.grads, planned.grads) <= tolerance:
        return 0.0, True
    say(progress, "the step without the plan again, to see what differs from run to run")
    again = _run(model, inputs, loss_fn).grads
    return max_diff(base.grads, again), replayed(base.grads, again)


def _deterministic_diff(compiled: nn.Module, model: nn.Module, inputs: Any, loss_fn, plan: Plan) -> float | None:
    """The largest |difference| of the gradients with `plan` and without, both steps run with torch's deterministic
    kernels (NOTE [A step that does not replay itself], Rule 3); None where a step cannot run so (the gradients are
    then judged as first measured)."""
    with deterministic_kernels(), contextlib.suppress(RematError):
        base = _run(model, inputs, loss_fn).grads
        apply(compiled, plan)
        try:
            planned = _run(model, inputs, loss_fn).grads
        finally:
            remove(compiled)
        return max_diff(base, planned)
    return None


def _report(
    plan: Plan, tolerance: float, base: "_Measured", planned: "_Measured", independent, loop, *, times
) -> VerifyReport:
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


def interleaved_times(
    model: nn.Module, step_args: tuple, plan: Plan, loop: Loop, rounds: int
) -> tuple[float, float, float]:
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


# NOTE [The budget is the GPU's memory]
# A budget is the memory the user's GPU has, and what runs out there is the caching allocator's reserve, not the
# allocated peak.  On an H100 (2026-11-26) five plans remat made were run again with the process capped at their
# own budget (`torch.cuda.set_per_process_memory_fraction(budget / total_memory)`): each fitted by
# `max_memory_allocated`, and only one ran.  BERT's 65% plan, its allocated peak 17% under its budget, ran out of
# memory asking for a 1.86 GiB block with 12.06 of its 12.41 GiB in use: fragmentation.  And the allocator's history
# moves the peak: one plan measured 1,890 MiB in a fresh process and 2,049 MiB (+8%) after another model trained.
#
# Rule 1: on CUDA, `remat.verify` runs the planned step's loop (third step, steady) in a fresh process capped at
#         `plan.budget_bytes / total_memory` (at most 1), and the unplanned loop in a fresh process without a cap,
#         and reports `max_memory_allocated` and `max_memory_reserved` of the measured step (`report.cuda`).
#         The fresh process builds the model from its TARGET (`target=`, as `remat plan --verify` passes it, with
#         the command line's optimizer), else loads what `torch.save` wrote of it (its classes importable there):
#         `python -m remat.verifier.process TARGET|--saved F ... --device cuda --budget-bytes N [--alloc-conf S]`.
#         That run's Rule-6 peak (NOTE [Measuring a step by the process]) is `independent_peak_bytes`.
# Rule 2: where neither can be done (a compiled model, a class in __main__, a lambda), the step runs in this
#         process after `gc.collect()` and `torch.cuda.empty_cache()`, under the same cap plus what this process
#         holds besides the step (remat's copies: taken off the figures again), the fraction set back to 1.0 after;
#         the report says which ("fresh process" / "this process, after empty_cache").
# Rule 3: where the capped step ran out of memory (or reserved over the budget), it runs once more in a fresh
#         process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the user's settings kept): if that runs,
#         the budget holds with it, and the fix is to set it before torch is imported.  This process cannot rerun
#         it (torch read its allocator's settings when it started): there the fix says to try it.
# Rule 4: where neither allocator held, the planned step runs once more without a cap: its reserved peak minus the
#         budget is how much lower the budget must be (without that run, what the out-of-memory message says was
#         reserved plus the block asked for, minus the budget: a least figure).
# Rule 5: `report.ok` needs the capped step to have run to its end, with the default allocator or with expandable
#         segments (`report.cuda_verdict.allocator` says which); the arithmetic is `remat.types.capped.judge_cap`.
# Rule 6: a step that ran out because the GPU itself had less free than it asked for (other processes; the one
#         that called verify keeps its model and inputs there meanwhile) is the GPU's failure, not the budget's:
#         still not ok, and the report says so (`device_full`).  The saved model is written to a temporary file.

PROCESS_COUNTER = "process's high-water mark"
CUDA_COUNTER = "CUDA allocator's max_memory_allocated"
COMPILED_STEP = " (compiled)"


def independent_peak(model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop) -> tuple[int | None, str]:
    """The step's peak in the training loop by a counter that is not remat's tracker, and its name."""
    measured, counter = independent_step(model, inputs, loss_fn, optimizer, loop)
    return (measured.peak_bytes if measured else None), counter


def independent_step(
    model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop, timed_steps: int = 0
) -> tuple[ProcessPeak | None, str]:
    """`independent_peak` with the rest of what the counter saw: the resident bytes and the step's seconds, the
    fastest of the steps after the first, `timed_steps` more of them included."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    compiled = COMPILED_STEP if is_compiled(model) else ""
    if device.type == "cuda":
        opt = make_optimizer(optimizer, model)
        snapshot = StateSnapshot(model, opt, normalize_inputs(inputs).tensors())
        try:
            with compiled_as_compiled():  # however often this process compiled the model before
                return cuda_peak_bytes(model, inputs, loss_fn, opt, loop, timed_steps), CUDA_COUNTER + compiled
        finally:
            snapshot.restore()
    if device.type == "cpu" and os.path.exists("/proc/self/clear_refs") and hasattr(os, "fork"):
        return forked_peak_bytes(model, inputs, loss_fn, optimizer, loop, timed_steps), PROCESS_COUNTER + compiled
    return None, ""


def _with_cuda_check(
    report: VerifyReport, model: nn.Module, step_args: tuple, plan: Plan, loop: Loop, *, target: str | None
) -> VerifyReport:
    """On CUDA, `report` with the capped runs of NOTE [The budget is the GPU's memory] and their Rule-6 peak as the
    counter's; on CPU `report` as it is."""
    if not any(p.is_cuda for p in model.parameters()):
        return report
    check, peak = cuda_check(model, step_args, plan, loop, target)
    counter = f"{CUDA_COUNTER} ({check.where})" + (COMPILED_STEP if is_compiled(model) else "")
    return replace(
        report, cuda=check, independent_peak_bytes=peak, independent_counter=counter if peak is not None else ""
    )


PLANNED_FIX = (
    "The step runs without the plan, so the plan broke it: a forward that changes state outside its "
    "tensors (a cache, a counter) cannot be recomputed. Fix: remat.remove(model), and report the model to remat."
)


@contextlib.contextmanager
def _unplanned(model: nn.Module, plan: Plan) -> Iterator[None]:
    """The model without `plan` meanwhile (if it follows it), nor any `remat.checkpoint` mark; as it was afterwards."""
    before = applied(model)
    if before is not None and before is not plan:
        raise RematError(
            f"remat: {type(model).__name__} already follows another plan. Fix: remat.remove(model), then verify."
        )
    with taken_off(model):
        yield


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
        prof = profile(
            model,
            inputs,
            loss_fn=loss_fn,
            optimizer=optimizer,
            step=loop.step,
            accumulate=loop.accumulate,
            keep_output=loop.keep_output,
            timed=False,
        )  # the peak alone: the times are interleaved_times
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
        fresh_cast_cache()
        planned, fix = (" with the plan applied", PLANNED_FIX) if applied(model) is not None else ("", RUN_FIX)
        with flop_counter() as counter:  # torch's FlopCounterMode: GQA on torch < 2.12, no_grad module calls
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
