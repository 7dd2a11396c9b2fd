"""What a checkpoint of remat's shows torch, so that its recomputation replays the random generator of
every device its tensors live on (NOTE [How a module is checkpointed in place], Rule 1).

torch's non-reentrant checkpoint stashes the RNG state of the devices of its *positional* tensor
arguments only (`get_device_states(*args)`), and picks the device type of the recomputation's autocast
from them too.  A tensor that comes as a keyword argument, is bound by `functools.partial`, or is a
parameter on a device no argument is on, is not seen: on a GPU its dropout draws another mask when
recomputed.  `seen_by_torch` adds such tensors, in one tuple, as a last positional argument, and the
checkpointed function drops it again.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn

from remat._torch_compat import tensor_leaves
from remat.module_tree import OWN_CHECKPOINT_MARK


def bound_tensors(function) -> list[torch.Tensor]:
    """The tensors `functools.partial` binds in `function` (partials of partials, lists, tuples and dicts too)."""
    found: list[torch.Tensor] = []
    while isinstance(function, functools.partial):
        found += tensor_leaves((function.args, function.keywords))
        function = function.func
    return found


def unseen_tensors(functions: Iterable[Callable], modules: Iterable[nn.Module], args: tuple, kwargs: dict) -> tuple:
    """What torch would not see among `args`: every tensor of `kwargs` and every tensor `functions` bind by
    `functools.partial` (nested in lists, tuples and dicts too), and one parameter or buffer of `modules` for
    each GPU (any device but CPU and meta) that none of those nor `args` is on.  Meta tensors draw no random
    numbers: none is added."""
    given = tensor_leaves(kwargs) + [t for f in functions for t in bound_tensors(f)]
    given = [t for t in given if t.device.type != "meta"]
    seen = {t.device for t in tensor_leaves(args)} | {t.device for t in given}
    extra: dict[torch.device, torch.Tensor] = {}
    for module in modules:
        for t in itertools.chain(module.parameters(), module.buffers()):
            if t.device.type not in ("cpu", "meta") and t.device not in seen:
                extra.setdefault(t.device, t)
    return (*given, *extra.values())


def seen_by_torch(
    function: Callable, functions: list[Callable], modules: list[nn.Module], args: tuple, kwargs: dict
) -> tuple[Callable, tuple]:
    """(call, positional) such that torch's checkpoint of `call(*positional, **kwargs)` runs
    `function(*args, **kwargs)`, in forward and in its recomputation, and finds among its positional
    arguments every tensor `unseen_tensors(functions, modules, args, kwargs)` names; `args` stay where
    they were (saved by torch as before), the others come last, in one tuple, that `call` drops.

    `(function, args)` as given when nothing is unseen, and under torch.compile: Dynamo does not run
    torch's eager stash, and the compiled checkpoint replays each random op's own generator."""
    if torch.compiler.is_compiling():
        return function, args
    unseen = unseen_tensors(functions, modules, args, kwargs)
    if not unseen:
        return function, args
    return _dropping_last(function), (*args, unseen)


def _dropping_last(function: Callable) -> Callable:
    def call(*args, **kwargs):
        return function(*args[:-1], **kwargs)

    if getattr(function, OWN_CHECKPOINT_MARK, False) is True:
        setattr(call, OWN_CHECKPOINT_MARK, True)  # still remat's own checkpoint (explain leaves it alone)
    return call
