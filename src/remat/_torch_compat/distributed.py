"""The private parts of torch.distributed that remat uses, in one place (see `remat._torch_compat`).

- Its classes (DDP, FSDPModule, DTensor, checkpoint_wrapper's) are looked up once, by name, and are None
  where torch is built without distributed (`distributed_class`, `is_a`).

- DTensor (FSDP2's sharded parameters, gradients and optimizer state) is a wrapper: a rank holds
  only its local shard (`DTensor._local_tensor`), and that is what remat counts.
- FSDP2 frees and re-allocates the memory of the parameters it all-gathers by resizing their
  storages (`UntypedStorage.resize_`), which no dispatch mode sees; `storage_resizes` reports
  each resize.  `fsdp_gathered` lists those storages' tensors.
- A fake process group (`torch.testing._internal.distributed.fake_pg`) lets one process run the
  step of rank 0 of N with every collective a no-op, so FSDP2 allocates, gathers and frees as on
  each rank of a real run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn


DDP = ("torch.nn.parallel", "DistributedDataParallel")
FSDP_MODULE = ("torch.distributed.fsdp", "FSDPModule")
"""What `fully_shard` makes a module: an instance of FSDP<its class>, a subclass of FSDPModule and its class."""
DTENSOR = ("torch.distributed.tensor", "DTensor")


@functools.cache
def distributed_class(module: str, name: str) -> type | None:
    """Class `name` of torch's `module`, imported once (the tracker asks on every op); None where torch is
    built without distributed."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # torch built without distributed
        return None


def is_a(obj, which: tuple[str, str]) -> bool:
    """`obj` is an instance of the class `which` names (DDP, FSDP_MODULE, DTENSOR), which torch may lack."""
    cls = distributed_class(*which)
    return cls is not None and isinstance(obj, cls)


def checkpoint_wrapper_type():
    """The class of `checkpoint_wrapper(...)` modules, or None where torch.distributed is absent."""
    return distributed_class("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "CheckpointWrapper")


def wrapped_module(model):
    """The module a training wrapper runs, or None: DistributedDataParallel's `module`, or the original of
    `torch.compile(module)` (`OptimizedModule._orig_mod`, a private attribute of a private class)."""
    if is_a(model, DDP):
        return model.module
    return compiled_module(model)


def uncompiled(model):
    """The model inside `torch.compile` wrappers (nested too), or `model` itself: remat tracks this one, by its
    own module names.  Dynamo never compiles a frame again once it ran under a dispatch mode (until
    `torch._dynamo.reset()`), so what remat runs under its tracker or FlopCounterMode runs with the compiler
    told to stand aside (`torch.compiler.set_stance("force_eager")`), for code compiled anywhere
    (`module.compile()`, a compiled block or loss): else the user's step would stay eager afterwards."""
    inner = compiled_module(model)
    while inner is not None:
        model, inner = inner, compiled_module(inner)
    return model


def is_compiled(model) -> bool:
    """`torch.compile(model)`, or a model compiled in place by `model.compile()` (which keeps the compiled call in
    the private `nn.Module._compiled_call_impl`): its step runs compiled code."""
    return uncompiled(model) is not model or getattr(model, "_compiled_call_impl", None) is not None


def compiled_module(model):
    """The original of `torch.compile(module)` (`OptimizedModule._orig_mod`, a private attribute of a private
    class), or None when `model` is not one."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # never imported: nothing was compiled
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return None


def local_tensor(t):
    """The tensor a rank holds for `t`: its local shard if `t` is a DTensor, else `t`."""
    while is_a(t, DTENSOR):
        t = t._local_tensor
    return t


def has_dtensor(types) -> bool:
    """True if one of the tensor types of a dispatched op is DTensor (which then desugars into ops on the
    local shards: a dispatch mode that returns NotImplemented sees those instead)."""
    dtensor = distributed_class(*DTENSOR)
    return dtensor is not None and any(issubclass(t, dtensor) for t in types)


@contextlib.contextmanager
def storage_resizes(on_resize: Callable[[torch.UntypedStorage], None]) -> Iterator[None]:
    """Call `on_resize(storage)` after each `UntypedStorage.resize_` that changes a storage's size (FSDP2's
    unshard and reshard), restoring the method after; nests."""
    original = torch.UntypedStorage.resize_

    def resize_(storage, size):
        before = storage.nbytes()
        result = original(storage, size)
        if storage.nbytes() != before:
            on_resize(storage)
        return result

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]  # replaced meanwhile
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


def fsdp_state(module: Any) -> Any:
    """FSDP2's state of a module `fully_shard` wrapped (a private FSDPState), else None."""
    return module._get_fsdp_state() if is_a(module, FSDP_MODULE) else None


def _param_groups(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """(module name, FSDP2 parameter group) of every unit `fully_shard` made in `model`."""
    for name, mod in model.named_modules():
        state = fsdp_state(mod)
        yield from ((name, group) for group in getattr(state, "_fsdp_param_groups", []))


def fsdp_gathered(model: nn.Module) -> list[torch.Tensor]:
    """The tensors FSDP2 all-gathers each unit's parameters into (resized to 0 bytes while resharded)."""
    return [
        t
        for _, group in _param_groups(model)
        for fsdp_param in group.fsdp_params
        for t in fsdp_param.all_gather_outputs
    ]


def fsdp_mesh_problem(model: nn.Module) -> str:
    """Why remat cannot profile this FSDP2 model ("" if it can): remat follows a 1-D mesh of data-parallel
    shards (FSDP); a 2-D mesh (HSDP, or FSDP with tensor parallelism) it does not."""
    for name, group in _param_groups(model):
        mesh = group.mesh_info.mesh
        if mesh.ndim != 1:
            return f"{name or 'the model'} is sharded over a {mesh.ndim}-D mesh {tuple(mesh.shape)}"
    return ""


@contextlib.contextmanager
def fake_process_group(world_size: int, device_type: str) -> Iterator[object]:
    """A process group of `world_size` ranks in which this process is rank 0 and every collective is a
    no-op (it allocates its outputs, moves no data); yields its 1-D device mesh, and is gone after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh(device_type, (world_size,))
    finally:
        dist.destroy_process_group()


def ddp_bucket_bytes(ddp: Any) -> list[int]:
    """Bytes of each gradient bucket DistributedDataParallel allocated (its logging data, a private method)."""
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", "")).replace(" ", "")
    return [int(s) for s in sizes.split(",") if s]
