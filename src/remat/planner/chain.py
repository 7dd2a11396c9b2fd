"""A chain's plan (the groups `dp.planned_groups` finds): dp's, checked by the exact evaluation, and the ilp over
the chain's units where dp's model is not the plan's."""

from __future__ import annotations

from remat.planner import dp, ilp
from remat.planner.problem import Group, Problem, Unit


def plan(problem: Problem, budget: int, groups: list[Group], time_limit_s: float) -> list[Unit] | None:
    """dp's segmentation of the chain; where its one number of bytes freed so far was too hopeful (an output
    freed only from a read after its segment: a long skip connection, `dp`'s docstring), the ilp over the same
    chain's units, which evaluates every interval exactly.  The ilp too where dp's model is not the plan's: a
    module called more than once (dp takes each unit to free its bytes over one span, not one per call:
    NOTE [A module called more than once]), and inputs autograd keeps for others' ops that dp's two passes do not
    settle (`_kept_plan`)."""
    if _many_calls(problem, groups):
        return ilp.solve(problem.within(groups), budget, time_limit_s)
    if _has_kept(problem, groups):
        return _kept_plan(problem, budget, groups, time_limit_s)
    chosen = dp.solve(problem, budget, groups)
    if chosen is None:
        return _least_within(problem, budget, groups)
    if problem.peak(chosen) <= budget:
        return chosen
    return ilp.solve(problem.within(groups), budget, time_limit_s)


SWEEP = 8
"""How many of dp's plans above its own least `_within_reach` checks exactly."""


def _least_within(problem: Problem, budget: int, groups: list[Group]) -> list[Unit] | None:
    """The cheapest of dp's plans at its least peak and above (`_within_reach`) that fits `budget` by the exact
    evaluation.  dp counts a hold that several units share once per unit (safe), so it can find no plan for a
    budget its own plans meet: a 3-layer Llama's frontier with two micro-batches went down to 1,615,688 bytes,
    where `remat.plan` at that budget said the least was 1,616,200, its 256 bytes of positions held by three
    checkpoints counted three times (2026-12-02, test_plan); a BLOOM of 4 layers at 512 tokens had dp's least plan
    at 79,262,728 bytes where two checkpoints of one layer each reach 79,067,140, their alibi and mask counted
    twice (2026-12-03)."""
    fits = [c for c in _within_reach(problem, groups) if problem.peak(c) <= budget]
    return min(fits, key=lambda c: _costs(problem, c)) if fits else None


def _within_reach(problem: Problem, groups: list[Group]) -> list[list[Unit]]:
    """dp's plans at its least peak and at SWEEP budgets above it, up to what it counts as held: by the exact
    evaluation one of those may peak lower than dp's least (the holds its model counts more than once).  Built once
    per problem and chain (`Problem.solver_cache`): `min_peak` asks after `plan` may have."""
    key = ("within reach", *groups)
    if key not in problem.solver_cache:
        problem.solver_cache[key] = _sweep(problem, groups)
    return problem.solver_cache[key]


def _sweep(problem: Problem, groups: list[Group]) -> list[list[Unit]]:
    least, units = dp.min_peak(problem, groups), [u for u in problem.units if u.group in groups]
    blocks = {b for u in units for b in u.blocks}
    top = least + len(blocks) * max((sum(h.bytes for h in u.holds) for u in units), default=0)  # each block's unit
    budgets = sorted({least, *(least + (top - least) * k // SWEEP for k in range(1, SWEEP + 1))})
    plans = [dp.solve(problem, b, groups) for b in budgets]
    return [p for p in plans if p is not None]


def _kept_plan(problem: Problem, budget: int, groups: list[Group], time_limit_s: float) -> list[Unit] | None:
    """A chain whose checkpoints may hold inputs autograd keeps for others' ops (NOTE [The memory model of a plan],
    Rule 2), by dp twice: without those holds (hopeful: no dearer than any plan dp makes with them) and with
    them always held (safe, not always the cheapest).  The hopeful plan if it fits by the exact evaluation; else
    the safe one if it fits and costs no more; else the ilp's.  On report 001's chain (65 blocks, a Sigmoid's input
    its one kept hold) the ilp took 35 s and 184 s a plan at 50% and 70%, dp 0.5 s (2026-11-28)."""
    hopeful = dp.solve(problem, budget, groups, kept=False)
    if hopeful is None or problem.peak(hopeful) <= budget:
        return hopeful  # None: dp finds no plan of the chain even without the holds, as `plan` takes dp's None
    safe = dp.solve(problem, budget, groups)
    if safe is not None and problem.peak(safe) <= budget and _costs(problem, safe) == _costs(problem, hopeful):
        return safe
    return ilp.solve(problem.within(groups), budget, time_limit_s)


def _costs(problem: Problem, chosen: list[Unit]) -> tuple[int, int]:
    return problem.cost(chosen), problem.tie(chosen)


def _has_kept(problem: Problem, groups: list[Group]) -> bool:
    return any(u.kept for u in problem.units if u.group in groups)


def _many_calls(problem: Problem, groups: list[Group]) -> bool:
    return any(u.calls > 1 for u in problem.units if u.group in groups)


def min_peak(problem: Problem, groups: list[Group], time_limit_s: float) -> int:
    """The least peak a plan of the chain reaches: dp's, where a plan reaches it by the exact evaluation; else the
    ilp's over the chain's units (dp was too hopeful, or its model is not the plan's: `plan`)."""
    if _many_calls(problem, groups):
        return ilp.min_peak(problem.within(groups), time_limit_s)
    if _has_kept(problem, groups):  # the hopeful least, where a plan reaches it by the exact evaluation
        least = dp.min_peak(problem, groups, kept=False)
        hopeful = dp.solve(problem, least, groups, kept=False)
        reached = hopeful is not None and problem.peak(hopeful) <= least
    else:
        chosen = plan(problem, dp.min_peak(problem, groups), groups, time_limit_s)
        least, reached = (problem.peak(chosen), True) if chosen is not None else (0, False)  # exact: dp's can be high
        least = min([least, *(problem.peak(c) for c in _within_reach(problem, groups))]) if reached else least
    return least if reached else ilp.min_peak(problem.within(groups), time_limit_s)  # dp was too hopeful
