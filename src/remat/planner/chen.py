"""`chen`: the sqrt(n) segmentation of Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost" (Sec. 4.1): cut the chain into about sqrt(n) segments and
recompute each.  The baseline the literature starts from; it ignores the budget.
Also the other recipes people use by hand, on the same chain, for comparison."""

from __future__ import annotations

import math

from remat.planner.problem import Problem, Unit


def segments_chen(n: int) -> list[tuple[int, int]]:
    size = max(1, round(math.sqrt(n)))
    return [(i, min(n, i + size) - 1) for i in range(0, n, size)]


def segments_checkpoint_sequential(n: int, segments: int) -> list[tuple[int, int]]:
    """What `torch.utils.checkpoint.checkpoint_sequential(fns, segments)` checkpoints: segments-1
    runs of n // segments functions; the remainder at the end runs without checkpoint."""
    size = n // segments
    if size == 0:
        return []
    return [(i, i + size - 1) for i in range(0, size * (segments - 1), size)]


def segments_every_block(n: int) -> list[tuple[int, int]]:
    return [(i, i) for i in range(n)]


def units_for(problem: Problem, group: str, segments: list[tuple[int, int]]) -> list[Unit]:
    """The units for these (first, last) runs of the group; runs that free nothing are left kept."""
    by_span = {
        (u.position, u.position + len(u.blocks) - 1): u
        for u in problem.units
        if u.group == group and u.action == "recompute"
    }
    return [by_span[s] for s in segments if s in by_span]
