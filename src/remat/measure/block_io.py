"""What the step's forward hooks see of each candidate module: its order, its calls, its inputs and outputs, and
where each call's forward and backward run on the timeline (NOTE [A module called more than once] in
`remat.measure.calls`).

NOTE [When the caller lets go of an output]
  A block that returns several tensors (BLOOM's and MPT's layers: their states and their attention weights) may
  return one that only its own ops save: the caller drops it (`outputs = layer(...)` again at the next layer), and
  the unplanned step keeps it only for the block's backward.  Under a checkpoint nothing saves it, so it goes with
  the caller's last Python reference; remat counted it until the step's first backward op: a BLOOM of 3 layers at
  512 tokens had its plans predicted 3.9 and 8.4 MB above their 57 MB steps (docs/validation.md section 2.4), one of
  4 layers its least plan at 108,140,548 bytes where two checkpoints reach 79,067,140
  (`tests/test_what_a_checkpoint_frees.py`, with a model shaped like it held to the byte; 2026-12-03).
  Rule 1. Each tensor such a block returns is watched by a weak reference.  Autograd's hold is remat's pack of an
          alias (NOTE [What remat's pack keeps] in `remat.measure.tracker`), never the object: the reference dies
          when nothing but autograd keeps the tensor (before 2026-12-07 the pack held the object, and the search
          below looked past it).
  Rule 2. At the start of each later candidate, and at the end of each module around the block, every watched
          tensor is looked for: among what any object the garbage collector sees refers to (a tuple, a list, a
          module's dict), among the variables of the functions still running (the forwards around the hook, read
          as a snapshot and emptied at once, which the search above does not see), and, at a module's end, in what
          it returns.  Gone, or found nowhere: the step has let go of it, and the op where it was looked for is
          where a checkpoint of the block frees it (`BlockIO.let_go`, then `BlockProfile.output_own_free_op`).
          Found: it stays watched, at most until the step's backward, from whose first op it is freed as before.
  Rule 3. What it cannot see: a view of the tensor that the model keeps without reading it (the view is another
          object), and references held by C code outside autograd.  Either would make a checkpoint free it later
          than predicted.  And a running function that keeps the dict of its own `locals()` and reads it later
          finds it emptied by the snapshot's clearing (none in transformers, peft or torch.nn, 2026-12-03).
  Rule 4. A search scans the interpreter's objects once (about 30 ms with transformers loaded; 170 ms with a 7B
          model and peft's LoRA modules), and runs only while a tensor is watched: a model whose blocks each return
          one tensor pays nothing.  Only outputs that require grad are watched: a Llama's rotary embedding returns
          its cosines and sines, which the whole forward holds, and watching them searched at each of 700
          candidates' starts, 123 s of the 266 s fake profile of Mistral-7B with LoRA at 4096 tokens (2026-12-03).
          An output that requires no grad and that only its block's ops save is then counted until the first
          backward op, as before this NOTE (the safe side).  `remat fit` of a 24-layer BLOOM-560m config took
          14.7 s (27.4 s before, when its reserve took more plans to check).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import sys
import weakref
from types import FrameType

import torch
import torch.nn as nn
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_pre_hook

from remat._torch_compat import global_forward_hook_with_kwargs, in_backward, tree_flatten
from remat.measure.tracker import StorageRecord, Tracker
from remat.module_tree import WRAPPED_MARK, find_extras, parent_name, within


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
        self.names = {id(m): n for n, m in mods.items()}
        self._watched: list[tuple[str, weakref.ref, StorageRecord]] = []  # NOTE [When the caller lets go of an output]
        self.let_go: dict[int, int] = {}
        """id() of an output's record: the op where the step was first found to have let go of it (a later
        candidate's start, or the end of a module around its block: NOTE [When the caller lets go of an output])."""

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
        if self._watched:
            self._check_let_go(name, starting=True)
        if name not in self.calls:
            self.order.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        self.call_spans.setdefault(name, []).append([len(self.tracker.ops), -1, -1])

    def _post(self, mod, args, kwargs, out):
        if in_backward():
            return
        if self._watched:
            self._check_let_go(self.names.get(id(mod)), out)
        name = self.by_module.get(id(mod))
        if name is None:
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
        returned = [t for t in tree_flatten(_flatten_output(out))[0] if isinstance(t, torch.Tensor)]
        made = [t for t in returned if t.requires_grad and id(t) not in given]
        if made:  # "any": at the first gradient, holding none (mode "all" keeps each until the last one comes)
            hook = functools.partial(self._entered_backward, span)
            self._grad_hooks.append(register_multi_grad_hook(made, hook, mode="any"))
        self._watch(name, returned)

    def _watch(self, name: str, tensors: list[torch.Tensor]) -> None:
        """Rule 1 of NOTE [When the caller lets go of an output], for a block returning more than one tensor: those
        that require grad (Rule 4)."""
        if len(tensors) < 2:
            return
        recs = [self.tracker.record_of(t) for t in tensors]
        for t, rec in zip(tensors, recs):
            if rec is not None and t.requires_grad and sum(r is rec for r in recs) == 1:  # two views of one storage
                self._watched.append((name, weakref.ref(t), rec))

    def _check_let_go(self, here: str | None, out=None, starting: bool = False) -> None:
        """Rule 2: at the end of module `here` (returning `out`) the watched tensors of the blocks inside it, at the
        start of a candidate (`starting`) those of every block, that Python let go of."""
        if here is None:
            return
        mine = [
            w for w in self._watched if (starting and not within(here, w[0])) or (w[0] != here and within(w[0], here))
        ]
        returned = {id(t) for t in tree_flatten(_flatten_output(out))[0] if isinstance(t, torch.Tensor)}
        objects, owners = [], []
        done = set()
        for w in mine:
            t = w[1]()
            if t is None:  # nothing refers to it any more, autograd's packs included (they hold an alias)
                self.let_go.setdefault(id(w[2]), len(self.tracker.ops))
                done.add(id(w))
            elif id(t) not in returned:
                objects.append(t)
                owners.append(w)
        t = None
        for w, free in zip(owners, _unheld(objects)):
            if free:
                self.let_go.setdefault(id(w[2]), len(self.tracker.ops))
                done.add(id(w))
        objects.clear()
        self._watched = [w for w in self._watched if id(w) not in done and w[1]() is not None]

    def _entered_backward(self, span: list[int], grad) -> None:
        if span[2] < 0:
            span[2] = len(self.tracker.ops)


def _unheld(objects: list) -> list[bool]:
    """Rule 2: for each of `objects`, whether the step has let go of it: no object the garbage collector sees refers
    to it, and no variable of a function still running (the modules' forwards around the hook) holds it."""
    if not objects:
        return []
    seen: set[int] = set()
    for r in gc.get_referrers(*objects):
        if r is not objects:
            seen.update(id(x) for x in gc.get_referents(r))
    r = None
    seen |= _in_running_frames({id(o) for o in objects})
    return [id(o) not in seen for o in objects]


def _in_running_frames(ids: set[int]) -> set[int]:
    """Of `ids`, those a running function's variable holds, in the frames above BlockIO's own.  A frame's variables
    are read as a snapshot (`f_locals`), emptied again at once: a snapshot kept would hold what the function lets go
    of later, and change the step measured."""
    found: set[int] = set()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED and frame.f_code not in _OWN_CODE:
            snapshot = frame.f_locals
            found.update(id(v) for v in snapshot.values() if id(v) in ids)
            snapshot.clear()
        frame = frame.f_back
    return found


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


_OWN_CODE = frozenset(
    f.__code__ for f in (BlockIO._pre, BlockIO._post, BlockIO._check_let_go, _unheld, _in_running_frames)
)
