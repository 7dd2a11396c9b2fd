"""One setup's training step, predicted for the GPU, and its answer (NOTE [Does a step fit])."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

from torch import nn

from remat.applier.apply import apply, remove
from remat.errors import InfeasibleBudget, NoLoss, RematError, UnsupportedOp
from remat.fit.build import Built, adamw, build
from remat.fit.lora import quiet
from remat.fit.rows import IMAGE, image_shape, one_length, row_words
from remat.fit.outcome import AS_IS, NO, WITH_PLAN, Outcome, fits_reserve, states_of
from remat.fit.setup import FitError, Gpu, Setup
from remat.gpu_fit import MIN_STEP, RESERVE_MARGIN, fit_reserve, gpu_reserve
from remat.measure.profiling import profile
from remat.module_tree import find_candidates, main_chain
from remat.planner.api import plan as remat_plan
from remat.types import Plan, StepProfile
from remat.types.reserve import EXPANDABLE, GpuReserve

POSITIONS = ("max_position_embeddings", "max_target_positions")
"""The config fields that bound `--seq`: a text model's positions, Whisper's decoder's (its labels' tokens)."""

Progress = Callable[[str], None]


def options_for(setup: Setup, gpu: Gpu) -> dict[str, Any]:
    """remat.profile's arguments for the step `remat fit` predicts: a steady AdamW step (`setup.optim`) on a CUDA
    GPU, the loss kept and the output let go before backward (Hugging Face's Trainer), one rank of `world_size`
    (FSDP2)."""
    return {
        "optimizer": functools.partial(adamw, fused=setup.fused),
        "mode": "fake",
        "device": "cuda",
        "hardware": gpu.hardware,
        "keep_output": False,
        "world_size": setup.world_size,
        "wrap": "fsdp",
    }


def profile_step(config, head: str, setup: Setup, gpu: Gpu) -> tuple[Built, StepProfile]:
    """The model built as `setup` trains it, and its step profiled in fake mode for `gpu`."""
    built = build(config, head, setup)
    try:
        prof = _profile(built.model, built.inputs, options_for(setup, gpu))
    except Exception as e:
        if isinstance(e, UnsupportedOp):
            raise FitError(
                f"remat: {built.name}'s training step runs {e.op}, whose result depends on the values in its batch, "
                "which remat fit's fake step does not have (it knows the batch's shape alone); expected a model whose "
                "step follows from its batch's shape. Fix: measure the step on a GPU with your own batch, "
                "`remat profile file.py:factory --mode real --device cuda` (a small batch first)."
            ) from e
        if isinstance(e, NoLoss):
            raise FitError(
                f"remat: {built.name} returned no loss from the batch's labels, so it trains nothing as built (a "
                f"class for inference); remat fit predicts a training step with the model's own loss. Fix: name "
                f'the class that trains in the config\'s "architectures" (e.g. {built.name.removesuffix("WithTeacher")}'
                "), or profile your own model and loss with `remat profile file.py:factory --mode fake --device cuda`."
            ) from e
        missing = _missing_setting(e)
        if missing is not None:
            raise FitError(
                f"remat: {built.name}'s training step reads `{missing}` from its config, which this config lacks "
                f"({type(config).__name__} has no attribute {missing!r}). Expected the model's own config.json, "
                f'where it is set. Fix: add "{missing}" to the config.json, with the value of the model\'s own.'
            ) from e
        why = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". Expected ")[0]
        hint = _hint(config, head, setup) or _dtype_hint(setup, why)
        rows = setup.batch * setup.world_size
        if hint is None and isinstance(e, RematError):
            if "the model's forward raised" not in why:
                raise
            raise FitError(
                f"remat: {built.name}'s forward failed on remat fit's batch of {rows} x "
                f"{row_words(config, head, setup)}: {why.split('forward raised ')[-1]}. Expected a model that "
                "trains on that batch alone (remat fit gives it no other inputs: images, boxes, a language). Fix: "
                "profile the model with your own batch, `remat profile file.py:factory --mode fake --device cuda`."
            ) from e
        hint = hint or f"Fix: check the config and the {'--batch' if head == IMAGE else '--seq and --batch'} asked for"
        raise FitError(
            f"remat: {built.name}'s training step failed on a batch of {rows} x {row_words(config, head, setup)}: "
            f"{hint}. (It said: {why.removeprefix('remat: ')})"
        ) from e
    return built, prof


def _hint(config, head: str, setup: Setup) -> str | None:
    """Why a step the model refused failed, with the fix, where the setup asked for more than the config allows: a
    text model's positions, or another image size than a model that cannot interpolate its own."""
    if head == IMAGE:
        if setup.image_size is None or not _has_size(config) or image_shape(config, setup) == image_shape(config):
            return None
        own = image_shape(config)
        return f"its config's images are {own[1]} x {own[2]} pixels. Fix: --image-size {own[1]}, or leave it out"
    known = [k for k in POSITIONS if isinstance(getattr(config, k, None), int) and getattr(config, k) > 0]
    if known and setup.seq > getattr(config, known[0]):  # not XLNet's -1: its relative positions have no bound
        limit = getattr(config, known[0])
        return f"its config allows at most {limit} positions ({known[0]}). Fix: --seq {limit} or shorter"
    only = one_length(config)
    if only is not None and setup.seq != only:
        return f"it trains on sequences of {only} tokens (its axial_pos_shape). Fix: --seq {only}"
    return None


HALVES = {"bf16": ("bfloat16",), "fp16": ("float16", "half")}
"""The words a model's error names the dtype of its weights in, for the `--dtype` that trains in it alone."""


def _dtype_hint(setup: Setup, why: str) -> str | None:
    """Where weights in bf16 or fp16 (`--dtype bf16`) fail in the model's own code, and its error names that dtype
    (XLNet adds a float32 tensor to bf16 ones; FNet's FFT has no bf16 kernel), the fix is fp32 weights, forward
    under autocast (the Trainer's `bf16=True` trains so), or fp32 throughout."""
    if setup.dtype not in HALVES or not any(w in why.lower() for w in HALVES[setup.dtype]):
        return None
    return (
        f"its code does not run with its weights in {setup.dtype} (the error names that dtype). Fix: --dtype "
        f"amp-{setup.dtype} (fp32 weights, forward under {setup.dtype} autocast: the Trainer's {setup.dtype}=True), "
        "or --dtype fp32"
    )


def _has_size(config) -> bool:
    try:
        return bool(image_shape(config))
    except FitError:
        return False


def _missing_setting(e: BaseException | None) -> str | None:
    """The config attribute whose absence raised `e` (or an exception it was raised from), if one did."""
    from transformers import PretrainedConfig

    while e is not None:
        if isinstance(e, AttributeError) and isinstance(getattr(e, "obj", None), PretrainedConfig):
            return e.name
        e = e.__cause__
    return None


def judge(built: Built, prof: StepProfile, setup: Setup, gpu: Gpu, progress: Progress | None = None) -> Outcome:
    """NOTE [Does a step fit] for a profiled step: as is, with a plan fitted to the GPU's reserve, or not."""
    reserve, budget = gpu_reserve(prof), gpu.memory_bytes
    base = Outcome(setup, NO, profile=prof, states_bytes=states_of(prof))
    for allocator, reserved in (("", reserve.reserved_bytes), (EXPANDABLE, reserve.expandable_reserved_bytes)):
        if fits_reserve(reserved, budget):
            return dataclasses.replace(
                base, verdict=AS_IS, allocator=allocator, reserve_bytes=reserved, peak_bytes=prof.peak_bytes
            )
    try:
        first = make_plan(prof, budget)
    except InfeasibleBudget as e:
        return dataclasses.replace(base, least_bytes=e.min_bytes, least_tensors_bytes=e.min_bytes)
    if progress:
        progress("replaying planned steps through the GPU's caching allocator")
    checked: list[tuple[Plan, GpuReserve]] = []
    replan = _replanner(prof, budget, checked)
    guess = int(budget / (1 + RESERVE_MARGIN)) - (reserve.reserved_bytes - prof.peak_bytes)
    if first.peak_bytes > guess:  # NOTE [Does a step fit], Rule 2: the first plan checked
        first = replan(guess)
    try:
        plan = fit_reserve(first, budget, replan, reserve_checker(built, prof, setup, gpu, checked))
    except InfeasibleBudget as e:
        return dataclasses.replace(
            base, least_bytes=e.min_bytes, least_is_reserve=True, least_tensors_bytes=least_tensors(prof)
        )
    timed, planned = bool(plan.step_time_s), gpu_reserve(plan)
    return dataclasses.replace(
        base,
        verdict=WITH_PLAN,
        allocator=plan.allocator,
        plan=plan,
        reserve_bytes=planned.expandable_reserved_bytes if plan.allocator else planned.reserved_bytes,
        peak_bytes=plan.peak_bytes,
        extra_fraction=plan.extra_fraction if timed else plan.recompute_fraction,
        extra_unit="time" if timed else "FLOPs",
    )


def make_plan(prof: StepProfile, budget: int) -> Plan:
    """remat.plan by its dp solver; where dp finds none (or the step has no chain), as remat.plan picks, whose
    InfeasibleBudget then gives the least any plan reaches (NOTE [Does a step fit], Rule 5)."""
    try:
        return remat_plan(prof, budget, solver="dp")
    except RematError:  # InfeasibleBudget too: the ilp over the module tree may go lower
        return remat_plan(prof, budget)


def _dp_or_least(prof: StepProfile, budget: int) -> Plan:
    """dp's plan for `budget`; where dp has none, remat.plan's own pick for it, whose ilp may reach lower (an
    encoder-decoder's chain is one of its two stacks); below both, the least-memory plan of the two (Rule 5)."""
    try:
        return remat_plan(prof, budget, solver="dp")
    except InfeasibleBudget as e:
        dp_least = e.min_bytes
    except RematError:
        dp_least = None
    try:
        return remat_plan(prof, budget)
    except InfeasibleBudget as e:
        if dp_least is not None and dp_least <= e.min_bytes:
            return remat_plan(prof, dp_least, solver="dp")
        return remat_plan(prof, e.min_bytes)


def least_tensors(prof: StepProfile) -> int:
    """The least-memory plan's tensors: the least budget remat.plan reaches."""
    try:
        return make_plan(prof, 1).peak_bytes
    except InfeasibleBudget as e:
        return e.min_bytes


def least_plan(prof: StepProfile) -> Plan:
    """The plan with the least memory (its peak is `least_tensors(prof)`)."""
    try:
        return make_plan(prof, 1)
    except InfeasibleBudget as e:
        return make_plan(prof, e.min_bytes)


def _replanner(prof: StepProfile, budget: int, checked: list[tuple[Plan, GpuReserve]]) -> Callable[[int], Plan]:
    """fit_reserve's replan, stepping down from the last checked plan's own tensors (not from the target, which may
    lie far above them: the same plan again) by its reserve's excess, and never below the least-memory plan (planned
    once: the ilp finds it in seconds on an encoder-decoder, where dp's chain is one of its stacks)."""
    least: list[Plan] = []

    def replan(target: int) -> Plan:
        if checked:
            plan, reserve = checked[-1]
            over = int(reserve.reserved_bytes * (1 + RESERVE_MARGIN)) - budget
            target = max(min(target, plan.peak_bytes - max(over, MIN_STEP)), 1)  # 1: the least-memory plan
        if least and target <= least[0].peak_bytes:
            return least[0]
        plan = dataclasses.replace(_dp_or_least(prof, target), budget_bytes=budget)
        if plan.peak_bytes > target:  # the target is below any plan: this is the least-memory plan
            least.append(plan)
        return plan

    return replan


def reserve_checker(
    built: Built, prof: StepProfile, setup: Setup, gpu: Gpu, checked: list | None = None
) -> Callable[[Plan], GpuReserve]:
    """A plan's reserve: its planned step profiled and replayed (NOTE [A plan fits the GPU's reserve], Rule 1), once
    per distinct plan (each plan and its reserve appended to `checked`).  A rank of N shards a copy of the model:
    the plan is applied to that copy, before FSDP2."""
    seen: dict[tuple, GpuReserve] = {}
    options = options_for(setup, gpu)

    def reserve_of(plan: Plan) -> GpuReserve:
        key = (repr(plan.segments), repr(plan.selective), repr(plan.offload), repr(plan.selective_keeps))
        if not (plan.segments or plan.selective or plan.offload):
            seen[key] = gpu_reserve(prof)
        elif key not in seen:
            seen[key] = gpu_reserve(planned_profile(built.model, built.inputs, plan, options))
        if checked is not None:
            checked.append((plan, seen[key]))
        return seen[key]

    return reserve_of


def planned_profile(model: nn.Module, inputs, plan: Plan, options: dict[str, Any]) -> StepProfile:
    """The step of `model` under `plan`, profiled with `options` (remat.profile's)."""
    if options.get("world_size", 1) == 1:
        apply(model, plan)
        try:
            return _profile(model, inputs, options)
        finally:
            remove(model)
    blocks = main_chain(find_candidates(model))

    def shard(copy: nn.Module, mesh) -> nn.Module:  # remat.measure.ranks' "fsdp", the plan applied first
        from torch.distributed.fsdp import fully_shard

        apply(copy, plan)
        for name in blocks:
            fully_shard(copy.get_submodule(name), mesh=mesh)
        return cast(nn.Module, fully_shard(copy, mesh=mesh))

    return _profile(model, inputs, {**options, "wrap": shard})


def _profile(model: nn.Module, inputs, options: dict[str, Any]) -> StepProfile:
    with quiet():
        return profile(model, inputs, **options)
