"""Data-parallel steps, one rank at a time: DistributedDataParallel and FSDP2.

NOTE [A rank's step]
  Rule 1. Under DistributedDataParallel (DDP) or FSDP2 (`fully_shard`) every rank runs the same
          step on its own part of the batch.  `remat.profile` measures the step of the rank it
          runs in (real mode, after `init_process_group`), and the figures are that rank's.
  Rule 2. FSDP2: a rank holds its shards of the parameters, gradients and optimizer state
          (DTensors: their local tensors count, Rule 6 of NOTE [What counts as live memory]),
          and the parameters of a unit all-gathered from its unshard to its reshard (category
          "gathered"), as FSDP2 schedules them: prefetch of the next unit in forward and
          backward, `reshard_after_forward`, the root's parameters kept through backward.
          Reduce-scatter buffers are temporaries.
  Rule 3. DDP: the gradient buckets exist from the wrapping on, and DDP allocates them again in
          the forward of the second step (it rebuilds them in the order the gradients came).
          The lead-in runs that step, so in the measured step they are live throughout: the
          storages no op made, first read in backward (the reducer copies gradients into them)
          and live after the step.  They are counted with the gradients.
  Rule 4. Block names are those of the bare model (no `module.` of DDP; FSDP2 keeps names),
          so a plan made on the bare model applies to the wrapped one and back.
  Rule 5. Kernel scratch is estimated, never measured in a forked copy: the copy could not take
          part in the collectives of the other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch.nn as nn

from remat._torch_compat.distributed import DDP, ddp_bucket_bytes, fsdp_mesh_problem, fsdp_state, is_a
from remat.errors import RematError
from remat.measure.tracker import StorageRecord, Tracker, rounded_bytes

PREDICT_FIX = "or predict N ranks from one process with remat.profile(bare_model, inputs, mode='fake', world_size=N)"


@dataclass(frozen=True)
class Parallel:
    """How the profiled step is spread over ranks (Rule 1)."""

    kind: str = ""
    """"ddp", "fsdp" or "" (one process)."""
    world_size: int = 1
    rank: int = 0
    runner: nn.Module | None = None
    """The module the training loop calls (the DDP wrapper); None: the model itself."""
    buckets: tuple[int, ...] = ()
    """Bytes of DDP's gradient buckets in a prediction (NOTE [N ranks from one process], Rule 3)."""

    def tracker_root(self, model: nn.Module) -> str:
        """How torch's ModuleTracker names the bare model (Rule 4)."""
        return f"{type(self.runner).__name__}.module" if self.runner is not None else type(model).__name__

    def notes(self) -> list[str]:
        return (
            [
                f"rank {self.rank} of {self.world_size} ({'FSDP2' if self.kind == 'fsdp' else 'DDP'}): the figures "
                "are this rank's (docs/many-gpus.md)."
            ]
            if self.kind
            else []
        )


def is_ddp(model: nn.Module) -> bool:
    return is_a(model, DDP)


def is_sharded(model: nn.Module) -> bool:
    """Some module of `model` is an FSDP2 unit."""
    return any(fsdp_state(m) is not None for m in model.modules())


def parallel_of(model: nn.Module) -> tuple[nn.Module, Parallel]:
    """The bare model (its blocks are named as without DDP, Rule 4) and how its step is spread over ranks; a
    `remat:` error for a wrapped model with no process group, or a mesh remat does not follow."""
    ddp = is_ddp(model)
    bare = cast(nn.Module, model.module) if ddp else model
    if not ddp and not is_sharded(bare):
        return model, Parallel()
    what = "DistributedDataParallel" if ddp else "FSDP2 (fully_shard)"
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RematError(
            f"remat: {type(bare).__name__} is wrapped in {what}, but this process has no process group "
            "(torch.distributed.init_process_group was not called, or the group was destroyed); expected "
            "the profile to run inside each rank of the training job. Fix: call "
            f"torch.distributed.init_process_group(...) first (torchrun sets up the ranks), {PREDICT_FIX}."
        )
    problem = fsdp_mesh_problem(bare)
    if problem:
        raise RematError(
            f"remat: {problem}; remat follows FSDP2 over a 1-D mesh of data-parallel ranks, not HSDP or "
            "FSDP with tensor or pipeline parallelism. Fix: profile the model sharded over a 1-D mesh "
            f"(fully_shard(..., mesh=init_device_mesh(device, (world_size,)))), {PREDICT_FIX}."
        )
    return bare, Parallel("ddp" if ddp else "fsdp", dist.get_world_size(), dist.get_rank(), model if ddp else None)


def ddp_buckets(tracker: Tracker, parallel: Parallel) -> list[str]:
    """Rule 3: under DDP, the storages no op made that backward first read and that outlive the step are DDP's
    gradient buckets: live from the step's start, counted as gradients.  Returns a note with their bytes."""
    if parallel.kind != "ddp":
        return []
    if parallel.buckets:  # predicted: no DDP ran
        sizes = [rounded_bytes(n, tracker.rounding) for n in parallel.buckets]
        for n in sizes:
            tracker.records.append(StorageRecord(n, -1, "setup", "", category="grads", op="DDP bucket"))
        return [
            f"gradients include DDP's gradient buckets, live through the step: {len(sizes)} bucket(s), "
            f"{sum(sizes)} bytes (docs/many-gpus.md)."
        ]
    found = []
    for rec in tracker.records:
        if rec.alloc_step >= 0 and not rec.op and rec.free_step is None and rec.phase == "backward":
            rec.alloc_step, rec.category = -1, "grads"
            found.append(rec.nbytes)
    assert parallel.runner is not None, "a measured DDP step keeps its DDP module"
    reported = ddp_bucket_total(parallel.runner, tracker.rounding)
    seen = f"{len(found)} storage(s), {sum(found)} bytes"
    agrees = "as DDP reports" if sum(found) == reported else f"DDP reports {reported} bytes of buckets"
    return [f"gradients include DDP's gradient buckets, live through the step: {seen}, {agrees} (docs/many-gpus.md)."]


def ddp_bucket_total(model: nn.Module, rounding: int = 1) -> int:
    """Bytes of DDP's gradient buckets if `model` is a DDP wrapper (resident between steps), else 0."""
    return sum(rounded_bytes(n, rounding) for n in ddp_bucket_bytes(model)) if is_ddp(model) else 0
