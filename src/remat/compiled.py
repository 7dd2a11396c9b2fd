"""`remat.profile` and `remat.auto` as users call them: the step profiled by `remat.measure`, and for a compiled
model the compiled step's own peak measured beside it, and plans for it chosen by measuring them.

NOTE [A compiled step's peak]
remat's tracker sees tensors through a dispatch mode, which cannot look inside the kernels Inductor generates,
so a compiled model is profiled eagerly (the model inside the compile wrapper, `remat.measure.profiling`).
The compiled step usually keeps less: Inductor fuses pointwise ops and does not store their outputs.  That
peak is measured here, once, by the counter `remat.verify` uses for the truth: the process's high-water mark
of a forked copy of this process running the training loop (third step; the copy compiles the step itself),
or `torch.cuda.max_memory_allocated` on CUDA.  It is stored in `StepProfile.compiled_peak_bytes`.

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
import functools
from typing import Any

import torch.nn as nn

from remat._torch_compat.distributed import is_compiled
from remat.applier import apply, remove
from remat.errors import InfeasibleBudget, RematError, listing
from remat.measure import profile as measure_profile
from remat.measure.loop import Loop
from remat.planner import plan
from remat.planner.budget import parse_budget
from remat.report.text import fmt_bytes
from remat.types import Plan, StepProfile
from remat.types.profile import COMPILED_PEAK_MARGIN
from remat.verifier.verify import independent_peak


@functools.wraps(measure_profile)
def profile(model, inputs, loss_fn=None, optimizer=None, mode: str = "real", **options) -> StepProfile:
    prof = measure_profile(model, inputs, loss_fn, optimizer, mode, **options)
    if mode != "real" or options.get("world_size", 1) != 1 or not is_compiled(model):
        return prof
    loop = Loop.of(options.get("step", "steady"), options.get("accumulate", 1))
    peak, counter = independent_peak(model, inputs, loss_fn, optimizer, loop)
    if peak is None:
        return prof
    note = (f"compiled step: {fmt_bytes(peak, 'auto')} by the {counter}, against {fmt_bytes(prof.peak_bytes, 'auto')} "
            "eager; a budget 2% above it or more needs no checkpoint (NOTE [A compiled step's peak]).")
    return dataclasses.replace(prof, compiled_peak_bytes=peak, compiled_counter=counter, notes=[*prof.notes, note])


# NOTE [Plans for a compiled step]
# A budget below the compiled step's peak needs a plan, and the planner can only price plans on the eager
# step (the tracker cannot see inside Inductor's kernels), which keeps much more: on the peers' large models a
# plan predicted at 886 MiB eager measured 544 MiB compiled.  A plan made for the budget as if it were eager
# fits, mostly, but recomputes what the compiled step never needed to.  `remat.auto` has the model and the
# inputs, so it searches by measurement instead:
#
# Rule 1: a plan for the compiled step is a plan priced eagerly for a larger eager budget (its target); the
#         first target is the budget scaled by the unplanned eager/compiled ratio.
# Rule 2: each candidate is applied, measured by the counter `remat.verify` trusts (`independent_peak`: a forked
#         copy compiling and running the loop on CPU, `torch.cuda.max_memory_allocated` on CUDA) and removed.
# Rule 3: the next target scales the last one by budget / measured, kept strictly between the largest eager
#         peak whose plan fitted and the smallest whose plan did not (their middle otherwise).  A fit within
#         CLOSE_ENOUGH of the budget, a plan measured before, or `trials` compilations end the search.
# Rule 4: of the plans measured to fit, the cheapest (predicted seconds, then FLOPs) is applied, carrying its
#         measured peak and counter (`Plan.measured_peak_bytes`, `Plan.measured_counter`).  None fitting is
#         `remat.InfeasibleBudget`, naming each measured peak: never a plan that was measured not to fit.
# Each candidate costs one compilation (tens of seconds on the peers' large models on CPU).

SEARCH_TRIALS = 4
CLOSE_ENOUGH = 0.05


def auto(model: nn.Module, inputs: Any, budget, loss_fn=None, optimizer=None, *, trials: int = SEARCH_TRIALS,
         **plan_options) -> Plan:
    """Profile, plan and apply in one call; returns the Plan it applied.  For a compiled model whose compiled step
    is over the budget, the plan is chosen by compiling and measuring candidates, at most `trials` of them
    (NOTE [Plans for a compiled step]).

    Example: plan = remat.auto(model, batch, budget="6GiB", optimizer=opt)
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise RematError(f"remat: trials must be a whole number of candidate plans to compile, 1 or more; saw "
                         f"{trials!r}. Fix: pass trials={SEARCH_TRIALS} (the default) or more.")
    prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
    chosen = plan_for(model, (inputs, loss_fn, optimizer), prof, parse_budget(budget, prof.peak_bytes), trials,
                      plan_options)
    apply(model, chosen)
    return chosen


def plan_for(model, step: tuple, prof: StepProfile, budget: int, trials: int = SEARCH_TRIALS,
             plan_options: dict | None = None) -> Plan:
    """The plan `remat.auto` applies, not applied: `remat.plan`'s, unless `model` is compiled and its compiled step is
    over `budget` (then NOTE [Plans for a compiled step]).  `step` is (inputs, loss_fn, optimizer); `prof` is
    `remat.profile` of `model`."""
    plan_options = plan_options or {}
    compiled = prof.compiled_peak_bytes
    if not compiled or budget >= min(compiled * (1 + COMPILED_PEAK_MARGIN), prof.peak_bytes):
        return plan(prof, budget, **plan_options)
    return _fit_compiled(model, step, prof, budget, trials, plan_options)


def _fit_compiled(model, step: tuple, prof: StepProfile, budget: int, trials: int, plan_options: dict) -> Plan:
    """NOTE [Plans for a compiled step]: the cheapest plan measured to fit among at most `trials` compiled."""
    eager = dataclasses.replace(prof, compiled_peak_bytes=0)  # priced eagerly, with no compiled-step shortcut
    tried: dict[str, tuple[Plan, int, str]] = {}
    fit, miss = 0, prof.peak_bytes  # eager peaks: the largest whose plan fitted, the smallest whose plan did not
    target = budget * prof.peak_bytes / prof.compiled_peak_bytes  # Rule 1
    for _ in range(trials):
        target = target if fit < target < miss else (fit + miss) / 2
        candidate = _eager_plan(eager, int(target), plan_options)
        key = repr((candidate.segments, candidate.selective, candidate.selective_keeps, candidate.offload))
        if key in tried:
            break
        peak, counter = _measured(model, candidate, step)
        tried[key] = (candidate, peak, counter)
        if peak <= budget:
            fit = max(fit, candidate.peak_bytes)
            if peak >= budget * (1 - CLOSE_ENOUGH):
                break
        else:
            miss = min(miss, candidate.peak_bytes)
        target = candidate.peak_bytes * budget / peak  # Rule 3
    return _cheapest_fit(list(tried.values()), budget)


def _eager_plan(eager: StepProfile, target: int, plan_options: dict) -> Plan:
    try:
        return plan(eager, target, **plan_options)
    except InfeasibleBudget as e:  # below the least-memory plan's eager peak: that plan
        return plan(eager, e.min_bytes, **plan_options)


def _measured(model, candidate: Plan, step: tuple) -> tuple[int, str]:
    """The compiled step's peak with `candidate` applied, by the independent counter (Rule 2)."""
    apply(model, candidate)
    try:
        peak, counter = independent_peak(model, *step, Loop())
    finally:
        remove(model)
    if peak is None:  # profile measured the compiled step with this counter: it cannot be gone
        raise RematError("remat: the compiled step's counter gave no figure. Expected the one remat.profile used. "
                         "Fix: report this to remat.")
    return peak, counter


def _cheapest_fit(tried: list[tuple[Plan, int, str]], budget: int) -> Plan:
    """Rule 4."""
    fitting = [t for t in tried if t[1] <= budget]
    if not fitting:
        least = min(peak for _, peak, _ in tried)
        raise InfeasibleBudget(
            f"remat: no plan tried fits the compiled step in {fmt_bytes(budget, 'auto')}: {len(tried)} compiled and "
            f"measured by the {tried[0][2]} peaked at "
            f"{listing([fmt_bytes(peak, 'auto') for _, peak, _ in tried], 6)}. Expected a budget the compiled step "
            f"can meet. Fix: a budget of {fmt_bytes(least, 'auto')} or more, or more trials (trials=8).",
            least, budget,
        )
    best, peak, counter = min(fitting, key=lambda t: (t[0].extra_s, t[0].recompute_flops, t[1]))
    note = (f"chosen for the compiled step: {len(tried)} plans compiled and measured by the {counter}; this one "
            f"peaked at {fmt_bytes(peak, 'auto')} (eager prediction {fmt_bytes(best.peak_bytes, 'auto')}), within "
            f"the budget (NOTE [Plans for a compiled step]).")
    return dataclasses.replace(best, budget_bytes=budget, measured_peak_bytes=peak, measured_counter=counter,
                               notes=[note, *best.notes])
