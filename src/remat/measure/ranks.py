"""One rank of N, predicted from one process: `remat.profile(model, inputs, mode="fake", world_size=N)`.

NOTE [N ranks from one process]
  Rule 1. The inputs are the global batch: the first dimension of every input tensor with one is
          split evenly over the N ranks, and rank 0's share runs (a `remat:` error if N does
          not divide it).
  Rule 2. wrap="fsdp" (the default) shards the model as torchtitan does: `fully_shard` on each
          block of the main chain (the transformer layers), then on the model, with FSDP2's
          defaults.  The model is copied onto the meta device (no weights are copied), sharded
          over a fake process group of N ranks in which this process is rank 0 (every
          collective allocates its output and moves no data), and materialised as fake
          tensors; the step then runs as in a real rank (NOTE [A rank's step]).  A callable
          `wrap(model, mesh) -> model` shards the copy the user's way instead.
  Rule 3. wrap="ddp": DistributedDataParallel does not run on fake tensors, so the bare model's
          step runs on rank 0's share and DDP's gradient buckets are added as resident
          gradient memory: every trainable parameter's bytes, in buckets of DDP's default
          caps (1 MiB first, then 25 MiB), each rounded like the target's allocator.
  Rule 4. The user's model, optimizer and process are left as they were: no process group
          remains after the prediction.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from remat._torch_compat import tensor_leaves, tree_map
from remat._torch_compat.distributed import fake_process_group
from remat.errors import RematError
from remat.measure.device import fake
from remat.measure.parallel import is_ddp, is_sharded
from remat.module_tree import find_candidates, has_remat_wrappers, main_chain
from remat.types.kinds import Mode

WRAPS = ("fsdp", "ddp")
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel's bucket_cap_mb=25


def check_request(model: nn.Module, mode: str, world_size: Any, wrap: Any) -> None:
    """A `remat:` error for a prediction that cannot be made as asked."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise RematError(
            f"remat: world_size is how many ranks train the model: a whole number of at least 1; saw {world_size!r}. "
            "Fix: pass world_size=N for N data-parallel ranks, or leave it out for one process."
        )
    if world_size == 1:
        return
    if mode != Mode.FAKE:
        raise RematError(
            f"remat: world_size={world_size} predicts one rank of {world_size} in fake mode; saw mode={mode!r}. "
            "Fix: pass mode='fake', or measure a real job by calling remat.profile(wrapped_model, ...) in each rank."
        )
    if not (wrap in WRAPS or callable(wrap)):
        raise RematError(
            f"remat: wrap says how the {world_size} ranks share the model: 'fsdp' (FSDP2 per block), 'ddp' "
            f"(DistributedDataParallel) or a callable (model, mesh) -> model; saw {wrap!r}. Fix: pick one of these."
        )
    if is_ddp(model) or is_sharded(model):
        raise RematError(
            f"remat: world_size={world_size} predicts from the bare model, but {type(model).__name__} is wrapped "
            "already (DistributedDataParallel or fully_shard). Fix: pass the model before wrapping, or profile the "
            "wrapped model in mode='real' in each rank of the job."
        )
    if has_remat_wrappers(model):
        raise RematError(
            f"remat: world_size={world_size} predicts from a copy of the model, but remat.apply has wrapped modules "
            "of this one, and its checkpoints call the modules they wrapped, not their copies. Fix: predict the bare "
            "model (remat.remove(model) first), or apply the plan to the copy inside wrap: "
            "wrap=lambda m, mesh: shard(remat.apply(m, plan), mesh), as torchtitan applies checkpointing before "
            "fully_shard."
        )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RematError(
            f"remat: world_size={world_size} predicts from one process with a fake process group of its own, but this "
            f"process has one already (rank {dist.get_rank()} of {dist.get_world_size()}). Fix: predict from a process "
            "that has not called init_process_group, or profile the wrapped model in mode='real' in each rank."
        )


def rank_share(inputs: Any, world_size: int) -> Any:
    """Rule 1: rank 0's share of the global batch (a copy, so the global batch's storage is not counted)."""

    def share(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        rows = t.shape[0]
        if rows % world_size:
            raise RematError(
                f"remat: world_size={world_size} does not divide the batch: an input of shape {tuple(t.shape)} has "
                f"{rows} rows; expected the global batch, whose first dimension the ranks split evenly. Fix: a "
                f"global batch that is a multiple of {world_size} (e.g. {world_size * max(1, rows // world_size)}), "
                "or a world_size that divides it."
            )
        with torch.no_grad():
            part = t[: rows // world_size].clone()
        return part.requires_grad_(t.requires_grad) if t.is_floating_point() else part

    return tree_map(share, inputs)


def predicted_ddp_buckets(model: nn.Module) -> list[int]:
    """Rule 3: bytes of the gradient buckets DDP builds over `model`'s trainable parameters."""
    sizes, current, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        current += p.numel() * p.element_size()
        if current >= cap:
            sizes.append(current)
            current, cap = 0, DDP_BUCKET_BYTES
    return sizes + ([current] if current else [])


@contextlib.contextmanager
def sharded_copy(model: nn.Module, world_size: int, wrap, device: torch.device) -> Iterator[nn.Module]:
    """Rule 2: a copy of `model` sharded over a fake group of `world_size` ranks, as fake tensors on `device`."""
    with fake.swapped_tensors(model, fake.meta_like, keep_fake=False):
        copied = copy.deepcopy(model)
    with fake_process_group(world_size, device.type) as mesh:
        sharded = _shard_per_block(copied, mesh) if wrap == "fsdp" else wrap(copied, mesh)
        if not isinstance(sharded, nn.Module) or not is_sharded(sharded) or is_ddp(sharded):
            raise RematError(
                f"remat: the wrap callable returned {type(sharded).__name__}, expected the model sharded with FSDP2's "
                "fully_shard over the mesh it was given. Fix: return the model after fully_shard(..., mesh=mesh), or "
                "pass wrap='ddp' for DistributedDataParallel."
            )
        mode = fake.FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            sharded.to_empty(device=device)
        yield sharded


def _shard_per_block(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    modules = dict(model.named_modules())
    for name in main_chain(find_candidates(model)):
        fully_shard(modules[name], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def optimizer_for(optimizer: Any, model: nn.Module, sharded: nn.Module) -> Any:
    """The optimizer asked for, over the sharded copy's parameters: a factory is kept, an instance is rebuilt
    with its class and groups (its state is not: the steady step makes its own)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    params = dict(sharded.named_parameters())
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [params[names[id(p)]] for p in g["params"]]}
        for g in optimizer.param_groups
    ]
    make: Any = type(optimizer)  # an optimizer class, called with the groups its defaults already filled
    return lambda _: make(groups)


def wrap_label(wrap: Any) -> str:
    if wrap == "fsdp":
        return "FSDP2 per block (fully_shard on each block of the main chain, then the model)"
    return f"{getattr(wrap, '__name__', 'a callable')}(model, mesh)"


def prediction_note(world_size: int, wrap: Any, inputs: Any) -> str:
    rows = [t.shape[0] for t in tensor_leaves(inputs) if t.dim()]
    batch = f"rank 0's share of the batch ({rows[0] // world_size} of {rows[0]} rows)" if rows else "the inputs"
    how = "the bare model's step and DDP's buckets" if wrap == "ddp" else f"{wrap_label(wrap)}, a fake process group"
    return f"predicted for one rank of {world_size}: {how}, {batch} (docs/many-gpus.md)."
