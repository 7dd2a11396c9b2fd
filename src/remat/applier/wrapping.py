"""Making modules follow a plan, in place, without changing their state dict.

NOTE [How a module is checkpointed in place]
  remat never replaces a module object: it sets an instance attribute `forward` that
  shadows the class's method (so `state_dict()` keys, parameters, hooks and
  `named_modules()` are unchanged), and `remove` deletes it again.
  Rule 1. The wrapped forward calls non-reentrant `torch.utils.checkpoint.checkpoint`
          with `preserve_rng_state=True`: dropout masks in the recomputation equal the
          first ones, and inputs that do not require grad are fine (no reentrant pitfall).
          torch stashes the RNG state only of the devices of its positional tensor
          arguments (and picks the recomputation's autocast device from them): seen on an
          H100 2026-11-26, BERT's embeddings, which Hugging Face calls with keywords only,
          replayed dropout with another mask (gradients off by 5.7e-3, silently; CPU never
          shows it, its generator is always forked).  So every tensor torch would miss
          (in keyword arguments, nested or not, bound by `functools.partial` in the
          forward, and one parameter or buffer per GPU no argument is on) goes to it as
          one last positional tuple, which the function it runs drops again
          (`remat.applier.rng`); the recomputation runs the same function on the same
          inputs.  Under torch.compile the call is as written: the compiled checkpoint
          replays each random op's own generator.
  Rule 2. In eval mode or under `torch.no_grad()` the original forward runs directly.
  Rule 3. BatchNorm in training mode inside a checkpoint would update its running
          statistics again when recomputed; their values (and `num_batches_tracked`)
          are saved before the recomputation and put back after it, also when torch
          stops the recomputation early (the planner counts the copies in the
          re-run's moment: `BlockProfile.batchnorm_stats_bytes`).
  Rule 4. A segment of several consecutive children of an `nn.Sequential` is one
          checkpoint: the first child's forward runs the whole segment, and the others
          pass their input through for that one call of the parent.  Only where the
          Sequential's own forward runs: the children of one the model never calls (its
          code calls them, `Plan.called_directly`) are a run of entries (`remat.applier.runs`,
          NOTE [An nn.Sequential the model never calls]).
  Rule 5. A selective checkpoint is the same checkpoint with torch's selective policy:
          outputs of SAVE_OPS (matmuls, convolutions, attention) are kept, every other
          op is recomputed; or, when the plan names them (`Plan.selective_keeps`), the
          outputs of the ops of those signatures
          (NOTE [Which outputs a selective checkpoint keeps]).  A signature holds argument shapes: a forward in which
          no named op ran with its shapes (inputs of other shapes than profiled) keeps
          nothing, and says so in a warning, once per module.
  Rule 6. An offloaded module runs its forward under `saved_tensors_hooks`: every tensor
          its ops save goes to CPU memory (pinned when it comes from CUDA, copied
          without blocking on the current stream) and comes back to its device when
          backward unpacks it.  Parameters and buffers (and views of them, as `linear`
          saves `weight.t()`) stay where they are: they live on the device anyway.  A
          storage is copied whole, once per forward call, however many of its views are
          saved, and each view comes back with its own offset and strides, so backward
          runs the same kernels on the same layouts (gradients bit-equal).  This is
          torch.autograd.graph.save_on_cpu with those changes; nothing is recomputed,
          so RNG and BatchNorm statistics are untouched.
  Rule 7. A module that Hugging Face gradient checkpointing checkpoints itself (turned on
          after `apply`; `apply` leaves alone the modules it checkpoints already) runs its
          original forward inside Hugging Face's checkpoint, with a warning: one checkpoint,
          not one nested in another.
  Rule 8. What remat installs on a module holds it, and every other module of its segment, weakly: the
          forwards and undo records live in the modules' own `__dict__`, and a strong reference back would be
          a cycle that keeps a dropped model's wrapped modules, their parameters on the GPU included, allocated
          until Python's cycle collector runs, which may be never within a step (seen 2026-12-04: on an H200 a
          plan's 16 Llama layers, 688 MiB, were still allocated while the next variant trained, and counted
          in its `max_memory_allocated`).  A module a plan wraps is alive while it runs, so the references
          resolve.  A copy of a wrapped module (`copy.deepcopy` of a planned model copies the instance's
          functions as they are) would run the original's forward, with the original's weights; a pre-hook
          remat adds to each module it wraps stops a copy with an error saying so.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from remat._torch_compat import BatchNormBase as _BatchNorm
from remat._torch_compat import in_backward, op_name, tree_flatten
from remat._torch_compat.hooks import remove_forward_pre_hook
from remat.applier.rng import seen_by_torch
from remat.errors import RematError
from remat.hf import checkpointed_by_hf
from remat.module_tree import OWN_CHECKPOINT_MARK, WRAPPED_MARK
from remat.ops import SAVE_OPS, op_signature

MARK = WRAPPED_MARK  # attribute holding the WrapInfo of a wrapped module
OWN = OWN_CHECKPOINT_MARK  # attribute marking the function a remat checkpoint runs


@dataclass
class WrapInfo:
    """What remat did to one module, to undo it exactly."""

    members: list[weakref.ref]  # the modules of its segment or run, weakly (Rule 8)
    had_instance_forward: bool
    previous_forward: Callable | None
    role: str  # "head" runs the segment; "pass" passes its input through after the head ran
    pending: list[int] = field(default_factory=lambda: [0])  # shared by the segment: pass-through calls left
    moved: list[int] = field(default_factory=lambda: [0])  # offload: bytes copied to CPU memory so far
    guard: int = field(default=-1, compare=False)  # the id of the pre-hook that stops a copy of it (Rule 8)

    @property
    def segment(self) -> list[nn.Module]:
        """The modules of its segment (or run), first the one that runs it."""
        return alive(self.members)


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


def _run_segment(originals: list[Callable], refs: list[weakref.ref]) -> Callable:
    """The function a checkpoint re-runs: the segment's original forwards, chained (Rule 4)."""

    def run(*args, **kwargs):
        if in_backward():  # the recomputation
            with _batchnorm_stats_kept(alive(refs)):
                return _chain(originals, args, kwargs)
        return _chain(originals, args, kwargs)

    setattr(run, OWN, True)
    return run


def is_own_checkpoint(function: Callable) -> bool:
    """`function` is what one of remat's checkpoints runs (not a checkpoint of the model's own code)."""
    return getattr(function, OWN, False) is True


def _chain(originals: list[Callable], args, kwargs):
    out = originals[0](*args, **kwargs)
    for fwd in originals[1:]:
        out = fwd(out)
    return out


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Rule 5's policy."""
    return CheckpointPolicy.MUST_SAVE if op_name(op) in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _keeping(signatures: frozenset[str], kept: list[int]) -> Callable:
    """Rule 5's policy for a plan that names the ops to keep (NOTE [Which outputs a selective checkpoint keeps]);
    counts in `kept` the outputs it kept."""
    names = {s.split("(", 1)[0] for s in signatures}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        name = op_name(op)
        if name in names:
            tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            if op_signature(name, tensors) in signatures:
                kept[0] += 1
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _warn_if_none_kept(module: nn.Module, keeps: list[str], kept: list[int], warned: list[bool]) -> None:
    """Rule 5: a signature holds the shapes profiled; a forward in which none matched ran on other shapes, and
    its checkpoint keeps nothing (it recomputes more than the plan said).  Said once per module."""
    if kept[0] or warned[0] or torch.compiler.is_compiling():
        return
    warned[0] = True
    warnings.warn(
        f"remat: the plan keeps the outputs of {len(keeps)} op(s) of this {type(module).__name__} by their argument "
        f"shapes (e.g. {keeps[0]}), and none ran with those shapes in this forward: its inputs are not the shapes "
        "the plan was profiled with, so it keeps nothing and recomputes all its ops. Fix: profile and plan with "
        "inputs of these shapes.",
        stacklevel=3,
    )


def wrap_segment(segment: list[nn.Module], selective: bool = False, keeps: list[str] | None = None) -> None:
    """Checkpoint `segment` (one module, or consecutive children of an nn.Sequential) in place; `selective`:
    with torch's selective policy, keeping matmul-like outputs or, if given, those of the ops in `keeps`."""
    originals = [_current_forward(m) for m in segment]
    refs = [weakref.ref(m) for m in segment]  # Rule 8
    run = _run_segment(originals, refs)
    pending, kept, warned = [0], [0], [False]
    policy = _keeping(frozenset(keeps), kept) if keeps else _keep_matmuls
    options = {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)} if selective else {}

    def head_forward(*args, **kwargs):
        head = resolved(refs[0])
        if not (head.training and torch.is_grad_enabled()):  # Rule 2
            out = _chain(originals[:1], args, kwargs)
            return out
        pending[0] = len(refs) - 1
        if hf_checkpoints(head):  # Rule 7
            return run(*args, **kwargs)
        kept[0] = 0
        call, positional = seen_by_torch(run, originals, alive(refs), args, kwargs)  # Rule 1: every device's RNG
        out = checkpoint(call, *positional, use_reentrant=False, preserve_rng_state=True, **options, **kwargs)
        if selective and keeps:
            _warn_if_none_kept(head, keeps, kept, warned)
        return out

    _install(segment[0], head_forward, refs, "head", pending)
    for m, original in zip(segment[1:], originals[1:]):
        _install(m, _pass_through(original, pending), refs, "pass", pending)


def hf_checkpoints(module: nn.Module) -> bool:
    """Rule 7: Hugging Face gradient checkpointing checkpoints `module` now (it was turned on after apply)."""
    if not checkpointed_by_hf(module):
        return False
    warnings.warn(
        f"remat: Hugging Face gradient checkpointing now checkpoints a {type(module).__name__} that remat's plan "
        "checkpoints or offloads too: left to it, not done twice, so the plan's predicted peak and recomputation "
        "no longer describe this step. Fix: model.gradient_checkpointing_disable() to follow the plan, or "
        "remat.remove(model) and profile and plan again with it on.",
        stacklevel=3,
    )
    return True


def wrap_offload(module: nn.Module) -> None:
    """Offload what `module`'s ops save to CPU memory during the step (Rule 6), in place."""
    original = _current_forward(module)
    ref, moved = weakref.ref(module), [0]  # Rule 8

    def forward(*args, **kwargs):
        module = resolved(ref)
        if not (module.training and torch.is_grad_enabled()) or hf_checkpoints(module):  # Rules 2 and 7
            return original(*args, **kwargs)
        resident = {_storage_key(t) for t in [*module.parameters(), *module.buffers()]}
        pack, unpack, hosts = _offload_hooks(resident, moved)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                return original(*args, **kwargs)
        finally:
            for host in hosts.values():
                host.device_tensor = None  # the device copy may go now; backward brings the bytes back

    _install(module, forward, [ref], "offload", [0], moved)


class _HostStorage:
    """One device storage copied to CPU memory, and its copy back while backward still needs it."""

    def __init__(self, t: torch.Tensor):
        storage = t.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        self.device = t.device
        # Held until the module's forward returns: while it lives, no other storage can take
        # its address, so the address identifies it in `hosts` (Rule 6).
        self.device_tensor: torch.Tensor | None = t
        self.host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=t.is_cuda)
        self.host.copy_(flat, non_blocking=t.is_cuda)
        self.views_left = 0
        self.back: torch.Tensor | None = None

    def view(self, dtype, offset, size, stride) -> torch.Tensor:
        if self.back is None:
            self.back = self.host.to(self.device, non_blocking=self.host.is_pinned())
        out = torch.empty(0, dtype=dtype, device=self.device).set_(self.back.untyped_storage(), offset, size, stride)
        self.views_left -= 1
        if self.views_left <= 0:
            self.back = None  # the last view holds the storage now; backward frees it after use
        return out


def _offload_hooks(resident: set[tuple], moved: list[int]):
    """pack/unpack for one forward call: each saved storage goes to CPU memory once, and every
    saved view of it comes back with its own dtype, offset, size and strides (bit-equal kernels)."""
    hosts: dict[tuple, _HostStorage] = {}

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key in resident or t.layout != torch.strided:
            return t  # a parameter or buffer (or a view of one) stays on the device anyway; so does a sparse tensor
        if key not in hosts:
            hosts[key] = _HostStorage(t)
            moved[0] += t.untyped_storage().nbytes()
        host = hosts[key]
        host.views_left += 1
        return host, t.dtype, t.storage_offset(), tuple(t.shape), t.stride()

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        host, dtype, offset, size, stride = saved
        return host.view(dtype, offset, size, stride)

    return pack, unpack, hosts


def _storage_key(t: torch.Tensor) -> tuple:
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def offloaded_bytes(model: nn.Module) -> int:
    """Bytes the offloaded modules of `model` copied to CPU memory since they were wrapped."""
    return sum(
        m.__dict__[MARK].moved[0] for m in model.modules() if is_wrapped(m) and m.__dict__[MARK].role == "offload"
    )


def _current_forward(module: nn.Module) -> Callable:
    """What calling `module` runs now: its instance `forward` if it has one, else its class's, bound to the module
    weakly (Rule 8)."""
    if "forward" in module.__dict__:
        return module.__dict__["forward"]
    function, ref = type(module).forward, weakref.ref(module)

    def forward(*args, **kwargs):
        return function(resolved(ref), *args, **kwargs)

    return forward


def resolved(ref: weakref.ref) -> nn.Module:
    """The module `ref` holds (Rule 8).  Gone only where a forward remat installed outlived its module: one copied
    with the module into another model (`copy.deepcopy` copies an instance's functions as they are)."""
    module = ref()
    if module is None:
        raise RematError(
            "remat: this module's forward is remat's checkpoint of a module that no longer exists: the model was "
            "copied (copy.deepcopy) after remat.apply, and a copy keeps running the original's forwards. Fix: "
            "remat.remove(model) before copying it, then remat.apply(copy, plan) to the copy."
        )
    return module


def alive(refs: list[weakref.ref]) -> list[nn.Module]:
    """The modules `refs` hold weakly (Rule 8)."""
    modules = [r() for r in refs]
    return [m for m in modules if m is not None]


def _pass_through(original: Callable, pending: list[int]) -> Callable:
    def forward(*args, **kwargs):
        if pending[0] > 0:  # the head already ran this module inside its checkpoint
            pending[0] -= 1
            return args[0]
        return original(*args, **kwargs)

    return forward


def _install(module: nn.Module, forward: Callable, members, role: str, pending: list[int], moved=None) -> None:
    had = "forward" in module.__dict__
    guard = module.register_forward_pre_hook(_no_copy(weakref.ref(module))).id
    moved = moved if moved is not None else [0]
    info = WrapInfo(members, had, module.__dict__.get("forward"), role, pending, moved, guard)
    module.forward = forward
    object.__setattr__(module, MARK, info)


def _no_copy(ref: weakref.ref) -> Callable:
    """Rule 8: a pre-hook that stops a copy of the wrapped module, whose forward is still the original's."""

    def hook(module, args):
        if module is not ref():
            raise RematError(
                f"remat: this {type(module).__name__} is a copy (copy.deepcopy) of a module that remat.apply "
                "checkpoints: expected the module it wrapped, saw a copy, whose forward is still the original's and "
                "would run the original's weights. "
                "Fix: remat.apply(copy, plan) to the copy (it replaces what was copied), or remat.remove(model) "
                "before copying it."
            )

    return hook


def is_wrapped(module: nn.Module) -> bool:
    return MARK in module.__dict__


def unwrap(module: nn.Module) -> None:
    """Undo `wrap_segment` on one module: its forward is the one it had before."""
    info: WrapInfo = module.__dict__.pop(MARK)
    remove_forward_pre_hook(module, info.guard)
    if info.had_instance_forward and info.previous_forward is not None:
        module.forward = info.previous_forward
    else:
        del module.forward
