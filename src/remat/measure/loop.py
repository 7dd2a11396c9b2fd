"""The training loop around the measured step: which step is measured, and what runs before it.

NOTE [The step that is measured]
  Rule 1. By default the measured step is the *steady state*: the step as a training loop
          runs it from the second step on.  One whole step runs first (the micro-batches,
          the optimizer step, then `zero_grad(set_to_none=True)`), so the optimizer's state
          (Adam's exp_avg and exp_avg_sq) is resident through the measured forward and
          backward, and library state created lazily on first use already exists.
  Rule 2. With `accumulate=K`, a step is K forward/backward passes on the given inputs (one
          micro-batch each) and one optimizer step.  The first K-1 passes of the measured
          step run before the tracker starts; the tracked pass is the last, which holds the
          most: its gradients exist from its start and its backward adds into them.
  Rule 3. `step="first"` measures the first step of the optimizer as given.  In steady mode
          the first step is metered too (its peak of live tensor bytes only, `PeakMeter`),
          and the profile says when it is the larger of the two.
  Rule 4. The previous pass's output and loss are still held while the next forward runs, as
          in the loop of PyTorch's tutorials (`out = model(x); loss = loss_fn(out); ...`): the
          name is rebound only when the new forward returns.  They are live from the start of
          the measured forward to its end (`LeadIn.held`), and through the optimizer step.
  Rule 5. What runs here changes the model, its gradients, the optimizer and the RNG: a real
          step works under `StateSnapshot` (restored after), a fake one on fake copies.
  Rule 6. `keep_output=True` (the default) is the loop that keeps the model's output object until after
          backward (`out = model(**b); out.loss.backward()`): every tensor of the output (a Hugging Face
          model's logits) is live through backward.  `keep_output=False` is the loop that keeps only the loss
          (Hugging Face's Trainer: its `compute_loss` returns the loss and drops the output): the output is let
          go when the loss is computed, before backward, and only the loss is held into the next pass (Rule 4).
          On an H100 the two differ by BERT-base's logits: 18,732 against 16,823 MiB (batch 32 x 512,
          2026-11-26, ../shared/gpu-facts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from remat.errors import RematError
from remat.measure.step import StepInputs, compute_loss, run_user_code
from remat.measure.peak_meter import PeakMeter
from remat.measure.tracker import rounded_bytes, storage_of
from remat.types import Step

FIRST_STEP_NOTE = (
    "This is the first step of the optimizer: from the second step on its state is resident through "
    "forward and backward (profile with the default step='steady' for the step a training loop repeats). "
    "A process's first step also creates library state lazily (seen: 8-11 MiB on CPU) that no tensor tracker sees."
)


@dataclass(frozen=True)
class Loop:
    """Which step of the training loop is measured (Rules 1 and 3), and its micro-batches (Rule 2)."""

    step: Step = Step.STEADY
    accumulate: int = 1
    keep_output: bool = True
    """Rule 6: the output is held through backward (True) or only the loss is (False)."""

    @classmethod
    def of(cls, step: str, accumulate: int, keep_output: bool = True) -> "Loop":
        if step not in tuple(Step):
            raise RematError(
                f"remat: step must be 'steady' (the step a training loop repeats) or 'first'; saw {step!r}. "
                "Fix: pass step='steady' or step='first'."
            )
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise RematError(
                f"remat: accumulate must be a whole number of micro-batches per optimizer step, 1 or more; "
                f"saw {accumulate!r}. Fix: pass accumulate=1 (no gradient accumulation) or the K of your loop."
            )
        if not isinstance(keep_output, bool):
            raise RematError(
                f"remat: keep_output must be True (your loop keeps the model's output until after backward) or "
                f"False (it keeps only the loss, as Hugging Face's Trainer does); saw {keep_output!r}. "
                "Fix: pass keep_output=True or keep_output=False."
            )
        return cls(Step(step), accumulate, keep_output)


def micro_batch(
    model: nn.Module,
    step: StepInputs,
    loss_fn: Callable | None,
    held: list,
    mark: Callable[[], None] | None = None,
    keep_output: bool = True,
) -> None:
    """One untracked forward, loss and backward, as the user's loop runs it: `held` has the previous
    pass's output and loss until the forward returns, and this pass's after (Rule 4); without `keep_output`
    the output is let go before backward and only the loss is held (Rule 6).  `mark()`, if given, is called
    after the loss and after backward (where a timer splits the pass)."""
    fresh_cast_cache()
    out = run_user_code("the model's forward", lambda: model(*step.args, **step.kwargs))
    held.clear()
    loss = run_user_code("the loss", lambda: compute_loss(out, loss_fn))
    if not keep_output:
        out = None
    if mark is not None:
        mark()
    run_user_code("backward", loss.backward)
    if mark is not None:
        mark()
    held += [out, loss] if keep_output else [loss]


def fresh_cast_cache() -> None:
    """Start a pass with autocast's cache of casts empty, as a loop that enters `torch.autocast` for each pass has it:
    in a step run inside one region (`remat.profile` called within `with torch.autocast(...)`), the pass before
    would have left its casts there (NOTE [A weight autocast casts] in `remat.measure.tracker`)."""
    torch.clear_autocast_cache()


def optimizer_step_of_loop(
    model: nn.Module,
    step: StepInputs,
    loss_fn: Callable | None,
    opt: torch.optim.Optimizer | None,
    loop: Loop,
    held: list,
) -> None:
    """One step of the user's loop, untracked: K passes (Rule 2), then the optimizer step; the caller clears
    the gradients after it, as `zero_grad` does."""
    for _ in range(loop.accumulate):
        micro_batch(model, step, loss_fn, held, keep_output=loop.keep_output)
    if opt is not None:
        run_user_code("the optimizer step", opt.step)


@dataclass
class LeadIn:
    """What the passes before the tracked one leave behind."""

    first_peak: int | None
    """Rule 3: the first step's metered peak, in steady mode."""
    held: list
    """Rule 4: the previous pass's output and loss, held until the tracked forward returns ([] if none)."""


def clear_grads(model: nn.Module, opt: torch.optim.Optimizer | None) -> None:
    """`zero_grad(set_to_none=True)`, as a training loop does between steps."""
    for p in model.parameters():
        p.grad = None
    if opt is not None:
        opt.zero_grad(set_to_none=True)


def lead_in(
    model: nn.Module,
    step: StepInputs,
    loss_fn: Callable | None,
    opt: torch.optim.Optimizer | None,
    loop: Loop,
    rounding: int = 1,
    *,
    warm_steps: int = 0,
    skip_host: bool = False,
) -> LeadIn:
    """Run what comes before the tracked pass: in steady mode a whole first step, metered (Rule 3), and
    `warm_steps` more (DDP rebuilds its buckets in the second), then the measured step's first K-1
    passes (Rule 2)."""
    clear_grads(model, opt)
    first_peak: int | None = None
    held: list = []
    if loop.step == Step.STEADY:
        with PeakMeter(resident_tensors(model, step, opt), rounding, skip_host) as meter:
            optimizer_step_of_loop(model, step, loss_fn, opt, loop, held)
        first_peak = meter.peak_bytes
        clear_grads(model, opt)
        for _ in range(warm_steps):
            optimizer_step_of_loop(model, step, loss_fn, opt, loop, held)
            clear_grads(model, opt)
    for _ in range(loop.accumulate - 1):
        micro_batch(model, step, loss_fn, held, keep_output=loop.keep_output)
    return LeadIn(first_peak, held)


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors in a nest of tuples, lists and dicts (a Hugging Face output is a dict)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in tensors_in(x)]
    return []


def optimizer_state(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors an optimizer keeps between steps (Adam's moments and step counters, momentum buffers)."""
    if opt is None:
        return []
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def resident_tensors(model: nn.Module, step: StepInputs, opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """What is live before a step: parameters, buffers, inputs, gradients and optimizer state."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return list(model.parameters()) + list(model.buffers()) + step.tensors() + grads + optimizer_state(opt)


def storage_bytes(tensors: list, rounding: int = 1) -> int:
    """Bytes of the distinct storages of the tensors among `tensors`, each rounded up to `rounding`."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = storage_of(t)  # a DTensor's local shard (NOTE [What counts as live memory], Rule 6)
        if st is not None:
            seen[id(st)] = rounded_bytes(st.nbytes(), rounding)
    return sum(seen.values())


def first_step_note(first_peak: int | None, steady_peak: int) -> list[str]:
    """Rule 3: a note when the first step peaks higher than the steady state."""
    if first_peak is None or first_peak <= steady_peak:
        return []
    return [
        f"The first step peaks higher than the steady state measured here: {first_peak} vs {steady_peak} bytes "
        "of live tensors; the first step's optimizer creates its state while the step's other tensors are live. "
        "Plan with remat.profile(..., step='first') (CLI --first-step) if the first step must fit too."
    ]
