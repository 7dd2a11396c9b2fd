"""`ilp`: a mixed-integer program over all units of the model tree, solved with HiGHS.

For models that are not one chain (skip connections, nested candidates, several
groups), every unit of every group is a binary variable and every elementary time
interval of the step a memory constraint (NOTE [The memory model of a plan]).
"""

from __future__ import annotations

import numpy as np

from remat.errors import RematError
from remat.planner.problem import Problem, Unit


def solve(problem: Problem, budget_bytes: int, time_limit_s: float = 60.0) -> list[Unit] | None:
    """The cheapest compatible units that fit the budget (optimal for the model), or None."""
    target = budget_bytes
    for _ in range(3):  # HiGHS works in floating point: tighten if it lands a few bytes over
        chosen = _solve(problem, target, time_limit_s)
        if chosen is None:
            return None
        over = problem.peak(chosen) - budget_bytes
        if over <= 0:
            return chosen
        target -= over
    return None


def min_peak(problem: Problem, time_limit_s: float = 60.0) -> int:
    """The least peak any compatible set of units reaches."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, rows, lbs = len(problem.units), [], []
    mem = problem.interval_max
    # [Constraint] memory: sum_u a_uk x_u + z >= L_k for every interval k, scaled so the peak is ~1e4:
    # in bytes HiGHS stops at points that are not optimal (seen: 1,088 MiB reported where 585 is reachable)
    scale = max(1.0, max(mem) / 1e4)
    for k, a in enumerate(problem.coefficient_matrix):
        rows.append(np.append(a / scale, 1.0))
        lbs.append(mem[k] / scale)
    # [Constraint] exclusivity: a block is inside at most one chosen unit
    for row in problem.exclusive_sets:
        rows.append(np.append(row, 0.0))
        lbs.append(-np.inf)
    ubs = [np.inf] * len(problem.interval_max) + [1.0] * (len(rows) - len(problem.interval_max))
    c = np.zeros(n + 1)
    c[-1] = 1.0
    res = milp(
        c,
        constraints=[LinearConstraint(np.array(rows), lbs, ubs)],
        integrality=np.append(np.ones(n), 0),
        bounds=Bounds(np.zeros(n + 1), np.append([1.0 if ok else 0.0 for ok in problem.useful], np.inf)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if res.x is None:
        return max(mem)
    chosen = [u for u, x in zip(problem.units, res.x[:n]) if x > 0.5]
    return problem.peak(chosen)


def _solve(problem: Problem, budget_bytes: int, time_limit_s: float) -> list[Unit] | None:
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = len(problem.units)
    if n == 0:
        return [] if max(problem.interval_max) <= budget_bytes else None
    cost = np.array([float(u.cost_flops) for u in problem.units])
    # among equal FLOPs prefer fewer ops re-run (elementwise ops count 0 FLOPs), then more bytes freed
    ops = np.array([float(u.cost_ops) for u in problem.units])
    freed = np.array([float(u.reduction_bytes) for u in problem.units]) / max(1.0, max(problem.interval_max))
    cost = cost + 1e-3 * ops / max(1.0, ops.sum()) - 1e-6 * freed
    # HiGHS sometimes stops with "Solve error" (status 4) on one form of the same program (seen with
    # byte-sized memory rows, and with rows scaled to max(L) = 1e4 on another model): try the forms in turn.
    attempts = [(max(1.0, max(problem.interval_max) / 1e4), True), (1.0, True), (1.0, False)]
    for scale, presolve in attempts:
        program = _budget_program(problem, budget_bytes, scale)
        if program is None:
            return None  # an interval over budget that no unit acts on
        rows, lbs, ubs = program
        res = milp(
            cost,
            constraints=[LinearConstraint(np.array(rows), lbs, ubs)] if rows else [],
            integrality=np.ones(n),
            bounds=Bounds(0, [1.0 if ok else 0.0 for ok in problem.useful]),
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


def _budget_program(problem: Problem, budget_bytes: int, scale: float) -> tuple[list, list, list] | None:
    """Constraint rows, lower and upper bounds; None if an interval over budget has no unit acting on it."""
    rows, lbs, ubs = [], [], []
    # [Constraint] memory: L_k - sum_u a_uk x_u <= budget (in units of `scale`) for every interval k over
    # budget, and every one where a unit adds bytes (Rule 2's held inputs can push an interval at or under
    # budget over it); elsewhere the constraint holds whatever is chosen
    for k, a in enumerate(problem.coefficient_matrix):
        need = problem.interval_max[k] - budget_bytes
        if need > 0 and not a.any():
            return None
        if need > 0 or (a < 0).any():
            rows.append(a / scale)
            lbs.append(need / scale)
            ubs.append(np.inf)
    # [Constraint] exclusivity: a block is inside at most one chosen unit
    for row in problem.exclusive_sets:
        rows.append(row)
        lbs.append(-np.inf)
        ubs.append(1.0)
    return rows, lbs, ubs
