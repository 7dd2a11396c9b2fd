"""`remat.apply`, `remat.remove`, `remat.auto`, `remat.checkpoint`: plans made real."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch.nn as nn

from remat.errors import RematError
from remat.measure.candidates import find_candidates, runs_children_in_order
from remat.planner.plan import Plan
from remat.rewrite.wrapping import MARK, is_wrapped, unwrap, wrap_offload, wrap_segment

log = logging.getLogger(__name__)

APPLIED = "_remat_applied"  # on the root model: the Plan (or recipe) applied to it
RECIPES = ("every-block", "chen")


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

    Known limitations: a segment of several modules must be consecutive children of
    an nn.Sequential; a module that Hugging Face gradient checkpointing already
    checkpoints is left to it.
    """
    if not isinstance(model, nn.Module):
        raise RematError(f"remat: apply expects a torch.nn.Module, saw {type(model).__name__}. Fix: pass the model.")
    if APPLIED in model.__dict__:
        raise RematError(
            f"remat: {type(model).__name__} already follows a plan ({_describe(model.__dict__[APPLIED])}); "
            "applying a second one would checkpoint twice. Fix: call remat.remove(model) first."
        )
    selective: list[str] = []
    offload: list[str] = []
    if isinstance(plan, str):
        segments, what = _recipe(model, plan), plan
    elif isinstance(plan, Plan):
        segments, what = _check_plan(model, plan), plan
        selective, offload = list(plan.selective), list(plan.offload)
    else:
        raise RematError(
            f"remat: apply expects a remat.Plan or one of {RECIPES}, saw {type(plan).__name__}. "
            "Fix: pass remat.plan(profile, budget) or 'every-block'."
        )
    if offload and not any(t.is_cuda for t in [*model.parameters(), *model.buffers()]):
        warnings.warn(
            f"remat: the plan offloads {', '.join(offload[:4])}{' ...' if len(offload) > 4 else ''}, but "
            f"{type(model).__name__} is not on a GPU: its saved tensors are copied within CPU memory, which saves "
            "nothing. Move the model to the GPU the plan was made for.",
            stacklevel=2,
        )
    skipped = _wrap_all(model, segments, selective, offload)
    object.__setattr__(model, APPLIED, what)
    if skipped:
        warnings.warn(
            f"remat: {', '.join(skipped[:4])}{' ...' if len(skipped) > 4 else ''} already checkpointed by Hugging Face "
            "gradient checkpointing: left to it, not checkpointed twice.",
            stacklevel=2,
        )
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo `remat.apply` (and `remat.checkpoint`) on `model`: every module's forward as before."""
    wrapped = [m for m in model.modules() if is_wrapped(m)]
    if APPLIED not in model.__dict__ and not wrapped:
        raise RematError(
            f"remat: {type(model).__name__} follows no remat plan, so there is nothing to remove. "
            "Expected a model given to remat.apply, remat.auto or remat.checkpoint. Fix: nothing to do."
        )
    for m in wrapped:
        unwrap(m)
    model.__dict__.pop(APPLIED, None)
    return model


def checkpoint(module: nn.Module) -> nn.Module:
    """Mark one module for checkpointing, the one-flag way: it is recomputed in backward from now on.

    Example: remat.checkpoint(model.encoder.layer[3]); remat.remove(model) undoes it.
    """
    if not isinstance(module, nn.Module):
        raise RematError(f"remat: checkpoint expects a torch.nn.Module, saw {type(module).__name__}. Fix: pass a module.")
    if is_wrapped(module):
        raise RematError(f"remat: {type(module).__name__} is already checkpointed by remat. Fix: mark it once.")
    wrap_segment([module])
    return module


def auto(model: nn.Module, inputs: Any, budget, loss_fn=None, optimizer=None, **plan_options) -> Plan:
    """Profile, plan and apply in one call; returns the Plan it applied.

    Example: plan = remat.auto(model, batch, budget="6GiB", optimizer=opt)
    """
    from remat.measure import profile
    from remat.planner import plan as make_plan

    prof = profile(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
    p = make_plan(prof, budget, **plan_options)
    apply(model, p)
    return p


# -- plans and recipes ------------------------------------------------------------------------


def _check_plan(model: nn.Module, plan: Plan) -> list[list[str]]:
    """The plan's segments, after checking that it was made for this model (nothing is changed yet)."""
    modules = dict(model.named_modules())
    missing = [b.name for b in plan.blocks if b.name not in modules]
    named = [n for seg in plan.segments for n in seg] + list(plan.selective) + list(plan.offload)
    missing += [n for n in named if n not in modules and n not in missing]
    if missing:
        raise RematError(
            f"remat: the plan names modules this {type(model).__name__} does not have: {', '.join(missing[:6])}"
            f"{' ...' if len(missing) > 6 else ''}. Expected a plan made for this model (plan.model = "
            f"{plan.model!r}). Fix: profile and plan this model, then apply."
        )
    changed = [f"{b.name} ({b.type} in the plan, {type(modules[b.name]).__name__} here)" for b in plan.blocks
               if type(modules[b.name]).__name__ != b.type]
    if changed:
        raise RematError(
            f"remat: the plan was made for a different model: {', '.join(changed[:4])}. "
            "Fix: profile and plan this model, then apply."
        )
    for seg in plan.segments:
        _check_segment(modules, seg)
    return [list(seg) for seg in plan.segments]


def _check_segment(modules: dict[str, nn.Module], seg: list[str]) -> None:
    if len(seg) == 1:
        return
    parents = {n.rsplit(".", 1)[0] if "." in n else "" for n in seg}
    parent = modules.get(next(iter(parents)))
    children = list(parent.named_children()) if parent is not None else []
    names = [(f"{next(iter(parents))}.{c}" if next(iter(parents)) else c) for c, _ in children]
    ok = len(parents) == 1 and runs_children_in_order(parent) and _consecutive(names, seg)
    if not ok:
        raise RematError(
            f"remat: a segment of the plan ({seg[0]} .. {seg[-1]}) is not a run of consecutive children of one "
            "nn.Sequential, so one checkpoint cannot wrap it. Fix: plan again with this version of remat."
        )


def _consecutive(names: list[str], seg: list[str]) -> bool:
    if seg[0] not in names:
        return False
    i = names.index(seg[0])
    return names[i : i + len(seg)] == list(seg)


def _recipe(model: nn.Module, recipe: str) -> list[list[str]]:
    if recipe not in RECIPES:
        raise RematError(f"remat: unknown recipe {recipe!r}; expected one of {RECIPES} or a Plan. Fix: pick one.")
    blocks = _chain_of_blocks(model)
    if recipe == "every-block":
        return [[b] for b in blocks]
    modules = dict(model.named_modules())
    parent = blocks[0].rsplit(".", 1)[0] if "." in blocks[0] else ""
    if not runs_children_in_order(modules[parent]):
        raise RematError(
            f"remat: the 'chen' recipe checkpoints segments of consecutive blocks, which remat can wrap only "
            f"inside an nn.Sequential; {parent or type(model).__name__} is a {type(modules[parent]).__name__}. "
            "Fix: use 'every-block', or remat.plan for a plan that fits a budget."
        )
    size = max(1, round(math.sqrt(len(blocks))))
    return [blocks[i : i + size] for i in range(0, len(blocks), size)]


def _chain_of_blocks(model: nn.Module) -> list[str]:
    """The biggest group of sibling candidates at the top of the module tree (the layers)."""
    groups: dict[str, list[str]] = {}
    cands = find_candidates(model)
    for name in cands:
        if any(name.startswith(o + ".") for o in cands if o != name):
            continue  # nested in another candidate
        groups.setdefault(name.rsplit(".", 1)[0] if "." in name else "", []).append(name)
    if not groups:
        raise RematError(
            f"remat: {type(model).__name__} has no submodules to checkpoint. Expected layers in an nn.Sequential "
            "or nn.ModuleList, or named children. Fix: use remat.checkpoint(module) on the part to recompute."
        )
    return max(groups.values(), key=len)


def _wrap_all(model: nn.Module, segments: list[list[str]], selective: list[str], offload: list[str]) -> list[str]:
    modules = dict(model.named_modules())
    skipped = []
    jobs = [(s, "recompute") for s in segments] + [([n], "selective") for n in selective] + [([n], "offload") for n in offload]
    for seg, action in jobs:
        mods = [modules[n] for n in seg]
        if any(getattr(m, "gradient_checkpointing", False) is True for m in mods):
            skipped += seg  # Hugging Face already checkpoints these: no double checkpointing
            continue
        if action == "offload":
            wrap_offload(mods[0])
        else:
            wrap_segment(mods, selective=action == "selective")
    return skipped


def _describe(what) -> str:
    if isinstance(what, str):
        return f"recipe {what!r}"
    extra = f" and {len(what.offload)} offloaded modules" if what.offload else ""
    return f"a {what.solver} plan with {len(what.segments) + len(what.selective)} checkpoints{extra}"


def applied(model: nn.Module) -> Plan | str | None:
    """The plan or recipe `model` follows, if any."""
    return model.__dict__.get(APPLIED)


__all__ = ["apply", "applied", "auto", "checkpoint", "remove", "MARK"]
