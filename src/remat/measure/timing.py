"""How long the step takes, and each of its ops: what a plan's recomputation is weighed in.

NOTE [The seconds of a step]
  Rule 1. In real mode the seconds are measured on steps of the user's loop run after the
          tracked step, from where it left off (the steady state: the optimizer's state exists,
          kernels and caches are warm; `remat.profile` restores the model after), in REPEATS
          rounds of two steps.  The first is timed whole, untracked: the step's seconds.  In the
          second, each op of the last pass and of the optimizer step is timed (on CPU by the
          clock around it; on CUDA by a pair of events, read after the step).  Step and ops take
          the median over the rounds.  Each op then gets an even share of the time its phase
          (forward with the loss, backward, optimizer step) spends between ops in the untracked
          step: the modules' Python, which a recomputation runs again.  The tracked step's own
          clock is not used: tracking costs more than the ops of a small step.
  Rule 2. The timed ops are matched to the tracked ones by position, when both runs ran the same
          ops (by name) in the same order; otherwise (a forward that depends on its data) the
          tracked step's own times stay, and the profile says so.
  Rule 3. In fake mode each op's seconds are predicted by the roofline of the target
          (NOTE [An op's seconds, predicted] in `remat.measure.device.roofline`), and the step's are
          their sum.
  Rule 4. A rank of a DDP or FSDP2 job is not timed: every rank must make the same plan, and
          measured seconds differ between ranks.  Its ops count 0 seconds, and plans of it
          minimise FLOPs (a fake-mode prediction of a rank is timed by the roofline).
  Rule 5. Checkpointing costs more than the ops it re-runs: a non-reentrant checkpoint's hooks,
          detaches and frames per op re-run (`checkpoint_op_s`), and selective checkpointing's
          policy, a Python dispatch mode, on every op of the module in forward and again in the
          recomputation (`selective_op_s`).  Both are constants of the device the step runs on, in
          real mode as in a prediction (NOTE [An op's seconds, predicted], Rule 5: the reference
          machine's on a CPU, what the kernels do not hide on a GPU; `overheads_on`).  Measured in
          each profile they moved 2-3x from one process to the next on this machine (a chain of
          small ops: 13-36 and 7-22 us; on the demo's GPT-2 model, 27-94 us per op selective), more
          than they differ from the constants, and `remat demo` printed two plans in four runs.
          `python benchmarks/checkpoint_overheads.py` measures them on a machine.
  Rule 6. Copies take the same seconds: candidates of one class whose forward and backward ran
          the same ops (names and FLOPs, in order), as the layers of a transformer do, give each
          of those ops the median of its seconds over the copies.  Otherwise the clock's noise
          alone would pick which layer a plan recomputes, and profiling twice would give two
          plans for one budget.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from remat._torch_compat import TorchDispatchMode, op_name
from remat.measure.build import Setup
from remat.measure.device.roofline import overheads_on
from remat.measure.loop import Loop, clear_grads, micro_batch
from remat.measure.step import StepInputs, run_user_code
from remat.module_tree import class_name, within
from remat.measure.tracker import OpRecord, Tracker, alias

REPEATS = 3
"""Rounds of timed steps (Rule 1)."""
UNMATCHED_NOTE = (
    "Op seconds are the tracked step's own (tracking overhead included): the timed steps ran other ops "
    "than the tracked one (a forward that depends on its data)."
)
RANK_NOTE = (
    "A rank of a job is not timed: every rank must make the same plan, and measured seconds differ between "
    "ranks; plans of this profile minimise FLOPs (docs/many-gpus.md)."
)


class OpTimer(TorchDispatchMode):
    """The name and seconds of each aten op run while it is active (Rule 1)."""

    def __init__(self, cuda: bool = False):
        super().__init__()
        self.cuda = cuda
        self.names: list[str] = []
        self._spans: list = []
        self._packing = False  # in `alias`: the detach is no op of the step, as in the tracked one

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._packing:
            return func(*args, **kwargs)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **kwargs)
            end.record()
            self._spans.append((start, end))
        else:
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            self._spans.append(time.perf_counter() - t0)
        self.names.append(op_name(func))
        return out

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """The timed pass's pack hook: what the tracked step's packs (NOTE [What remat's pack keeps])."""
        return alias(self, t)

    def seconds(self) -> list[float]:
        if not self.cuda:
            return list(self._spans)
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in self._spans]


@dataclass(frozen=True)
class StepTimes:
    """Rule 1: the medians of the timed rounds."""

    step_s: float
    op_names: list[str]
    op_s: list[float]
    """Each op's own seconds (the clock or the events around it)."""
    phase_s: list[float]
    """Seconds of the last pass's forward (with the loss), its backward, and the optimizer step."""
    bounds: list[int]
    """Where those phases start and end among the ops: phase i is ops bounds[i] .. bounds[i+1] - 1."""

    def with_overhead(self) -> list[float]:
        """Rule 1: each op's seconds plus an even share of the time its phase spends outside ops."""
        out = list(self.op_s)
        for i, wall in enumerate(self.phase_s):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            if hi > lo:
                share = max(0.0, wall - sum(out[lo:hi])) / (hi - lo)
                out[lo:hi] = [s + share for s in out[lo:hi]]
        return out


def settle(
    tracker: Tracker,
    setup: Setup,
    ranked: bool,
    time_again: Callable[[], StepTimes],
    candidates: dict[str, nn.Module],
    notes: list[str],
) -> dict:
    """The profile's timing fields (`timing`, `step_time_s`, Rule 5's overheads), with the tracker's op
    seconds set as Rules 1-4 and 6 say (`candidates`: the modules plans may choose, by name);
    `time_again()` runs `time_loop` after the tracked step."""
    if setup.hardware is not None:  # Rule 3
        return {
            "timing": f"roofline {setup.hardware.name}",
            "step_time_s": sum(op.seconds for op in tracker.ops),
            **setup.hardware.overheads(),
        }
    if ranked or not setup.timed:  # Rule 4, or a step whose memory alone is wanted
        notes.extend([RANK_NOTE] if ranked else [])
        return {"timing": "", "step_time_s": 0.0, "checkpoint_op_s": 0.0, "selective_op_s": 0.0}
    times = time_again()
    seconds = matched(times, [op.name for op in tracker.ops])
    if seconds is None:  # Rule 2: the tracked step's own seconds stay
        notes.append(UNMATCHED_NOTE)
    for op, s in zip(tracker.ops, seconds or []):
        op.seconds = s
    same_seconds_for_copies(tracker.ops, candidates)
    return {
        "timing": "tracked" if seconds is None else "measured",
        "step_time_s": times.step_s,
        **overheads_on(setup.target),
    }


def same_seconds_for_copies(ops: list[OpRecord], candidates: dict[str, nn.Module]) -> None:
    """Rule 6, on the tracker's ops in place."""
    copies: dict[tuple, list[list[OpRecord]]] = {}
    for name, module in candidates.items():
        mine = [op for op in ops if within(op.module, name) and op.phase != "setup"]
        if mine:
            signature = (class_name(module), tuple((op.name, op.phase, op.recompute, op.flops) for op in mine))
            copies.setdefault(signature, []).append(mine)
    for group in copies.values():
        if len(group) > 1:
            for same in zip(*group):
                median = statistics.median(op.seconds for op in same)
                for op in same:
                    op.seconds = median


def time_loop(
    model: nn.Module,
    step: StepInputs,
    loss_fn: Callable | None,
    opt: torch.optim.Optimizer | None,
    loop: Loop,
    *,
    cuda: bool = False,
    repeats: int | None = None,
) -> StepTimes:
    """Rule 1: the step's seconds and its ops', from the model's current state (which this changes), in
    `repeats` rounds (REPEATS when None)."""
    repeats = REPEATS if repeats is None else repeats
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    held: list = []
    clear_grads(model, opt)
    walls: list[float] = []
    phases: list[list[float]] = []
    rounds: list = []
    names: list = []
    bounds: list[int] = []

    def last_pass(mark: Callable[[], None]) -> None:
        for _ in range(loop.accumulate - 1):
            micro_batch(model, step, loss_fn, held, keep_output=loop.keep_output)
        mark()
        micro_batch(model, step, loss_fn, held, mark, keep_output=loop.keep_output)
        if opt is not None:
            run_user_code("the optimizer step", opt.step)
        mark()

    for _ in range(repeats):
        sync()
        stamps = [time.perf_counter()]
        last_pass(lambda: _stamp(sync, stamps))
        clear_grads(model, opt)
        walls.append(stamps[-1] - stamps[0])
        phases.append([b - a for a, b in zip(stamps[1:], stamps[2:])])
        with OpTimer(cuda) as timer, torch.autograd.graph.saved_tensors_hooks(timer.pack, identity):
            bounds = []  # the hooks as the tracked step has them: the same ops run
            last_pass(lambda: _bound(sync, bounds, timer))
        clear_grads(model, opt)
        first = bounds[0]  # the ops of the pass before it (accumulate > 1) are not the tracked ones
        rounds.append(timer.seconds()[first:])
        names, bounds = timer.names[first:], [k - first for k in bounds]
    if not _same_length(rounds):
        return StepTimes(statistics.median(walls), names, [], [], [])
    per_op = [statistics.median(r[k] for r in rounds) for k in range(len(names))]
    per_phase = [statistics.median(p[i] for p in phases) for i in range(3)]
    return StepTimes(statistics.median(walls), names, per_op, per_phase, bounds)


def _stamp(sync: Callable[[], None], stamps: list[float]) -> None:
    """A boundary of a timed pass: the device drained, then the clock."""
    sync()
    stamps.append(time.perf_counter())


def _bound(sync: Callable[[], None], bounds: list[int], timer: OpTimer) -> None:
    """A boundary of a pass under the op timer: the device drained, then how many ops ran so far."""
    sync()
    bounds.append(len(timer.names))


def identity(t):
    """The unpack hook of the timed pass: what `alias` packed, as it is."""
    return t


def _same_length(rounds: list[list[float]]) -> bool:
    return len({len(r) for r in rounds}) == 1


def matched(times: StepTimes, tracked_names: list[str]) -> list[float] | None:
    """Rule 2: the timed seconds of the tracked ops, or None when the runs differ."""
    if not times.op_s or times.op_names != tracked_names:
        return None
    return times.with_overhead()


def best_of(run: Callable[[], object], repeats: int) -> float:
    """The least seconds of `repeats` calls of `run()`, after one more that warms up."""
    run()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def host_bandwidth(device: torch.device, nbytes: int = 64 * 2**20, repeats: int = 3) -> float:
    """Bytes per second of a pinned host<->device round trip (best of a few): what offloading costs."""
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def round_trip() -> None:
        torch.cuda.synchronize(device)
        pinned.copy_(on_device, non_blocking=True)
        on_device.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize(device)

    return 2 * nbytes / best_of(round_trip, repeats)
