"""torch's ModuleTracker, adapted: which module runs now, in forward, backward and checkpoint recomputation."""

from __future__ import annotations

import itertools

import torch
from torch.utils.module_tracker import ModuleTracker as _ModuleTracker

from remat._torch_compat import in_backward, tree_flatten


class ModuleTracker(_ModuleTracker):
    """`torch.utils.module_tracker.ModuleTracker` that registers no grad hooks for forwards
    re-run inside backward (checkpoint recomputation).

    torch's tracker hooks every module call's inputs and outputs and keeps the hooks until
    it exits; for a recomputed forward those hooks keep the recomputed tensors alive to the
    end of backward (measured: checkpoint_sequential(4) over a 33-module chain, 71 MiB instead
    of the true 48 MiB).  Overrides two private methods, hence here.

    Modules re-run in backward are kept apart, in `recomputing`: torch stops a recomputation
    early by raising inside it, so their post-hooks may never run.  A module entered in a
    recomputation drops the names that are not its ancestors (left over from an earlier,
    stopped one), and ops that are not recomputation ignore them.

    Under `torch.no_grad()` (a custom autograd Function's forward: Hugging Face's Reformer runs
    its reversible layers so) a module call records no graph, and nothing is hooked for its
    backward: torch's own tracker tried, and raised on a view made there of a tensor that
    requires grad ("Expected gradient function to be set"; such a view has no node to hook).

    `root`: how torch names the model (its class name).  A module outside it (not registered
    in it: an activation module made on the fly or shared through a module-level table, a loss
    module) is named by its class alone, never under the model.  Called while modules of the
    model run, it runs inside the innermost of them: `innermost` answers that one, and entering
    it in a recomputation drops none of the model's open modules.  Nor are its tensors hooked for its
    backward there (`_inside_the_model`): torch's hook on a tensor holds that tensor's node, the node holds
    the hook, and a tensor the forward then drops unused lived until the tracker exited.  Hugging Face's
    `kernels` make functions such modules; from transformers 5.25 Mamba's mixer hands one, `mamba_inner_fn`,
    an `A` that the CPU's path never uses: 4 KiB per layer, counted to the step's end and past its peak, and
    a checkpoint's input held with it (`benchmarks/unseen_models.py`, 2026-12-07; against the process, an 8 MiB
    tensor so handed: `tests/test_dead_branches.py`).
    """

    def __init__(self, root: str | None = None) -> None:
        super().__init__()
        self.root = root
        self.recomputing: set[str] = set()
        self.entered: dict[str, int] = {}
        """Module name -> when it was last entered (forward, backward or recomputation), for `innermost`."""
        self._entries = itertools.count()

    def _get_append_fn(self, name, is_bw):
        enter = super()._get_append_fn(name, is_bw)

        def fn(*args) -> None:
            self.entered[name] = next(self._entries)
            enter(*args)

        return fn

    def _fw_pre_hook(self, mod, input) -> None:
        if in_backward():
            name = self._get_mod_name(mod)
            self.entered[name] = next(self._entries)
            if self._outside(name):
                self.recomputing.add(name)
            else:
                self.recomputing = {n for n in self.recomputing if name.startswith(n + ".")} | {name}
        elif torch.is_grad_enabled() and not self._inside_the_model(self._get_mod_name(mod)):
            super()._fw_pre_hook(mod, input)
        else:  # no graph is recorded, so no backward of this call to hook (nor, for a view made here, a node);
            # or a module outside the model called inside it, whose backward is the model module's around it
            self._get_append_fn(self._get_mod_name(mod), False)()

    def _fw_post_hook(self, mod, input, output) -> None:
        if in_backward():
            self.recomputing.discard(self._get_mod_name(mod))
            return
        given = {id(t) for t in tree_flatten(input)[0] if isinstance(t, torch.Tensor)}
        made = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and id(t) not in given]
        if not torch.is_grad_enabled() or self._inside_the_model(self._get_mod_name(mod)):
            made = []
        super()._fw_post_hook(mod, input, made)  # an output that is an input (nn.Identity) opens no backward

    def _inside_the_model(self, name: str) -> bool:
        """`name` is a module outside the model called while one of the model's runs: its backward runs inside that
        one's, which `innermost` names anyway, and hooking its tensors would keep a tensor it drops (a branch the
        forward computes and never uses) alive until the tracker exits (see the class docstring)."""
        return self._outside(name) and any(n != "Global" and not self._outside(n) for n in self.parents)

    def _outside(self, name: str) -> bool:
        """The module named `name` is not the model nor one of its submodules (always False without `root`)."""
        return self.root is not None and name != self.root and not name.startswith(self.root + ".")

    def innermost(self, recompute: bool) -> str | None:
        """The module running now: of the recomputed ones for a recomputed op, else of the others.

        The one entered last, then inside it the one entered last, down to a module with none open
        inside (in backward a module and its last child are entered on the same gradient, the child
        first).  Not simply the deepest: in backward a module whose inputs need no gradient (an
        embedding, a stem's convolution) is never left, and the deepest open one would take every
        later op.  Ties (never in practice: entries are numbered) go to the last name, so the answer
        never depends on set order.  A module outside the model gives way to the model's modules
        open around it."""
        names = [n for n in (self.recomputing if recompute else self.parents) if n != "Global"]
        names = [n for n in names if not self._outside(n)] or names
        pick = None
        while names:
            pick = max(names, key=lambda n: (self.entered.get(n, -1), n))
            names = [n for n in names if n.startswith(pick + ".")]
        return pick
