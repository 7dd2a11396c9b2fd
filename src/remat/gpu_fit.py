"""Plans whose GPU reserve fits the budget: NOTE [A plan fits the GPU's reserve]."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from remat.applier.apply import apply, remove
from remat.errors import InfeasibleBudget
from remat.measure.profiling import profile
from remat.planner.api import TENSORS_NOTE
from remat.planner.api import plan as make_plan
from remat.report.text import fmt_bytes
from remat.types import Plan, StepProfile
from remat.types.reserve import EXPANDABLE, GpuReserve

# NOTE [A plan fits the GPU's reserve]
# On CUDA a budget is what the GPU has, and the caching allocator reserves more than the live tensors the planner
# counts (NOTE [The caching allocator's reserve] in `remat.measure.device.cuda_allocator`): on an H200 (2026-11-26) none
# of nine plans made to a budget of tensor bytes ran under a cap of that budget.  With the model at hand
# (`remat.auto`, `remat plan TARGET`), a plan for a CUDA step is checked before it is returned:
# Rule 1: the planned step is profiled in fake mode on the profile's device, with its loop and optimizer, and
#         replayed through the allocator (`plan.gpu_reserve`).  That profile also counts what the plan's own peak
#         formula misses (the bf16 Llama of docs/validation.md section 6: 3% under its planned step's tensors).
# Rule 2: a reserve fits when it is RESERVE_MARGIN under the budget.  While the default allocator's does not, plan
#         again for tensors of the budget less the excess (at least MIN_STEP less each time) and at least MIN_STEP
#         under the plan checked, else the same plan comes back (GPT-2 at 80% once spent all four checks on one plan
#         470 MiB under a budget of 491); where that is below what any plan reaches, the least-memory plan, then no
#         more (a target is never below 1 byte: Qwen2-1.5B's least plan on a 24 GiB GPU reserved 11 GiB over it,
#         the target fell to 0 and `remat fit` stopped on a budget error); at most TRIALS plans in all; the first
#         that fits is the plan.
# Rule 3: if none fits, the checked plan of least cost whose reserve with expandable segments fits is the plan,
#         `plan.allocator` says the setting it needs, and a note says to set it before torch is imported
#         (`remat.auto`, which applies the plan in a process whose allocator is set already, warns where it is not).
# Rule 4: if none fits either way, remat.InfeasibleBudget, with the least budget the plans seen would fit.
# Rule 5: where CUDA is simulated on the CPU, a plan that may offload (offload rates given) is not checked, and says
#         so: its planned step's saved tensors would go to "host" memory that is the CPU's own.
# What it cannot fix: allocations the fake step does not see, and where the allocator puts each block.  On the
# H200 (2026-11-27) the replay's reserve was -10.5% to +9.3% of the measured one uncapped, and all ten plans of the
# GPU check ran under a cap of their budget (docs/validation.md section 6.1); `remat.verify` on the GPU is the check.
# `remat.plan(profile, budget)` has no model to profile: its plan counts tensors, and for a CUDA profile a note says
# what the unplanned step reserves beyond them.

TRIALS = 4
MIN_STEP = 2 * 2**20
NOT_REPLAYED = (
    "The GPU reserve of a plan that may offload is not checked where CUDA is simulated on the CPU: the "
    "offloaded tensors would stay in the memory replayed (docs/validation.md §6.2)."
)
RANK_NOT_REPLAYED = (
    "The GPU reserve of this plan for one rank of a job is not checked: its step is predicted on a "
    "sharded copy of the model, which the plan's checkpoints do not reach. On the GPUs, remat.verify "
    "in a rank measures it."
)
RESERVE_MARGIN = 0.04
"""Rule 2's room for the replay's error: on the H200 its reserve was 0.1-3.4% under the measured one for BERT's and
the Llama's steps, planned and not (docs/validation.md section 6.2)."""


def fit_reserve(
    first: Plan, budget: int, replan: Callable[[int], Plan], reserve_of: Callable[[Plan], GpuReserve]
) -> Plan:
    """Rules 2-4: `first` (planned for `budget`) or a plan for fewer tensor bytes (`replan(bytes)`), checked by
    `reserve_of(plan)` (Rule 1)."""
    checked: list[Plan] = []
    candidate, target, least = first, budget, 0
    for _ in range(TRIALS):
        candidate = dataclasses.replace(candidate, gpu_reserve=reserve_of(candidate))
        checked.append(candidate)
        if _fits(gpu_reserve(candidate).reserved_bytes, budget):
            return _noted(candidate, "")
        over = int(gpu_reserve(candidate).reserved_bytes * (1 + RESERVE_MARGIN)) - budget
        if target <= least:
            break  # the least-memory plan was checked
        target = max(min(target - max(over, MIN_STEP), candidate.peak_bytes - MIN_STEP), least, 1)
        try:
            candidate = replan(target)
        except InfeasibleBudget as e:  # below the least-memory plan: check that one last
            target = least = e.min_bytes
            try:
                candidate = replan(target)
            except InfeasibleBudget:
                break
    expandable = [p for p in checked if _fits(gpu_reserve(p).expandable_reserved_bytes, budget)]
    if expandable:
        return _noted(min(expandable, key=lambda p: (p.extra_s, p.recompute_flops)), EXPANDABLE)
    raise _nothing_fits(checked, budget)


def gpu_reserve(step: Plan | StepProfile) -> GpuReserve:
    """The caching allocator's reserve a CUDA step's profile, or a plan checked against it, carries."""
    assert step.gpu_reserve is not None, "a CUDA step's profile and the plans checked on it carry their reserve"
    return step.gpu_reserve


def _fits(reserved: int, budget: int) -> bool:
    """Rule 2's test: the replayed reserve with RESERVE_MARGIN to spare."""
    return reserved * (1 + RESERVE_MARGIN) <= budget


def _nothing_fits(checked: list[Plan], budget: int) -> InfeasibleBudget:
    """Rule 4: the least reserve seen, with the allocator setting that had it."""
    need, setting, plan = min(
        (
            min((gpu_reserve(p).reserved_bytes, ""), (gpu_reserve(p).expandable_reserved_bytes, EXPANDABLE)) + (p,)
            for p in checked
        ),
        key=lambda t: t[0],
    )
    least = int(need * (1 + RESERVE_MARGIN)) + 1
    with_setting = f" with PYTORCH_CUDA_ALLOC_CONF={setting}" if setting else ""
    plans = f"{len(checked)} plan{'s' if len(checked) > 1 else ''} checked"
    return InfeasibleBudget(
        f"remat: no plan's step fits a GPU budget of {fmt_bytes(budget, 'auto')}: of {plans}, the one with "
        f"{fmt_bytes(plan.peak_bytes, 'auto')} of tensors would have the caching allocator reserve "
        f"{fmt_bytes(need, 'auto')}{with_setting}, and a budget needs {RESERVE_MARGIN:.0%} more than that "
        f"(docs/validation.md §6.2). Fix: give a budget of at least {least} bytes "
        f"({fmt_bytes(least, 'auto')}){with_setting}, or a smaller batch.",
        min_bytes=least,
        budget_bytes=budget,
    )


def _noted(plan: Plan, allocator: str) -> Plan:
    r = gpu_reserve(plan)
    note = (
        f"On the GPU the caching allocator would reserve {fmt_bytes(r.reserved_bytes, 'auto')} for this step "
        f"({fmt_bytes(r.expandable_reserved_bytes, 'auto')} with {EXPANDABLE}); the budget is "
        f"{fmt_bytes(plan.budget_bytes, 'auto') if plan.budget_bytes is not None else 'not set'} "
        "(docs/validation.md §6.2)."
    )
    if allocator:
        note += (
            f" Only {EXPANDABLE} makes it hold: set PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE} before torch is "
            "imported (in the shell, or first thing in the script)."
        )
    notes = [n for n in plan.notes if not n.startswith(TENSORS_NOTE)]  # the reserve is checked: this note says more
    return dataclasses.replace(plan, allocator=allocator, notes=[*notes, note])


def fit_gpu(
    model: nn.Module,
    step: tuple,
    prof: StepProfile,
    first: Plan,
    plan_options: dict | None = None,
    profile_options: dict | None = None,
) -> Plan:
    """`first` (remat.plan's for `first.budget_bytes`) checked against the GPU's reserve and planned again until it
    fits (NOTE [A plan fits the GPU's reserve]); `first` itself where `prof` is no CUDA step or has no budget.
    `step` is (inputs, loss_fn, optimizer); `profile_options` what `prof` was profiled with besides them."""
    if prof.gpu_reserve is None or first.budget_bytes is None:
        return first
    if prof.simulated_device and (first.offload or (plan_options or {}).get("offload_bandwidth")):
        return dataclasses.replace(first, notes=[*first.notes, NOT_REPLAYED])
    if prof.world_size > 1:  # a predicted rank: the copy remat shards cannot carry the plan (it wraps the model)
        return dataclasses.replace(first, notes=[*first.notes, RANK_NOT_REPLAYED])
    options = {**(profile_options or {}), "mode": "fake", "device": prof.device}

    def replan(target: int) -> Plan:
        return dataclasses.replace(make_plan(prof, target, **(plan_options or {})), budget_bytes=first.budget_bytes)

    seen: dict[tuple, GpuReserve] = {}  # a lower target often gives a plan checked already: profile it once

    def reserve_of(plan: Plan) -> GpuReserve:
        key = (repr(plan.segments), repr(plan.selective), repr(plan.offload), repr(plan.selective_keeps))
        if key not in seen:
            seen[key] = planned_reserve(model, step, prof, plan, options)
        return seen[key]

    return fit_reserve(first, first.budget_bytes, replan, reserve_of)


def planned_reserve(
    model: nn.Module, step: tuple, prof: StepProfile, plan: Plan, options: dict[str, Any]
) -> GpuReserve:
    """Rule 1: the reserve of `model`'s step under `plan`; the unplanned profile's for a plan that changes nothing."""
    if not (plan.segments or plan.selective or plan.offload):
        return gpu_reserve(prof)
    inputs, loss_fn, optimizer = step
    apply(model, plan)
    try:
        planned = profile(model, inputs, loss_fn, optimizer, **options)
    finally:
        remove(model)
    return gpu_reserve(planned)
