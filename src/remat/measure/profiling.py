"""`remat.profile`: measure (or predict) where the memory of one training step goes."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from remat._torch_compat import (
    FAKE_OP_ERRORS,
    FakeTensorMode,
    ModuleTracker,
    checkpoint_wrapper_type,
    in_backward,
    tree_flatten,
)
from remat._torch_compat import BatchNormBase as _BatchNorm
from remat.errors import RematError, UnsupportedOp
from remat.measure import fake
from remat.measure.candidates import enclosing, find_candidates, runs_children_in_order, within
from remat.measure.step import (
    StateSnapshot,
    check_model,
    compute_loss,
    make_optimizer,
    normalize_inputs,
)
from remat.measure.tracker import RANDOM_OPS, SAVE_OPS, StorageRecord, Tracker
from remat.types import BlockProfile, Breakdown, StepProfile, Timeline

log = logging.getLogger(__name__)

CUDA_ROUNDING_BYTES = 512  # the CUDA caching allocator's block granularity
Progress = Callable[[str, int], None]


def profile(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable | None = None,
    optimizer: Any = None,
    mode: str = "real",
    *,
    device: str | torch.device | None = None,
    blocks: list[str] | None = None,
    progress: Progress | None = None,
) -> StepProfile:
    """Measure one training step (forward, loss, backward, optimizer step) of `model` on `inputs`.

    Example:
        >>> prof = remat.profile(model, torch.randn(8, 1024), optimizer=torch.optim.Adam(model.parameters()))
        >>> prof.peak_bytes, prof.peak_phase, prof.blocks[0].saved_bytes

    `mode="real"` runs the step on the model's device and counts live tensor storages;
    `mode="fake"` predicts the same figures with fake tensors, allocating nothing, also
    for a `device="cuda"` this machine does not have.  The model, its optimizer and the
    RNG are left as they were (a real step's updates are undone).

    Known limitations: memory a kernel allocates and frees inside one op (cuBLAS
    workspaces) is not seen; in fake mode data-dependent ops (`.item()`, `nonzero`)
    cannot run; a simulated CUDA target uses CPU kernels (e.g. CPU attention).
    """
    check_model(model)
    step_inputs = normalize_inputs(inputs)
    if mode not in ("real", "fake"):
        raise RematError(f"remat: mode must be 'real' or 'fake'; saw {mode!r}. Fix: pick one of the two.")
    model_device = _model_device(model)
    target = torch.device(device) if device is not None else model_device
    if mode == "real" and target.type != model_device.type:
        raise RematError(
            f"remat: mode='real' measures on the model's device ({model_device}), but device={target} was asked. "
            f"Fix: move the model with model.to('{target}'), or predict with mode='fake', device='{target}'."
        )
    candidates = find_candidates(model, blocks)
    rounding = CUDA_ROUNDING_BYTES if target.type == "cuda" else 1
    simulated = mode == "fake" and target.type == "cuda" and not torch.cuda.is_available()
    run_device = torch.device("cpu") if simulated else target
    notes: list[str] = []
    if simulated:
        notes.append(
            "CUDA target simulated on CPU: storages rounded to 512 bytes like the CUDA caching allocator; "
            "kernels that differ on CUDA (attention backends) may save different tensors."
        )

    if mode == "real":
        opt = make_optimizer(optimizer, model)
        snapshot = StateSnapshot(model, opt, step_inputs.tensors())
        try:
            return _measure(model, step_inputs, loss_fn, opt, candidates, "real", target, rounding, False, notes, progress)
        finally:
            snapshot.restore()

    fake_mode = fake.existing_fake_mode(model)
    if fake_mode is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake.fake_model(model, fake_mode, run_device) as table:
        fake_step = normalize_inputs(fake.fake_inputs(inputs, fake_mode, run_device))
        opt = make_optimizer(optimizer, model)
        if opt is not None and any(id(p) in table for g in opt.param_groups for p in g["params"]):
            opt = fake.fake_optimizer(opt, table, fake_mode, run_device)
        with fake_mode:
            return _measure(model, fake_step, loss_fn, opt, candidates, "fake", target, rounding, simulated, notes, progress)


def _model_device(model: nn.Module) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device if t.device.type != "meta" else torch.device("cpu")
    return torch.device("cpu")


def _measure(model, step, loss_fn, opt, candidates, mode, target, rounding, simulated, notes, progress):
    cuda_sync = torch.cuda.synchronize if mode == "real" and target.type == "cuda" else None
    tracker = Tracker(root_type=type(model).__name__, rounding=rounding, time_ops=(mode == "real"), sync=cuda_sync)
    kinds = _register_state(tracker, model, step, opt)
    io = _BlockIO(model, candidates, tracker)
    allocator_peak = None
    cuda_real = mode == "real" and target.type == "cuda"
    if cuda_real:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_allocated = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tracker.modules = stack.enter_context(ModuleTracker())
        stack.enter_context(io.hooks())
        stack.enter_context(tracker)
        phase = _phase_setter(tracker, progress)
        try:
            phase("forward")
            with torch.autograd.graph.saved_tensors_hooks(tracker.mark_saved, _identity):
                out = _run_user_code("the model's forward", lambda: model(*step.args, **step.kwargs))
                phase("loss")
                loss = _run_user_code("the loss", lambda: compute_loss(out, loss_fn))
            phase("backward")
            _run_user_code("backward", loss.backward)
            kinds["grads"] += [p.grad for p in model.parameters() if p.grad is not None]
            if opt is not None:
                phase("optimizer")
                _run_user_code("the optimizer step", opt.step)
                kinds["optimizer"] += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
            _classify(tracker, kinds)
            del out, loss
        finally:
            tracker.modules = None
    step_s = time.perf_counter() - t0 if mode == "real" else 0.0
    if cuda_real:
        torch.cuda.synchronize()
        allocator_peak = torch.cuda.max_memory_allocated() - base_allocated
        notes.append(f"torch.cuda.max_memory_allocated() over the step, above its start: {allocator_peak} bytes")
    prof = _build_profile(model, tracker, io, candidates, mode, target, rounding, simulated, notes, step_s)
    if cuda_real:
        prof = dataclasses.replace(prof, host_bandwidth_bytes_s=host_bandwidth(target))
    return prof


def host_bandwidth(device: torch.device, nbytes: int = 64 * 2**20, repeats: int = 3) -> float:
    """Bytes per second of a pinned host<->device round trip (best of a few): what offloading costs."""
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(repeats + 1):  # the first round warms up
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        pinned.copy_(on_device, non_blocking=True)
        on_device.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def _identity(t):
    return t


def _phase_setter(tracker: Tracker, progress: Progress | None):
    def set_phase(name: str) -> None:
        tracker.phase = name
        if progress is not None:
            progress(name, len(tracker.ops))

    return set_phase


def _run_user_code(what: str, fn):
    try:
        return fn()
    except RematError:
        raise
    except FAKE_OP_ERRORS as e:
        op = str(getattr(e, "func", "") or e)
        raise UnsupportedOp(
            f"remat: fake mode cannot run op {op} during {what}: its output depends on tensor values "
            "that fake tensors do not have. Expected only shape-determined ops. "
            "Fix: profile with mode='real' (on a smaller batch if memory is short), or avoid the "
            "data-dependent op (.item(), nonzero, boolean masking) in the training step.",
            op,
        ) from e
    except Exception as e:
        raise RematError(
            f"remat: {what} raised {type(e).__name__}: {e}. Expected the training step to run on the given "
            "inputs. Fix: check that the inputs match what the model takes (try calling it yourself first)."
        ) from e


def _register_state(tracker: Tracker, model: nn.Module, step, opt) -> dict[str, list]:
    """Pre-existing storages (Rule 3) and the tensors whose category is known."""
    kinds: dict[str, list] = {
        "params": list(model.parameters()),
        "buffers": list(model.buffers()),
        "inputs": step.tensors(),
        "grads": [p.grad for p in model.parameters() if p.grad is not None],
        "optimizer": [],
    }
    if opt is not None:
        kinds["optimizer"] = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    for ts in kinds.values():
        for t in ts:
            tracker.record_of(t, before_step=True)
    return kinds


def _classify(tracker: Tracker, kinds: dict[str, list]) -> None:
    """Give each record its category; the first kind that claims a storage wins."""
    for kind in ("params", "buffers", "inputs", "grads", "optimizer"):
        for t in kinds[kind]:
            rec = tracker.record_of(t)  # seen already, or made without dispatch (Adam's step counters)
            if rec is not None and not rec.category:
                rec.category = kind
    for rec in tracker.records:
        if not rec.category:
            made_in_forward = rec.phase in ("forward", "loss") and rec.alloc_step >= 0
            rec.category = "activations" if (rec.saved and made_in_forward) else "temporaries"


class _BlockIO:
    """Forward hooks that record each candidate's order, calls, input and output storages."""

    def __init__(self, model: nn.Module, candidates: list[str], tracker: Tracker):
        self.tracker = tracker
        mods = dict(model.named_modules(remove_duplicate=True))
        self.by_module = {id(mods[n]): n for n in candidates}
        self.modules = {n: mods[n] for n in candidates}
        self.containers = {n: mods.get(n.rsplit(".", 1)[0] if "." in n else "") for n in candidates}
        self.order: list[str] = []
        self.calls: dict[str, int] = {}
        self.inputs: dict[str, list[StorageRecord]] = {}
        self.outputs: dict[str, list[StorageRecord]] = {}

    @contextlib.contextmanager
    def hooks(self):
        h1 = register_module_forward_pre_hook(self._pre)
        h2 = register_module_forward_hook(self._post)
        try:
            yield
        finally:
            h1.remove()
            h2.remove()

    def _records(self, obj) -> list[StorageRecord]:
        recs = {}
        for t in tree_flatten(obj)[0]:
            if isinstance(t, torch.Tensor):
                rec = self.tracker.record_of(t)
                if rec is not None:
                    recs[id(rec)] = rec
        return list(recs.values())

    def _pre(self, mod, args):
        name = self.by_module.get(id(mod))
        if name is None or in_backward():
            return
        if name not in self.calls:
            self.order.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        self.inputs[name] = self._records(args)

    def _post(self, mod, args, out):
        name = self.by_module.get(id(mod))
        if name is None or in_backward():
            return
        self.outputs[name] = self._records(_flatten_output(out))


def _flatten_output(out):
    if hasattr(out, "to_tuple"):  # Hugging Face ModelOutput
        return out.to_tuple()
    if hasattr(out, "__dataclass_fields__"):
        return [getattr(out, f) for f in out.__dataclass_fields__]
    return out


def _live_series(tracker: Tracker) -> list[int]:
    n = len(tracker.ops)
    delta = [0] * (n + 1)
    for rec in tracker.records:
        start = max(rec.alloc_step, 0)
        end = n if rec.free_step is None else min(rec.free_step, n)
        if start < end:
            delta[start] += rec.nbytes
            delta[end] -= rec.nbytes
    live, acc = [], 0
    for d in delta[:n]:
        acc += d
        live.append(acc)
    return live


def _breakdown(tracker: Tracker, k: int) -> Breakdown:
    sums: dict[str, int] = {}
    for rec in tracker.records:
        if rec.live_at(k):
            sums[rec.category] = sums.get(rec.category, 0) + rec.nbytes
    return Breakdown(**{f"{c}_bytes": v for c, v in sums.items()})


def _last_index(tracker: Tracker, phases: tuple[str, ...]) -> int:
    for i in range(len(tracker.ops) - 1, -1, -1):
        if tracker.ops[i].phase in phases:
            return i
    return -1


def _build_profile(model, tracker, io, candidates, mode, target, rounding, simulated, notes, step_s) -> StepProfile:
    ops = tracker.ops
    if not ops or _last_index(tracker, ("forward", "loss")) < 0:
        raise RematError(
            f"remat: the step of {type(model).__name__} ran no tensor op in forward; expected a model that "
            "computes with tensors. Fix: check that forward uses its inputs."
        )
    live = _live_series(tracker)
    k_peak = max(range(len(live)), key=live.__getitem__)
    k_fwd = _last_index(tracker, ("forward", "loss"))
    k_bwd = _last_index(tracker, ("backward",))
    at_peak, end_fwd = _breakdown(tracker, k_peak), _breakdown(tracker, k_fwd)
    end_bwd = _breakdown(tracker, k_bwd) if k_bwd >= 0 else end_fwd
    end = _breakdown(tracker, len(ops) - 1)
    names = sorted({op.module for op in ops})
    index = {n: i for i, n in enumerate(names)}
    timeline = Timeline(live, [op.phase for op in ops], [index[op.module] for op in ops], names)
    blocks = _blocks(tracker, io, candidates, live)
    return StepProfile(
        model=type(model).__name__,
        mode=mode,
        device=target.type,
        peak_bytes=live[k_peak],
        peak_phase=ops[k_peak].phase,
        peak_module=ops[k_peak].module,
        peak_op=ops[k_peak].name,
        param_bytes=at_peak.params_bytes,
        buffer_bytes=at_peak.buffers_bytes,
        input_bytes=at_peak.inputs_bytes,
        grad_bytes=end_bwd.grads_bytes,
        optimizer_bytes=end.optimizer_bytes,
        activation_bytes=end_fwd.activations_bytes,
        at_peak=at_peak,
        end_of_forward=end_fwd,
        forward_flops=sum(op.flops for op in ops if op.phase in ("forward", "loss")),
        backward_flops=sum(op.flops for op in ops if op.phase == "backward" and not op.recompute),
        recompute_flops=sum(op.flops for op in ops if op.recompute),
        step_s=step_s,
        blocks=blocks,
        timeline=timeline,
        torch_version=torch.__version__,
        allocation_rounding_bytes=rounding,
        simulated_device=simulated,
        notes=notes,
    )


def _recomputed_ops(fwd_ops, block: str, selective: bool = False) -> list:
    """The ops a checkpoint around `block` re-runs: up to the last one whose output is saved inside it
    (see NOTE [Recomputation]); selective checkpointing takes the SAVE_OPS from its cache instead."""
    last = -1
    for i, op in enumerate(fwd_ops):
        if any(within(m, block) for m in op.packed_by):
            last = i
    return [op for op in fwd_ops[: last + 1] if not (selective and op.name in SAVE_OPS)]


def _blocks(tracker: Tracker, io: _BlockIO, candidates: list[str], live: list[int]) -> list[BlockProfile]:
    ran = list(io.order)
    parents = {n: enclosing(n, ran) for n in ran}
    siblings = {n: [m for m in ran if parents[m] == parents[n]] for n in ran}
    return [_block(tracker, io, name, i, parents, siblings[name], live) for i, name in enumerate(ran)]


def _kept_by(records: list[StorageRecord], siblings: list[str]) -> list[str]:
    """The siblings whose ops pack any of `records`, "*" for a packer outside all of them."""
    found: list[str] = []
    for rec in records:
        for m in rec.packers:
            owner = next((s for s in siblings if within(m, s)), "*")
            if owner not in found:
                found.append(owner)
    return sorted(found)


def _block(tracker: Tracker, io: _BlockIO, name: str, i: int, parents, siblings: list[str], live) -> BlockProfile:
    depth, p = 0, parents[name]
    while p is not None:
        depth, p = depth + 1, parents[p]
    ops = tracker.ops
    mine = [k for k, op in enumerate(ops) if within(op.module, name)]
    fwd_k = [k for k in mine if ops[k].phase in ("forward", "loss")]
    bwd_k = [k for k in mine if ops[k].phase == "backward"]
    fwd = [ops[k] for k in fwd_k]
    bwd = [ops[k] for k in bwd_k if not ops[k].recompute]
    rec_ops = [ops[k] for k in bwd_k if ops[k].recompute]
    outputs, inputs = io.outputs.get(name, []), io.inputs.get(name, [])
    out_ids = {id(r) for r in outputs}
    acts = [r for r in tracker.records if r.category == "activations" and within(r.module, name)]
    internal = [r for r in acts if id(r) not in out_ids and _kept_only_in(r, name)]
    mod = io.modules[name]
    wrapper = checkpoint_wrapper_type()
    kind = "checkpoint_wrapper" if wrapper is not None and isinstance(mod, wrapper) else ("recomputed" if rec_ops else "")
    return BlockProfile(
        name=name,
        type=type(mod).__name__,
        index=i,
        depth=depth,
        parent=parents[name],
        calls=io.calls[name],
        saved_bytes=sum(r.nbytes for r in acts),
        output_bytes=sum(r.nbytes for r in outputs),
        output_saved_bytes=sum(r.nbytes for r in outputs if r.category == "activations"),
        input_bytes=sum(r.nbytes for r in inputs),
        internal_bytes=sum(r.nbytes for r in internal),
        output_kept_by=_kept_by([r for r in outputs if r.category == "activations"], siblings),
        input_unsaved_bytes=sum(r.nbytes for r in inputs if not r.saved and r.category in ("activations", "temporaries")),
        forward_flops=sum(op.flops for op in fwd),
        backward_flops=sum(op.flops for op in bwd),
        recompute_flops=sum(op.flops for op in rec_ops),
        checkpoint_recompute_flops=sum(op.flops for op in _recomputed_ops(fwd, name)),
        selective_free_bytes=sum(r.nbytes for r in internal if r.op not in SAVE_OPS),
        selective_extra_bytes=sum(
            r.nbytes for r in tracker.records
            if r.op in SAVE_OPS and r.category == "temporaries" and r.phase == "forward" and within(r.module, name)
        ),
        selective_recompute_flops=sum(op.flops for op in _recomputed_ops(fwd, name, selective=True)),
        selective_recompute_s=sum(op.seconds for op in _recomputed_ops(fwd, name, selective=True)),
        forward_s=sum(op.seconds for op in fwd),
        backward_s=sum(op.seconds for op in bwd),
        peak_bytes=max((live[k] for k in mine), default=0),
        forward_start_op=fwd_k[0] if fwd_k else -1,
        forward_end_op=fwd_k[-1] if fwd_k else -1,
        backward_start_op=bwd_k[0] if bwd_k else -1,
        backward_end_op=bwd_k[-1] if bwd_k else -1,
        checkpointed=bool(kind),
        checkpoint_kind=kind,
        has_dropout=any(op.name in RANDOM_OPS for op in fwd),
        has_batchnorm=any(isinstance(m, _BatchNorm) and m.training for m in mod.modules()),
        checkpoint_recompute_ops=len(_recomputed_ops(fwd, name)),
        selective_recompute_ops=len(_recomputed_ops(fwd, name, selective=True)),
        offload_bytes=sum(
            r.nbytes for r in tracker.records
            if r.saved and r.category in ("inputs", "activations", "temporaries") and any(within(m, name) for m in r.packers)
        ),
        container=_container_kind(io.containers.get(name)),
    )


def _container_kind(parent: nn.Module | None) -> str:
    """"Sequential" when the parent runs its children in order (a subclass too), else its class name."""
    if parent is None:
        return ""
    return "Sequential" if runs_children_in_order(parent) else type(parent).__name__


def _kept_only_in(rec: StorageRecord, block: str) -> bool:
    """Every op that saved `rec` for backward ran inside `block`."""
    return bool(rec.packers) and all(within(m, block) for m in rec.packers)
