"""The recipes people checkpoint with by hand, as units of the planning problem.

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost" (Sec. 4.1): cut the
chain into about sqrt(n) segments and recompute each; the baseline the literature starts
from, which ignores the budget.  Beside it, checkpoint every block, and what
`torch.utils.checkpoint.checkpoint_sequential(fns, k)` checkpoints.  Segments are
(first, last) positions in the chain (`remat.module_tree.main_chain`).
"""

from __future__ import annotations

import math

from remat.errors import RematError
from remat.planner.problem import Group, Problem, Unit, chain_group
from remat.planner.result import make_plan, with_notes
from remat.types import BY_HAND, Action, Plan, Recipe, StepProfile

Segments = list[tuple[int, int]]
SEQUENTIAL = "checkpoint_sequential({k})"


def segments_chen(n: int) -> Segments:
    """About sqrt(n) segments of about sqrt(n) blocks each."""
    size = max(1, round(math.sqrt(n)))
    return [(i, min(n, i + size) - 1) for i in range(0, n, size)]


def segments_checkpoint_sequential(n: int, segments: int) -> Segments:
    """What `checkpoint_sequential(fns, segments)` checkpoints: segments-1 runs of n // segments
    functions; the remainder at the end runs without checkpoint."""
    size = n // segments
    if size == 0:
        return []
    return [(i, i + size - 1) for i in range(0, size * (segments - 1), size)]


def segments_every_block(n: int) -> Segments:
    return [(i, i) for i in range(n)]


RECIPES = {Recipe.EVERY_BLOCK: segments_every_block, Recipe.CHEN: segments_chen}
"""The recipes `remat.apply` takes by name: chain length -> segments."""


def units_for(problem: Problem, group: Group, segments: Segments) -> list[Unit]:
    """The units for these (first, last) runs of the group; runs that free nothing are left kept."""
    by_span = {
        (u.position, u.position + len(u.blocks) - 1): u
        for u in problem.units
        if u.group == group and u.action == Action.RECOMPUTE
    }
    return [by_span[s] for s in segments if s in by_span]


def chen_units(problem: Problem, group: Group) -> list[Unit]:
    """Chen's sqrt(n) segments of the chain, if remat.apply can build them."""
    chosen = units_for(problem, group, segments_chen(len(problem.groups[group])))
    if not all(u.appliable for u in chosen):
        raise RematError(
            f"remat: solver 'chen' checkpoints runs of consecutive blocks, which remat can wrap as one checkpoint "
            f"only inside an nn.Sequential or an nn.ModuleList; the blocks of {group.container or 'the model'} are "
            "in neither (an nn.ModuleDict, or a custom forward calls them). Fix: use solver='dp' or 'ilp' (or "
            "'auto'), which plan one checkpoint per block there."
        )
    return chosen


def baseline_plans(profile: StepProfile) -> dict[str, Plan]:
    """The hand recipes on the chain: every block, Chen's sqrt(n), checkpoint_sequential(2..n)."""
    problem = Problem.from_profile(profile)
    group = chain_group(problem)
    n = len(problem.groups[group])
    cuts: dict[str, Segments] = {name: segments(n) for name, segments in RECIPES.items()}
    for k in range(2, n + 1):
        cuts[SEQUENTIAL.format(k=k)] = segments_checkpoint_sequential(n, k)
    plans = {}
    for name, segments in cuts.items():
        units = units_for(problem, group, segments)
        plan = make_plan(profile, problem, units, name, None)
        plans[name] = plan if all(u.appliable for u in units) else with_notes(plan, [*plan.notes, BY_HAND])
    return plans
