"""The moment a checkpoint re-runs its forward (NOTE [The memory model of a plan], Rule 3): what the
recomputation holds at once, when backward first unpacks a tensor saved inside it (`rerun_points`), as one more
`Effect`.

Seen on four `nn.TransformerEncoderLayer`s in an nn.ModuleList (CPU, real mode): one checkpoint over
layers 0-1 measured 70,494,740 bytes where the model, which gave the blocks' bytes back at their first
backward op, predicted 69,562,388 (-1.3%).  The peak is the recomputation's last op (the second layer's
norm, whose output nothing saves): every saved tensor of both layers rebuilt, that output, and the
checkpoint's held input, after the previous backward node released what the timeline still counts before
(`BlockProfile.freed_before_backward_bytes`).  An output that the run's ops and the next block's both save is
gone by then too: report 001's chain (each ReLU's output saved by itself and the next Linear) measured a
checkpoint over Linear, ReLU, Linear, ReLU 128 KiB under a moment that counted it.  A selective checkpoint re-runs
its block too, taking the outputs it kept from its cache (NOTE [Which outputs a selective checkpoint keeps], Rule 5).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from remat.planner.effects import Effect, breakpoints
from remat.types import BlockProfile

if TYPE_CHECKING:
    from remat.planner.units import Unit


class Rerun:
    """What re-running the forwards of a run that starts at `first` holds at once, for each block it may end
    with: the growth of the live bytes over the unplanned forward from just before `first`'s first op, plus each
    input the checkpoint holds that the forward freed on the way (the recomputation keeps it)."""

    def __init__(self, live: np.ndarray, first: BlockProfile, last_op: int, start: int = -1):
        """`start`: the live bytes before the step's first op (`Timeline.start_bytes`; -1: not known, and a run
        from op 0 has no moment)."""
        self.start = f0 = first.forward_start_op
        if f0 < 0 or (f0 == 0 and start < 0) or last_op >= len(live):
            self.grown = self.most = np.zeros(0, dtype=np.int64)
            return
        before = (live[f0 - 1] if f0 else start) - first.freed_before_forward_bytes
        self.grown = grown = live[f0 : last_op + 1] - before
        for _, nbytes, freed in first.held_inputs:
            if f0 < freed <= last_op:
                grown[freed - f0 :] += nbytes
        self.most = np.maximum.accumulate(grown) if len(grown) else grown

    def held(
        self, last: BlockProfile, shared: int, taken: list[list[int]] | None = None, copied: int = 0
    ) -> int | None:
        """The most bytes the re-run adds at once when it ends with `last`, which torch stops re-running after
        its last op whose output is saved inside it (NOTE [Recomputation]), above the live bytes before it; None
        if the profile cannot say.  `shared`: outputs the run and the blocks after it both keep
        (`effects.shared_outputs`), in the timeline before the re-run but gone from the planned step.  `taken`: [op
        index, bytes] a selective checkpoint's cache gives the re-run instead of running the op
        (`SelectiveVariant.kept_made`): already live before it, they add nothing.  `copied`: what it holds from its
        start beside that, the running statistics of the BatchNorms remat's checkpoint copies (`batchnorm_stats_bytes`:
        RegNet's checkpoints of two layers were predicted 136 bytes under their step)."""
        if last.checkpoint_recompute_ops <= 0:
            return None
        k = min(last.forward_end_op, last.forward_start_op + last.checkpoint_recompute_ops - 1) - self.start
        if not 0 <= k < len(self.most):
            return None
        if not taken:
            return int(self.most[k]) - shared + copied
        made = np.zeros(k + 1, dtype=np.int64)
        for op, nbytes in taken:
            if 0 <= op - self.start <= k:
                made[op - self.start] += nbytes
        return int((self.grown[: k + 1] - np.cumsum(made)).max()) - shared + copied


def rerun_points(blocks: list[BlockProfile]) -> list[tuple[int, int]]:
    """Per run blocks[0..k] (k = 0, 1, ...): the op before which a checkpoint of it re-runs their forwards, and what
    the timeline counts after the op before that is gone by then (the previous backward node released it): the first
    unpack of a tensor saved inside the run (`BlockProfile.rerun_op`, NOTE [When a checkpoint re-runs] in
    `remat.measure.tracker`); for a block where it is not recorded, its first backward op (never later)."""
    out: list[tuple[int, int]] = []
    for b in blocks:
        at = (b.rerun_op, b.freed_before_rerun_bytes) if b.rerun_op >= 0 else None
        at = at or (b.backward_start_op, b.freed_before_backward_bytes)
        out.append(min(out[-1], at) if out else at)
    return out


def rerun_effect(live: np.ndarray, effects: list[Effect], at: tuple[int, int], held: int | None) -> list[Effect]:
    """The effect at op `at` = (t, released), where the run re-runs (`rerun_points`), that makes the plan's live bytes
    there at least the recomputation's moment: the unplanned step's live bytes after the op before, less what the
    previous backward node `released`, less what the unit frees there, plus what the re-run adds (`Rerun.held`).
    None where that moment is no higher than the live bytes after that op."""
    t, released = at
    if held is None or not 1 <= t < len(live):
        return []
    now = int(live[t]) - _freed_at(effects, t)
    moment = int(live[t - 1]) - released - _freed_at(effects, t - 1) + held
    return [Effect(t, t + 1, now - moment)] if moment > now else []


def _freed_at(effects: list[Effect], t: int) -> int:
    return sum(e.bytes for e in effects if e.start <= t < e.end)


def widen(units: list["Unit"], live: np.ndarray) -> list["Unit"]:
    """`units` with each moment (`rerun_effect`, its unit's last effect) spread over the whole elementary interval that
    starts at its op, as what it adds to that interval's most, and each narrow effect (`Unit.narrow`) over the
    intervals it covers: one more breakpoint per unit made the ILP's program larger (T5's 55 intervals became 77) and
    slower (a 16-layer Llama's plan took 15.6 s instead of 5.7; a kept output's hold, 10.4 s), for the same plans.
    Exact: no unit's other effects or holds change inside those intervals.  A narrow effect stays as it is in the
    interval of a moment that raises its most, of another narrow effect of its unit, or of another block's: two
    added there apart can sum to more, or less, than the two at once."""
    single = [bool(u.moment_bytes) and u.calls == 1 for u in units]  # a unit of several calls (`planner.calls`) has
    # one moment per call among its effects: they stay there, each over its one op (exact, a few more intervals)
    own = [u.effects[:-1] if one else u.effects for u, one in zip(units, single)]
    spans = [s for u, effects in zip(units, own) for s in (*effects, *u.holds, *u.kept)]
    spans += [Effect(n.end, n.end, 0) for u in units for n in u.narrow]  # where the cache lets go: kept as bounds
    bounds = np.array(breakpoints(spans, len(live)), dtype=np.int64)
    widened = {k: _moment(u, bounds, live) for k, u in enumerate(units) if single[k]}
    moments = {units[k].effects[-1].start for k, (_, v) in widened.items() if v}
    inside: dict[int, list] = {}  # the blocks of each narrow effect starting inside each interval, per unit
    for u in units:
        starts = [_interval(bounds, n.start)[0] for n in u.narrow]
        for a in set(starts):
            inside.setdefault(a, []).append(u.blocks if starts.count(a) == 1 else None)
    crowded = moments | {a for a, blocks in inside.items() if None in blocks or len(set(blocks)) > 1}
    kept = [tuple(n for n in u.narrow if _interval(bounds, n.start)[0] in crowded) for u in units]
    if any(kept):  # finer intervals: the moments again
        bounds = np.array(breakpoints([*spans, *(n for k in kept for n in k)], len(live)), dtype=np.int64)
        widened = {k: _moment(units[k], bounds, live) for k in widened}
    out = []
    for k, (u, effects, stay) in enumerate(zip(units, own, kept)):
        if not (single[k] or u.narrow):
            out.append(u)
            continue
        spread = tuple(e for n in u.narrow if n not in stay for e in _spread(n, bounds, live))
        extra = sum(n.bytes for n in u.narrow if n not in stay) - sum(e.bytes for e in spread)
        moment, v = widened[k] if single[k] else ((), -u.moment_bytes)
        u = dataclasses.replace(
            u, effects=(*effects, *stay, *spread, *moment), moment_bytes=-v, narrow=(), spread_bytes=extra
        )
        out.append(u)
    return out


def _interval(bounds: np.ndarray, t: int) -> tuple[int, int]:
    """The elementary interval [a, b) of `bounds` that holds op `t`."""
    k = int(np.searchsorted(bounds, t, side="right"))
    return int(bounds[k - 1]), int(bounds[k])


def _moment(u: "Unit", bounds: np.ndarray, live: np.ndarray) -> tuple[tuple[Effect, ...], int]:
    t, _, v = u.effects[-1]
    _, end = _interval(bounds, t)
    v = min(0, v + int(live[t:end].max()) - int(live[t]))
    return ((Effect(t, end, v),) if v else ()), v


def _spread(n: Effect, bounds: np.ndarray, live: np.ndarray) -> tuple[Effect, ...]:
    """`n` as effects on `bounds` (its end is one): over the interval [a, b) its start falls in, what it changes of
    that interval's most (the live bytes there differ by -n.bytes from its start on), and as it is from b on."""
    a, b = _interval(bounds, n.start)
    if a == n.start:
        return (n,)
    v = int(live[a:b].max()) - max(int(live[a : n.start].max()), int(live[n.start : b].max()) - n.bytes)
    return tuple(e for e in (Effect(a, b, v), Effect(b, n.end, n.bytes)) if e.bytes and e.start < e.end)
