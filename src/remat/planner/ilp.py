"""`ilp`: a mixed-integer program over all units of the model tree, solved with HiGHS.

For models that are not one chain (skip connections, nested candidates, several
groups), every unit of every group is a binary variable and every elementary time
interval of the step a memory constraint (NOTE [The memory model of a plan]).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from remat.errors import RematError
from remat.planner.problem import Problem, Unit

SCALED_PEAK = 1e4
"""Memory rows are divided so that the peak is about this: in bytes HiGHS stops at points that are not
optimal (seen: 1,088 MiB reported where 585 is reachable)."""
TIE_BREAK_LEAST_S = 1.0
"""The tie-break program runs in what the cheapest plan's program left of `time_limit_s`, if at least this: on a T5
of 12 + 12 layers at 512 tokens (604 units) each program ran into the 60 s limit at a budget of 340 MiB, 120 s a
plan, where the first one's point, not proven optimal, has no tie to break (2026-12-03)."""
PEAK_WEIGHT = 0.5
"""The second program's objective is the tie-break (ops re-run, or FLOPs in whole units: `_whole_ties`) + this
x peak / largest interval: ties are whole numbers, so the peak (below 1) only breaks ties between plans of
equal tie-break."""


@dataclass
class _Rows:
    """Constraint rows over the units (and any extra columns), with their lower and upper bounds."""

    rows: list[np.ndarray]
    lower: list[float]
    upper: list[float]

    def add(self, row: np.ndarray, lower: float, upper: float) -> None:
        self.rows.append(row)
        self.lower.append(lower)
        self.upper.append(upper)


def solve(problem: Problem, budget_bytes: int, time_limit_s: float = 60.0) -> list[Unit] | None:
    """The cheapest compatible units that fit the budget (optimal for the model), or None."""
    return _within(problem, budget_bytes, lambda target: _solve(problem, target, time_limit_s))


def _within(problem: Problem, budget_bytes: int, solve_at) -> list[Unit] | None:
    """`solve_at(target)` for target = the budget, then tighter: HiGHS works in floating point, and a byte or
    two over is under its feasibility tolerance on rows in units of `scale` bytes.  None once it finds none."""
    target = budget_bytes
    for attempt in range(4):
        chosen = solve_at(target)
        if chosen is None:
            return None
        over = problem.peak(chosen) - budget_bytes
        if over <= 0:
            return chosen
        target -= max(over, int(_scale(problem))) << attempt
    return None


def min_peak(problem: Problem, time_limit_s: float = 60.0) -> int:
    """The least peak any compatible set of units reaches: minimise z with sum_u a_uk x_u + z >= L_k."""
    n = len(problem.units)

    def program(scale: float) -> _Program:
        objective = np.append(np.zeros(n + _n_held(problem)), 1.0)
        return _Program(objective, _peak_rows(problem, scale), _upper_bounds(problem) + [np.inf])

    x = _milp(problem, program, time_limit_s)
    if x is None:
        return max(problem.interval_max)
    return problem.peak([u for u, v in zip(problem.units, x[:n]) if v > 0.5])


def _solve(problem: Problem, budget_bytes: int, time_limit_s: float) -> list[Unit] | None:
    """The plan of least (cost, tie-break, peak) under the budget (`Problem.cost_of`), in two programs: HiGHS
    resolves an objective to about 1e-6 of its size, so tie-breaks folded into a cost objective are lost (seen:
    a plan re-running 717 ops where dp found one of equal FLOPs re-running 712)."""
    n_units = len(problem.units)
    if not problem.units:
        return [] if max(problem.interval_max) <= budget_bytes else None
    rows = {_scale(problem): _budget_rows(problem, budget_bytes, _scale(problem))}  # the first form _milp tries
    if rows[_scale(problem)] is None:
        return None  # an interval over budget that no unit acts on
    costs = np.append([float(problem.cost_of(u)[0]) for u in problem.units], np.zeros(_n_held(problem)))

    def program(scale: float) -> _Program:
        if scale not in rows:
            rows[scale] = _budget_rows(problem, budget_bytes, scale)
        scaled = rows[scale]
        assert scaled is not None  # None only when no unit acts on an interval over budget: the same at any scale
        return _Program(costs, scaled, _upper_bounds(problem))

    deadline = time.monotonic() + time_limit_s
    x = _milp(problem, program, time_limit_s)
    if x is None:
        return None
    cheapest = [u for u, v in zip(problem.units, x[:n_units]) if v > 0.5]
    left = deadline - time.monotonic()  # the tie-break has what the first program left of the time limit
    if left <= TIE_BREAK_LEAST_S:
        return cheapest
    ties = _least_tie_then_peak(problem, budget_bytes, problem.cost(cheapest), left)
    return ties if ties is not None and _rank(problem, ties) < _rank(problem, cheapest) else cheapest


def _least_tie_then_peak(problem: Problem, budget_bytes: int, cost_bound: int, time_limit_s: float):
    """Among plans of at most `cost_bound` cost under the budget, the one of least tie-break, then the one of
    least peak: the min-peak program with the peak column bounded by the budget and one more row."""
    n = len(problem.units)
    n_held = _n_held(problem)
    cost_row = np.array([float(problem.cost_of(u)[0]) for u in problem.units] + [0.0] * (n_held + 1)) / max(
        1.0, cost_bound
    )
    ties = np.append(_whole_ties(problem), np.zeros(n_held))

    def solve_at(bound: int) -> list[Unit] | None:  # the peak column bounded by `bound`

        def program(scale: float) -> _Program:
            rows = _peak_rows(problem, scale)
            rows.add(cost_row, -np.inf, 1.0 if cost_bound else 0.0)  # [Constraint] the cheapest plan's cost
            objective = np.append(ties, PEAK_WEIGHT * scale / max(1, max(problem.interval_max)))
            return _Program(objective, rows, _upper_bounds(problem) + [bound / scale])

        x = _milp(problem, program, time_limit_s, TIE_BREAK_FORMS, required=False)
        if x is None:  # none better than the cheapest plan, or HiGHS found none in time: the cheapest stands
            return None
        chosen = [u for u, v in zip(problem.units, x[:n]) if v > 0.5]
        return chosen if problem.cost(chosen) <= cost_bound else None  # HiGHS's row tolerance: checked exactly

    return _within(problem, budget_bytes, solve_at)


def _whole_ties(problem: Problem) -> list[float]:
    """The units' tie-breaks as whole numbers below about 1e7 (FLOPs in units of a power of ten): HiGHS's
    resolution, and PEAK_WEIGHT's rule that ties differ by at least 1."""
    ties = [problem.cost_of(u)[1] for u in problem.units]
    unit = 10 ** max(0, len(str(max(ties, default=0))) - 7)
    return [float(t // unit) for t in ties]


def _rank(problem: Problem, chosen: list[Unit]) -> tuple[int, int, int]:
    return problem.cost(chosen), problem.tie(chosen), problem.peak(chosen)


@dataclass
class _Program:
    """One mixed-integer program: the unit columns are binary, any after them continuous."""

    objective: np.ndarray
    rows: _Rows
    upper: list[float]


PLAN_FORMS = ((1.0, True), (10.0, True), (1.0, False), (None, True), (None, False))
"""The forms `_milp` tries a program in, in turn: (memory rows in units of this times `_scale`, or None for bytes;
HiGHS's presolve).  HiGHS sometimes stops with "Solve error" (status 4) on one form of the same program (seen with
byte-sized memory rows, and with rows scaled to max(L) = 1e4 on another model).  The scaled ones first: in bytes
HiGHS may call a worse point optimal (a LoRA Llama-3-8B's least peak came out 54.4 GiB where every scaled form that
answers finds 27.7)."""
TIE_BREAK_FORMS = ((None, True), (1.0, True), (10.0, True), (1.0, False), (None, False))
"""The tie-break program's forms (`_least_tie_then_peak`), bytes first: its answer is checked exactly and taken only
if it ranks before the cheapest plan, so a worse point called optimal costs nothing, and on report 001's chain at
70% each scaled form ran into the time limit with no point at all (3 x 60 s) where bytes solved it in 0.5 s."""


def _milp(problem: Problem, program, time_limit_s: float, forms=PLAN_FORMS, required: bool = True):
    """HiGHS on `program(scale)` in each of `forms` in turn: the solution vector, or None when HiGHS proves that
    none exists; or, not `required`, when no form answers within `time_limit_s` in all (else each form has it)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    deadline = time.monotonic() + time_limit_s
    for times, presolve in forms:
        left = time_limit_s if required else deadline - time.monotonic()
        if left <= 0:
            return None
        scale = 1.0 if times is None else times * _scale(problem)
        p = program(scale)
        rows = [LinearConstraint(np.array(p.rows.rows), p.rows.lower, p.rows.upper)] if p.rows.rows else []
        with _quiet_stdout():
            res = milp(
                p.objective,
                constraints=rows,
                integrality=np.append(np.ones(len(problem.units)), np.zeros(len(p.objective) - len(problem.units))),
                bounds=Bounds(np.zeros(len(p.objective)), p.upper),
                options={"time_limit": left, "mip_rel_gap": 0.0, "presolve": presolve},
            )
        if res.x is not None or res.status == 2:  # a solution, or proved infeasible
            return res.x
    if not required:
        return None
    raise RematError(
        f"remat: the ilp solver (HiGHS) stopped without an answer: status {res.status}, {res.message!r}. "
        "Expected an optimal plan or a proof that none fits. Fix: use solver='dp' if the model is a chain "
        "of blocks, or a larger time_limit_s."
    )


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """The process's standard output (file descriptor 1) sent to nothing: HiGHS's MIP solver prints
    "HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();" there whatever its options (seen on
    T5's frontier, twice; jump-dev/HiGHS.jl#312), which would land in the middle of `remat plan`'s output or its
    JSON.  Left as it is where there is no such descriptor to swap."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _scale(problem: Problem) -> float:
    return max(1.0, max(problem.interval_max) / SCALED_PEAK)


def _peak_rows(problem: Problem, scale: float) -> _Rows:
    """[Constraint] memory with the peak z as one more column: sum_u a_uk x_u + z >= L_k for every
    interval k (in units of `scale`), exclusivity and the OR columns' links."""
    rows = _Rows([], [], [])
    for k, a in enumerate(_memory_matrix(problem)):
        rows.add(np.append(a / scale, 1.0), problem.interval_max[k] / scale, np.inf)
    _exclusivity(problem, rows, extra_columns=1)
    return rows


def _memory_matrix(problem: Problem) -> np.ndarray:
    """Bytes freed per interval (row) by each unit, then by each OR column of the shared holds and each AND column
    of the kept holds (negative: `remat.planner.holds.or_columns`, `and_columns`)."""
    held = [m for m in (problem.or_columns[0], problem.and_columns[0]) if m.shape[1]]
    return np.hstack([problem.coefficient_matrix, *(-m for m in held)]) if held else problem.coefficient_matrix


def _n_held(problem: Problem) -> int:
    """The columns after the units': the shared holds' OR columns, then the kept holds' AND columns."""
    return problem.or_columns[0].shape[1] + problem.and_columns[0].shape[1]


def _upper_bounds(problem: Problem) -> list[float]:
    """A unit may be chosen only if it is useful (Rule 5); an OR column is a share in [0, 1]."""
    return [1.0 if ok else 0.0 for ok in problem.useful] + [1.0] * _n_held(problem)


def _budget_rows(problem: Problem, budget_bytes: int, scale: float) -> _Rows | None:
    """The rows of the budget program; None if an interval over budget has no unit acting on it."""
    rows = _Rows([], [], [])
    # [Constraint] memory: L_k - sum_u a_uk x_u <= budget (in units of `scale`) for every interval k over
    # budget, and every one where a unit adds bytes (Rule 2's held inputs can push an interval at or under
    # budget over it); elsewhere the constraint holds whatever is chosen
    for k, a in enumerate(_memory_matrix(problem)):
        need = problem.interval_max[k] - budget_bytes
        if need > 0 and not (a > 0).any():
            return None
        if need > 0 or (a < 0).any():
            rows.add(a / scale, need / scale, np.inf)
    _exclusivity(problem, rows, extra_columns=0)
    return rows


def _exclusivity(problem: Problem, rows: _Rows, extra_columns: int) -> None:
    n, n_or, n_held = len(problem.units), problem.or_columns[0].shape[1], _n_held(problem)
    # [Constraint] exclusivity: a block is inside at most one chosen unit
    for row in problem.exclusive_sets:
        rows.add(np.append(row, np.zeros(n_held + extra_columns)), -np.inf, 1.0)
    # [Constraint] OR: a shared hold's column is at least each of its holders (z_c - x_u >= 0)
    for column, unit in problem.or_columns[1]:
        row = np.zeros(n + n_held + extra_columns)
        row[n + column], row[unit] = 1.0, -1.0
        rows.add(row, 0.0, np.inf)
    # [Constraint] AND: a kept hold's column is at least its holder and a freer together (w - x_b - sum x_a >= -1)
    for column, holder, freers in problem.and_columns[1]:
        row = np.zeros(n + n_held + extra_columns)
        row[n + n_or + column], row[holder] = 1.0, -1.0
        row[freers] = -1.0
        rows.add(row, -1.0, np.inf)
