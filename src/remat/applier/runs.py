"""One checkpoint around consecutive entries of an nn.ModuleList that the model's own loop calls.

NOTE [A run of nn.ModuleList entries as one checkpoint]
  An nn.Sequential chains its children, so remat runs a segment of them inside one function
  (NOTE [How a module is checkpointed in place], Rule 4).  The entries of an nn.ModuleList
  are called by the model's own loop, with arguments remat does not choose (the attention
  mask, rotary embeddings, the previous layer's output taken out of a tuple).  So:
  Rule 1. The first entry's forward opens a non-reentrant checkpoint (torch's own, run by
          hand: `_torch_compat.open_checkpoint`) and the last entry's forward closes it; in
          between, each entry runs when the loop calls it.
  Rule 2. Each later entry's tensor arguments are recorded as what they are: one of the
          first entry's inputs, an output of an earlier entry of the run, or a tensor that
          needs no gradient from elsewhere (a mask, rotary embeddings), which the record
          keeps.  In backward the recomputation calls the entries' forwards again in order,
          each on the recomputed tensors in place of the first ones, holding an entry's
          output only until the last entry that takes it has been called.  The record holds
          no output: an output is recognised by identity while the loop still holds it.
  Rule 3. The loop's code between two entries must save nothing for backward, and the next
          entry must not take a tensor that needs a gradient and comes from anywhere else:
          the recomputation does not run that code.  Either is a `remat:` error at that
          forward (the checkpoint is closed first), never a wrong gradient; so is an entry
          called out of turn.
  Rule 4. RNG and BatchNorm as for every remat checkpoint (the RNG state at the first entry
          is restored for the recomputation; running statistics are put back after it); in
          eval mode, without grad or inside a recomputation the entries run as they are.
          torch stashes the RNG state of the devices of the checkpoint's positional tensors
          only (NOTE [How a module is checkpointed in place], Rule 1): the first entry's
          keyword tensors, tensors its entries' forwards bind by `functools.partial`, and a
          parameter of the run's entries per GPU none of those is on go to it too, in one
          last positional tuple that the recomputation drops (`remat.applier.rng`).  The
          state is stashed when the run opens, so a later entry's keyword tensors count
          through the entries' parameters (on the same GPU, as they are in practice).
  Rule 5. Under torch.compile each entry of a run is its own checkpoint (torch's, which Dynamo
          traces as one region): opening a checkpoint in one call and closing it in another
          cannot be traced without breaking the graph.  The compiler then keeps the output of
          every entry of the run (a boundary between two checkpointed regions), not only the
          first entry's input, and recomputes one entry at a time in backward: another peak
          than the plan's, which `remat.verify(compiled_model, ...)` measures (docs/compile.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from remat._torch_compat import in_backward, open_checkpoint, tensor_leaves, tree_flatten, tree_unflatten
from remat.applier.rng import seen_by_torch
from remat.applier.wrapping import (
    OWN,
    _batchnorm_stats_kept,
    _current_forward,
    _install,
    alive,
    hf_checkpoints,
    resolved,
)
from remat.errors import RematError
from remat.module_tree import children_of, is_fsdp_unit, parent_name, runs_children_in_order

Ref = tuple  # ("in", leaf index) | ("out", entry, tensor index) | ("keep", object)
_OPEN: list[_Run] = []
"""Runs whose checkpoint is open now (waiting for their next layer), innermost last."""


def run_of(modules: dict[str, nn.Module], seg: list[str], called_directly: frozenset[str]) -> tuple[list, list] | None:
    """(entries, names) of the run of entries a checkpoint over `seg` is, or None where it is one module the model
    calls, or consecutive children an nn.Sequential's forward chains (NOTE [How a module is checkpointed in place],
    Rule 4).  A segment of an nn.ModuleList's entries is one; so is one of the children of an nn.Sequential the
    model never calls (`called_directly`, from the profile), and such a Sequential in `seg` stands for its children
    (NOTE [An nn.Sequential the model never calls])."""
    names = [n for name in seg for n in _called(name, modules, called_directly)]
    parent = parent_name(seg[0])
    chained = parent not in called_directly and runs_children_in_order(modules.get(parent))
    if names == list(seg) and (len(seg) == 1 or chained):
        return None
    return [modules[n] for n in names], names


def _called(name: str, modules: dict[str, nn.Module], called_directly: frozenset[str]) -> list[str]:
    """`name`, or the modules the model calls in its place: the children of a Sequential it never calls."""
    if name not in called_directly:
        return [name]
    return [n for child in children_of(name, modules[name]) for n in _called(child, modules, called_directly)]


def wrap_run(entries: list[nn.Module], names: list[str]) -> None:
    """Checkpoint consecutive entries of an nn.ModuleList as one, in place (see the NOTE above)."""
    run = _Run(entries, names, [_current_forward(m) for m in entries])
    for k, module in enumerate(entries):
        _install(module, run.forward_of(k), run.refs, "head" if k == 0 else "member", [0])


class _Run:
    """The state of one run across the loop's calls: open checkpoint, record, guard between entries."""

    def __init__(self, entries: list[nn.Module], names: list[str], originals: list[Callable]):
        self.names, self.originals = names, originals
        self.refs = [weakref.ref(m) for m in entries]  # NOTE [How a module is checkpointed in place], Rule 8
        self.close: Callable | None = None
        self.expected = 0
        self.guard: torch.autograd.graph.saved_tensors_hooks | None = None
        self.inputs: dict[int, tuple[int, weakref.ref]] = {}
        self.outputs: dict[int, tuple[int, int, weakref.ref]] = {}
        self.calls: list[tuple[object, list[Ref]]] = []

    @property
    def entries(self) -> list[nn.Module]:
        """The entries, held weakly (NOTE [How a module is checkpointed in place], Rule 8)."""
        return alive(self.refs)

    def forward_of(self, k: int) -> Callable:
        def forward(*args, **kwargs):
            module = resolved(self.refs[k])
            if torch.compiler.is_compiling():  # Rule 5
                if module.training and torch.is_grad_enabled() and not hf_checkpoints(module):
                    call, positional = seen_by_torch(self.originals[k], [self.originals[k]], [module], args, kwargs)
                    return checkpoint(call, *positional, use_reentrant=False, preserve_rng_state=True, **kwargs)
                return self.originals[k](*args, **kwargs)
            if k == 0 and (
                not (module.training and torch.is_grad_enabled()) or in_backward() or hf_checkpoints(module)
            ):
                return self.originals[0](*args, **kwargs)  # Rule 4
            if k > 0 and self.close is None:
                return self.originals[k](*args, **kwargs)  # not inside a run (eval, no grad, recomputation)
            self._enter(k, args, kwargs)
            try:
                out = self.originals[k](*args, **kwargs)
            except BaseException:
                self._abort()
                raise
            self._leave(k, out)
            return out

        return forward

    def _enter(self, k: int, args, kwargs) -> None:
        leaves, spec = tree_flatten((args, kwargs))
        if k == 0:
            if self.close is not None:
                self._abort()  # the previous forward stopped inside the run
            if _OPEN and _OPEN[-1] is not self:  # another run is waiting for its next layer
                other = _OPEN[-1]
                other._abort()
                raise other._out_of_turn(self.names[0])
            self.inputs = {id(t): (i, weakref.ref(t)) for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}
            self.outputs, self.calls = {}, []
            call, positional = seen_by_torch(self._replay_fn(), self.originals, self.entries, args, kwargs)  # Rule 4
            self.close = open_checkpoint(call, *positional, **kwargs)
            _OPEN.append(self)
        else:
            self._unguard()
            if k != self.expected:
                self._abort()
                raise self._out_of_turn(self.names[k])
            self.calls.append((spec, [self._ref(k, leaf) for leaf in leaves]))
        self.expected = k + 1

    def _out_of_turn(self, name: str) -> RematError:
        return RematError(
            f"remat: {name} ran while the checkpoint around {self.names[0]} .. {self.names[-1]} expected "
            f"{self.names[self.expected]} next; remat checkpoints a run of nn.ModuleList entries only when the "
            "model's loop calls them in turn. Fix: plan with max_segment=1 (one checkpoint per layer)."
        )

    def _ref(self, k: int, leaf) -> Ref:
        if not isinstance(leaf, torch.Tensor):
            return ("keep", leaf)
        for table in (self.outputs, self.inputs):
            found = table.get(id(leaf))
            if found is not None and found[-1]() is leaf:
                return ("out", *found[:-1]) if table is self.outputs else ("in", found[0])
        if leaf.requires_grad:
            self._abort()
            where = (
                "FSDP's hooks around the layers (fully_shard) make it"
                if is_fsdp_unit(resolved(self.refs[k]))
                else "the model's loop makes it between the layers"
            )
            raise RematError(
                f"remat: {self.names[k]} takes a tensor that needs a gradient and is neither an input of "
                f"{self.names[0]} nor an output of an earlier layer of the checkpoint {self.names[0]} .. "
                f"{self.names[-1]}: {where}, and a recomputation cannot. "
                "Fix: plan from a profile of this step, or with max_segment=1 (one checkpoint per layer)."
            )
        return ("keep", leaf)

    def _leave(self, k: int, out) -> None:
        self.outputs.update({id(t): (k, j, weakref.ref(t)) for j, t in enumerate(tensor_leaves(out))})
        if k == len(self.refs) - 1:
            close, self.close = self.close, None
            _OPEN.remove(self)
            if close is not None:
                close()
        else:
            self.guard = torch.autograd.graph.saved_tensors_hooks(self._saved_between(k), _never)
            self.guard.__enter__()

    def _saved_between(self, k: int) -> Callable:
        def pack(t):
            self._abort()
            raise RematError(
                f"remat: code between {self.names[k]} and {self.names[k + 1]} saves a tensor for backward, inside "
                f"the checkpoint {self.names[0]} .. {self.names[-1]}; its recomputation runs the layers only. "
                "Fix: plan from a profile of this step, or with max_segment=1 (one checkpoint per layer)."
            )

        return pack

    def _unguard(self) -> None:
        if self.guard is not None:
            guard, self.guard = self.guard, None
            guard.__exit__(None, None, None)

    def _abort(self) -> None:
        self._unguard()
        if self.close is not None:
            close, self.close = self.close, None
            _OPEN.remove(self)
            close(abort=True)

    def _replay_fn(self) -> Callable:
        calls, originals, held = self.calls, self.originals, self.refs

        def replay(*args, **kwargs):  # Rule 2: the recomputation, on detached copies of the first inputs
            first = tree_flatten((args, kwargs))[0]
            last_use = {r[1]: k for k, (_, refs) in enumerate(calls, start=1) for r in refs if r[0] == "out"}
            with _batchnorm_stats_kept(alive(held)):
                out = originals[0](*args, **kwargs)
                outs = {0: tensor_leaves(out)} if 0 in last_use else {}
                for k, (spec, refs) in enumerate(calls, start=1):
                    a, kw = tree_unflatten([_resolve(r, first, outs) for r in refs], spec)
                    for j in [j for j, last in last_use.items() if last == k]:
                        del outs[j]  # no later entry takes it: not held while the others re-run
                    out = originals[k](*a, **kw)
                    if k in last_use:
                        outs[k] = tensor_leaves(out)
            return out

        setattr(replay, OWN, True)
        return replay


def _resolve(ref: Ref, first: list, outs: dict[int, list[torch.Tensor]]):
    kind = ref[0]
    if kind == "in":
        return first[ref[1]]
    if kind == "out":
        return outs[ref[1]][ref[2]]
    return ref[1]


def _never(_):
    raise AssertionError("remat: nothing is saved between the layers of a run (Rule 3)")
