"""The one place where remat touches private PyTorch APIs.

Each name here is used by remat's measurement code; if a PyTorch release moves
one, this file is the only one to change.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import (  # private: fake tensors
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils.flop_counter import flop_registry  # module-level table of FLOP formulas

__all__ = [
    "ModuleTracker",
    "FakeTensor",
    "FakeTensorMode",
    "FAKE_OP_ERRORS",
    "in_backward",
    "flops_of",
    "fake_mode_of",
    "checkpoint_wrapper_type",
]

FAKE_OP_ERRORS = (UnsupportedOperatorException, DynamicOutputShapeException, DataDependentOutputException)


def in_backward() -> bool:
    """True while the autograd engine is running a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def flops_of(func, args, kwargs, out) -> int:
    """FLOPs of one aten op, with the same formulas `FlopCounterMode` uses (0 if it has none)."""
    formula = flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def fake_mode_of(t: torch.Tensor):
    """The FakeTensorMode a fake tensor belongs to, or None for a real tensor."""
    return t.fake_mode if isinstance(t, FakeTensor) else None


def checkpoint_wrapper_type():
    """The class of `checkpoint_wrapper(...)` modules, or None where torch.distributed is absent."""
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    except Exception:  # torch built without distributed
        return None
    return CheckpointWrapper


from torch.utils.module_tracker import ModuleTracker as _ModuleTracker  # noqa: E402


class ModuleTracker(_ModuleTracker):
    """`torch.utils.module_tracker.ModuleTracker` that registers no grad hooks for forwards
    re-run inside backward (checkpoint recomputation).

    torch's tracker hooks every module call's inputs and outputs and keeps the hooks until
    it exits; for a recomputed forward those hooks keep the recomputed tensors alive to the
    end of backward (measured: checkpoint_sequential(4) over a 33-module chain, 71 MiB instead
    of the true 48 MiB).  Overrides two private methods, hence here.
    """

    def _fw_pre_hook(self, mod, input) -> None:
        if in_backward():
            self._get_append_fn(self._get_mod_name(mod), False)()
        else:
            super()._fw_pre_hook(mod, input)

    def _fw_post_hook(self, mod, input, output) -> None:
        if in_backward():
            self._get_pop_fn(self._get_mod_name(mod), False)()
        else:
            super()._fw_post_hook(mod, input, output)
