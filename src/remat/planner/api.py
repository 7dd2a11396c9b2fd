"""`remat.plan` and `remat.frontier`: from a StepProfile to Plans."""

from __future__ import annotations

import logging

from remat.errors import InfeasibleBudget, RematError
from remat.planner import chen, dp, ilp
from remat.planner.budget import parse_budget
from remat.planner.plan import Plan, PlannedBlock
from remat.planner.problem import MAX_SEGMENT, Problem, Unit
from remat.types import StepProfile

log = logging.getLogger(__name__)

SOLVERS = ("auto", "dp", "ilp", "chen")
MIB = 2**20


def plan(
    profile: StepProfile,
    budget: int | float | str,
    solver: str = "auto",
    *,
    max_segment: int = MAX_SEGMENT,
    time_limit_s: float = 60.0,
) -> Plan:
    """The plan with the least recomputation whose predicted peak fits `budget`.

    Example:
        >>> p = remat.plan(prof, "6GiB")          # or 6 * 2**30, or 0.5 of prof.peak_bytes
        >>> p.peak_bytes, p.recompute_flops, p.decisions

    The budget is the whole step's peak (parameters, gradients, optimizer state,
    activations, temporaries).  Raises `remat.InfeasibleBudget` when no plan fits;
    its `.min_bytes` is the smallest budget that does.

    Decisions are keep, recompute (a checkpoint around one module or a run of
    nn.Sequential children) or selective (matmul-like outputs kept, the rest recomputed).

    Known limitations: offload to CPU memory is not planned yet; FLOPs are the cost, so
    elementwise ops (which `FlopCounterMode` counts as 0) look free to recompute.
    """
    _check_profile(profile)
    if solver not in SOLVERS:
        raise RematError(f"remat: unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}. Fix: pick one.")
    budget_bytes = parse_budget(budget, profile.peak_bytes)
    problem = Problem.from_profile(profile, max_segment)
    if budget_bytes >= profile.peak_bytes:
        return _keep_all(profile, budget_bytes, "the budget is at or above the unplanned peak: nothing to recompute")
    name = _pick(problem, solver)
    chosen = _solve(problem, name, budget_bytes, time_limit_s)
    if chosen is None or problem.peak(chosen) > budget_bytes:
        raise _infeasible(profile, problem, name, budget_bytes, time_limit_s)
    return make_plan(profile, problem, chosen, name, budget_bytes)


def frontier(profile: StepProfile, solver: str = "auto", max_points: int = 64, time_limit_s: float = 60.0) -> list[Plan]:
    """Pareto-optimal plans, from keep-everything down to the least memory possible.

    Example: for p in remat.frontier(prof): print(p.peak_bytes, p.recompute_flops)
    """
    _check_profile(profile)
    problem = Problem.from_profile(profile)
    name = _pick(problem, solver)
    plans = [_keep_all(profile, None, "keep everything")]
    budget = profile.peak_bytes - 1
    while len(plans) < max_points:
        chosen = _solve(problem, name, budget, time_limit_s)
        if chosen is None:
            break
        p = make_plan(profile, problem, chosen, name, None)
        if p.peak_bytes >= plans[-1].peak_bytes:
            break
        plans.append(p)
        budget = p.peak_bytes - 1
    return plans


def baseline_plans(profile: StepProfile) -> dict[str, Plan]:
    """The hand recipes on the same chain: checkpoint_sequential(2..n), every block, Chen's sqrt(n)."""
    problem = Problem.from_profile(profile)
    group = dp.chain_group(problem)
    n = len(problem.groups[group])
    recipes = {"every-block": chen.segments_every_block(n), "chen": chen.segments_chen(n)}
    for k in range(2, n + 1):
        recipes[f"checkpoint_sequential({k})"] = chen.segments_checkpoint_sequential(n, k)
    return {
        name: make_plan(profile, problem, chen.units_for(problem, group, segs), name, None)
        for name, segs in recipes.items()
    }


def make_plan(profile: StepProfile, problem: Problem, chosen: list[Unit], solver: str, budget: int | None) -> Plan:
    decided = {b: u.action for u in chosen for b in u.covers}
    notes = []
    if any(profile.block(b).has_batchnorm for u in chosen for b in u.blocks):
        notes.append("a recomputed block has BatchNorm in training mode: apply keeps its running statistics exact")
    return Plan(
        model=profile.model,
        solver=solver,
        decisions={b.name: decided.get(b.name, "keep") for b in profile.blocks},
        segments=[list(u.blocks) for u in chosen if u.action == "recompute"],
        selective=[u.blocks[0] for u in chosen if u.action == "selective"],
        peak_bytes=problem.peak(chosen),
        recompute_flops=problem.cost(chosen),
        recompute_s=sum(u.cost_s for u in chosen),
        unplanned_peak_bytes=profile.peak_bytes,
        budget_bytes=budget,
        blocks=[PlannedBlock(b.name, b.type, b.output_bytes) for b in profile.blocks],
        step_flops=profile.forward_flops + profile.backward_flops,
        notes=notes,
    )


def _keep_all(profile: StepProfile, budget: int | None, note: str) -> Plan:
    problem = Problem(list(profile.timeline.live_bytes), [], {}, {}, profile.model)
    p = make_plan(profile, problem, [], "keep", budget)
    return Plan(**{**_fields(p), "notes": [note]})


def _fields(p: Plan) -> dict:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


def _check_profile(profile) -> None:
    if not isinstance(profile, StepProfile):
        raise RematError(
            f"remat: expected a StepProfile from remat.profile, saw {type(profile).__name__}. "
            "Fix: prof = remat.profile(model, inputs); remat.plan(prof, budget)."
        )


def _pick(problem: Problem, solver: str) -> str:
    if solver != "auto":
        return solver
    if len(problem.groups) == 1 and any(problem.useful):
        try:
            dp._slots(problem, *dp._chain_units(problem, next(iter(problem.groups))))
            return "dp"
        except dp.NotAChain:
            pass
    return "ilp"


def _solve(problem: Problem, solver: str, budget: int, time_limit_s: float) -> list[Unit] | None:
    if not any(problem.useful):  # no unit frees anything: only keep-everything exists
        return [] if max(problem.live) <= budget else None
    if solver == "ilp":
        return ilp.solve(problem, budget, time_limit_s)
    group = dp.chain_group(problem)
    if solver == "chen":
        n = len(problem.groups[group])
        chosen = chen.units_for(problem, group, chen.segments_chen(n))
        return chosen if problem.peak(chosen) <= budget else None
    try:
        return dp.solve(problem, budget, group)
    except dp.NotAChain as e:
        raise RematError(
            f"remat: solver 'dp' needs a chain of blocks, but {e}. Fix: use solver='ilp' (or 'auto')."
        ) from e


def _min_bytes(problem: Problem, solver: str, time_limit_s: float) -> int:
    if not any(problem.useful):
        return max(problem.live)
    if solver == "ilp":
        return ilp.min_peak(problem, time_limit_s)
    if solver == "chen":
        group = dp.chain_group(problem)
        return problem.peak(chen.units_for(problem, group, chen.segments_chen(len(problem.groups[group]))))
    return dp.min_peak(problem, dp.chain_group(problem))


def _infeasible(profile: StepProfile, problem: Problem, solver: str, budget: int, time_limit_s: float) -> InfeasibleBudget:
    least = _min_bytes(problem, solver, time_limit_s)
    fixed = profile.param_bytes + profile.grad_bytes + profile.optimizer_bytes + profile.buffer_bytes
    share = fixed / least if least else 0.0
    if share >= 0.5:
        why = (
            f"parameters + gradients + optimizer state are {fixed / MIB:,.1f} MiB of it ({share:.0%}): "
            "checkpointing cannot go lower; see sharding, mixed precision or a smaller optimizer"
        )
    else:
        why = (
            f"parameters + gradients + optimizer state are {fixed / MIB:,.1f} MiB of it ({share:.0%}); the rest is "
            "what the least-memory plan still holds at its peak (block inputs, one block recomputed, the output)"
        )
    return InfeasibleBudget(
        f"remat: no plan fits the budget of {budget / MIB:,.1f} MiB ({budget} bytes); the least any "
        f"{solver} plan reaches is {least / MIB:,.1f} MiB ({least} bytes) — {why}. "
        f"Fix: give a budget of at least {least} bytes, or a smaller batch.",
        min_bytes=least,
        budget_bytes=budget,
    )
