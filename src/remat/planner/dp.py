"""`dp`: the optimal segmentation of a chain of blocks, by dynamic programming.

In the spirit of Beaumont et al. 2019 (Rotor), for the schedules `torch.utils.checkpoint`
can run: the chain is cut into consecutive segments, each kept or recomputed once as a
unit.  With the effects of NOTE [The memory model of a plan], every time interval of
the step is settled by the segment that contains one particular block (see `_slots`),
and the only thing it needs from the segments before is how many bytes they free in
total, R.  So a state is (position, cost, R) and only Pareto-optimal (cost, R) pairs are
kept: the result is optimal for the model, which the tests check against brute force.
"""

from __future__ import annotations

from dataclasses import dataclass

from remat.planner.problem import Problem, Unit


class NotAChain(ValueError):
    """The group's blocks do not run as a chain (forward in order, backward in reverse)."""


@dataclass(frozen=True, slots=True)
class _State:
    cost: int
    reduction: int
    back: "_State | None"
    unit: Unit | None


def chain_group(problem: Problem) -> str:
    """The group planned by `dp`: the one whose best unit frees the most bytes."""
    best: dict[str, int] = {}
    for u in problem.units:
        if problem.is_useful(u):
            best[u.group] = max(best.get(u.group, 0), u.reduction_bytes)
    if not best:
        raise NotAChain("no block frees memory when checkpointed")
    return max(best, key=best.__getitem__)


def solve(problem: Problem, budget_bytes: int, group: str | None = None) -> list[Unit] | None:
    """The cheapest units of one chain group that fit the budget, or None if none does."""
    group = group or chain_group(problem)
    names, units = _chain_units(problem, group)
    slots = _slots(problem, names, units)
    n = len(names)
    fronts: list[list[_State]] = [[] for _ in range(n + 1)]
    fronts[0] = [_State(0, 0, None, None)]
    for i in range(n):
        for j, unit in _choices(problem, i, n, units):  # what a choice needs depends on the choice only
            need = _need(problem, slots, i, j, unit) - budget_bytes
            red, cost = (unit.reduction_bytes if unit else 0), _cost(unit)
            for state in fronts[i]:
                if state.reduction >= need:
                    fronts[j + 1].append(_State(state.cost + cost, state.reduction + red, state, unit))
        fronts[i + 1] = _pareto(fronts[i + 1])
    final_need = max((problem.interval_max[k] for k in slots.head), default=0) - budget_bytes
    if max((problem.interval_max[k] for k in slots.const), default=0) > budget_bytes:
        return None
    done = [s for s in fronts[n] if s.reduction >= final_need]
    if not done:
        return None
    best = min(done, key=lambda s: (s.cost, -s.reduction))
    chosen = []
    while best is not None and best.back is not None:
        if best.unit is not None:
            chosen.append(best.unit)
        best = best.back
    return chosen[::-1]


def min_peak(problem: Problem, group: str | None = None) -> int:
    """The least peak any segmentation of the chain reaches (binary search on feasibility)."""
    hi = max(problem.interval_max)
    lo = min(0, min(problem.interval_max) - sum(max(0, u.reduction_bytes) for u in problem.units))
    while lo < hi:
        mid = (lo + hi) // 2
        if solve(problem, mid, group) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


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


def _chain_units(problem: Problem, group: str) -> tuple[list[str], dict[int, list[tuple[int, Unit]]]]:
    """The group's blocks, and for each start position the units that begin there with their last index."""
    names = problem.groups[group]
    starting: dict[int, list[tuple[int, Unit]]] = {i: [] for i in range(len(names))}
    for u in problem.units:
        if u.group == group and problem.is_useful(u):
            starting[u.position].append((u.position + len(u.blocks) - 1, u))
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


def _choices(problem: Problem, i: int, n: int, starting: dict[int, list[tuple[int, Unit]]]):
    yield i, None  # keep block i
    yield from starting[i]


def _need(problem: Problem, slots: _Slots, i: int, j: int, unit: Unit | None) -> int:
    """Bytes the segments before i must free for the intervals this choice settles."""
    coef = problem.coefficient_table[problem.index[unit.key]] if unit else {}
    need = 0
    for m in range(i, j + 1):
        for k in slots.forward[m]:
            need = max(need, problem.interval_max[k] - coef.get(k, 0))
        for k in slots.backward[m]:  # only this unit's own held inputs can act here
            need = max(need, problem.interval_max[k] - coef.get(k, 0))
    return need


def _cost(unit: Unit | None) -> int:
    """FLOPs first; among equal FLOPs, fewer ops re-run (elementwise ops count 0 FLOPs)."""
    if unit is None:
        return 0
    return unit.cost_flops * 2**32 + min(2**32 - 1, unit.cost_ops)


def _pareto(states: list[_State]) -> list[_State]:
    states.sort(key=lambda s: (s.cost, -s.reduction))
    out: list[_State] = []
    for s in states:
        if not out or s.reduction > out[-1].reduction:
            out.append(s)
    return out
