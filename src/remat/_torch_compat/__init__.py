"""The one place where remat touches private PyTorch APIs.

Each name here is used by remat's measurement code; if a PyTorch release moves
one, this file is the only one to change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import (  # private: fake tensors
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.nn.modules.batchnorm import _BatchNorm  # private: the base class of every BatchNorm
from torch.nn.modules.dropout import _DropoutNd  # private: the base class of the Dropout modules
from torch.utils._python_dispatch import TorchDispatchMode  # private module, public-facing class
from torch.utils._python_dispatch import _disable_current_modes  # private: run an op beneath every mode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # private: pytree (un)flattening

from remat._torch_compat.fake_ops import real_kernel_rules  # fake kernels where the meta kernel refuses
from remat._torch_compat.flops import flop_counter, flop_formulas, flops_of  # torch's formulas, attention's GQA-aware
from remat._torch_compat.hooks import global_forward_hook_with_kwargs  # torch's handle leaves a flag

__all__ = [
    "real_kernel_rules",
    "BatchNormBase",
    "DropoutBase",
    "TorchDispatchMode",
    "beneath_modes",
    "tree_flatten",
    "tensor_leaves",
    "tree_unflatten",
    "tree_map",
    "fsdp_checkpoint_wrapper",
    "replaced",
    "ModuleTracker",
    "FakeTensor",
    "FakeTensorMode",
    "FAKE_OP_ERRORS",
    "DATA_DEPENDENT_ERRORS",
    "in_backward",
    "op_name",
    "flop_counter",
    "flops_of",
    "flop_formulas",
    "fake_mode_of",
    "checkpoint_wrapper_type",
    "cuda_autocast_runs_on_cpu",
    "autocast_caches",
    "autocast_cache_clears",
    "backward_in_mode",
    "compile_on_this_thread",
    "global_forward_hook_with_kwargs",
]

BatchNormBase = _BatchNorm
DropoutBase = _DropoutNd

FAKE_OP_ERRORS = (UnsupportedOperatorException, DynamicOutputShapeException, DataDependentOutputException)
DATA_DEPENDENT_ERRORS = (DynamicOutputShapeException, DataDependentOutputException)


def beneath_modes():
    """A context in which ops run on real tensors beneath every dispatch mode on the stack (fake mode included)."""
    return _disable_current_modes()


def in_backward() -> bool:
    """True while the autograd engine is running a backward pass on this thread.

    False while torch.compile traces: Dynamo traces forwards only (AOTAutograd derives the backward, and
    its recomputation, from the traced graph), and asking the engine would break the graph."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


def op_name(func) -> str:
    """The packet name of an aten op overload ("mm" for aten.mm.default)."""
    return func._overloadpacket.__name__


@contextlib.contextmanager
def cuda_autocast_runs_on_cpu() -> Iterator[None]:
    """While inside, `torch.autocast("cuda", dtype)` (and `torch.cuda.amp.autocast`) enters CPU autocast with
    that dtype (CUDA's default, float16, when none is given) instead of disabling itself for want of a GPU.

    NOTE [A CUDA step simulated on CPU], Rule 2.  Replaces `torch.amp.autocast.__init__` for the length of the
    block (the class has no hook for it), hence here.
    """
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    original = cls.__init__

    def init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            device_type, dtype = "cpu", dtype if dtype is not None else torch.get_autocast_dtype("cuda")
        original(self, device_type, dtype, enabled, cache_enabled)

    cls.__init__ = init  # type: ignore[method-assign]  # replaced meanwhile
    try:
        yield
    finally:
        cls.__init__ = original  # type: ignore[method-assign]


def autocast_caches(func, args: tuple, out) -> bool:
    """`out`, made by `func` on `args`, is a cast autocast keeps in its cache until the outermost `torch.autocast`
    region exits: a float32 parameter (a leaf that requires grad, not a view) cast to a half dtype inside a
    region whose cache is on.  The conditions of `cached_cast` in ATen's autocast_mode.cpp, read in a dispatch
    mode, where autocast itself shows as off (NOTE [A weight autocast casts], in `remat.measure.tracker`); the
    region's depth is read by entering one level and leaving it (no public getter)."""
    if func is not torch.ops.aten._to_copy.default or not isinstance(out, torch.Tensor):
        return False
    a = args[0] if args else None
    if not isinstance(a, torch.Tensor) or not (a.is_leaf and a.requires_grad) or a._is_view():
        return False
    if a.dtype != torch.float32 or out.dtype not in (torch.bfloat16, torch.float16):
        return False
    if not torch.is_autocast_cache_enabled():
        return False
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return depth > 1


@contextlib.contextmanager
def autocast_cache_clears(callback) -> Iterator[None]:
    """While inside, `callback()` runs whenever autocast empties its cache of casts (`torch.autocast.__exit__` calls
    `torch.clear_autocast_cache` when it leaves the outermost region): replaced for the length of the block, hence
    here."""
    original = torch.clear_autocast_cache

    def clear() -> None:
        callback()
        original()

    torch.clear_autocast_cache = clear
    try:
        yield
    finally:
        torch.clear_autocast_cache = original


def backward_in_mode(mode, func, args: tuple, kwargs: dict):
    """Run `Tensor.backward` / `torch.autograd.backward` (`func`) with the torch-function `mode` active while
    the autograd engine runs, so the forwards that checkpoints recompute in backward pass through it too.

    Called from `mode.__torch_function__`, where torch has popped the mode; pushed again, it would catch the
    same backward call again, so the engine is entered beneath torch.autograd.backward's torch-function
    check, through two private helpers, hence here.
    """
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    names: tuple[str, ...]
    if func is torch.Tensor.backward:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "inputs")
    else:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
    given = {**dict(zip(names, args)), **kwargs}
    if func is torch.Tensor.backward:
        given["grad_tensors"] = given.pop("gradient", given.get("grad_tensors"))
    tensors = _as_tuple(given["tensors"])
    grads = _make_grads(
        tensors, _tensor_or_tensors_to_tuple(given.get("grad_tensors"), len(tensors)), is_grads_batched=False
    )
    create = bool(given.get("create_graph", False))
    retain = create if given.get("retain_graph") is None else given["retain_graph"]
    inputs = given.get("inputs")
    inputs = tuple(inputs.values()) if isinstance(inputs, dict) else _as_tuple(inputs)
    with mode:
        _engine_run_backward(tensors, grads, retain, create, inputs, allow_unreachable=True, accumulate_grad=True)


def _as_tuple(tensors) -> tuple:
    if tensors is None:
        return ()
    return (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)


def fake_mode_of(t: torch.Tensor):
    """The FakeTensorMode a fake tensor belongs to, or None for a real tensor."""
    return t.fake_mode if isinstance(t, FakeTensor) else None


@contextlib.contextmanager
def replaced(owner, name: str, value) -> Iterator[None]:
    """`owner.name` is `value` meanwhile, put back after: torch's private config around a compiled call
    (`remat._torch_compat.compiler`) and Hugging Face's own functions under fake tensors (`remat.hf`).  Not a
    config module's own `patch`: it builds a class at each call, and remat's compiler-budget plans set two around
    every step (0.16 ms a step of a tiny compiled Llama on CPU, none measurable so, 2026-12-07; docs/changelog.md,
    session 65)."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def fsdp_checkpoint_wrapper(module, reentrant: bool = False):
    """`checkpoint_wrapper(module)` from torch.distributed (used by `remat explain`'s examples)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    return checkpoint_wrapper(module, checkpoint_impl=impl)


from remat._torch_compat.module_tracker import ModuleTracker  # noqa: E402, F401  (needs in_backward above)


# -- intercepting torch.utils.checkpoint (used by remat.explainer) ------------------------------------

import contextlib  # noqa: E402
import functools  # noqa: E402
import inspect  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, ContextManager  # noqa: E402

import torch.utils.checkpoint as _tuc  # noqa: E402

_CHECKPOINT_GENERATOR = _tuc._checkpoint_without_reentrant_generator
"""torch's own, kept here: `intercept_checkpoints` stands in for it while explain runs."""


@dataclass(frozen=True)
class CheckpointCall:
    """One call of `torch.utils.checkpoint.checkpoint`, as `intercept_checkpoints` sees it."""

    function: Callable
    args: tuple
    kwargs: dict
    reentrant: bool
    preserve_rng_state: bool


# on_call(call) -> (keep, scope): keep=False runs the function without checkpointing; the
# forward run of the function happens inside the context manager `scope`.
CheckpointHandler = Callable[[CheckpointCall], "tuple[bool, ContextManager]"]


@contextlib.contextmanager
def intercept_checkpoints(on_call: CheckpointHandler, in_backward_keep: Callable[[CheckpointCall], bool] | None = None):
    """Route every `torch.utils.checkpoint.checkpoint` call made in forward through `on_call`.

    `checkpoint` binds early (`from torch.utils.checkpoint import checkpoint`, the partial
    inside `checkpoint_wrapper`), so the patch is one level down, where every call goes:
    the module globals `CheckpointFunction` (use_reentrant=True) and
    `_checkpoint_without_reentrant_generator` (use_reentrant=False), both looked up at call
    time.  Calls made during backward (a nested checkpoint being recomputed) keep their
    checkpoint if `in_backward_keep(call)` says so (always, without it), and are not passed
    to `on_call`.  Both globals are restored on exit, also after an error.
    """
    keep_in_backward = in_backward_keep or (lambda call: True)
    reentrant_orig = _tuc.CheckpointFunction
    generator_orig = _tuc._checkpoint_without_reentrant_generator
    n_fixed = _positional_before_varargs(generator_orig)

    class _Reentrant:
        @staticmethod
        def apply(function, preserve, *args):
            if in_backward():
                keep = keep_in_backward(CheckpointCall(function, args, {}, True, bool(preserve)))
                return reentrant_orig.apply(function, preserve, *args) if keep else function(*args)
            keep, scope = on_call(CheckpointCall(function, args, {}, True, bool(preserve)))
            with scope:
                return reentrant_orig.apply(function, preserve, *args) if keep else function(*args)

    def _non_reentrant(*fixed_and_args, **kwargs):
        function = fixed_and_args[0]
        preserve = fixed_and_args[1] if len(fixed_and_args) > 1 else True
        args = fixed_and_args[n_fixed:]
        if in_backward():
            if keep_in_backward(CheckpointCall(function, args, kwargs, False, bool(preserve))):
                yield from generator_orig(*fixed_and_args, **kwargs)
            else:
                yield
            return
        keep, scope = on_call(CheckpointCall(function, args, kwargs, False, bool(preserve)))
        with scope:  # `checkpoint` runs the function between the generator's two steps
            if keep:
                yield from generator_orig(*fixed_and_args, **kwargs)
            else:
                yield

    _tuc.CheckpointFunction = _Reentrant  # type: ignore[misc,assignment]  # torch's own class, swapped meanwhile
    _tuc._checkpoint_without_reentrant_generator = _non_reentrant
    try:
        yield
    finally:
        _tuc.CheckpointFunction = reentrant_orig  # type: ignore[misc]
        _tuc._checkpoint_without_reentrant_generator = generator_orig


def open_checkpoint(fn: Callable, *args, **kwargs):
    """A non-reentrant checkpoint whose forward runs between two calls, not inside one function:
    `close = open_checkpoint(replay, *inputs)`; run the forward; `close()` (`close(abort=True)` after
    a failed forward).  Tensors saved in between are recomputed in backward by `replay(*inputs)`
    (detached copies), with the RNG state of the start restored, exactly as
    `torch.utils.checkpoint.checkpoint(replay, *inputs, use_reentrant=False)` would; that function
    is this generator, run by hand.  Like it, it stashes the GPU RNG state of the devices of the
    positional `inputs`' tensors only (`remat.applier.rng.seen_by_torch` adds the others)."""
    fixed: list[Any] = [fn, True, _tuc.noop_context_fn, "default", False, True][:_CHECKPOINT_GENERATOR_FIXED]
    gen = _CHECKPOINT_GENERATOR(*fixed, *args, **kwargs)
    next(gen)

    def close(abort: bool = False) -> None:
        if abort:
            gen.close()
            return
        try:
            next(gen)
        except StopIteration:
            return

    return close


def _positional_before_varargs(fn) -> int:
    """How many parameters precede `*args` (fn, preserve_rng_state, context_fn, ... vary by release)."""
    params = list(inspect.signature(fn).parameters.values())
    return next(i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL)


_CHECKPOINT_GENERATOR_FIXED = _positional_before_varargs(_CHECKPOINT_GENERATOR)


def tensor_leaves(obj) -> list[torch.Tensor]:
    """The tensors among the pytree leaves of `obj` (tuples, lists, dicts, Hugging Face outputs), in order."""
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def sequential_segment(function) -> tuple[int, int, list[Any]] | None:
    """(start, end, functions) if `function` is one segment made by `checkpoint_sequential`, else None.

    `checkpoint_sequential` checkpoints closures `run_function(start, end, functions)`; their
    free variables say which slice of the sequence each one runs.
    """
    if not getattr(function, "__qualname__", "").startswith("checkpoint_sequential."):
        return None
    try:
        free = inspect.getclosurevars(function).nonlocals
        return int(free["start"]), int(free["end"]), list(free["functions"])
    except (KeyError, TypeError, ValueError):
        return None


def unwrap_callable(function) -> Any:
    """The module a checkpointed callable runs, if it is one: `mod`, `mod.__call__`, `mod.forward`,
    `partial(Cls.forward, mod, ...)` (Hugging Face's layers); otherwise the function, partials unwrapped."""
    while isinstance(function, functools.partial):
        if function.args and isinstance(function.args[0], torch.nn.Module) and _is_forward(function.func):
            return function.args[0]
        function = function.func
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) and _is_forward(function) else function


def _is_forward(fn) -> bool:
    return getattr(fn, "__name__", "") in ("__call__", "forward", "_call_impl", "_wrapped_call_impl")


def rng_fingerprint() -> bytes:
    """The CPU (and initialised CUDA) random generators' states, read with Python dispatch off, so
    that neither a profiling TorchDispatchMode nor a FakeTensorMode sees the read."""
    with torch._C._DisableTorchDispatch():
        states = [torch.get_rng_state()]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states += torch.cuda.get_rng_state_all()
        return b"".join(s.numpy().tobytes() for s in states)


from remat._torch_compat.distributed import checkpoint_wrapper_type, wrapped_module  # noqa: E402, F401  (re-exported)


def compile_on_this_thread() -> None:
    """Inductor compiles kernels on this thread from now on, with no pool.  For a forked copy of a process that
    compiled before: the parent's compile thread pool (`AsyncCompile.pool`, cached) comes across the fork without
    its threads, and a kernel handed to it waits forever (seen: a copy measuring a compiled step hung in
    `CppCodeCache.load_async`).  Nothing is imported when Inductor is not loaded yet: the copy will then build its
    own pool."""
    import sys

    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        setattr(config, "compile_threads", 1)  # private: read by AsyncCompile.submit and .cpp on every kernel
