"""The module tree by dotted path: which modules are candidates for checkpointing, which of
them are siblings, and which siblings form "the chain" every recipe and the `dp` solver plan.

Dotted paths are those of `model.named_modules()`; "" is the model itself."""

from __future__ import annotations

import torch.nn as nn

from remat._torch_compat.distributed import FSDP_MODULE, checkpoint_wrapper_type, distributed_class, is_a
from remat.errors import RematError


WRAPPED_MARK = "_remat_forward"
"""The attribute `remat.apply` sets on each module it wraps (its undo record, `applier.wrapping.WrapInfo`)."""
OWN_CHECKPOINT_MARK = "_remat_checkpointed"
"""Attribute marking a function that one of remat's own checkpoints runs (a plan's, or a measurement's): never
the model's (`remat.explainer.record`, Rule 6)."""

CALLED_DIRECTLY = "Sequential (children called directly)"
"""`BlockProfile.container` of a child of an nn.Sequential whose own forward the profiled step never ran: the
model's code calls its children itself (`x = seq[1](seq[0](x))`, `for m in seq: x = m(x)`, checkpoint_sequential).
Nothing may rest on the Sequential chaining them (NOTE [How a module is checkpointed in place], Rule 4): a run of
them is one checkpoint as a run of nn.ModuleList entries is
(NOTE [A run of nn.ModuleList entries as one checkpoint]), and such a Sequential is a block only where its children
ran in turn (`remat.measure.chains`)."""

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
"""Modules that hold blocks: their children are the natural units of checkpointing."""
NO_FORWARD = (nn.ModuleList, nn.ModuleDict)


def find_candidates(model: nn.Module, named: list[str] | None = None) -> list[str]:
    """Dotted names of candidate modules, in registration order.

    Candidates are the children of every `nn.Sequential` / `nn.ModuleList` /
    `nn.ModuleDict` that have a forward (this covers transformer layers: `transformer.h.N`, `encoder.layer.N`,
    `model.layers.N`, and blocks kept by name),
    modules wrapped by `checkpoint_wrapper`, and the modules the user names.  A model
    with none of these gets its direct children.
    """
    modules = dict(model.named_modules(remove_duplicate=True))
    found: list[str] = []
    wrapper = checkpoint_wrapper_type()
    for name, mod in modules.items():
        if isinstance(mod, CONTAINERS):  # not a child that has no forward (an nn.ModuleDict per layer): its children
            found += [
                join(name, child) for child, c in mod.named_children() if type(c).forward is not nn.Module.forward
            ]
        if wrapper is not None and isinstance(mod, wrapper) and name:
            found.append(name)
    if not found:
        found = [name for name, _ in model.named_children()]
    for name in named or []:
        if name not in modules or name == "":
            sample = ", ".join(n for n in list(modules)[1:9])
            raise RematError(
                f"remat: blocks names a module {name!r} that the model does not have; "
                f"expected a dotted path from model.named_modules(), e.g. {sample}. "
                "Fix: correct the name, or leave blocks=None to use the natural units."
            )
        found.append(name)
    return list(dict.fromkeys(found))  # in order, each once


def find_extras(model: nn.Module, candidates: list[str]) -> list[str]:
    """Modules outside the blocks that a user could checkpoint too, in registration order: the other
    children of every module that encloses a top-level candidate (embedders, stems, final norms,
    heads: `transformer.wte`, `resnet.embedder`, `lm_head`).

    Not the enclosing modules themselves (`transformer`, `encoder`): a checkpoint around one recomputes
    all of its blocks at once in backward, which brings the peak back (user report 000), and remat
    plans the blocks inside instead.  Not a module listed under a second name (tied weights), nor an
    nn.ModuleList or nn.ModuleDict, which have no forward."""
    modules = dict(model.named_modules(remove_duplicate=True))
    enclosing_blocks = {""}
    for name in top_level(candidates):
        while name:
            name = parent_name(name)
            enclosing_blocks.add(name)
    taken = set(candidates) | enclosing_blocks
    found = []
    for name, mod in modules.items():
        if name not in enclosing_blocks:
            continue
        for child_name, child in mod.named_children():
            child_name = join(name, child_name)
            if child_name not in taken and modules.get(child_name) is child and not isinstance(child, NO_FORWARD):
                found.append(child_name)
    return found


def runs_children_in_order(module: nn.Module | None) -> bool:
    """True for an nn.Sequential (or a subclass) whose forward is nn.Sequential's: its children run
    one after another, each on the previous one's output, so a run of them can be one checkpoint."""
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def children_of(name: str, module: nn.Module) -> list[str]:
    """The dotted paths of `module`'s children, `module` being at `name`, in registration order."""
    return [join(name, child) for child, _ in module.named_children()]


def holds_runs(module: nn.Module | None) -> bool:
    """True where remat.apply can wrap a run of several children as one checkpoint: an nn.Sequential that
    chains them, or an nn.ModuleList whose entries the model's loop calls
    (NOTE [A run of nn.ModuleList entries as one checkpoint])."""
    return runs_children_in_order(module) or isinstance(module, nn.ModuleList)


def join(prefix: str, name: str) -> str:
    """`prefix.name`, or `name` under the model itself."""
    return f"{prefix}.{name}" if prefix else name


def parent_name(name: str) -> str:
    """The dotted path of the module holding `name` ("" for a child of the model)."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def enclosing(name: str, others: list[str]) -> str | None:
    """The nearest candidate in `others` that contains `name` (by dotted path)."""
    best = None
    for o in others:
        if o != name and name.startswith(o + ".") and (best is None or len(o) > len(best)):
            best = o
    return best


def within(module: str, block: str) -> bool:
    """True if `module` is `block` or nested inside it."""
    return module == block or block == "" or module.startswith(block + ".")


def top_level(names: list[str]) -> list[str]:
    """The names not nested inside another of `names`, in order."""
    return [n for n in names if enclosing(n, names) is None]


def main_chain(names: list[str]) -> list[str]:
    """The chain: the largest run of top-level sibling candidates (the first such on ties), in order.

    The recipes of `remat.apply` read it off the model's candidates, the `dp` solver and the hand
    recipes of `remat.plan` off the candidates of a profile: one definition, so they agree."""
    groups: dict[str, list[str]] = {}
    for name in top_level(names):
        groups.setdefault(parent_name(name), []).append(name)
    return max(groups.values(), key=len, default=[])


def is_fsdp_unit(module) -> bool:
    """`module` was sharded by FSDP2's `fully_shard` (its class is then FSDP<original class>)."""
    return is_a(module, FSDP_MODULE)


def class_name(module) -> str:
    """The name of `module`'s class as the user wrote it: FSDP2's `fully_shard` renames GPT2Block to FSDPGPT2Block
    (a subclass of FSDPModule and GPT2Block), and profiles and plans name the original, so a plan made on the
    sharded model applies to the bare one and back."""
    cls = type(module)
    if is_fsdp_unit(module):
        fsdp = distributed_class(*FSDP_MODULE)
        cls = next((b for b in cls.__bases__ if b is not fsdp), cls)
    return cls.__name__


def has_remat_wrappers(model: nn.Module) -> bool:
    """`remat.apply` wrapped some module of `model` (and `remat.remove` has not undone it)."""
    return any(WRAPPED_MARK in m.__dict__ for m in model.modules())


def container_kind(parent: nn.Module | None, forward_ran: set[int]) -> str:
    """ "Sequential" when the parent runs its children in order (a subclass too) and its forward ran, CALLED_DIRECTLY
    when it never did (the model calls them), else its class name."""
    if parent is None:
        return ""
    if runs_children_in_order(parent):
        return "Sequential" if id(parent) in forward_ran else CALLED_DIRECTLY
    return "ModuleList" if isinstance(parent, nn.ModuleList) else type(parent).__name__
