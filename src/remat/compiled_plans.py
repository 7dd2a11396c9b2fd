"""Plans for a compiled model, chosen by compiling and measuring candidates: what `remat.auto` applies to a
compiled step over its budget (NOTE [Plans for a compiled step])."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from remat.applier import apply, remove
from remat.errors import InfeasibleBudget, RematError, listing
from remat.measure.loop import Loop
from remat.planner import plan
from remat.planner.api import check_above_held
from remat.planner.result import keep_all
from remat.progress import Progress, say
from remat.report.text import fmt_bytes
from remat.types import Plan, StepProfile
from remat.types.profile import COMPILED_PEAK_MARGIN
from remat.verifier.process import ProcessPeak
from remat.verifier.verify import independent_step

# NOTE [Plans for a compiled step]
# A budget below the compiled step's peak needs a plan, and the planner can only price plans on the eager
# step (the tracker cannot see inside Inductor's kernels), which keeps much more: on the peers' large models a
# plan predicted at 886 MiB eager measured 544 MiB compiled.  A plan made for the budget as if it were eager
# fits, mostly, but recomputes what the compiled step never needed to.  And Inductor recomputes fused pointwise
# ops inside its backward kernels almost for free when given its own budget, where remat's units are modules or
# whole ops (peers, BERT at torch.compile's budget 0.5: remat's plan ran at 0.76x the eager step, compile's 0.67x).
# `remat.auto` has the model and the inputs, so it measures candidates of both kinds, and of both together, instead:
#
# Rule 1: a remat candidate is a plan priced eagerly for a larger eager budget (its target); the first target
#         is the budget scaled by the unplanned eager/compiled ratio.
# Rule 2: a compiler candidate checkpoints nothing and sets torch.compile's activation memory budget
#         (`Plan.compiler_budget`, NOTE [The compiler's budget as a plan]); the first is the fraction of the
#         compiled step's activations (its peak less the resident bytes) that the budget leaves room for.
# Rule 3: each candidate is applied, measured by the counter `remat.verify` trusts (`independent_step`: a forked
#         copy compiling and running the loop on CPU, `torch.cuda.max_memory_allocated` on CUDA), peak and
#         seconds of a step, and removed.
# Rule 4: the next remat candidate scales the last one's target by budget / measured, kept strictly between the
#         largest eager peak whose plan fitted and the smallest whose plan did not (their middle otherwise).  The
#         compiled step's peak is neither linear nor monotone in the compiler's fraction (a 6-block MLP: 128 MiB
#         at every fraction from 0.52 to 0.95, 136 MiB at 0.47, 126 MiB at 0.39; the peers' ViT: 51.3 MiB at
#         0.674, 54.3 at 0.337, 46.2 at 0.085, and 40.0 at 0.9 where the peers measured compile's own budget), so
#         after the first the compiler candidates are GRID, from the top: the largest fraction of it above the
#         largest that fitted, not within GRID_NEAR of one measured (a larger fraction recomputes less, and
#         mostly runs faster).  A fit within CLOSE_ENOUGH of the budget, a candidate measured before, or
#         `trials` compilations end the search of remat's candidates; a grid fraction that fits, none left, or
#         `trials` end the compiler's.  Above a first fraction that fitted within CLOSE_ENOUGH, only the largest
#         grid fraction left is tried, one compilation more (the peers' ViT at the peak of compile's budget 0.9:
#         the estimate 0.718 fitted closely and ran at 0.85x the eager step, compile's own 0.9 at 0.76x).
# Rule 5: of the candidates measured to fit, the fastest measured is applied; those within TIME_NOISE of it
#         count as equal, and of them the one whose checkpoints the cost model prices cheapest wins (torch.compile's
#         own recomputation, fused pointwise work inside its kernels, is priced 0), then the lower measured peak.
#         On CPU the copy's seconds are one thread's and miss what the user's threads see: the peers' GPT-2 at compile's
#         budget 0.5, 3 checkpoints timed 160 ms and budget 0.5 alone 154 ms there (equal), 0.69x and 0.63x the
#         eager step on 2 threads (2026-12-05); a lower peak within the budget buys the user nothing.  The plan
#         carries its measured peak, counter and seconds (`Plan.measured_peak_bytes`, `measured_counter`,
#         `measured_step_s`).  None fitting is `remat.InfeasibleBudget`, naming each measured peak: never a plan
#         that was measured not to fit.
# Rule 6: a hybrid sets a compiler fraction that was measured over the budget and adds remat's checkpoints for
#         what it missed by.  Tried when that fraction ran faster than every candidate that fitted by more than
#         TIME_NOISE (or none fitted): the fastest such fraction, at most `trials` hybrids.  Inductor's budget
#         acts on what the checkpoints leave, not always for the better, so hybrids are measured, never
#         predicted (6-block MLPs, 3 checkpoints / budget 0.5 / both: 662 / 661 / 600 MiB at width 256,
#         151 / 167 / 203 MiB at width 128).  The checkpoints are a plan priced eagerly for the eager peak less
#         the miss times the eager/compiled ratio; after a hybrid, the eager saving is scaled by the compiled
#         saving still needed over the one measured, kept strictly between the largest eager peak whose hybrid
#         fitted and the smallest whose hybrid did not (as in Rule 4).  A fit within CLOSE_ENOUGH, a hybrid
#         measured before, or a miss already slower than the fits ends it.  Rule 5 chooses among all kinds.
# Rule 7: a candidate compiles however often this process compiled the model's code before (`compiled_as_compiled`):
#         past Dynamo's `recompile_limit` a code object runs uncompiled, and the eager step would be measured as
#         the compiled one.  On CPU each candidate compiles in a forked copy; on CUDA in this process, so the search's
#         compiled code is dropped after it (`torch.compiler.reset()`): the plan applied compiles afresh at the
#         model's next step, and whatever else this process compiled compiles again at its next call.
# Rule 8: none fitting, the error says whether the uncompiled step fits the budget with remat's plan for it, as
#         predicted on the eager step (its peak and seconds): the compiled step can keep more than the eager one
#         at the least memory (the peers' default GPT-2 at batch 4, remat's least-memory plan: 38.6 MiB eager,
#         40.5 MiB compiled, 2026-12-06), and a user who asked for that budget is better told the way that reaches it.
#         A budget under what every step holds (`held_bytes`: parameters, gradients, optimizer state) is refused
#         before any candidate compiles (a 2-layer GPT-2 given its weights alone: 6 compiled first).
# Rule 9: a step that draws random numbers (dropout) gets candidates of torch.compile's budget too: remat's
#         budget keeps what each random op drew (NOTE [The compiler's budget as a plan], Rule 5), where torch's
#         own re-draws it in backward and changes the gradients silently.  From 2026-12-06 until the keeping
#         existed, the same day, such a step got remat's checkpoints only.
# Each candidate costs one compilation (tens of seconds on the peers' large models on CPU); with `progress`, the
# search says each candidate before it compiles it ("candidate 2 of at most 12: compiler budget 0.7").

SEARCH_TRIALS = 4
CLOSE_ENOUGH = 0.05
TIMED_STEPS = 2
"""Steps a measuring copy runs after the measured one, for the seconds of a step: the fastest of steps 2 to 5."""
MORE_TRIALS = "more trials (trials=8)"
"""The fix an infeasible search suggests besides a larger budget (the CLI says it with its flag)."""
UNCOMPILED = "remat.auto on the model without torch.compile"
"""Rule 8's fix, where the eager step fits the budget and no compiled candidate did (the CLI: without its flag)."""
GRID = (0.9, 0.7, 0.5, 0.3, 0.1)
"""Rule 4: the compiler's fractions tried after the first, from the top (torch.compile's budgets in the peers)."""
GRID_NEAR = 0.05
TIME_NOISE = 0.05
"""Candidates within this fraction of the fastest count as equal.  Six copies timing one compiled plan by the
faster of steps 2 and 3 spread over 10% (one thread, CPU); the fastest of four steps is steadier, by how much
not measured."""


class Measured(NamedTuple):
    """A candidate plan and what the counter measured of the compiled step with it applied (Rule 3)."""

    plan: Plan
    peak: ProcessPeak
    counter: str


def plan_for(
    model,
    step: tuple,
    prof: StepProfile,
    budget: int,
    trials: int = SEARCH_TRIALS,
    plan_options: dict | None = None,
    *,
    progress: Progress | None = None,
) -> Plan:
    """The plan `remat.auto` applies, not applied: `remat.plan`'s, unless `model` is compiled and its compiled step is
    over `budget` (then NOTE [Plans for a compiled step]).  `step` is (inputs, loss_fn, optimizer); `prof` is
    `remat.profile` of `model`; `progress(phase, n)` is told each candidate before it compiles."""
    plan_options = plan_options or {}
    compiled = prof.compiled_peak_bytes
    if not compiled or budget >= min(compiled * (1 + COMPILED_PEAK_MARGIN), prof.peak_bytes):
        return plan(prof, budget, **plan_options)
    check_above_held(prof, budget)  # Rule 8: a budget no candidate can meet compiles none
    said = _teller(progress, most_candidates(trials))
    try:
        tried = _remat_candidates(model, step, prof, budget, trials, plan_options, said=said)
        tried += _compiler_candidates(model, step, prof, budget, trials, said=said)
        tried += _hybrid_candidates(
            model, step, prof, budget, tried, trials=trials, plan_options=plan_options, said=said
        )
    finally:
        if any(p.is_cuda for p in model.parameters()):  # Rule 7: the candidates compiled in this process
            torch.compiler.reset()
    uncompiled = functools.partial(_uncompiled_fix, prof, budget, plan_options)
    return _fastest_fit(tried, budget, prof, uncompiled=uncompiled)


def most_candidates(trials: int) -> int:
    """How many candidates `plan_for` compiles at most: `trials` of each kind (remat's, the compiler's, both)."""
    return 3 * trials


Said = Callable[[Plan], None]
"""Told each candidate before it is compiled and measured."""


def _teller(progress: Progress | None, most: int) -> Said:
    """A `Said` that tells `progress` "candidate N of at most `most`: <what it is>", N counting from 1."""
    count = itertools.count(1)

    def said(candidate: Plan) -> None:
        n = next(count)
        say(progress, f"candidate {n} of at most {most}: {_kind(candidate)}", n)

    return said


def _untold(candidate: Plan) -> None:
    """The `Said` of a search nobody watches."""


def _remat_candidates(
    model, step: tuple, prof: StepProfile, budget: int, trials: int, plan_options: dict, *, said: Said = _untold
) -> list[Measured]:
    """Rules 1, 3 and 4 for plans of remat's checkpoints."""
    eager = dataclasses.replace(prof, compiled_peak_bytes=0)  # priced eagerly, with no compiled-step shortcut
    tried: dict[str, Measured] = {}
    fit, miss = 0, prof.peak_bytes  # eager peaks: the largest whose plan fitted, the smallest whose plan did not
    target = budget * prof.peak_bytes / prof.compiled_peak_bytes
    for _ in range(trials):
        target = target if fit < target < miss else (fit + miss) / 2
        candidate = _eager_plan(eager, int(target), plan_options)
        if _key(candidate) in tried:
            break
        said(candidate)
        measured, counter = measure_compiled(model, candidate, step)
        tried[_key(candidate)] = Measured(candidate, measured, counter)
        fit, miss, close = _bracketed(measured.peak_bytes, budget, candidate.peak_bytes, (fit, miss))
        if close:
            break
        target = candidate.peak_bytes * budget / measured.peak_bytes
    return list(tried.values())


def _compiler_candidates(
    model, step: tuple, prof: StepProfile, budget: int, trials: int, *, said: Said = _untold
) -> list[Measured]:
    """Rules 2, 3 and 4 for torch.compile's activation memory budget (a fraction: 1.0 is the unplanned step)."""
    resident = prof.param_bytes + prof.optimizer_bytes
    tried: list[Measured] = []
    fit, close = 0.0, False  # the largest fraction whose step fitted; whether the first fitted within CLOSE_ENOUGH
    fraction: float | None = min(max((budget - resident) / max(prof.compiled_peak_bytes - resident, 1), 0.0), 0.95)
    for _ in range(trials):
        if fraction is None:
            break
        fraction = round(fraction, 3)
        candidate = compiler_plan(prof, budget, fraction)
        said(candidate)
        try:
            measured, counter = measure_compiled(model, candidate, step)
        except RematError:  # the copy could not compile or run the step under the budget: remat's plans only
            break
        tried.append(Measured(candidate, measured, counter))
        fits = measured.peak_bytes <= budget
        if len(tried) == 1:
            close = fits and measured.peak_bytes >= budget * (1 - CLOSE_ENOUGH)
        elif fits or close:
            break  # a grid fraction that fits, the largest left; or the one tried above a close first fit
        fit = max(fit, fraction) if fits else fit
        fraction = _next_fraction(fit, [c.compiler_budget for c, _, _ in tried])
    return tried


def compiler_plan(prof: StepProfile, budget: int, fraction: float) -> Plan:
    """torch.compile's own activation memory budget `fraction` as a plan for `budget` bytes, no checkpoint of remat's
    (NOTE [The compiler's budget as a plan])."""
    note = (
        f"torch.compile's activation memory budget {fraction:g}: Inductor saves that fraction of the "
        "activations it would and recomputes the rest in its backward kernels; remat checkpoints nothing "
        "(docs/compile.md)."
    )
    base = keep_all(dataclasses.replace(prof, compiled_peak_bytes=0), budget, "")
    return dataclasses.replace(base, solver="compiler", compiler_budget=fraction, notes=[note])


def _next_fraction(fit: float, measured: list[float]) -> float | None:
    """Rule 4: the largest of GRID above `fit` and not within GRID_NEAR of a fraction `measured`, or None."""
    left = [f for f in GRID if f > fit and all(abs(f - m) >= GRID_NEAR for m in measured)]
    return max(left, default=None)


def _hybrid_candidates(
    model,
    step: tuple,
    prof: StepProfile,
    budget: int,
    tried: list[Measured],
    *,
    trials: int,
    plan_options: dict,
    said: Said = _untold,
) -> list[Measured]:
    """Rule 6: remat's checkpoints under torch.compile's budget, for a fraction measured fast but over `budget`
    (`tried`: the candidates measured so far), in at most `trials` more measurements."""
    fits = [m.step_s for _, m, _ in tried if m.peak_bytes <= budget]
    bar = min(fits) * (1 - TIME_NOISE) if fits else float("inf")
    over = [t for t in tried if t.plan.compiler_budget < 1.0 and t.peak.peak_bytes > budget and t.peak.step_s < bar]
    if not over:
        return []
    knob, alone, _ = min(over, key=lambda t: t.peak.step_s)
    eager = dataclasses.replace(prof, compiled_peak_bytes=0)
    hybrids: dict[str, Measured] = {}
    fit, miss = 0, prof.peak_bytes  # eager peaks of remat's part: the largest whose hybrid fitted, the smallest not
    saving = (alone.peak_bytes - budget) * prof.peak_bytes / prof.compiled_peak_bytes
    for _ in range(trials):
        target = prof.peak_bytes - saving
        target = target if fit < target < miss else (fit + miss) / 2
        checkpoints = _eager_plan(eager, int(target), plan_options)
        if _key(checkpoints) in hybrids or not _checkpoints(checkpoints):
            break
        note = (
            f"torch.compile's activation memory budget {knob.compiler_budget:g} over remat's checkpoints: "
            "Inductor recomputes within what they leave (docs/compile.md)."
        )
        candidate = dataclasses.replace(
            checkpoints, compiler_budget=knob.compiler_budget, notes=[note, *checkpoints.notes]
        )
        said(candidate)
        measured, counter = measure_compiled(model, candidate, step)
        hybrids[_key(checkpoints)] = Measured(candidate, measured, counter)
        fit, miss, close = _bracketed(measured.peak_bytes, budget, checkpoints.peak_bytes, (fit, miss))
        if close or measured.peak_bytes > budget and measured.step_s >= bar:  # more checkpoints: slower still
            break
        saved = max(alone.peak_bytes - measured.peak_bytes, 1 << 20)  # on the compiled step, by this hybrid
        saving = (prof.peak_bytes - checkpoints.peak_bytes) * (alone.peak_bytes - budget) / saved
    return list(hybrids.values())


def _key(plan: Plan) -> str:
    """What a plan of remat's checkpoints checkpoints, to tell a candidate measured before."""
    return repr((plan.segments, plan.selective, plan.selective_keeps, plan.offload))


def _bracketed(peak: int, budget: int, eager_peak: int, bracket: tuple[int, int]) -> tuple[int, int, bool]:
    """Rule 4's bracket of eager peaks (the largest whose candidate fitted, the smallest whose candidate did not)
    after a candidate priced at `eager_peak` measured `peak`, and whether that is a fit close enough to stop."""
    fit, miss = bracket
    if peak <= budget:
        return max(fit, eager_peak), miss, peak >= budget * (1 - CLOSE_ENOUGH)
    return fit, min(miss, eager_peak), False


def _eager_plan(eager: StepProfile, target: int, plan_options: dict) -> Plan:
    try:
        return plan(eager, target, **plan_options)
    except InfeasibleBudget as e:  # below the least-memory plan's eager peak: that plan
        return plan(eager, e.min_bytes, **plan_options)


def measure_compiled(model, candidate: Plan, step: tuple[Any, Any, Any]) -> tuple[ProcessPeak, str]:
    """The compiled step's peak and seconds with `candidate` applied, by the independent counter (Rule 3); the
    peers harness measures torch.compile's own budgets with it, as remat.auto's search sees them."""
    apply(model, candidate)
    try:
        measured, counter = independent_step(model, *step, Loop(), TIMED_STEPS)
    finally:
        remove(model)
    if measured is None:  # profile measured the compiled step with this counter: it cannot be gone
        raise RematError(
            "remat: the compiled step's counter gave no figure. Expected the one remat.profile used. "
            "Fix: report this to remat."
        )
    return measured, counter


def _fastest_fit(tried: list[Measured], budget: int, prof: StepProfile, uncompiled=lambda: "") -> Plan:
    """Rule 5; none fitting, `InfeasibleBudget` with `uncompiled()`'s fix after the others (Rule 8)."""
    fitting = [t for t in tried if t.peak.peak_bytes <= budget]
    if not fitting:
        least = min(m.peak_bytes for _, m, _ in tried)
        raise InfeasibleBudget(
            f"remat: no plan tried fits the compiled step in {fmt_bytes(budget, 'auto')}: {len(tried)} compiled and "
            f"measured by the {tried[0].counter} peaked at "
            f"{listing([fmt_bytes(m.peak_bytes, 'auto') for _, m, _ in tried], 8)}. Expected a budget the compiled "
            f"step can meet. Fix: a budget of {fmt_bytes(least, 'auto')} or more, "
            f"or {MORE_TRIALS}{uncompiled()}.",
            least,
            budget,
        )
    fastest = min(m.step_s for _, m, _ in fitting)
    best, measured, counter = min(
        (t for t in fitting if t.peak.step_s <= fastest * (1 + TIME_NOISE)),
        key=lambda t: (t.plan.extra_s, t.plan.recompute_flops, t.peak.peak_bytes),
    )
    knobs = sum(c.compiler_budget < 1.0 and not _checkpoints(c) for c, _, _ in tried)
    both = sum(c.compiler_budget < 1.0 and _checkpoints(c) for c, _, _ in tried)
    versus = (
        f", {measured.step_s / prof.compiled_step_s - 1:+.1%} against the unplanned compiled step's "
        f"{prof.compiled_step_s * 1e3:,.1f} ms"
        if prof.compiled_step_s
        else ""
    )
    eager = f" (eager prediction {fmt_bytes(best.peak_bytes, 'auto')})" if best.compiler_budget == 1.0 else ""
    note = (
        f"chosen for the compiled step: {len(tried)} plan{'s' * (len(tried) != 1)} compiled and measured by the {counter} "
        f"({len(tried) - knobs - both} of remat's checkpoints, {knobs} of torch.compile's own budget"
        f"{f', {both} of both' if both else ''}); this one "
        f"peaked at {fmt_bytes(measured.peak_bytes, 'auto')}{eager} in {measured.step_s * 1e3:,.1f} ms a step"
        f"{versus}, the fastest within the budget (docs/compile.md)."
    )
    each = "; ".join(f"{_kind(c)}: {fmt_bytes(m.peak_bytes, 'auto')}, {m.step_s * 1e3:,.0f} ms" for c, m, _ in tried)
    return dataclasses.replace(
        best,
        budget_bytes=budget,
        measured_peak_bytes=measured.peak_bytes,
        measured_counter=counter,
        measured_step_s=measured.step_s,
        notes=[note, f"measured: {each}.", *best.notes],
    )


def _uncompiled_fix(prof: StepProfile, budget: int, plan_options: dict) -> str:
    """Rule 8: ", or UNCOMPILED: ..." where remat's plan for `budget` on the eager step fits it, else ""."""
    try:
        eager = plan(prof, budget, **plan_options)
    except InfeasibleBudget:
        return ""
    return (
        f", or {UNCOMPILED}: its eager step with remat's plan for this budget is predicted at "
        f"{fmt_bytes(eager.peak_bytes, 'auto')} at {eager.extra_fraction:+.0%} time over the unplanned eager step"
    )


def _checkpoints(plan: Plan) -> bool:
    return bool(plan.segments or plan.selective or plan.offload)


def _kind(candidate: Plan) -> str:
    """A candidate in a few words: "compiler budget 0.42", "remat 2 checkpoints + 3 selective", "compiler budget
    0.6 + remat 1 checkpoints + 0 selective"."""
    knob = f"compiler budget {candidate.compiler_budget:g}" if candidate.compiler_budget < 1.0 else ""
    if knob and not _checkpoints(candidate):
        return knob
    ours = f"remat {len(candidate.segments)} checkpoints + {len(candidate.selective)} selective" + (
        f" + {len(candidate.offload)} offloaded" if candidate.offload else ""
    )
    return f"{knob} + {ours}" if knob else ours
