"""From the tracker's records of one step to the `StepProfile` the user gets.

Pure bookkeeping over what `remat.measure.tracker.Tracker` logged: live bytes after
each op (NOTE [What counts as live memory]), the breakdown at the peak and at the end of
forward, and the candidate blocks (`remat.measure.blocks`); and what kind of tensor each storage holds
(`register_state` before the step, `classify` after: NOTE [What counts as live memory], Rule 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from remat.errors import RematError, listing
from remat.measure.block_io import BlockIO
from remat.measure.blocks import block_profiles
from remat.measure.device.cuda_allocator import gpu_reserve
from remat._torch_compat.distributed import fsdp_gathered
from remat.measure.loop import optimizer_state, tensors_in
from remat.measure.device.roofline import Hardware
from remat.measure.tracker import Tracker
from remat.types import Breakdown, Mode, StepProfile, Timeline

FORWARD = ("forward", "loss")


@dataclass(frozen=True)
class Setup:
    """How the step is measured: decided by `remat.profile` before it runs."""

    mode: Mode
    target: torch.device
    """The device the figures are for."""
    rounding: int
    """Every storage counted rounded up to this many bytes (the allocator's granularity)."""
    simulated: bool
    """A CUDA target run on this machine's CPU (fake mode without a GPU)."""
    notes: tuple[str, ...] = ()
    """What is known before the step runs (a simulated device, the roofline); a run adds its own (`build_profile`)."""
    hardware: Hardware | None = None
    """The roofline a fake step's op seconds are predicted by (NOTE [An op's seconds, predicted]); None in real mode."""
    timed: bool = True
    """A real step's seconds measured (NOTE [The seconds of a step]); False where only its memory is wanted."""
    compiled: bool = False
    """The model is compiled: the profile says what its compiled step holds that this eager one does not."""

    @property
    def cuda_real(self) -> bool:
        return self.mode == Mode.REAL and self.target.type == "cuda"

    @property
    def fake_cuda(self) -> bool:
        """A CUDA step predicted with fake tensors: what CUDA's libraries allocate beyond tensors is modelled
        (NOTE [CUDA memory that is no tensor])."""
        return self.mode == Mode.FAKE and self.target.type == "cuda"


def build_profile(
    model_name: str, tracker: Tracker, io: BlockIO, setup: Setup, step_s: float, noticed: list[str]
) -> StepProfile:
    """The StepProfile of the logged step; a `remat:` error if the forward ran no tensor op."""
    ops = tracker.ops
    if not ops or _last_index(tracker, FORWARD) < 0:
        raise RematError(
            f"remat: the step of {model_name} ran no tensor op in forward; expected a model that "
            "computes with tensors. Fix: check that forward uses its inputs."
        )
    live = _live_series(tracker)
    k_peak = max(range(len(live)), key=live.__getitem__)
    k_fwd, k_bwd = _last_index(tracker, FORWARD), _last_index(tracker, ("backward",))
    at_peak, end_fwd = _breakdown(tracker, k_peak), _breakdown(tracker, k_fwd)
    end_bwd = _breakdown(tracker, k_bwd) if k_bwd >= 0 else end_fwd
    blocks, call_blocks = block_profiles(tracker, io, live, _freed_before(tracker))
    return StepProfile(
        model=model_name,
        mode=setup.mode,
        device=setup.target.type,
        peak_bytes=live[k_peak],
        peak_phase=ops[k_peak].phase,
        peak_module=ops[k_peak].module,
        peak_op=ops[k_peak].name,
        param_bytes=at_peak.params_bytes,
        buffer_bytes=at_peak.buffers_bytes,
        input_bytes=at_peak.inputs_bytes,
        grad_bytes=end_bwd.grads_bytes,
        optimizer_bytes=_breakdown(tracker, len(ops) - 1).optimizer_bytes,
        activation_bytes=end_fwd.activations_bytes,
        at_peak=at_peak,
        end_of_forward=end_fwd,
        forward_flops=sum(op.flops for op in ops if op.phase in FORWARD),
        backward_flops=sum(op.flops for op in ops if op.phase == "backward" and not op.recompute),
        recompute_flops=sum(op.flops for op in ops if op.recompute),
        step_s=step_s,
        blocks=blocks,
        call_blocks=call_blocks,
        timeline=_timeline(tracker, live),
        torch_version=torch.__version__,
        allocation_rounding_bytes=setup.rounding,
        simulated_device=setup.simulated,
        notes=[*setup.notes, *noticed, *_own_checkpoints_note(blocks)],
        gpu_reserve=(
            gpu_reserve(tracker.records, tracker.scratch, [op.phase for op in ops])
            if setup.target.type == "cuda"
            else None
        ),
    )


def _own_checkpoints_note(blocks) -> list[str]:
    """The blocks remat's own checkpoints re-run in the step (remat.apply, remat.checkpoint): not the model's."""
    ours = [b.name for b in blocks if b.checkpoint_kind == "remat"]
    if not ours:
        return []
    return [
        f"remat's own checkpoints (remat.apply, remat.checkpoint) recompute {listing(ours, 3)} in this step: "
        "this is the planned step. A plan made from this profile plans around them, and remat.apply replaces "
        "them; to plan the model as written, remat.remove(model) and profile again (remat.auto does this itself)."
    ]


def _timeline(tracker: Tracker, live: list[int]) -> Timeline:
    names = sorted({op.module for op in tracker.ops})
    index = {n: i for i, n in enumerate(names)}
    start = sum(r.nbytes for r in tracker.records if r.alloc_step < 0 and (r.free_step is None or r.free_step > 0))
    return Timeline(live, [op.phase for op in tracker.ops], [index[op.module] for op in tracker.ops], names, start)


def _freed_before(tracker: Tracker) -> list[int]:
    """Per op k, what the timeline counts after op k - 1 that is gone when op k starts: storages freed in between
    (Rule 4 counts them after op k - 1) and op k - 1's kernel scratch (Rule 5)."""
    n = len(tracker.ops)
    freed = [0] * (n + 1)
    for rec in tracker.records:
        if rec.free_step is not None and max(rec.alloc_step, 0) < rec.free_step <= n:
            freed[rec.free_step] += rec.nbytes
    scratch = tracker.scratch if len(tracker.scratch) == n else [0] * n
    return [0] + [freed[k] + scratch[k - 1] for k in range(1, n)]


def _live_series(tracker: Tracker) -> list[int]:
    """Live bytes after each op (Rules 2-4 of NOTE [What counts as live memory])."""
    n = len(tracker.ops)
    delta = [0] * (n + 1)
    for rec in tracker.records:
        start = max(rec.alloc_step, 0)
        end = n if rec.free_step is None else min(rec.free_step, n)
        if start < end:
            delta[start] += rec.nbytes
            delta[end] -= rec.nbytes
    scratch = tracker.scratch if len(tracker.scratch) == n else [0] * n  # Rule 5
    live, acc = [], 0
    for d, extra in zip(delta[:n], scratch):
        acc += d
        live.append(acc + extra)
    return live


def _breakdown(tracker: Tracker, k: int) -> Breakdown:
    sums: dict[str, int] = {}
    for rec in tracker.records:
        if rec.live_at(k):
            sums[rec.category] = sums.get(rec.category, 0) + rec.nbytes
    if len(tracker.scratch) == len(tracker.ops) and tracker.scratch[k]:
        sums["scratch"] = tracker.scratch[k]
    return Breakdown(**{f"{c}_bytes": v for c, v in sums.items()})


def _last_index(tracker: Tracker, phases: tuple[str, ...]) -> int:
    for i in range(len(tracker.ops) - 1, -1, -1):
        if tracker.ops[i].phase in phases:
            return i
    return -1


def register_state(tracker: Tracker, model: nn.Module, step, opt, held: list) -> dict[str, list]:
    """Pre-existing storages (Rule 3) and the tensors whose category is known; `held` (the previous pass's
    output and loss) is pre-existing too, and ends up a temporary."""
    kinds: dict[str, list] = {
        "params": list(model.parameters()),
        "buffers": list(model.buffers()),
        "inputs": step.tensors(),
        "grads": [p.grad for p in model.parameters() if p.grad is not None],
        "optimizer": [],
        "gathered": fsdp_gathered(model),  # resized to nothing between uses (NOTE [A rank's step], Rule 2)
    }
    if opt is not None:
        kinds["optimizer"] = optimizer_state(opt)
    for t in [t for ts in kinds.values() for t in ts] + tensors_in(held):
        tracker.record_of(t, before_step=True)
    return kinds


def classify(tracker: Tracker, kinds: dict[str, list]) -> None:
    """Give each record its category; the first kind that claims a storage wins."""
    for kind in ("params", "buffers", "inputs", "grads", "optimizer", "gathered"):
        for t in kinds[kind]:
            rec = tracker.record_of(t)  # seen already, or made without dispatch (Adam's step counters)
            while rec is not None and not rec.category:  # and its records before resizes (FSDP2)
                rec.category = kind
                rec = rec.resized_from
    for rec in tracker.records:
        if not rec.category:
            made_in_forward = rec.phase in ("forward", "loss") and rec.alloc_step >= 0
            rec.category = "activations" if (rec.saved and made_in_forward) else "temporaries"
