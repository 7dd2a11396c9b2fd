"""A TorchDispatchMode that logs every tensor storage of a training step.

NOTE [What counts as live memory]
  Rule 1. Memory is counted per *storage*, never per tensor: views and tensors that
          share a storage count once, with `storage.nbytes()` rounded up to the
          allocator's granularity (512 bytes for the CUDA caching allocator, 1 on CPU).
  Rule 2. A storage is live from the op that returns it until its Python object is
          finalized (PyTorch keeps one Python object per live storage, so a
          `weakref.finalize` on it fires exactly when the storage is freed).
  Rule 3. The parameters, buffers, inputs, grads and optimizer state that exist
          before the step are live from its start.  Any other storage an op reads
          that no op made (a plain tensor attribute, a `torch.tensor(...)` constant,
          made without dispatch) is live from that op on.
  Rule 4. A storage freed between op k and op k+1 is still counted after op k: the
          allocator needed it and op k's outputs at the same time.
  Rule 5. Scratch memory a kernel allocates and frees inside one op is no storage; it is
          measured or estimated per op (`Tracker.scratch`, NOTE [Kernel scratch] in
          `remat.measure.scratch`) and counted on top of what is live after that op.
  Rule 6. A rank holds its own shard of a DTensor (FSDP2's parameters, gradients, optimizer
          state): that local tensor is what counts, and the ops on DTensors are seen as the
          ops DTensor runs on the local shards.
  Rule 7. A storage resized in place (FSDP2 frees an all-gathered parameter with
          `resize_(0)` and re-allocates it for the next use) is freed at the resize, and
          a storage resized to a new size is a new allocation from there on.
  Rule 8. The memory of a step on a GPU is the GPU's: a storage in host memory (an
          offloaded module's saved tensors, copied there by `save_on_cpu`; Adam's CPU step
          counters) is not counted, as `torch.cuda.max_memory_allocated` does not count it.
          Counted, offload copies made every offload plan's tracked peak the unplanned one
          (H200, 2026-11-26: 377.1 MiB tracked where the CUDA counter read 206.6 MiB).

NOTE [When a saved tensor is attributed to a module]
  A storage belongs to the innermost module running when the op that made it
  returned (`torch.utils.module_tracker.ModuleTracker`), and to every enclosing
  module.  It is an *activation* when autograd packs it for backward during the
  forward or loss phase (seen through `saved_tensors_hooks`); a checkpoint in the
  user's code installs its own hooks, so what it drops is never packed here and
  only what it really keeps (its inputs) counts.
  A module the model does not register (made inside a forward, as Hugging Face's
  Mamba makes its SiLU with `ACT2FN[...]` on CPU, or one instance shared through a
  module-level table) is not a module of the model: called while the model's
  modules run, its ops and packs are the innermost of those (`ModuleTracker.root`).
  Named after its class alone, "<SiLUActivation>", it was inside no block: what it
  made and saved in Mamba's first layer, 68,608 bytes, was freed by a checkpoint of
  that layer but not counted as freed (2026-11-29).  Called outside them (a loss
  module in the loss function), it keeps its own name.

NOTE [Recomputation]
  An op runs as recomputation when the autograd engine is in a backward pass and
  grad mode is on: the engine turns grad mode off for backward formulas, and both
  flavours of `torch.utils.checkpoint` turn it back on to re-run the forward.
  Non-reentrant checkpoint stops re-running at the region's last pack: its pack hook
  counts the tensors saved, and raises at the last one.  An op packs its inputs before
  it runs and its outputs after, so the re-run ends with the last op that had run when
  the block's last pack came (`OpRecord.packs_after`), not the one that packed: a
  checkpoint around Linear, GELU, Linear re-runs the first two but not the last matmul.
  Before 2026-12-02 remat took the last op whose output is saved inside the block:
  an op between it and the last pack, whose output nothing saves (a branch the
  forward drops), ran in the re-run unpredicted (a checkpoint over two such layers was
  predicted 131,072 bytes low; `tests/test_what_a_checkpoint_frees.py`).

NOTE [When a checkpoint re-runs]
  Non-reentrant checkpoint re-runs its forward when backward first unpacks a tensor saved inside it, not when the
  block's backward starts: its first backward nodes may save nothing (peft's LoRA casts its input and scales its
  output) and allocate gradients before.  The tracker notes each pack's first unpack (`StorageRecord.unpacks`), a
  block the first of its own (`BlockProfile.rerun_op`).  Placed at the block's first backward op, the re-run of
  Mistral's last layer with LoRA on `down_proj` under bf16 autocast was 16,384 bytes above its moment, and a plan
  over two layers was predicted 14,852 bytes low (2026-12-02, `tests/test_rerun_moment.py`).  It can also come
  before the block's first backward op: a block returning a tensor its caller drops (BLOOM's attention weights)
  had its first backward nodes named no module's, and its re-run was placed six ops late (2026-12-03).

NOTE [A weight autocast casts]
  Under `torch.autocast` a float32 parameter is cast to the half dtype once, and autocast's cache holds the cast
  until the outermost region exits (`StorageRecord.autocast_cast`, `Tracker.cache_clears`): a checkpoint frees it
  from then on, or, backward inside the region too, never (its re-run takes it from the cache).  Counted freed at
  the block's end, 5 of 56 bf16 plans failed `remat.verify` (2026-12-02, docs/validation.md §2.2).  A parameter the
  model casts itself to that dtype inside the region counts as cached too: then high, never low.  The cache is one
  for all threads, a region's depth one per thread: on a GPU, whose backward runs in the device's own thread, the
  first re-run leaves its region there and empties the cache (`tests/test_autocast_casts.py`, backward run in a
  second thread), and later re-runs cast anew what it had freed: for a step inside one region, high, never low.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from remat._torch_compat import ModuleTracker, TorchDispatchMode, flops_of, in_backward, op_name, tree_flatten
from remat._torch_compat import autocast_cache_clears, autocast_caches
from remat._torch_compat.distributed import has_dtensor, local_tensor, storage_resizes
from remat._torch_compat.fake_ops import as_the_kernel_lays_out
from remat._torch_compat.schema import runs_no_kernel, written_tensors
from remat.measure.device.roofline import Hardware, op_seconds
from remat.ops import op_signature


def storage_of(t, skip_host: bool = False) -> torch.UntypedStorage | None:
    """The storage a strided tensor counts by (NOTE [What counts as live memory]); None for anything else
    (not a tensor, sparse, a subclass without storage), and with `skip_host` for a storage in host memory (Rule 8);
    a DTensor's is its local shard's (Rule 6)."""
    t = local_tensor(t)
    if not isinstance(t, torch.Tensor) or t.is_sparse or t.layout != torch.strided:
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return None
    return None if skip_host and st.device.type == "cpu" else st


def rounded_bytes(n: int, rounding: int) -> int:
    """`n` bytes rounded up to a multiple of `rounding` (the CUDA caching allocator's 512), as allocated."""
    return n if rounding <= 1 else (n + rounding - 1) // rounding * rounding


class SeesResizes(TorchDispatchMode):
    """A dispatch mode that is told of storage resizes while it is active (Rule 7): `self.resized(storage)`."""

    def resized(self, st: torch.UntypedStorage) -> None:
        raise NotImplementedError

    def alongside(self) -> list:
        """The contexts active with the mode: the resize watch, and what a subclass adds."""
        return [storage_resizes(self.resized)]

    def __enter__(self):
        self._alongside = contextlib.ExitStack()
        for context in self.alongside():
            self._alongside.enter_context(context)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._alongside.__exit__(*exc)


@dataclass(slots=True)
class StorageRecord:
    """One storage seen during the step. Steps are op indices (see NOTE [What counts as live memory])."""

    nbytes: int
    alloc_step: int
    """Index of the op that returned it; -1 if it existed before the step."""
    phase: str
    module: str
    """Innermost module at creation (dotted path, "" for the model itself)."""
    free_step: int | None = None
    """First op index at which it is no longer live; None if alive at the end."""
    saved: bool = False
    """Packed by autograd for backward while forward or loss ran."""
    packs: list[tuple[int, str]] = field(default_factory=list)
    """Each time it was packed: the index of the op that saved it, and the innermost module running then (who keeps
    it)."""
    unpacks: list[int] = field(default_factory=list)
    """Per pack: the op before which autograd first unpacked it (-1: never; NOTE [When a checkpoint re-runs])."""
    category: str = ""
    op: str = ""
    """The aten op (packet name) that returned it; "" if no op made it."""
    last_forward_use: int = -1
    """Index of the last op of forward or loss that read it (-1 if none did)."""
    resized_from: "StorageRecord | None" = None
    """The record of the same storage before it was resized in place (Rule 7)."""
    written: bool = False
    """An op after the one that made it wrote it in place (a selective checkpoint cannot keep it)."""
    autocast_cast: bool = False  # a parameter's cast autocast's cache holds too (NOTE [A weight autocast casts])
    cast_reads: list[int] = field(default_factory=list)
    """Of such a cast: the forward ops that read it, from the cache too (`remat.measure.cast_replay`, its NOTE)."""

    def live_at(self, k: int) -> bool:
        return self.alloc_step <= k and (self.free_step is None or k < self.free_step)


class Packed(NamedTuple):
    """What `Tracker.mark_saved` gives autograd.  NOTE [What remat's pack keeps]: an alias (`detach()`), not the tensor:
    an op saving its own output (exp, sigmoid) is that output's `grad_fn`, the two held each other through C++ unseen
    by Python's collector, and an output the forward dropped unused outlived the step: three dropped 8 MiB sigmoids
    put a step the process measured at 77,796,380 bytes at 86,254,620 (now 77,866,012) and stayed allocated after
    `remat.profile` returned (2026-12-07, `tests/test_dead_branches.py`).  The model's object goes as the model drops it."""

    tensor: torch.Tensor
    record: StorageRecord
    pack: int


def alias(mode, t: torch.Tensor) -> torch.Tensor:
    """`t` detached for a pack hook, the detach no op of dispatch mode `mode` (NOTE [What remat's pack keeps])."""
    mode._packing = True
    try:
        return t.detach()
    finally:
        mode._packing = False


@dataclass(slots=True)
class OpRecord:
    name: str
    phase: str
    module: str
    flops: int
    seconds: float
    recompute: bool
    packs_after: set[str] = field(default_factory=set)
    """Modules running when autograd packed a tensor after this op and before the next (NOTE [Recomputation])."""
    reads_grad: bool = False
    """A forward op, under grad mode, with an input that requires grad: its output joins the graph."""
    signature: str = ""
    """`remat.ops.op_signature`: its name and its tensor arguments' shapes."""
    predicted_s: float = 0.0
    """Its seconds by the roofline (NOTE [An op's seconds, predicted]): the same on every run, for orders that the
    clock's noise must not decide (NOTE [Which outputs a selective checkpoint keeps], Rule 2); in a real step 0 but
    for forward ops, the ones ranked."""


@dataclass
class Tracker(SeesResizes):
    """Logs storages and ops; all interpretation happens afterwards in `remat.measure.build` and `remat.measure.blocks`."""

    root_type: str
    rounding: int = 1
    time_ops: bool = True
    sync: Callable[[], None] | None = None
    """Called around each timed op (torch.cuda.synchronize on a GPU, whose kernels run asynchronously:
    without it an op's seconds would be its launch time)."""
    phase: str = "setup"
    records: list[StorageRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    _live: dict[int, StorageRecord] = field(default_factory=dict)
    _names: dict[str, str] = field(default_factory=dict)
    modules: ModuleTracker | None = None
    skip_host: bool = False
    """A step on a GPU, run for real: storages in host memory are not its memory (Rule 8)."""
    scratch_probe: object | None = None
    """Measures or estimates each op's kernel scratch as it runs (Rule 5): `start()`, then
    `stop(started, func, args, kwargs, out) -> bytes` (see `remat.measure.scratch`)."""
    scratch: list[int] = field(default_factory=list)
    """Kernel scratch of each op (Rule 5): estimated as ops run, or set after the step from a measurement."""
    cache_clears: list[int] = field(default_factory=list)  # ops before which autocast emptied its cache of casts
    roofline: Hardware | None = None
    """Predicts each op's seconds instead of the clock (fake mode: NOTE [An op's seconds, predicted])."""
    nominal: Hardware | None = None
    """A real step's: predicts its forward ops' `predicted_s` beside the clock's seconds (the device's nominal
    roofline); only forward ops are ranked, and the prediction costs ~17 us an op on the tracker's hot path."""

    _packing: bool = False  # in `alias`: the detach is no op of the step

    def __post_init__(self):
        super().__init__()

    def alongside(self) -> list:
        return [*super().alongside(), autocast_cache_clears(lambda: self.cache_clears.append(len(self.ops)))]

    # -- storages ----------------------------------------------------------------
    def record_of(self, t: torch.Tensor, *, before_step: bool = False, op: str = "") -> StorageRecord | None:
        """The record of `t`'s storage, creating it (as made now by `op`, or pre-existing) if unseen."""
        st = storage_of(t, self.skip_host)
        if st is None:
            return None
        rec = self._live.get(id(st))
        if rec is not None:
            return rec
        step = -1 if before_step else len(self.ops)
        rec = StorageRecord(rounded_bytes(st.nbytes(), self.rounding), step, self.phase, self.current_module(), op=op)
        self.records.append(rec)
        key = id(st)
        self._live[key] = rec
        weakref.finalize(st, self._freed, key, rec)
        return rec

    def _freed(self, key: int, rec: StorageRecord) -> None:
        if rec.free_step is None:  # not ended by a resize already (Rule 7)
            rec.free_step = len(self.ops)
        if self._live.get(key) is rec:
            del self._live[key]

    def resized(self, st: torch.UntypedStorage) -> None:
        """Rule 7: the record of a storage resized in place ends here, and its new size is a new record."""
        rec = self._live.pop(id(st), None)
        if rec is None and not st.nbytes():
            return
        if rec is not None:
            rec.free_step = len(self.ops)
        new = StorageRecord(
            rounded_bytes(st.nbytes(), self.rounding),
            len(self.ops),
            self.phase,
            self.current_module(),
            op="resize_",
            resized_from=rec,
        )
        self.records.append(new)  # 0 bytes while resized to nothing: the chain to its earlier records stays
        self._live[id(st)] = new
        weakref.finalize(st, self._freed, id(st), new)

    def mark_saved(self, t: torch.Tensor) -> torch.Tensor | tuple:
        """Pack hook for `saved_tensors_hooks`: flags the storage and the op; the tensor, with which pack of which
        record it is for `mark_unpacked` (the same tensor, no copy)."""
        rec = self.record_of(t)
        if self.ops:
            self.ops[-1].packs_after.add(self.current_module())
        if rec is None:
            return t
        rec.saved = True
        rec.packs.append((len(self.ops) - 1, self.current_module()))
        rec.unpacks.append(-1)
        return Packed(alias(self, t), rec, len(rec.unpacks) - 1)

    def mark_unpacked(self, packed: torch.Tensor | tuple) -> torch.Tensor:
        """Unpack hook: the tensor `mark_saved` packed; notes the op before which autograd first unpacked it."""
        if not isinstance(packed, tuple):
            return packed
        t, rec, k = packed
        if rec.unpacks[k] < 0:
            rec.unpacks[k] = len(self.ops)
        return t

    # -- modules -------------------------------------------------------------------
    def module_name(self, tracker_name: str) -> str:
        """ModuleTracker names modules `RootType.a.b`; remat uses `a.b` ("" for the root)."""
        name = self._names.get(tracker_name)
        if name is None:
            if tracker_name == self.root_type:
                name = ""
            elif tracker_name.startswith(self.root_type + "."):
                name = tracker_name[len(self.root_type) + 1 :]
            else:  # a module outside the model, e.g. a loss module
                name = f"<{tracker_name}>"
            self._names[tracker_name] = name
        return name

    def current_module(self) -> str:
        if self.modules is None:
            return ""
        innermost = self.modules.innermost(in_backward() and torch.is_grad_enabled())  # NOTE [Recomputation]
        return self.module_name(innermost) if innermost is not None else ""

    # -- dispatch --------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if has_dtensor(types) and not self._packing:  # Rule 6: seen again as the ops DTensor runs on the local shards
            return NotImplemented
        if self._packing or runs_no_kernel(func):  # NOTE [What remat's pack keeps]; fake tensors ask (Rule 3 of
            return func(*args, **kwargs)  # NOTE [An op's seconds, predicted]), a real step runs no kernel for them
        reads_forward = self.phase in ("forward", "loss") and not in_backward()
        reads_grad = False
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        for a in tensors:
            rec = self.record_of(a)  # Rule 3: an unseen input counts from this op on
            if rec is not None and reads_forward:
                rec.last_forward_use = len(self.ops)
                if rec.autocast_cast:
                    rec.cast_reads.append(len(self.ops))
            reads_grad = reads_grad or a.requires_grad
        for a in written_tensors(func, args, kwargs):
            rec = self.record_of(a)
            if rec is not None and rec.alloc_step != len(self.ops):
                rec.written = True
        if self.time_ops and self.sync is not None:
            self.sync()
        probe = self.scratch_probe
        started = probe.start() if probe is not None else None
        t0 = time.perf_counter() if self.time_ops else 0.0
        out = as_the_kernel_lays_out(func, func(*args, **kwargs), args)  # NOTE [A meta kernel stricter than its kernel]
        if self.time_ops and self.sync is not None:
            self.sync()
        dt = time.perf_counter() - t0 if self.time_ops else 0.0
        self._record_outputs(func, args, out, reads_forward)
        if probe is not None:
            self.scratch.append(probe.stop(started, func, args, kwargs, out))
        flops, hw = flops_of(func, args, kwargs, out), self.roofline or (self.nominal if reads_forward else None)
        predicted = op_seconds(hw, func, args, kwargs, out, flops) if hw is not None else 0.0
        dt = predicted if self.roofline is not None else dt
        self.ops.append(
            OpRecord(
                op_name(func),
                self.phase,
                self.current_module(),
                flops,
                dt,
                in_backward() and torch.is_grad_enabled(),  # NOTE [Recomputation]
                reads_grad=reads_forward and reads_grad and torch.is_grad_enabled(),
                signature=op_signature(op_name(func), tensors),
                predicted_s=predicted,
            )
        )
        return out

    def _record_outputs(self, func, args: tuple, out, reads_forward: bool) -> None:
        """Records of what `func` made; a forward's cast autocast's cache keeps marked (NOTE [A weight autocast casts])."""
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                made = self.record_of(t, op=op_name(func))
                if made is not None and reads_forward and autocast_caches(func, args, t):
                    made.autocast_cast = True
