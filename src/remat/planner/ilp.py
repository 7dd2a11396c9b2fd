"""`ilp`: a mixed-integer program over all units of the model tree, solved with HiGHS.

For models that are not one chain (skip connections, nested candidates, several
groups), every unit of every group is a binary variable and every elementary time
interval of the step a memory constraint (NOTE [The memory model of a plan]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from remat.errors import RematError
from remat.planner.problem import Problem, Unit

SCALED_PEAK = 1e4
"""Memory rows are divided so that the peak is about this: in bytes HiGHS stops at points that are not
optimal (seen: 1,088 MiB reported where 585 is reachable)."""
OPS_WEIGHT = 1e-3
"""Objective: FLOPs, plus at most this (in FLOPs) for re-running more ops, so that among plans of equal
FLOPs the one re-running fewer ops wins (elementwise ops count 0 FLOPs but not 0 time); it cannot outweigh
a single FLOP."""
FREED_WEIGHT = 1e-6
"""... minus at most this for the bytes a unit frees (as a share of the peak): among plans equal in both,
the one freeing more wins.  Smaller than OPS_WEIGHT so it never overrules the ops tie-break."""


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
    target = budget_bytes
    for attempt in range(4):  # HiGHS works in floating point: tighten if it lands a few bytes over
        chosen = _solve(problem, target, time_limit_s)
        if chosen is None:
            return None
        over = problem.peak(chosen) - budget_bytes
        if over <= 0:
            return chosen
        # a byte or two over is under HiGHS's feasibility tolerance on rows in units of `scale` bytes
        target -= max(over, int(_scale(problem))) << attempt
    return None


def min_peak(problem: Problem, time_limit_s: float = 60.0) -> int:
    """The least peak any compatible set of units reaches: minimise z with sum_u a_uk x_u + z >= L_k."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, mem = len(problem.units), problem.interval_max
    scale = _scale(problem)
    rows = _Rows([], [], [])
    # [Constraint] memory: every interval k, with the peak z as one more column
    for k, a in enumerate(problem.coefficient_matrix):
        rows.add(np.append(a / scale, 1.0), mem[k] / scale, np.inf)
    _exclusivity(problem, rows, extra_columns=1)
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res = milp(
        cost,
        constraints=[LinearConstraint(np.array(rows.rows), rows.lower, rows.upper)],
        integrality=np.append(np.ones(n), 0),
        bounds=Bounds(np.zeros(n + 1), np.append(_upper_bounds(problem), np.inf)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if res.x is None:
        return max(mem)
    return problem.peak([u for u, x in zip(problem.units, res.x[:n]) if x > 0.5])


def _solve(problem: Problem, budget_bytes: int, time_limit_s: float) -> list[Unit] | None:
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not problem.units:
        return [] if max(problem.interval_max) <= budget_bytes else None
    # HiGHS sometimes stops with "Solve error" (status 4) on one form of the same program (seen with
    # byte-sized memory rows, and with rows scaled to max(L) = 1e4 on another model): try the forms in turn.
    for scale, presolve in [(_scale(problem), True), (1.0, True), (1.0, False)]:
        rows = _budget_rows(problem, budget_bytes, scale)
        if rows is None:
            return None  # an interval over budget that no unit acts on
        res = milp(
            _objective(problem),
            constraints=[LinearConstraint(np.array(rows.rows), rows.lower, rows.upper)] if rows.rows else [],
            integrality=np.ones(len(problem.units)),
            bounds=Bounds(0, _upper_bounds(problem)),
            options={"time_limit": time_limit_s, "mip_rel_gap": 0.0, "presolve": presolve},
        )
        if res.x is not None or res.status == 2:  # a plan, or proved infeasible
            break
    if res.x is None:
        if res.status == 2:
            return None
        raise RematError(
            f"remat: the ilp solver (HiGHS) stopped without an answer: status {res.status}, {res.message!r}. "
            "Expected an optimal plan or a proof that none fits. Fix: use solver='dp' if the model is a chain "
            "of blocks, or a larger time_limit_s."
        )
    return [u for u, x in zip(problem.units, res.x) if x > 0.5]


def _scale(problem: Problem) -> float:
    return max(1.0, max(problem.interval_max) / SCALED_PEAK)


def _objective(problem: Problem) -> np.ndarray:
    """FLOPs, then ops re-run, then bytes freed (OPS_WEIGHT, FREED_WEIGHT)."""
    flops = np.array([float(u.cost_flops) for u in problem.units])
    ops = np.array([float(u.cost_ops) for u in problem.units])
    freed = np.array([float(u.reduction_bytes) for u in problem.units]) / max(1.0, max(problem.interval_max))
    return flops + OPS_WEIGHT * ops / max(1.0, ops.sum()) - FREED_WEIGHT * freed


def _upper_bounds(problem: Problem) -> list[float]:
    """A unit may be chosen only if it is useful (Rule 5)."""
    return [1.0 if ok else 0.0 for ok in problem.useful]


def _budget_rows(problem: Problem, budget_bytes: int, scale: float) -> _Rows | None:
    """The rows of the budget program; None if an interval over budget has no unit acting on it."""
    rows = _Rows([], [], [])
    # [Constraint] memory: L_k - sum_u a_uk x_u <= budget (in units of `scale`) for every interval k over
    # budget, and every one where a unit adds bytes (Rule 2's held inputs can push an interval at or under
    # budget over it); elsewhere the constraint holds whatever is chosen
    for k, a in enumerate(problem.coefficient_matrix):
        need = problem.interval_max[k] - budget_bytes
        if need > 0 and not a.any():
            return None
        if need > 0 or (a < 0).any():
            rows.add(a / scale, need / scale, np.inf)
    _exclusivity(problem, rows, extra_columns=0)
    return rows


def _exclusivity(problem: Problem, rows: _Rows, extra_columns: int) -> None:
    # [Constraint] exclusivity: a block is inside at most one chosen unit
    for row in problem.exclusive_sets:
        rows.add(np.append(row, np.zeros(extra_columns)), -np.inf, 1.0)
