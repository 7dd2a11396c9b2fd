"""The calls that take a model, `remat.profile` and `remat.auto`, as users call them: the step profiled by
`remat.measure`, and for a compiled model the compiled step's own peak measured beside it, and plans for it
chosen by measuring them.

NOTE [A compiled step's peak]
remat's tracker sees tensors through a dispatch mode, which cannot look inside the kernels Inductor generates,
so a compiled model is profiled eagerly (the model inside the compile wrapper, `remat.measure.profiling`).
The compiled step usually keeps less: Inductor fuses pointwise ops and does not store their outputs.  That
peak is measured here, once, by the counter `remat.verify` uses for the truth: the process's high-water mark
of a forked copy of this process running the training loop (third step; the copy compiles the step itself),
or `torch.cuda.max_memory_allocated` on CUDA.  It is stored in `StepProfile.compiled_peak_bytes`, and the
seconds of that copy's step in `StepProfile.compiled_step_s`.

What the planner does with it (`remat.planner.api.plan`): a budget at or above the compiled step's measured
peak plus COMPILED_PEAK_MARGIN (2%: two measurements of one compiled step differed by up to 1.5%) needs no
checkpoint, whatever the eager step keeps, and gets the keep-everything plan with a note that says so.
`remat.verify` of a compiled model judges the budget on the compiled step's counter.  Below that budget,
plans are still made and priced on the eager step, which keeps more: they fit the compiled step with room
to spare (docs/compile.md), and may recompute more than it needs: `remat.auto` has the model, so it measures
instead (NOTE [Plans for a compiled step]).

Known limitations: real mode and one process only (a fake-mode or N-rank prediction has no compiled figure);
on CPU it needs Linux (`/proc/self/clear_refs`) and `fork`; the forked copy compiles the step again, which
costs one compilation's time.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import warnings
from typing import Any

import torch.nn as nn

from remat._torch_compat.distributed import is_compiled, uncompiled
from remat.applier.apply import replace_plan, taken_off
from remat.compiled_plans import SEARCH_TRIALS, TIMED_STEPS, plan_for
from remat.errors import RematError
from remat.gpu_fit import fit_gpu
from remat.measure import profile as measure_profile
from remat.measure.loop import Loop
from remat.planner import plan
from remat.planner.budget import parse_budget
from remat.progress import Progress, resolve, say
from remat.report.text import fmt_bytes
from remat.types import Plan, StepProfile
from remat.verifier.verify import independent_step
from remat.types.kinds import Mode


def profile(model, inputs, loss_fn=None, optimizer=None, mode: str = "real", **options) -> StepProfile:
    """Measure one training step (forward, loss, backward, optimizer step) of `model` on `inputs`.

    Example:
        >>> prof = remat.profile(model, torch.randn(8, 1024), optimizer=torch.optim.Adam(model.parameters()))
        >>> prof.peak_bytes, prof.peak_phase, prof.blocks[0].saved_bytes

    `mode="real"` runs the step on the model's device and counts live tensor storages; `mode="fake"` predicts the
    same figures with fake tensors, allocating nothing, also for a `device="cuda"` this machine does not have, its
    seconds by the roofline of `hardware` ("A100", "H100", "H200", "L4", "cpu"; NOTE [The seconds of a step]).
    The model, its optimizer and the RNG are left as they were.

    `step="steady"` (the default) measures the step a training loop repeats, with the optimizer's state resident
    from its start; `step="first"` the first step of the optimizer as given.  `accumulate=K` runs K forward/backward
    passes per optimizer step.  `keep_output=True` (the default) is a loop that keeps the output until after
    backward (`out = model(**b); out.loss.backward()`), `False` only the loss (Hugging Face's Trainer);
    NOTE [The step that is measured].  `timed=False`: a real step's seconds not measured (as `remat.verify` needs).

    A model wrapped in DistributedDataParallel or sharded with FSDP2 is profiled as the rank this runs in sees
    its step (NOTE [A rank's step]).  `world_size=N` with `mode="fake"` predicts one rank of N from this process,
    with no process group: the inputs are the global batch, and `wrap` says how the job shares the model:
    "fsdp" (FSDP2 per block, torchtitan's default), "ddp", or a callable `(model, mesh) -> model`
    (NOTE [N ranks from one process]).  Of a compiled model: the model inside, eagerly, and the compiled step's peak
    by the process counter (`compiled_peak_bytes`, NOTE [A compiled step's peak]).

    Known limitations: in fake mode an op whose output depends on values (`.item()`, `nonzero`) runs only on values
    computed from the inputs and buffers alone (NOTE [Values a fake step can know]), not on activations or random
    draws; CUDA's workspaces are modelled from H100 and H200 measurements (NOTE [CUDA memory that is no tensor])."""
    options["progress"] = told = resolve(options.get("progress"), "profile")
    prof = measure_profile(model, inputs, loss_fn, optimizer, mode, **options)
    if mode != Mode.REAL or options.get("world_size", 1) != 1 or not is_compiled(model):
        return prof
    loop = Loop.of(options.get("step", "steady"), options.get("accumulate", 1), options.get("keep_output", True))
    say(told, "the compiled step, compiled and measured")
    measured, counter = independent_step(model, inputs, loss_fn, optimizer, loop, TIMED_STEPS)
    if measured is None:
        return prof
    peak = measured.peak_bytes
    note = (
        f"compiled step: {fmt_bytes(peak, 'auto')} by the {counter}, against {fmt_bytes(prof.peak_bytes, 'auto')} "
        "eager; a budget 2% above it or more needs no checkpoint (docs/compile.md)."
    )
    return dataclasses.replace(
        prof,
        compiled_peak_bytes=peak,
        compiled_counter=counter,
        compiled_step_s=measured.step_s,
        notes=[*prof.notes, note, *_tied_head_notes(uncompiled(model), prof)],
    )


def _tied_head_notes(model: nn.Module, prof: StepProfile) -> list[str]:
    """A Linear head sharing its weight with an Embedding: what the compiled backward can hold that the eager step
    does not (docs/compile.md: Inductor sums the weight's two gradients in one `addmm` at the end of the
    backward, so the gradient of the head's output lives through it), in the figure of the block that returns it."""
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append((name, module))
    blocks = {b.name: b for b in prof.blocks}
    notes = []
    for shared in owners.values():
        embedding = next((n for n, m in shared if isinstance(m, nn.Embedding)), None)
        head, linear = next(((n, m) for n, m in shared if isinstance(m, nn.Linear)), ("", None))
        if embedding is None or linear is None:
            continue
        returned = next((b for b in _self_and_ancestors(head) if b in blocks), None)
        if returned is None or blocks[returned].output_bytes % linear.out_features:
            continue  # the head's block returns something else than the head's rows
        notes.append(
            f"compiled step: `{head}` shares its weight with `{embedding}`; Inductor can sum that weight's two "
            f"gradients at the end of the backward, which keeps the gradient of `{returned}`'s output "
            f"({fmt_bytes(blocks[returned].output_bytes, 'auto')}) alive through it where the eager step frees it at "
            "once: a plan below the compiled step's peak, priced on the eager step, can peak that much higher "
            "compiled; remat.auto measures the compiled step instead (docs/compile.md)."
        )
    return notes


def _self_and_ancestors(name: str) -> list[str]:
    """`cls.predictions.decoder` -> itself, `cls.predictions`, `cls`: the deepest block first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


profile.__signature__ = inspect.signature(measure_profile)  # type: ignore[attr-defined]  # its options, for `help`


def auto(
    model: nn.Module,
    inputs: Any,
    budget,
    loss_fn=None,
    optimizer=None,
    *,
    trials: int = SEARCH_TRIALS,
    progress: bool | Progress | None = None,
    **plan_options,
) -> Plan:
    """Profile, plan and apply in one call; returns the Plan it applied.  For a compiled model whose compiled step
    is over the budget, the plan is chosen by compiling and measuring candidates, at most `trials` of remat's
    checkpoints, `trials` of torch.compile's own budget and `trials` of both (NOTE [Plans for a compiled step]).
    `progress=True` writes a line to stderr at each phase of the profile and before each candidate compiles (or
    pass a callable `progress(phase, done)`, as to `remat.profile`).  Other keywords are `remat.plan`'s.

    Example: plan = remat.auto(model, batch, budget="6GiB", optimizer=opt)

    On a model that follows a plan already (`remat.apply`, `remat.auto`, `remat.checkpoint` marks), it plans for
    the model as written: remat's own checkpoints are not the model's, so they are off while it profiles and
    searches (a budget given as a share is of the unplanned peak), and the new plan then replaces the old one,
    with `remat.apply`'s warning naming it.  If no plan fits, the old one is left in force.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise RematError(
            f"remat: trials must be a whole number of candidate plans to compile, 1 or more; saw "
            f"{trials!r}. Fix: pass trials={SEARCH_TRIALS} (the default) or more."
        )
    _check_plan_options(plan_options)
    told = resolve(progress, "auto")
    with taken_off(model):  # the model as written, remat's own checkpoints put back after (or if nothing fits)
        prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer, progress=told)
        step, limit = (inputs, loss_fn, optimizer), parse_budget(budget, prof.peak_bytes)
        chosen = plan_for(model, step, prof, limit, trials, plan_options, progress=told)
        if chosen.compiler_budget == 1.0 and not chosen.measured_peak_bytes:  # an eager plan, on CUDA checked
            chosen = fit_gpu(model, (inputs, loss_fn, optimizer), prof, chosen, plan_options)
    if chosen.allocator and chosen.allocator not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", ""):
        warnings.warn(
            f"remat: this plan fits the budget only with PYTORCH_CUDA_ALLOC_CONF={chosen.allocator}, and "
            "this process runs without it. Fix: set it before torch is imported (in the shell, or first "
            "thing in the script), and run again.",
            stacklevel=2,
        )
    replace_plan(model, chosen, stacklevel=3)  # in place of the old plan, if any, saying so
    return chosen


def _check_plan_options(plan_options: dict) -> None:
    """`remat.auto`'s keywords besides its own are `remat.plan`'s: one that is not stops here, before a profile
    that can take minutes (a compiled model's compiles), not as Python's TypeError from inside the planner."""
    known = [n for n, p in inspect.signature(plan).parameters.items() if p.kind is p.KEYWORD_ONLY or n == "solver"]
    unknown = sorted(set(plan_options) - set(known))
    if not unknown:
        return
    of_profile = [n for n in unknown if n in inspect.signature(measure_profile).parameters]
    fix = (
        f"profile the step with remat.profile(model, inputs, {of_profile[0]}=...), then remat.plan(prof, budget) "
        "and remat.apply(model, plan): remat.auto profiles the loop remat.profile's defaults describe"
        if of_profile
        else f"pass only {', '.join(known)} (remat.plan's options), or none"
    )
    raise RematError(
        f"remat: remat.auto takes model, inputs, budget, loss_fn, optimizer, trials and remat.plan's options "
        f"({', '.join(known)}); saw {', '.join(repr(n) for n in unknown)}. Fix: {fix}."
    )
