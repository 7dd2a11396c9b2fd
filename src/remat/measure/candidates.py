"""Which modules are candidates for checkpointing (the natural units of a model)."""

from __future__ import annotations

import torch.nn as nn

from remat._torch_compat import checkpoint_wrapper_type
from remat.errors import RematError


def find_candidates(model: nn.Module, named: list[str] | None = None) -> list[str]:
    """Dotted names of candidate modules, in registration order.

    Candidates are the children of every `nn.Sequential` / `nn.ModuleList` (this
    covers transformer layers: `transformer.h.N`, `encoder.layer.N`, `model.layers.N`),
    modules wrapped by `checkpoint_wrapper`, and the modules the user names.  A model
    with none of these gets its direct children.
    """
    modules = dict(model.named_modules(remove_duplicate=True))
    found: list[str] = []
    wrapper = checkpoint_wrapper_type()
    for name, mod in modules.items():
        if isinstance(mod, (nn.Sequential, nn.ModuleList)):
            found += [_join(name, child) for child, _ in mod.named_children()]
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
    seen: set[str] = set()
    return [n for n in found if not (n in seen or seen.add(n))]


def runs_children_in_order(module: nn.Module | None) -> bool:
    """True for an nn.Sequential (or a subclass) whose forward is nn.Sequential's: its children run
    one after another, each on the previous one's output, so a run of them can be one checkpoint."""
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


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
