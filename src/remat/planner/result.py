"""From the units a solver chose to the `Plan` it hands the user."""

from __future__ import annotations

import dataclasses

from remat.errors import listing
from remat.planner.problem import Problem, Unit
from remat.planner.units import called_directly
from remat.types import KEEP_ALL_SOLVER, Action, Plan, PlannedBlock, StepProfile
from remat.types.kinds import ParallelKind

BATCHNORM_NOTE = "a recomputed block has BatchNorm in training mode: apply keeps its running statistics exact"
OFFLOAD_NOTE = "offload not weighed: give offload_bandwidth (and device_flops for a fake profile) to consider it"
FSDP_NOTE = (
    "the step is sharded with FSDP2: each checkpoint wraps one module, since one over several FSDP units would run "
    "them without the hooks that gather their parameters"
)


def make_plan(profile: StepProfile, problem: Problem, chosen: list[Unit], solver: str, budget: int | None) -> Plan:
    """The Plan of `chosen` units: decisions per candidate, predicted peak and costs (Rule 3)."""
    decided = {b: u.action for u in chosen for b in u.covers}
    offloaded = [u for u in chosen if u.action == Action.OFFLOAD]
    recomputed = [u for u in chosen if u.action != Action.OFFLOAD]
    return Plan(
        model=profile.model,
        solver=solver,
        decisions={b.name: decided.get(b.name, Action.KEEP) for b in profile.blocks},
        segments=[list(u.blocks) for u in chosen if u.action == Action.RECOMPUTE],
        selective=[u.blocks[0] for u in chosen if u.action == Action.SELECTIVE],
        selective_keeps={u.blocks[0]: list(u.keeps) for u in chosen if u.action == Action.SELECTIVE and u.keeps},
        peak_bytes=problem.peak(chosen),
        recompute_flops=sum(u.cost_flops for u in recomputed),
        recompute_s=sum(u.cost_ns for u in recomputed) / 1e9,  # Rule 7: the sum the solver ranked
        recompute_ops=sum(u.cost_ops for u in chosen),
        offload=[u.blocks[0] for u in offloaded],
        offload_bytes=sum(u.transfer_bytes for u in offloaded),
        offload_s=sum(u.cost_s for u in offloaded),
        unplanned_peak_bytes=profile.peak_bytes,
        budget_bytes=budget,
        blocks=[PlannedBlock(b.name, b.type) for b in profile.blocks],
        called_directly=called_directly(profile),
        step_flops=profile.forward_flops + profile.backward_flops,
        step_time_s=profile.step_time_s,
        timing=profile.timing,
        parallel=profile.parallel,
        notes=_notes(profile, problem, recomputed, solver),
    )


def already_checkpointed_note(profile: StepProfile) -> str | None:
    """What the plan leaves to checkpointing the model does itself, and what a budget is a share of then."""
    done = [
        b.name for b in profile.blocks if b.checkpointed and b.checkpoint_kind != "remat"
    ]  # remat's: not the model's
    if not done:
        return None
    return (
        f"the model checkpoints {listing(done, 3)} itself in the profiled step (Hugging Face gradient "
        "checkpointing, or torch.utils.checkpoint in its code): remat plans around them, and a budget given as a "
        "share is of the peak with them. To let remat plan them too, turn that off "
        "(model.gradient_checkpointing_disable(), or take out the checkpoint calls) and profile again"
    )


def _notes(profile: StepProfile, problem: Problem, recomputed: list[Unit], solver: str) -> list[str]:
    notes = [n for n in [already_checkpointed_note(profile)] if n]
    if profile.parallel == ParallelKind.FSDP:
        notes.append(FSDP_NOTE)
    if any(profile.block(b).has_batchnorm for u in recomputed for b in u.blocks):
        notes.append(BATCHNORM_NOTE)
    offload_weighed = any(u.action == Action.OFFLOAD for u in problem.units)
    if profile.device == "cuda" and not offload_weighed and solver != KEEP_ALL_SOLVER:
        notes.append(OFFLOAD_NOTE)
    return notes


def keep_all(profile: StepProfile, budget: int | None, note: str) -> Plan:
    """The plan that checkpoints nothing: the unplanned step, with `note` saying why."""
    problem = Problem(list(profile.timeline.live_bytes), [], {}, {}, profile.model)
    plan = make_plan(profile, problem, [], KEEP_ALL_SOLVER, budget)
    return with_notes(plan, [note, *plan.notes])


def with_notes(plan: Plan, notes: list[str]) -> Plan:
    return dataclasses.replace(plan, notes=notes)
