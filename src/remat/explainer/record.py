"""What the model's own checkpoint calls are: recorded while `remat.profile` runs the step.

NOTE [Recording the user's checkpoints]
  Rule 1. Every `torch.utils.checkpoint.checkpoint` call made in forward goes through
          `intercept_checkpoints` (also those of `checkpoint_sequential` and
          `checkpoint_wrapper`, and names imported early).  Calls are numbered in
          forward order; the forward of a model runs the same calls in the same order
          each time, so call i of one run is call i of the next.
  Rule 2. A `Policy` says which calls keep their checkpoint; the others run their
          function directly.  Keep-all is the model as written, keep-none is the same
          model without checkpointing, keep-one measures one checkpoint alone.
  Rule 3. A call's region is what ran between the start and the end of its forward:
          the modules whose forward was entered (global module hooks) and whether the
          CPU or CUDA random generator moved (it does for dropout, not in fake mode).
  Rule 4. A module whose forward runs again during backward with grad enabled is being
          recomputed (NOTE [Recomputation] in `remat.measure.tracker`).
  Rule 5. `remat.profile` runs the model more than once (a first step before the steady
          one, K-1 passes before the measured one: NOTE [The step that is measured]).
          Each forward of the model itself starts the recording afresh, so what is
          recorded is the measured pass, and call i is call i of every pass.
  Rule 6. remat's own checkpoints (a plan applied to see it run) are not the model's: they
          keep their checkpoint under every policy and are not recorded.
  Rule 7. A call of the model's that runs again inside a checkpoint's recomputation (one
          of remat's around a layer whose forward calls checkpoint itself) keeps or drops
          its checkpoint as it did in forward: otherwise the recomputation saves other
          tensors than the forward did, and torch raises CheckpointError.
  Rule 8. A non-reentrant call with no tensor among its positional arguments records the
          keyword arguments that hold its tensors (and "functools.partial" for tensors bound
          in its function): torch saves the GPU random state only for the devices of
          positional tensors, so on a GPU its recomputation draws other dropout masks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from remat._torch_compat import (
    CheckpointCall,
    checkpoint_wrapper_type,
    in_backward,
    intercept_checkpoints,
    rng_fingerprint,
    sequential_segment,
    tensor_leaves,
    tree_flatten,
    unwrap_callable,
)
from remat.applier.rng import bound_tensors
from remat.applier.wrapping import is_own_checkpoint
from remat.module_tree import parent_name
from remat.types import CheckpointCallSite

Policy = Callable[[int], bool]
"""index of a checkpoint call -> keep its checkpoint (True) or run the function directly."""


@dataclass(slots=True)
class RecordedCall:
    """One checkpoint call as it ran (see NOTE [Recording the user's checkpoints]): the call site, and
    what the recording learns while its forward runs."""

    site: CheckpointCallSite
    sequence: tuple[str, ...] = ()
    """checkpoint_sequential: the names of all its functions ("?" for one that is not a module of the model)."""
    start: int = 0
    end: int = 0
    """checkpoint_sequential: the segment is sequence[start..end]."""
    modules: dict[str, None] = field(default_factory=dict)
    """Modules of the model whose forward ran inside the call, in order, each once (an ordered set)."""
    draws_random: bool = False


class Recorder:
    """Intercepts checkpoint calls and module calls for one profiled step; see the NOTE above."""

    def __init__(self, model: nn.Module, policy: Policy):
        self.policy = policy
        self.model = model
        self.names = {id(m): n for n, m in model.named_modules(remove_duplicate=True)}
        self.calls: list[RecordedCall] = []
        self.recomputed: set[str] = set()
        """Modules whose forward ran again during backward (Rule 4)."""
        self._stack: list[nn.Module] = []
        self._open: list[RecordedCall] = []
        self._kept: dict[int, tuple[object, bool]] = {}
        """id(what a call checkpoints) -> (it, whether the policy kept the checkpoint in forward)."""

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        h1 = register_module_forward_pre_hook(self._pre)
        h2 = register_module_forward_hook(self._post)
        try:
            with intercept_checkpoints(self._on_call, self._keep_in_backward):
                yield self
        finally:
            h1.remove()
            h2.remove()

    # -- module calls ---------------------------------------------------------------------
    def _pre(self, mod, args):
        name = self.names.get(id(mod))
        if in_backward():
            if name is not None and torch.is_grad_enabled():
                self.recomputed.add(name)
            return
        if mod is self.model and not self._stack:  # Rule 5: a new pass
            self.calls.clear()
            self.recomputed.clear()
        self._stack.append(mod)
        if name is not None:
            for call in self._open:
                call.modules[name] = None

    def _post(self, mod, args, out):
        if not in_backward() and self._stack and self._stack[-1] is mod:
            self._stack.pop()

    # -- checkpoint calls ---------------------------------------------------------------------
    def _on_call(self, call: CheckpointCall):
        if is_own_checkpoint(call.function):  # Rule 6
            return True, contextlib.nullcontext()
        rec = self._describe(call)
        self.calls.append(rec)
        keep = self.policy(rec.site.index)
        target = unwrap_callable(call.function)
        self._kept[id(target)] = (target, keep)
        return keep, self._scope(rec)

    def _keep_in_backward(self, call: CheckpointCall) -> bool:
        """Rule 7: a call of the model's re-run inside a checkpoint's recomputation does what it did in forward."""
        target = unwrap_callable(call.function)
        seen, keep = self._kept.get(id(target), (None, True))
        return keep if seen is target else True

    @contextlib.contextmanager
    def _scope(self, rec: RecordedCall):
        before = rng_fingerprint()
        self._open.append(rec)
        try:
            yield
        finally:
            self._open.remove(rec)
            rec.draws_random = before != rng_fingerprint()

    def _describe(self, call: CheckpointCall) -> RecordedCall:
        caller = self._stack[-1] if self._stack else None
        caller_name = self.names.get(id(caller), "") if caller is not None else ""
        common: dict[str, Any] = dict(  # what every CheckpointCallSite of this call shares
            index=len(self.calls),
            reentrant=call.reentrant,
            preserve_rng_state=call.preserve_rng_state,
            input_requires_grad=_requires_grad(call),
            depth=len(self._open),
            keyword_tensors=_keyword_tensors(call),
        )
        segment = sequential_segment(call.function)
        if segment is not None:
            return self._segment(segment, caller_name, common)
        wrapper = checkpoint_wrapper_type()
        if wrapper is not None and isinstance(caller, wrapper):  # the wrapper is the block: same ops, and a candidate
            label = f"checkpoint_wrapper({_show(caller_name)})"
            return RecordedCall(
                CheckpointCallSite(label=label, module=caller_name, kind="module", via="checkpoint_wrapper", **common)
            )
        target = unwrap_callable(call.function)
        if isinstance(target, nn.Module) and id(target) in self.names:
            name = self.names[id(target)]
            label = f"checkpoint({_show(name)})"
            return RecordedCall(CheckpointCallSite(label=label, module=name, kind="module", via="checkpoint", **common))
        label = f"checkpoint({self._function_label(target)})"
        return RecordedCall(
            CheckpointCallSite(label=label, module=caller_name, kind="function", via="checkpoint", **common)
        )

    def _segment(self, segment, caller_name: str, common: dict) -> RecordedCall:
        start, end, functions = segment
        names = tuple(self.names.get(id(f), "?") if isinstance(f, nn.Module) else "?" for f in functions)
        module = _common_parent(names) if "?" not in names else caller_name
        label = f"checkpoint_sequential({_show(module)})[{start}..{end}]"
        site = CheckpointCallSite(label=label, module=module, kind="sequential", via="checkpoint_sequential", **common)
        return RecordedCall(site, sequence=names, start=start, end=end)

    def _function_label(self, fn) -> str:
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, nn.Module) and id(owner) in self.names:
            return f"{_show(self.names[id(owner)], 'self')}.{getattr(fn, '__name__', '?')}"
        where = getattr(fn, "__module__", None) or ""
        name = getattr(fn, "__name__" if where == "torch" else "__qualname__", None) or type(fn).__name__
        where = _SHORT.get(where, where)
        return f"{where}.{name}" if where else name


_SHORT = {"torch.nn.functional": "F", "builtins": ""}


def _requires_grad(call: CheckpointCall) -> bool:
    """Reentrant checkpoint looks only at top-level tensor arguments; non-reentrant at all of them."""
    if call.reentrant:
        return any(isinstance(a, torch.Tensor) and a.requires_grad for a in call.args)
    flat = tree_flatten((call.args, call.kwargs))[0]
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat)


def _keyword_tensors(call: CheckpointCall) -> tuple[str, ...]:
    """Rule 8: the keyword arguments holding the tensors of a non-reentrant call that has none positional."""
    if call.reentrant or tensor_leaves(call.args):
        return ()
    named = [k for k, v in call.kwargs.items() if tensor_leaves(v)]
    return (*named, "functools.partial") if bound_tensors(call.function) else tuple(named)


def _show(name: str, root: str = "model") -> str:
    return name if name else root


def _common_parent(names: tuple[str, ...]) -> str:
    parents = {parent_name(n) for n in names}
    return parents.pop() if len(parents) == 1 else ""
