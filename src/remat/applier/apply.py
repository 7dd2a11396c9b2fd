"""`remat.apply`, `remat.remove`, `remat.checkpoint`: plans made real (`remat.auto`, which profiles and plans
first, is in remat/entry.py)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch.nn as nn

from remat._torch_compat import wrapped_module
from remat._torch_compat.distributed import DDP, is_a
from remat.applier.compiler_budget import clear_compiler_budget, optimized_module, set_compiler_budget
from remat.applier.runs import run_of, wrap_run
from remat.applier.wrapping import is_wrapped, unwrap, wrap_offload, wrap_segment
from remat.errors import RematError, listing
from remat.hf import NoCacheInTraining, checkpointed_by_hf
from remat.module_tree import (
    WRAPPED_MARK,
    find_candidates,
    holds_runs,
    is_fsdp_unit,
    join,
    main_chain,
    parent_name,
)
from remat.planner.recipes import RECIPES
from remat.types import Action, Plan, Recipe
from remat.types.kinds import ParallelKind

APPLIED = "_remat_applied"  # on the root model: the Plan (or recipe) applied to it
NO_CACHE = "_remat_no_cache"  # on the root model: its NoCacheInTraining hook while a plan is applied
MARKED = "_remat_marked"  # on a module remat.checkpoint wrapped (not the plan): said and put back as a mark
RECIPE_NAMES = tuple(str(r) for r in Recipe)


def apply(model: nn.Module, plan: Plan | str) -> nn.Module:
    """Make `model`'s training step follow `plan`, in place; returns the model.

    Example:
        >>> remat.apply(model, remat.plan(remat.profile(model, x), "6GiB"))
        >>> remat.apply(model, "every-block")      # or "chen": the classic recipes

    Each of `plan.segments` becomes one non-reentrant checkpoint (RNG preserved,
    BatchNorm statistics kept exact), each of `plan.selective` a selective one (matmul
    outputs kept, the rest recomputed), each of `plan.offload` a module whose saved
    tensors wait in pinned CPU memory between forward and backward; state dict keys do
    not change, and `remat.remove(model)` restores the original forwards.

    One plan at a time: on a model that follows a plan already (from `remat.apply` or
    `remat.auto`, with any `remat.checkpoint` marks), the new plan replaces it, never adds
    to it (that would checkpoint twice): the old one is removed first, and a warning that
    starts "remat:" names what was replaced.  A plan or recipe that does not fit the model
    is refused before anything changes, the old plan still in force.

    `model` may be wrapped, before or after apply, in DistributedDataParallel or
    `torch.compile`: the plan names the modules of the model inside (`bare`), as a profile
    of the bare model does, and a class FSDP2's `fully_shard` renamed (FSDPGPT2Block)
    matches the one it was made from (GPT2Block).

    Known limitations: a segment of several modules must be consecutive children of
    an nn.Sequential or entries of an nn.ModuleList; a module that Hugging Face gradient
    checkpointing already checkpoints is left to it.
    """
    return replace_plan(model, plan, stacklevel=3)


def replace_plan(model: nn.Module, plan: Plan | str, stacklevel: int = 2) -> nn.Module:
    """`remat.apply`, for callers in remat too (`remat.auto`): its warnings name the line `stacklevel` frames up."""
    if not isinstance(model, nn.Module):
        raise RematError(f"remat: apply expects a torch.nn.Module, saw {type(model).__name__}. Fix: pass the model.")
    wrapper, model = model, bare(model)
    segments, selective, offload = _what_to_wrap(model, plan)  # checked before anything changes
    compiler_budget = _compiler_budget(wrapper, model, plan)
    replaced = _taken_off(model)
    if offload and not any(t.is_cuda for t in [*model.parameters(), *model.buffers()]):
        warnings.warn(
            f"remat: the plan offloads {listing(offload, 4)}, but {type(model).__name__} is not on a GPU: its saved "
            "tensors are copied within CPU memory, which saves nothing. Move the model to the GPU the plan was "
            "made for.",
            stacklevel=stacklevel,
        )
    _warn_ddp_buckets(wrapper, model, plan, stacklevel + 1)
    skipped = _wrap_all(model, segments, selective, offload, frozenset(getattr(plan, "called_directly", ())))
    set_compiler_budget(wrapper, model, compiler_budget)
    object.__setattr__(model, APPLIED, plan)
    object.__setattr__(model, NO_CACHE, NoCacheInTraining(model))  # NOTE [The key/value cache in training]
    if replaced:
        warnings.warn(
            f"remat: {type(model).__name__} followed {replaced}; replaced by {_describe(plan)}, not added to "
            "it (one plan at a time; remat.remove(model) undoes it).",
            stacklevel=stacklevel,
        )
    if skipped:
        warnings.warn(
            f"remat: {listing(skipped, 4)} already checkpointed by Hugging Face gradient checkpointing: left to it, "
            "not checkpointed twice.",
            stacklevel=stacklevel,
        )
    return wrapper


def _warn_ddp_buckets(wrapper: nn.Module, model: nn.Module, plan: Plan | str, stacklevel: int) -> None:
    """A plan made for one process, put on a model DistributedDataParallel runs: its gradient buckets (a copy of
    the gradients unless `gradient_as_bucket_view`) are in no profile of the bare model, and the step peaks that
    much over the plan's budget (a 504 MiB plan trained at 529 MiB per rank)."""
    ddp = wrapper
    while ddp is not None and not is_a(ddp, DDP):
        ddp = wrapped_module(ddp)
    if ddp is None or not isinstance(plan, Plan) or plan.parallel == ParallelKind.DDP or ddp.gradient_as_bucket_view:
        return
    buckets = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    warnings.warn(
        f"remat: the plan was made from a profile of {type(model).__name__} in one process, and it runs under "
        f"DistributedDataParallel, whose gradient buckets (about {buckets / 2**20:,.1f} MiB, a copy of the "
        "gradients) that profile did not count: each rank's step may peak that much above the plan's budget. "
        "Fix: plan from a profile of the wrapped model, remat.profile(ddp_model, batch) in each rank, or from a "
        "prediction, remat.profile(model, global_batch, mode='fake', world_size=N, wrap='ddp'); or "
        "DistributedDataParallel(..., gradient_as_bucket_view=True), which keeps no copy.",
        stacklevel=stacklevel,
    )


def bare(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel and `torch.compile` wrappers (nested too); `model` itself
    when it is not wrapped."""
    inner = wrapped_module(model)
    while inner is not None:
        model, inner = inner, wrapped_module(inner)
    return model


def _compiler_budget(wrapper: nn.Module, model: nn.Module, plan: Plan | str) -> float:
    """The plan's `compiler_budget`, checked (NOTE [The compiler's budget as a plan], Rule 3); 1.0 for none."""
    budget = plan.compiler_budget if isinstance(plan, Plan) else 1.0
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 <= budget <= 1.0:
        raise RematError(
            f"remat: a plan's compiler_budget is a fraction of the activations Inductor saves, from 0 "
            f"to 1; saw {budget!r}. Fix: plan again, or set it to 1.0 for the compiler's default."
        )
    if budget == 1.0:
        return budget
    if optimized_module(wrapper) is None:
        raise RematError(
            f"remat: the plan sets torch.compile's activation memory budget ({budget:g}), which acts "
            f"only on a step compiled by torch.compile(model), and this {type(wrapper).__name__} is not "
            "one. Fix: apply the plan to torch.compile(model) (not model.compile()), or plan again for "
            "the eager model."
        )
    return budget


def _what_to_wrap(model: nn.Module, plan: Plan | str) -> tuple[list[list[str]], dict[str, list[str]], list[str]]:
    """(segments, {selective module: signatures of the ops it keeps, [] for matmul-like ones}, offloaded modules)
    of a plan or a recipe, checked against the model."""
    if isinstance(plan, str):
        return _recipe(model, plan), {}, []
    if isinstance(plan, Plan):
        stray = sorted(set(plan.selective_keeps) - set(plan.selective))
        if stray:
            raise RematError(
                f"remat: the plan says which outputs {listing(stray, 4)} keep(s), but does not checkpoint "
                "it selectively (`Plan.selective`). Fix: plan again, or add it to plan.selective."
            )
        segments = _check_plan(model, plan)
        return segments, {n: list(plan.selective_keeps.get(n, [])) for n in plan.selective}, list(plan.offload)
    raise RematError(
        f"remat: apply expects a remat.Plan or one of {RECIPE_NAMES}, saw {type(plan).__name__}. "
        "Fix: pass remat.plan(profile, budget) or 'every-block'."
    )


def remove(model: nn.Module) -> nn.Module:
    """Undo `remat.apply` (and `remat.checkpoint`) on `model`: every module's forward as before.

    A model that follows no plan is returned as it is."""
    if not isinstance(model, nn.Module):
        raise RematError(f"remat: remove expects a torch.nn.Module, saw {type(model).__name__}. Fix: pass the model.")
    wrapper, model = model, bare(model)
    for m in [m for m in model.modules() if is_wrapped(m)]:
        unwrap(m)
        m.__dict__.pop(MARKED, None)
    clear_compiler_budget(model)
    model.__dict__.pop(APPLIED, None)
    if NO_CACHE in model.__dict__:
        model.__dict__.pop(NO_CACHE).remove()
    return wrapper


def checkpoint(module: nn.Module) -> nn.Module:
    """Mark one module for checkpointing, the one-flag way: it is recomputed in backward from now on.

    Example: remat.checkpoint(model.encoder.layer[3]); remat.remove(model) undoes it.

    A flag: on a module remat checkpoints already (marked before, or checkpointed by the plan its model
    follows, alone, in a run of several or selectively) it is a no-op, and raises nothing.  Inside a model
    that follows a plan, it adds to the plan: on a module the plan offloads, the checkpoint takes the
    offload's place (a warning says so); `remat.apply` replaces the marks with the plan, and
    `remat.remove(model)` undoes both.  A module inside one that is checkpointed already gets a checkpoint
    nested in that one: the same gradients, one more forward of it in backward.
    """
    if not isinstance(module, nn.Module):
        raise RematError(
            f"remat: checkpoint expects a torch.nn.Module, saw {type(module).__name__}. Fix: pass a module."
        )
    if is_wrapped(module) and module.__dict__[WRAPPED_MARK].role != "offload":
        return module  # checkpointed already: the flag is set
    if is_wrapped(module):
        unwrap(module)
        warnings.warn(
            f"remat: the plan offloaded this {type(module).__name__}; remat.checkpoint recomputes it "
            "instead (a checkpoint keeps only its inputs, nothing left to offload).",
            stacklevel=2,
        )
    wrap_segment([module])
    object.__setattr__(module, MARKED, True)
    return module


@contextlib.contextmanager
def taken_off(model: nn.Module) -> Iterator[None]:
    """remat's own checkpoints and offloads off `model` meanwhile, so that its step is the model as written (as
    `remat.auto` measures it); put back as they were afterwards, also when the body raises."""
    inner = bare(model)
    before, marks = _state(inner)
    modules = dict(inner.named_modules())
    remove(inner)
    try:
        yield
    finally:
        remove(inner)  # anything a measurement left
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said when they were first applied
            if before is not None:
                replace_plan(model, before)
            for name in marks:
                checkpoint(modules[name])


def _state(model: nn.Module) -> tuple[Plan | str | None, list[str]]:
    """The plan or recipe the bare `model` follows, and the modules `remat.checkpoint` marked (outside it)."""
    return model.__dict__.get(APPLIED), [n for n, m in model.named_modules() if is_wrapped(m) and MARKED in m.__dict__]


def _taken_off(model: nn.Module) -> str:
    """remat's checkpoints removed from the bare `model`; what they were, in words ("" for none)."""
    before, marks = _state(model)
    if before is None and not marks:
        return ""
    remove(model)
    parts = [_describe(before)] if before is not None else []
    return " and ".join(parts + ([f"remat.checkpoint on {listing(marks, 4)}"] if marks else []))


# -- plans and recipes ------------------------------------------------------------------------


def _check_plan(model: nn.Module, plan: Plan) -> list[list[str]]:
    """The plan's segments, after checking that it was made for this model (nothing is changed yet)."""
    modules = dict(model.named_modules())
    missing = [b.name for b in plan.blocks if b.name not in modules]
    named = [n for seg in plan.segments for n in seg] + list(plan.selective) + list(plan.offload)
    missing += [n for n in named if n not in modules and n not in missing]
    if missing:
        raise RematError(
            f"remat: the plan names modules this {type(model).__name__} does not have: {listing(missing, 6)}. "
            f"Expected a plan made for this model (plan.model = "
            f"{plan.model!r}). Fix: profile and plan this model, then apply."
        )
    changed = [
        f"{b.name} ({b.type} in the plan, {type(modules[b.name]).__name__} here)"
        for b in plan.blocks
        if b.type not in {c.__name__ for c in type(modules[b.name]).__mro__}
    ]  # FSDP2: FSDPGPT2Block
    planned = {b.name for b in plan.blocks}
    changed += [
        f"{n} (here, not in the plan)"
        for n in main_chain(find_candidates(model))
        if n not in planned and n not in plan.called_directly
    ]  # never called: its children are planned
    if changed:
        raise RematError(
            f"remat: the plan was made for a different model: {listing(changed, 4)}. "
            f"Expected the modules the plan was made for (plan.model = "
            f"{plan.model!r}). Fix: profile and plan this model, then apply."
        )
    for seg in plan.segments:
        _check_segment(modules, seg)
    return [list(seg) for seg in plan.segments]


def _check_segment(modules: dict[str, nn.Module], seg: list[str]) -> None:
    if len(seg) == 1:
        return
    parent = parent_name(seg[0])
    container = modules.get(parent)
    names = [join(parent, c) for c, _ in container.named_children()] if container is not None else []
    consecutive = seg[0] in names and names[names.index(seg[0]) :][: len(seg)] == list(seg)
    if not (all(parent_name(n) == parent for n in seg) and holds_runs(container) and consecutive):
        raise RematError(
            f"remat: a segment of the plan ({seg[0]} .. {seg[-1]}) is not a run of consecutive children of one "
            "nn.Sequential or nn.ModuleList, so one checkpoint cannot wrap it. Fix: plan again with this version "
            "of remat."
        )
    sharded = [n for n in seg if is_fsdp_unit(modules[n])]
    if sharded:
        raise RematError(
            f"remat: the plan checkpoints {seg[0]} .. {seg[-1]} as one run, but {listing(sharded, 3)} "
            "are FSDP units (fully_shard): each gathers its parameters in its own forward hooks, which a "
            "recomputation of the run would not call. Expected one module per checkpoint on a sharded model. "
            "Fix: plan with max_segment=1 (remat plan --max-segment 1)."
        )


def _recipe(model: nn.Module, recipe: str) -> list[list[str]]:
    if recipe not in RECIPES:
        raise RematError(f"remat: unknown recipe {recipe!r}; expected one of {RECIPE_NAMES} or a Plan. Fix: pick one.")
    blocks = main_chain(find_candidates(model))
    if not blocks:
        raise RematError(
            f"remat: {type(model).__name__} has no submodules to checkpoint. Expected layers in an nn.Sequential "
            "or nn.ModuleList, or named children. Fix: use remat.checkpoint(module) on the part to recompute."
        )
    segments = RECIPES[Recipe(recipe)](len(blocks))
    parent = parent_name(blocks[0])
    container = dict(model.named_modules())[parent]
    if recipe == Recipe.CHEN and not holds_runs(container):
        raise RematError(
            f"remat: the {recipe!r} recipe checkpoints segments of consecutive blocks, which remat can wrap only "
            f"inside an nn.Sequential or an nn.ModuleList; {parent or type(model).__name__} is a "
            f"{type(container).__name__}. Fix: use 'every-block', or remat.plan for a plan that fits a budget."
        )
    runs = [blocks[first : last + 1] for first, last in segments]
    modules = dict(model.named_modules())
    sharded = [n for run in runs if len(run) > 1 for n in run if is_fsdp_unit(modules[n])]
    if sharded:
        raise RematError(
            f"remat: the {recipe!r} recipe checkpoints runs of several blocks as one, but {listing(sharded, 3)} "
            "are FSDP units (fully_shard): each gathers its parameters in its own forward hooks, which recomputing "
            "a run would not call. Expected one block per checkpoint on a sharded model. Fix: "
            "remat.apply(model, 'every-block'), or a plan from remat.plan (it checkpoints sharded blocks one by one)."
        )
    return runs


def _wrap_all(
    model: nn.Module,
    segments: list[list[str]],
    selective: dict[str, list[str]],
    offload: list[str],
    called_directly: frozenset[str] = frozenset(),
) -> list[str]:
    modules = dict(model.named_modules())
    skipped = []
    jobs = [(s, Action.RECOMPUTE) for s in segments] + [([n], Action.SELECTIVE) for n in selective]
    jobs += [([n], Action.OFFLOAD) for n in offload]
    for seg, action in jobs:
        mods = [modules[n] for n in seg]
        if any(checkpointed_by_hf(m) for m in mods):
            skipped += seg  # Hugging Face already checkpoints these: no double checkpointing
            continue
        if action == Action.OFFLOAD:
            wrap_offload(mods[0])
        elif action == Action.RECOMPUTE and (run := run_of(modules, seg, called_directly)) is not None:
            wrap_run(*run)  # entries the model's own code calls: of an nn.ModuleList, or of a Sequential it never calls
        else:
            wrap_segment(mods, selective=action == Action.SELECTIVE, keeps=selective.get(seg[0], []))
    return skipped


def _describe(what) -> str:
    if isinstance(what, str):
        return f"recipe {what!r}"
    if what.compiler_budget < 1.0:
        return f"torch.compile's activation memory budget {what.compiler_budget:g}"
    extra = f" and {len(what.offload)} offloaded modules" if what.offload else ""
    return f"a plan by {what.solver} with {len(what.segments) + len(what.selective)} checkpoints{extra}"


def applied(model: nn.Module) -> Plan | str | None:
    """The plan or recipe `model` (or the model inside its wrappers) follows, if any."""
    return bare(model).__dict__.get(APPLIED)
