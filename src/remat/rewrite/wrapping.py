"""Making modules follow a plan, in place, without changing their state dict.

NOTE [How a module is checkpointed in place]
  remat never replaces a module object: it sets an instance attribute `forward` that
  shadows the class's method (so `state_dict()` keys, parameters, hooks and
  `named_modules()` are unchanged), and `remove` deletes it again.
  Rule 1. The wrapped forward calls non-reentrant `torch.utils.checkpoint.checkpoint`
          with `preserve_rng_state=True`: dropout masks in the recomputation equal the
          first ones, and inputs that do not require grad are fine (no reentrant pitfall).
  Rule 2. In eval mode or under `torch.no_grad()` the original forward runs directly.
  Rule 3. BatchNorm in training mode inside a checkpoint would update its running
          statistics again when recomputed; their values (and `num_batches_tracked`)
          are saved before the recomputation and put back after it, also when torch
          stops the recomputation early.
  Rule 4. A segment of several consecutive children of an `nn.Sequential` is one
          checkpoint: the first child's forward runs the whole segment, and the others
          pass their input through for that one call of the parent.
  Rule 5. A selective checkpoint is the same checkpoint with torch's selective policy:
          outputs of SAVE_OPS (matmuls, convolutions, attention) are kept, every other
          op is recomputed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from remat._torch_compat import BatchNormBase as _BatchNorm
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from remat._torch_compat import in_backward
from remat.measure.tracker import SAVE_OPS

MARK = "_remat_forward"  # attribute holding the WrapInfo of a wrapped module


@dataclass
class WrapInfo:
    """What remat did to one module, to undo it exactly."""

    segment: list[nn.Module]
    had_instance_forward: bool
    previous_forward: Callable | None
    role: str  # "head" runs the segment; "pass" passes its input through after the head ran
    pending: list[int] = field(default_factory=lambda: [0])  # shared by the segment: pass-through calls left


@contextlib.contextmanager
def _batchnorm_stats_kept(modules: list[nn.Module]) -> Iterator[None]:
    """Rule 3: running statistics of training-mode BatchNorms come out as they went in."""
    bns = [m for mod in modules for m in mod.modules() if isinstance(m, _BatchNorm) and m.training]
    saved = [{k: v.clone() for k, v in bn.named_buffers(recurse=False) if v is not None} for bn in bns]
    try:
        yield
    finally:
        with torch.no_grad():
            for bn, bufs in zip(bns, saved):
                for k, v in bufs.items():
                    getattr(bn, k).copy_(v)


def _run_segment(originals: list[Callable], modules: list[nn.Module]) -> Callable:
    """The function a checkpoint re-runs: the segment's original forwards, chained (Rule 4)."""

    def run(*args, **kwargs):
        if in_backward():  # the recomputation
            with _batchnorm_stats_kept(modules):
                return _chain(originals, args, kwargs)
        return _chain(originals, args, kwargs)

    return run


def _chain(originals: list[Callable], args, kwargs):
    out = originals[0](*args, **kwargs)
    for fwd in originals[1:]:
        out = fwd(out)
    return out


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Rule 5's policy."""
    return CheckpointPolicy.MUST_SAVE if op._overloadpacket.__name__ in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def wrap_segment(segment: list[nn.Module], selective: bool = False) -> None:
    """Checkpoint `segment` (one module, or consecutive children of an nn.Sequential) in place."""
    originals = [type(m).forward.__get__(m) if "forward" not in m.__dict__ else m.__dict__["forward"] for m in segment]
    run = _run_segment(originals, segment)
    head = segment[0]
    pending = [0]
    options = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)} if selective else {}

    def head_forward(*args, **kwargs):
        if not (head.training and torch.is_grad_enabled()):  # Rule 2
            out = _chain(originals[:1], args, kwargs)
            return out
        pending[0] = len(segment) - 1
        return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True, **options, **kwargs)

    _install(head, head_forward, segment, "head", pending)
    for m, original in zip(segment[1:], originals[1:]):
        _install(m, _pass_through(original, pending), segment, "pass", pending)


def _pass_through(original: Callable, pending: list[int]) -> Callable:
    def forward(*args, **kwargs):
        if pending[0] > 0:  # the head already ran this module inside its checkpoint
            pending[0] -= 1
            return args[0]
        return original(*args, **kwargs)

    return forward


def _install(module: nn.Module, forward: Callable, segment, role: str, pending: list[int]) -> None:
    had = "forward" in module.__dict__
    info = WrapInfo(segment, had, module.__dict__.get("forward"), role, pending)
    module.forward = forward
    object.__setattr__(module, MARK, info)


def is_wrapped(module: nn.Module) -> bool:
    return MARK in module.__dict__


def unwrap(module: nn.Module) -> None:
    """Undo `wrap_segment` on one module: its forward is the one it had before."""
    info: WrapInfo = module.__dict__.pop(MARK)
    if info.had_instance_forward:
        module.forward = info.previous_forward
    else:
        del module.forward
