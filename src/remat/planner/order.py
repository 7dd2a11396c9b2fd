"""A stable order among plans that cost the same: NOTE [The memory model of a plan], Rule 9.

The layers of a transformer are copies: the same ops, the same seconds (NOTE [The seconds of a step], Rule 6),
the same FLOPs.  A plan that recomputes layer 1 and checkpoints layer 2 selectively often costs, to the
nanosecond, what the one doing it the other way round costs, at the same peak; which of the two a solver returns
then depends on the rest of the numbers it is given, which a measured profile's noise moves.  `remat demo` run
twice printed the two.  So a plan's units are put in a stable order: where swapping what two units of one group
do (their action and kept ops) gives a plan of the same cost and tie-break, no higher peak, the unit of the
smaller kind goes first (recompute before selective before offload; selective variants by their kept ops), and
a run of several layers goes as early as such a plan allows (three demo runs put one over h.0..h.1, h.0..h.1 and
h.1..h.2, the same plan otherwise).
"""

from __future__ import annotations

from remat.planner.problem import Problem, Unit
from remat.types import Action

_ACTION_ORDER = {Action.RECOMPUTE: 0, Action.SELECTIVE: 1, Action.OFFLOAD: 2}


def in_stable_order(problem: Problem, chosen: list[Unit] | None) -> list[Unit] | None:
    """`chosen`, or the plan of the same cost, tie-break and no higher peak whose units are in the stable order."""
    if chosen is None or len(chosen) < 2:
        return chosen
    places = {(u.group, u.position, len(u.blocks), u.action, u.keeps): i for i, u in enumerate(problem.units)}
    rank, peak = (problem.cost(chosen), problem.tie(chosen)), problem.peak(chosen)
    current = list(chosen)
    for _ in range(4 * len(problem.units)):  # each step moves a smaller kind or a run earlier: far fewer than this
        swapped = _one_swap(problem, current, places, rank, peak) or _one_shift(problem, current, places, rank, peak)
        if swapped is None:
            break
        current = swapped
    return sorted(current, key=lambda u: (u.group, u.position))  # and listed in the model's order


def _kind(u: Unit) -> tuple:
    return _ACTION_ORDER[u.action], u.keeps


def _as_good(problem: Problem, new: list[Unit], rank: tuple, peak: int) -> bool:
    return problem.compatible(new) and (problem.cost(new), problem.tie(new)) == rank and problem.peak(new) <= peak


def _one_shift(problem: Problem, chosen: list[Unit], places: dict, rank: tuple, peak: int) -> list[Unit] | None:
    """`chosen` with a run of several blocks moved one block earlier, the one-block unit before it moved to the
    run's last block, if that plan is as good; else None (runs come first among copies)."""
    at = {(u.group, u.position): u for u in chosen if len(u.blocks) == 1}
    for run in sorted((u for u in chosen if len(u.blocks) > 1), key=lambda u: (u.group, u.position)):
        single = at.get((run.group, run.position - 1))
        if single is None:
            continue
        new = _replaced(
            problem,
            chosen,
            (run, single),
            places,
            (
                (run.group, run.position - 1, len(run.blocks), run.action, run.keeps),
                (run.group, run.position + len(run.blocks) - 1, 1, single.action, single.keeps),
            ),
        )
        if new is not None and _as_good(problem, new, rank, peak):
            return new
    return None


def _one_swap(problem: Problem, chosen: list[Unit], places: dict, rank: tuple, peak: int) -> list[Unit] | None:
    """`chosen` with the first pair out of order swapped, if that plan is as good; else None."""
    ordered = sorted(chosen, key=lambda u: (u.group, u.position))
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.group != a.group or len(b.blocks) != len(a.blocks) or _kind(b) >= _kind(a):
                continue
            new = _replaced(
                problem,
                chosen,
                (a, b),
                places,
                (
                    (a.group, a.position, len(a.blocks), b.action, b.keeps),
                    (b.group, b.position, len(b.blocks), a.action, a.keeps),
                ),
            )
            if new is not None and _as_good(problem, new, rank, peak):
                return new
    return None


def _replaced(
    problem: Problem, chosen: list[Unit], old: tuple[Unit, Unit], places: dict, keys: tuple[tuple, tuple]
) -> list[Unit] | None:
    """`chosen` with the two units `old` replaced by the units at `keys` (group, position, blocks, action, keeps),
    or None where either is not a unit or frees nothing."""
    found = [i for key in keys if (i := places.get(key)) is not None and problem.useful[i]]
    if len(found) < len(keys):
        return None
    return [u for u in chosen if u is not old[0] and u is not old[1]] + [problem.units[i] for i in found]
