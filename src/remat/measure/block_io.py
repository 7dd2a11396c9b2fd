"""What the step's forward hooks see of each candidate module: its order, its calls, its inputs and outputs, and
where each call's forward and backward run on the timeline (NOTE [A module called more than once] in
`remat.measure.calls`)."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn as nn
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_pre_hook

from remat._torch_compat import global_forward_hook_with_kwargs, in_backward, tree_flatten
from remat.measure.tracker import StorageRecord, Tracker
from remat.module_tree import WRAPPED_MARK, find_extras, parent_name


class BlockIO:
    """Forward hooks that record each candidate's order, calls, input and output storages."""

    def __init__(self, model: nn.Module, candidates: list[str], tracker: Tracker):
        self.tracker = tracker
        mods = dict(model.named_modules(remove_duplicate=True))
        extras = find_extras(model, candidates)
        self.extras = frozenset(extras)
        candidates = [*candidates, *extras]
        self.by_module = {id(mods[n]): n for n in candidates}
        self.modules = {n: mods[n] for n in candidates}
        self.containers = {n: mods.get(parent_name(n)) for n in candidates}
        self.remat_checkpointed = [n for n, m in mods.items() if _remat_checkpoints(m)]
        """Modules remat.apply or remat.checkpoint wrapped in a checkpoint (not those it offloads)."""
        self.forward_ran: set[int] = set()
        """id() of every module whose forward ran in forward (NOTE [An nn.Sequential the model never calls])."""
        self.order: list[str] = []
        self.calls: dict[str, int] = {}
        self.inputs: dict[str, list[StorageRecord]] = {}
        self.outputs: dict[str, list[StorageRecord]] = {}
        self.grad_inputs: dict[str, list[StorageRecord]] = {}
        """Of each block's inputs, those that require grad."""
        self.call_spans: dict[str, list[list[int]]] = {}
        """Per call of each candidate: [its first forward op, the op after its last, the first op after its
        backward was entered (-1: never)], as timeline indices."""
        self.call_io: dict[str, dict[int, tuple[list[StorageRecord], ...]]] = {}
        """Per call of each candidate (by its index in `call_spans`): its inputs, those of them that require grad,
        and its outputs."""
        self._grad_hooks: list = []

    @contextlib.contextmanager
    def hooks(self):
        h1 = register_module_forward_pre_hook(self._pre)
        h2 = global_forward_hook_with_kwargs(self._post)  # T5 passes position_bias by keyword
        try:
            yield
        finally:
            h1.remove()
            h2.remove()
            for h in self._grad_hooks:
                h.remove()
            self._grad_hooks.clear()

    def _records(self, obj) -> list[StorageRecord]:
        recs = {}
        for t in tree_flatten(obj)[0]:
            if isinstance(t, torch.Tensor):
                rec = self.tracker.record_of(t)
                if rec is not None:
                    recs[id(rec)] = rec
        return list(recs.values())

    def _pre(self, mod, args):
        if in_backward():
            return
        self.forward_ran.add(id(mod))
        name = self.by_module.get(id(mod))
        if name is None:
            return
        if name not in self.calls:
            self.order.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        self.call_spans.setdefault(name, []).append([len(self.tracker.ops), -1, -1])

    def _post(self, mod, args, kwargs, out):
        name = self.by_module.get(id(mod))
        if name is None or in_backward():
            return
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self.inputs[name] = self._records((args, kwargs))
        self.grad_inputs[name] = self._records([t for t in tensors if t.requires_grad])
        self.outputs[name] = self._records(_flatten_output(out))
        spans = self.call_spans.get(name, [])
        k = max((i for i, s in enumerate(spans) if s[1] < 0), default=-1)  # the innermost call still running
        if k < 0:
            return
        span = spans[k]
        span[1] = len(self.tracker.ops)
        self.call_io.setdefault(name, {})[k] = (self.inputs[name], self.grad_inputs[name], self.outputs[name])
        given = {id(t) for t in tensors}
        made = [
            t
            for t in tree_flatten(_flatten_output(out))[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in given
        ]
        if made:  # "any": at the first gradient, holding none (mode "all" keeps each until the last one comes)
            hook = functools.partial(self._entered_backward, span)
            self._grad_hooks.append(register_multi_grad_hook(made, hook, mode="any"))

    def _entered_backward(self, span: list[int], grad) -> None:
        if span[2] < 0:
            span[2] = len(self.tracker.ops)


def _flatten_output(out):
    if hasattr(out, "to_tuple"):  # Hugging Face ModelOutput
        return out.to_tuple()
    if hasattr(out, "__dataclass_fields__"):
        return [getattr(out, f) for f in out.__dataclass_fields__]
    return out


def _remat_checkpoints(module: nn.Module) -> bool:
    """remat.apply or remat.checkpoint wrapped `module` in a checkpoint (its undo record, `WrapInfo`, says how)."""
    info = module.__dict__.get(WRAPPED_MARK)
    return info is not None and getattr(info, "role", "") != "offload"
