"""`dp`: the optimal segmentation of a chain of blocks, by dynamic programming.

In the spirit of Beaumont et al. 2019 (Rotor), for the schedules `torch.utils.checkpoint`
can run: the chain is cut into consecutive segments, each kept or recomputed once as a
unit.  With the effects of NOTE [The memory model of a plan], every time interval of
the step is settled by the segment that contains one particular block (see `_slots`),
and the only thing it needs from the segments before is how many bytes they free in
total, R.  So a state is (position, cost, R) and only Pareto-optimal (cost, R) pairs are
kept: the result is optimal for the model, which the tests check against brute force.

R counts each earlier unit's whole `reduction_bytes`, which is exact while a unit frees the same
bytes from its segment's end until its backward.  An output freed only from a later read (a long
skip connection: Rule 1) frees less before that read, so there R is too hopeful and a plan can
come out over budget (seen: 364 bytes over, by the exact evaluation); a shared hold counted as
each holder's own (`Problem.stacked_table`) errs the other, safe way.  `remat.plan` checks every
dp plan exactly and then plans that chain with the ilp over the same units (`remat.planner.chain.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from remat.planner.problem import Group, NotAChain, Problem, Unit, chain_group

__all__ = ["NotAChain", "min_peak", "solve"]


class _Step(NamedTuple):
    """One choice that settles blocks i..j, applied to the rows k.. of the front at i."""

    front: "_Front"
    i: int
    k: int
    unit: int
    """Index in problem.units, -1 for keep."""
    freed: int
    cost: int
    tie: int


def solve(
    problem: Problem, budget_bytes: int, groups: list[Group] | None = None, *, kept: bool = True
) -> list[Unit] | None:
    """The cheapest units of the chain (`groups`, by default `planned_groups`) that fit the budget, or None.

    fronts[i] holds the Pareto-optimal ways to settle blocks 0..i-1 as numpy columns: cost and its
    tie-break (`Problem.cost_of`), bytes freed, and a back link (position, row, unit).
    Every choice shifts a suffix of a front at once: a 100-stage chain is ~4,400 choices.  With `kept` False, the
    kept holds (NOTE [The memory model of a plan], Rule 2) are left out: a hopeful plan, to be checked exactly."""
    chain = _chain(problem, groups or planned_groups(problem), kept)
    if not chain.feasible(budget_bytes):
        return None
    # No interval needs more than max(L) - budget freed; past that (plus what later units can take
    # back, Rule 2) more freed bytes change nothing, so freed bytes are capped there and states merge.
    cap = max(0, max(problem.interval_max) - budget_bytes) + chain.deficit
    dtype = np.int64 if chain.max_cost < 2**62 else object
    n = chain.n
    parts: list[list[_Step]] = [[] for _ in range(n + 1)]
    fronts: list[_Front | None] = [None] * (n + 1)
    fronts[0] = _Front.start(dtype)
    for i in range(n + 1):
        if i > 0:  # every choice that ends before block i has been made
            fronts[i] = _Front.merge(parts[i], cap, dtype)
            parts[i] = []
        front = fronts[i]
        if front is None or i == n:
            continue
        for j, unit_id, need, red, cost, tie in chain.choices(i, budget_bytes):
            k = int(np.searchsorted(front.freed, need))  # freed ascending: rows k.. are enough
            if k < len(front.freed):
                parts[j + 1].append(_Step(front, i, k, unit_id, red, cost, tie))
    last = fronts[n]
    if last is None:
        return None
    ok = np.flatnonzero(last.freed >= chain.final_need(budget_bytes))
    if len(ok) == 0:
        return None
    row, pos, chosen = int(ok[0]), n, []  # rows are sorted by cost: the first that fits is the cheapest
    while pos > 0:
        f = fronts[pos]
        assert f is not None, "every position on the chosen path was reached"
        if f.unit[row] >= 0:
            chosen.append(problem.units[int(f.unit[row])])
        pos, row = int(f.back_pos[row]), int(f.back_row[row])
    return chosen[::-1]


@dataclass
class _Front:
    """Pareto states at one position, cost ascending and bytes freed strictly ascending."""

    cost: np.ndarray
    tie: np.ndarray
    freed: np.ndarray
    back_pos: np.ndarray
    back_row: np.ndarray
    unit: np.ndarray
    """Index in problem.units of the unit chosen last, -1 for keep."""

    @classmethod
    def start(cls, dtype) -> "_Front":
        zero = np.zeros(1, dtype=np.int64)
        return cls(np.zeros(1, dtype=dtype), np.zeros(1, dtype=dtype), zero, zero, zero, np.full(1, -1))

    @classmethod
    def merge(cls, parts: list[_Step], cap: int, dtype) -> "_Front | None":
        if not parts:
            return None
        cost = np.concatenate([p.front.cost[p.k :] + p.cost for p in parts]).astype(dtype)
        tie = np.concatenate([p.front.tie[p.k :] + p.tie for p in parts]).astype(dtype)
        freed = np.minimum(np.concatenate([p.front.freed[p.k :] + p.freed for p in parts]), cap)
        sizes = [len(p.front.freed) - p.k for p in parts]
        back_pos = np.concatenate([np.full(m, p.i) for p, m in zip(parts, sizes)])
        back_row = np.concatenate([np.arange(p.k, p.k + m) for p, m in zip(parts, sizes)])
        unit = np.concatenate([np.full(m, p.unit) for p, m in zip(parts, sizes)])
        order = np.lexsort((-freed, tie, cost))  # cost, then its tie-break, then most bytes freed
        freed = freed[order]
        best_before = np.maximum.accumulate(freed)
        keep = np.ones(len(freed), dtype=bool)
        keep[1:] = freed[1:] > best_before[:-1]
        rows = order[keep]
        return cls(cost[rows], tie[rows], freed[keep], back_pos[rows], back_row[rows], unit[rows])


def min_peak(problem: Problem, groups: list[Group] | None = None, *, kept: bool = True) -> int:
    """The least peak any segmentation of the chain reaches (binary search on feasibility).

    Feasibility alone needs no costs: the most bytes freed so far dominates, so each probe
    is one pass over the chain's choices.  `kept` as in `solve`."""
    chain = _chain(problem, groups or planned_groups(problem), kept)
    hi = max(problem.interval_max)
    lo = min(0, min(problem.interval_max) - sum(max(0, u.reduction_bytes) for u in problem.units))
    while lo < hi:
        mid = (lo + hi) // 2
        if chain.feasible(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Chain:
    """One chain of blocks: its units by start position, and what each choice needs (budget-free parts)."""

    def __init__(self, problem: Problem, groups: list[Group], kept: bool):
        names, starting = _chain_units(problem, groups)
        self.n = len(names)
        slots = _slots(problem, names, starting)
        mem = problem.interval_max_array
        self.head_max = max((problem.interval_max[k] for k in slots.head), default=0)
        self.const_max = max((problem.interval_max[k] for k in slots.const), default=0)
        # intervals settled by block m, flattened so blocks i..j are one slice
        per_block = [np.array(slots.forward[m] + slots.backward[m], dtype=np.int64) for m in range(self.n)]
        self.offsets = np.cumsum([0] + [len(x) for x in per_block])
        flat = np.concatenate(per_block) if per_block else np.zeros(0, dtype=np.int64)
        keep_need = [int(mem[x].max()) if len(x) else -(2**62) for x in per_block]
        table = problem.stacked_table if kept else problem.hopeful_table
        # (j, unit, need before the budget is subtracted), per start position
        self.options: list[list[tuple[int, Unit | None, int]]] = []
        self.problem = problem
        self.max_cost = max(sum(problem.cost_of(u)[k] for i in range(self.n) for _, u in starting[i]) for k in (0, 1))
        self.deficit = sum(max(0, -u.reduction_bytes) for i in range(self.n) for _, u in starting[i])
        for i in range(self.n):
            opts: list[tuple[int, Unit | None, int]] = [(i, None, keep_need[i])]
            for j, unit in starting[i]:
                idx = flat[self.offsets[i] : self.offsets[j + 1]]
                if len(idx) == 0:
                    opts.append((j, unit, -(2**62)))
                    continue
                k0, a = table[problem.position(unit)]  # shared holds once per holder: safe
                inside = (idx >= k0) & (idx < k0 + len(a))
                freed = np.zeros(len(idx), dtype=np.int64)
                freed[inside] = a[idx[inside] - k0]
                opts.append((j, unit, int((mem[idx] - freed).max())))
            self.options.append(opts)

    def choices(self, i: int, budget: int):
        """(last block, unit index or -1 for keep, bytes the segments before i must free,
        bytes the choice frees, its cost and tie-break: `Problem.cost_of`)."""
        for j, unit, need in self.options[i]:
            if unit is None:
                yield j, -1, need - budget, 0, 0, 0
            else:
                yield j, self.problem.position(unit), need - budget, unit.reduction_bytes, *self.problem.cost_of(unit)

    def final_need(self, budget: int) -> int:
        return self.head_max - budget

    def feasible(self, budget: int) -> bool:
        """Whether some segmentation fits: the most bytes freed before each position, forward."""
        if self.const_max > budget:
            return False
        best: list[int | None] = [None] * (self.n + 1)  # None: position unreachable
        best[0] = 0
        for i in range(self.n):
            reached = best[i]
            if reached is None:
                continue
            for j, unit, need in self.options[i]:
                if reached >= need - budget:
                    red = reached + (unit.reduction_bytes if unit else 0)
                    before = best[j + 1]
                    best[j + 1] = red if before is None else max(before, red)
        last = best[self.n]
        return last is not None and last >= self.head_max - budget


# -- the chain's structure --------------------------------------------------------------------


@dataclass
class _Slots:
    forward: list[list[int]]
    """forward[m]: intervals inside the forward, settled by the segment holding block m."""
    backward: list[list[int]]
    """backward[m]: intervals of the backward, settled by the segment holding block m."""
    head: list[int]
    """Between the last block's forward and its backward: every segment is held."""
    const: list[int]
    """Before the first block finishes forward: no unit acts there."""


def planned_groups(problem: Problem) -> list[Group]:
    """The groups dp plans: every group with a unit that frees bytes, where their blocks run as one chain (the
    embedding, the layers, the final norm and the head of a transformer: `line`); else the main chain's group."""
    return line(problem) or [chain_group(problem)]


def _chain(problem: Problem, groups: list[Group], kept: bool) -> "_Chain":
    """The chain of `groups`, built once per problem (`Problem.solver_cache`): it does not depend on the budget, and
    a frontier solves the same problem at up to 64 budgets (~75 ms each on a 100-stage chain)."""
    built = problem.solver_cache
    key = (*groups, kept)
    if key not in built:
        built[key] = _Chain(problem, groups, kept)
    return built[key]


def line(problem: Problem) -> list[Group] | None:
    """Every group with a useful unit, where their blocks together run forward in order and backward in reverse
    and none is inside another: one chain for dp, exact as for one group.  None where they do not (nested
    candidates, blocks that run side by side), or where no unit frees anything."""
    built = problem.solver_cache
    if "line" not in built:
        built["line"] = _line(problem)
    return built["line"]


def _line(problem: Problem) -> list[Group] | None:
    useful = {u.group for u, ok in zip(problem.units, problem.useful) if ok}
    groups = [g for g in problem.groups if g in useful]
    if not groups or not runs_as_a_chain(problem, groups):
        return None
    return groups


def runs_as_a_chain(problem: Problem, groups: list[Group]) -> bool:
    """Whether the blocks of `groups` run forward in order and backward in reverse, none inside another and every
    unit's blocks next to each other, as this solver needs (`_slots`)."""
    try:
        _slots(problem, *_chain_units(problem, groups))
    except NotAChain:
        return False
    return True


def _chain_units(problem: Problem, groups: list[Group]) -> tuple[list[str], dict[int, list[tuple[int, Unit]]]]:
    """The blocks, and for each position the units that begin there with the position of their last block.  One
    group's blocks are its members; several groups' are the blocks of their useful units in the order their
    forwards end (a block no unit acts on is always kept, so its memory is only the timeline's)."""
    chosen = set(groups)
    units = [u for u in problem.units if u.group in chosen and problem.is_useful(u)]
    if len(groups) == 1:
        names = list(problem.groups[groups[0]])
    else:
        names = sorted({b for u in units for b in u.blocks}, key=lambda n: problem.block_spans[n][0])
        nested = sorted(n for n in names for m in names if n.startswith(m + "."))
        if nested:
            raise NotAChain(f"{nested[0]} is inside another of the blocks")
    at = {n: i for i, n in enumerate(names)}
    starting: dict[int, list[tuple[int, Unit]]] = {i: [] for i in range(len(names))}
    for u in units:
        i = at[u.blocks[0]]
        if tuple(names[i : i + len(u.blocks)]) != u.blocks:
            raise NotAChain(f"other blocks run between those of the checkpoint around {', '.join(u.blocks)}")
        starting[i].append((i + len(u.blocks) - 1, u))
    return names, starting


def _slots(problem: Problem, names: list[str], units) -> _Slots:
    n = len(names)
    fend, bstart = _block_spans(problem, names)
    if any(fend[m] >= fend[m + 1] or bstart[m] <= bstart[m + 1] for m in range(n - 1)) or fend[-1] >= bstart[-1]:
        raise NotAChain(f"blocks of {names[0]}..{names[-1]} do not run forward in order and backward in reverse")
    slots = _Slots([[] for _ in range(n)], [[] for _ in range(n)], [], [])
    for k, p in enumerate(problem.breakpoints[:-1]):
        f = sum(1 for m in range(n) if fend[m] <= p)  # blocks whose forward is over at p
        g = sum(1 for m in range(n) if bstart[m] > p)  # blocks whose backward has not started
        if f == 0:
            slots.const.append(k)
        elif g == 0:  # after every block's backward started: only the first unit's held inputs remain
            slots.backward[0].append(k)
        elif f < n:
            slots.forward[f - 1].append(k)
        elif g == n:
            slots.head.append(k)
        else:
            slots.backward[g].append(k)
    return slots


def _block_spans(problem: Problem, names: list[str]) -> tuple[list[int], list[int]]:
    spans = problem.block_spans
    return [spans[n][0] for n in names], [spans[n][1] for n in names]
