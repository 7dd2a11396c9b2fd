"""`remat.plan` and `remat.frontier`: from a StepProfile to Plans."""

from __future__ import annotations

import contextlib
import functools
import dataclasses
import gc
from collections.abc import Iterator

from remat.errors import InfeasibleBudget, RematError
from remat.planner import chain, dp, ilp
from remat.planner.budget import parse_budget, parse_rate
from remat.planner.order import in_stable_order
from remat.planner.problem import MAX_SEGMENT, NotAChain, Problem, Unit, chain_group
from remat.planner.recipes import chen_units
from remat.planner.result import already_checkpointed_note, keep_all, make_plan
from remat.types import Plan, Solver, StepProfile
from remat.types.profile import COMPILED_PEAK_MARGIN

SOLVERS = tuple(Solver)
MIB = 2**20
FIXED_DOMINATES = 0.5
"""Parameters, gradients and optimizer state above this share of a peak: checkpointing is not the lever.
The infeasible-budget message measures it against the least peak any plan reaches, explain's
`activations-not-dominant` against the step's measured peak."""
FRONTIER_STEP = 1e-3
"""`frontier` looks for each next plan at least this share of the unplanned peak below the last one: a plan
that saves a few KiB for one more op re-run is not a point a reader can tell from its neighbour."""


def _without_cycle_collection(fn):
    """Run `fn` with Python's cyclic garbage collector paused.  Planning allocates ~10^5 small tuples (a
    100-stage chain) and no reference cycles; the collections those allocations trigger cost 0.2-0.5 s
    of a 0.6 s plan.  Reference counting still frees everything as usual."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return run


@_without_cycle_collection
def plan(
    profile: StepProfile,
    budget: int | float | str,
    solver: str = "auto",
    *,
    max_segment: int = MAX_SEGMENT,
    time_limit_s: float = 60.0,
    offload_bandwidth: float | str | None = None,
    device_flops: float | str | None = None,
) -> Plan:
    """The plan with the least recomputation whose predicted peak fits `budget`.

    Example:
        >>> p = remat.plan(prof, "6GiB")          # or 6 * 2**30, or 0.5 of prof.peak_bytes
        >>> p.peak_bytes, p.recompute_flops, p.decisions

    The budget is the whole step's peak (parameters, gradients, optimizer state,
    activations, temporaries).  Raises `remat.InfeasibleBudget` when no plan fits; its `.min_bytes`
    is the smallest that does.  A compiled step that fits: no plan (NOTE [A compiled step's peak]).

    Decisions are keep, recompute (a checkpoint around one module or a run of
    nn.Sequential children), selective (matmul-like outputs, or `plan.selective_keeps`, kept)
    and, for a CUDA step, offload (saved tensors to pinned CPU memory and back).  Offload
    is weighed in seconds: 2 x bytes / `offload_bandwidth` (measured by a real CUDA
    profile, or given: "16GB/s") against the recomputation's seconds; `device_flops`
    ("400TFLOPs/s") turns them into FLOPs, the cost of a profile that is not timed.

    The cost minimised is seconds when the profile is timed (`profile.timed`: measured
    in real mode, predicted by a roofline in fake mode), FLOPs breaking ties; else FLOPs,
    ops re-run breaking ties (NOTE [The memory model of a plan], Rule 7).

    Known limitations: a real profile's seconds vary a little from run to run, so two
    plans within that noise of each other may swap between runs (both fit the budget);
    checkpointing's own cost per op is the device's constant (16 and 20 us on a CPU, 4
    and 5 on a GPU), not measured per profile (it moved 2-3x between runs, plans with it).
    """
    _check_profile(profile)
    _check_max_segment(max_segment)
    budget_bytes = parse_budget(budget, profile.peak_bytes)
    problem = Problem.of(profile, max_segment, offload_rates(profile, offload_bandwidth, device_flops))
    name = _pick(problem, solver)  # before the budget test: an unknown solver is an error either way
    kept = _nothing_to_recompute(profile, budget_bytes)
    if kept is not None:
        return kept
    chosen = in_stable_order(problem, _solve(problem, name, budget_bytes, time_limit_s))  # Rule 9
    if chosen is None or problem.peak(chosen) > budget_bytes:
        raise _infeasible(profile, problem, name, budget_bytes, time_limit_s)
    return with_tensors_note(profile, make_plan(profile, problem, chosen, name, budget_bytes))


def _nothing_to_recompute(profile: StepProfile, budget_bytes: int) -> Plan | None:
    """The keep-everything plan when the budget is at or above the unplanned peak, or above the compiled step's
    measured peak (NOTE [A compiled step's peak]); else None."""
    if budget_bytes >= profile.peak_bytes:
        return with_tensors_note(profile, keep_all(profile, budget_bytes, KEEP_ALL))
    if 0 < profile.compiled_peak_bytes * (1 + COMPILED_PEAK_MARGIN) <= budget_bytes:
        return keep_all(
            profile,
            budget_bytes,
            f"the compiled step measured {profile.compiled_peak_bytes:,} bytes by "
            f"the {profile.compiled_counter}, within the budget: nothing to recompute",
        )
    return None


TENSORS_NOTE = "This plan counts live tensors;"
KEEP_ALL = "the budget is at or above the unplanned peak: nothing to recompute"


def with_tensors_note(profile: StepProfile, plan: Plan) -> Plan:
    """A plan of a CUDA profile, made without the model, says what the GPU's allocator reserves beyond tensors."""
    r = profile.gpu_reserve
    if r is None:
        return plan
    note = (
        f"{TENSORS_NOTE} on the GPU the caching allocator reserves more: for the unplanned step "
        f"{r.reserved_bytes / MIB:,.1f} MiB where its tensors peak at {profile.peak_bytes / MIB:,.1f} MiB "
        f"({r.expandable_reserved_bytes / MIB:,.1f} MiB with expandable_segments:True). remat.auto and "
        "`remat plan TARGET` check the planned step's reserve against the budget (docs/validation.md §6.2)."
    )
    return dataclasses.replace(plan, notes=[*plan.notes, note])


@_without_cycle_collection
def frontier(
    profile: StepProfile,
    solver: str = "auto",
    max_points: int = 64,
    time_limit_s: float = 60.0,
    offload_bandwidth: float | str | None = None,
    device_flops: float | str | None = None,
    *,
    max_segment: int = MAX_SEGMENT,
) -> list[Plan]:
    """Pareto-optimal plans, from keep-everything down to the least memory possible.

    Example: for p in remat.frontier(prof): print(p.peak_bytes, p.recompute_flops)

    Plans come in order of decreasing peak, each the cheapest for its memory (seconds or
    FLOPs as in `plan`, then the tie-break), and each at least FRONTIER_STEP (0.1%) of the
    unplanned peak below the one before; `plan` at a point's peak returns that point.  The
    last one is always the least-memory plan, also when `max_points` cuts the descent
    short (it then takes the place of the last point reached).
    """
    _check_profile(profile)
    _check_max_segment(max_segment)
    problem = Problem.of(profile, max_segment, offload_rates(profile, offload_bandwidth, device_flops))
    name = _pick(problem, solver)
    plans, costs, step = _descend(profile, problem, name, max_points, time_limit_s)
    least = _solve(problem, name, _min_bytes(problem, name, time_limit_s), time_limit_s)
    if least is not None and problem.peak(least) < plans[-1].peak_bytes:  # cut short by max_points
        least_cost = (problem.cost(least), problem.tie(least))
        _end_with(
            plans,
            costs,
            make_plan(profile, problem, least, name, None),
            least_cost,
            max_points,
            step,
            slack=problem.cost_slack,
        )
    return plans


def _descend(
    profile: StepProfile, problem: Problem, name: Solver, max_points: int, time_limit_s: float
) -> tuple[list[Plan], list[tuple[int, int]], int]:
    """The frontier's plans from keep-everything down, each at least `step` below the last, at most `max_points`;
    their (cost, tie-break), the solvers' own order (`Problem.cost_of`); and `step`."""
    plans = [keep_all(profile, None, "keep everything")]
    costs = [(0, 0)]
    step = max(1, int(profile.peak_bytes * FRONTIER_STEP))
    budget = profile.peak_bytes - step
    while len(plans) < max_points:
        chosen = in_stable_order(problem, _solve(problem, name, budget, time_limit_s))  # Rule 9
        if chosen is None:
            break  # no plan under the last one's peak: the least-memory plan below decides
        p = make_plan(profile, problem, chosen, name, None)
        if p.peak_bytes >= plans[-1].peak_bytes:
            break
        cost = (problem.cost(chosen), problem.tie(chosen))
        if len(plans) > 1 and _no_dearer(cost, costs[-1], problem.cost_slack):
            plans.pop()  # the new plan needs less memory for no more cost: the last one is dominated
            costs.pop()
        plans.append(p)
        costs.append(cost)
        budget = p.peak_bytes - step
    return plans, costs, step


def _end_with(
    plans: list[Plan], costs: list, least: Plan, cost: tuple, max_points: int, step: int, *, slack: int
) -> None:
    """Put the least-memory plan last, in place of the points it dominates, is too near, or needs room from."""
    while len(plans) > 1 and (
        len(plans) >= max_points or _no_dearer(cost, costs[-1], slack) or plans[-1].peak_bytes - least.peak_bytes < step
    ):
        plans.pop()
        costs.pop()
    plans.append(least)


def _no_dearer(cost: tuple[int, int], other: tuple[int, int], slack: int) -> bool:
    """(cost, tie-break) `cost` is no dearer than `other`: costs within `slack` of each other count as equal and
    the tie-breaks decide (NOTE [The memory model of a plan], Rule 8); with no slack, the order of the pairs."""
    if abs(cost[0] - other[0]) <= slack:
        return cost[1] <= other[1]
    return cost[0] < other[0]


def offload_rates(profile: StepProfile, bandwidth, device_flops) -> tuple[float, float] | None:
    """(host bandwidth bytes/s, device FLOP/s) when offload can be weighed for this profile, else None."""
    measured_bw = profile.host_bandwidth_bytes_s
    if profile.device != "cuda":
        if bandwidth is not None:
            raise RematError(
                f"remat: offload moves a GPU step's saved tensors to CPU memory, but this profile's step runs on "
                f"{profile.device}, where it would save nothing. Fix: profile for device='cuda' (mode='fake' works "
                "without a GPU), or leave offload_bandwidth unset."
            )
        return None
    if bandwidth is None and not measured_bw:
        return None  # nothing to weigh transfers with: recompute and selective only (see the plan's notes)
    bw = parse_rate(bandwidth, "offload_bandwidth", "16GB/s") if bandwidth is not None else measured_bw
    if device_flops is not None:
        return bw, parse_rate(device_flops, "device_flops", "400TFLOPs/s")
    if not profile.timed:
        raise RematError(
            "remat: offload is weighed in seconds against recomputation, which needs the GPU's FLOP rate; this "
            f"{profile.mode} profile has no op times to measure it. Fix: pass device_flops (e.g. "
            '"400TFLOPs/s" for bf16 matmuls on an H100), or profile again (a real or fake profile is timed).'
        )
    flops = sum(b.forward_flops for b in profile.blocks if b.depth == 0)
    seconds = sum(b.forward_s for b in profile.blocks if b.depth == 0)
    return bw, flops / seconds if seconds else 0.0


def _check_profile(profile) -> None:
    if not isinstance(profile, StepProfile):
        raise RematError(
            f"remat: expected a StepProfile from remat.profile, saw {type(profile).__name__}. "
            "Fix: prof = remat.profile(model, inputs); remat.plan(prof, budget)."
        )


def _check_max_segment(max_segment) -> None:
    if isinstance(max_segment, bool) or not isinstance(max_segment, int) or max_segment < 1:
        raise RematError(
            f"remat: max_segment is the most blocks one checkpoint may wrap: a whole number of at least 1; saw "
            f"{max_segment!r}. Fix: max_segment=1 for one checkpoint per module, or leave it out ({MAX_SEGMENT})."
        )


def _pick(problem: Problem, solver: str) -> Solver:
    """`solver`, or for AUTO: dp where the blocks of every group with a useful unit run as one chain (`dp.line`:
    a transformer's embeddings, layers, final norm and head), else ilp."""
    if solver not in SOLVERS:
        raise RematError(f"remat: unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}. Fix: pick one.")
    if solver != Solver.AUTO:
        return Solver(solver)
    if dp.line(problem) is not None:
        return Solver.DP
    return Solver.ILP


def _solve(problem: Problem, solver: Solver, budget: int, time_limit_s: float) -> list[Unit] | None:
    """The cheapest units that fit `budget` by `solver`'s method, or None if it finds none."""
    if not any(problem.useful):  # no unit frees anything: only keep-everything exists
        return [] if max(problem.live) <= budget else None
    if solver == Solver.ILP:
        return ilp.solve(problem, budget, time_limit_s)
    with _needs_a_chain(solver):
        if solver == Solver.CHEN:
            chosen = chen_units(problem, chain_group(problem))
            return chosen if problem.peak(chosen) <= budget else None
        return chain.plan(problem, budget, dp.planned_groups(problem), time_limit_s)


def _min_bytes(problem: Problem, solver: Solver, time_limit_s: float) -> int:
    """The least peak `solver` reaches."""
    if not any(problem.useful):
        return max(problem.live)
    if solver == Solver.ILP:
        return ilp.min_peak(problem, time_limit_s)
    with _needs_a_chain(solver):
        if solver == Solver.CHEN:
            return problem.peak(chen_units(problem, chain_group(problem)))
        return chain.min_peak(problem, dp.planned_groups(problem), time_limit_s)


@contextlib.contextmanager
def _needs_a_chain(solver: Solver) -> Iterator[None]:
    try:
        yield
    except NotAChain as e:
        raise RematError(
            f"remat: solver '{solver}' needs a chain of blocks, but {e}. Fix: use solver='ilp' (or 'auto')."
        ) from e


def _by(solver: str) -> str:
    """ " made by Chen's sqrt(n) segments" where the solver was told to use only those; else nothing: "any plan"
    is what remat can do."""
    return " made by Chen's sqrt(n) segments" if solver == "chen" else ""


def _infeasible(
    profile: StepProfile, problem: Problem, solver: Solver, budget: int, time_limit_s: float
) -> InfeasibleBudget:
    least = _min_bytes(problem, solver, time_limit_s)
    workspaces = profile.at_peak.workspaces_bytes
    fixed = held_bytes(profile) + workspaces
    share = fixed / least if least else 0.0
    parts = "parameters + gradients + optimizer state" + (" + cuBLAS's workspaces" if workspaces else "")
    fix = ""
    if share >= FIXED_DOMINATES:
        why = (
            f"{parts} are {fixed / MIB:,.1f} MiB of it ({share:.0%}): "
            "checkpointing cannot go lower; see sharding, mixed precision or a smaller optimizer"
        )
    elif least >= profile.peak_bytes and profile.peak_phase != "optimizer":
        why = (
            f"{parts} are {fixed / MIB:,.1f} MiB of it ({share:.0%}), and no checkpoint of a candidate module lowers "
            "the peak: a checkpoint frees what the ops inside a module save, not what the code around it "
            f"(the forward of {profile.model}, or the next module) saves of its output"
        )
        fix = "put each layer's code in the forward of one module (remat checkpoints modules), or "
    else:
        why = (
            f"{parts} are {fixed / MIB:,.1f} MiB of it ({share:.0%}); the rest is "
            "what the least-memory plan still holds at its peak (block inputs, one block recomputed, the output)"
        )
    already = already_checkpointed_note(profile)
    return InfeasibleBudget(
        f"remat: no plan fits the budget of {budget / MIB:,.1f} MiB ({budget} bytes); the least any "
        f"plan{_by(solver)} reaches is {least / MIB:,.1f} MiB ({least} bytes) — {why}. "
        + (f"Note: {already}. " if already else "")
        + f"Fix: {fix}give a budget of at least {least} bytes, or a smaller batch.",
        min_bytes=least,
        budget_bytes=budget,
    )


def held_bytes(profile: StepProfile) -> int:
    """What a step holds all at once after backward whatever a plan recomputes, compiled or not: parameters,
    buffers, gradients and optimizer state."""
    return profile.param_bytes + profile.grad_bytes + profile.optimizer_bytes + profile.buffer_bytes


def check_above_held(profile: StepProfile, budget: int) -> None:
    """Refuses a budget under `held_bytes`, which no plan reaches, without a plan: before a search that compiles
    its candidates (NOTE [Plans for a compiled step], Rule 8).  The error's `.min_bytes` is that floor, a bound:
    the least a plan reaches is above it."""
    held = held_bytes(profile)
    if budget < held:
        raise InfeasibleBudget(
            f"remat: no plan fits the budget of {budget / MIB:,.1f} MiB ({budget} bytes): parameters + gradients + "
            f"optimizer state are {held / MIB:,.1f} MiB ({held} bytes), all live after backward whatever a plan "
            "recomputes, compiled or not. Expected a budget above that. Fix: give a budget of more than "
            f"{held} bytes; to go lower, see sharding, mixed precision or a smaller optimizer.",
            min_bytes=held,
            budget_bytes=budget,
        )
