"""A setup's answer estimated from copies of the model with 1 and 2 layers: a few seconds, where the whole model's
step (and each planned step fit_gpu replays) takes ten or more.

NOTE [A deep model from two shallow ones]
  Rule 1. A transformer's layers are alike: each adds the same parameters, gradients, optimizer state and saved
          activations, and the same seconds and FLOPs.  So the unplanned step's tensors at its peak, the
          least-memory plan's tensors, its extra seconds, the step's seconds and the states are (nearly) linear in
          the number of layers L: each is read off copies with 1 and 2 layers (the config otherwise the same,
          `remat.fit.depth.with_layers`) and extrapolated, v(L) = v(1) + (L - 1)(v(2) - v(1)).  With many layers
          a plan may also wrap several layers in one checkpoint (Chen's sqrt(n)), and the copies' plans may differ
          in kind from the whole model's: the extrapolation is an estimate, not a bound (docs/fit.md holds it
          next to the whole model's answer: within 1.1% for Llama-3-8B with LoRA at 8192 tokens).  Not an
          encoder-decoder's: its least-memory plan is far from linear in the copies' layers (T5-base, 8 x 1024
          tokens, one rank of 8: 1.73, 1.86, 1.91 and 2.38 GiB with 1, 2, 3 and 12 layers in each stack, so the
          copies said 3.1 GiB), and `layers_of` gives it no L.
  Rule 2. What the caching allocator reserves beyond the tensors is not linear, nor monotone: it comes from a few
          large blocks (the logits, their gradient) cached where smaller ones cannot use them, and from 2 MiB
          segments (Llama-3-8B's least plan, one rank of 4: 3.0, 2.8, 2.5 GiB with 1, 2, 3 layers; a 4-layer test
          Llama's, with expandable segments: 17.9, 17.6, 17.1, 18.6 MiB with 1 to 4).  The estimate adds the
          2-layer copy's excess to the extrapolated tensors, unplanned and for the least-memory plan (that copy's
          planned step replayed); Rule 4's margin is for its error.
  Rule 3. The plan's extra time at the GPU's memory is read off the chord between the unplanned step (no extra
          time, its reserve) and the least-memory plan (its extra time, its reserve).  Plans recompute what frees
          the most memory per second first, so the cost of the bytes freed grows toward the least plan, and the
          chord lies above the frontier: an upper bound of the cheapest plan's extra time.
  Rule 4. An estimate says a change fits only when it fits with ESTIMATE_MARGIN more to spare; one that fits the
          GPU but not with that margin is too close to call, and says so.  An estimate is a suggestion, never the
          answer: `remat fit` with the change profiles the whole model (docs/fit.md holds each estimate it shows
          next to that answer).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from remat.fit.depth import with_layers
from remat.fit.outcome import (
    AS_IS,
    NO,
    WITH_PLAN,
    Outcome,
    fits_reserve,
    states_of,
    with_margin,
)
from remat.fit.setup import Gpu, Setup
from remat.fit.step import least_plan, profile_step, reserve_checker
from remat.gpu_fit import RESERVE_MARGIN, gpu_reserve
from remat.types.reserve import EXPANDABLE, GpuReserve

DEPTHS = (1, 2)
ESTIMATE_MARGIN = 0.03
"""Rule 4: an estimate fits only with this much to spare beyond RESERVE_MARGIN."""
LINEAR = ("tensors", "least_tensors", "least_extra_s", "step_s", "least_flops", "step_flops", "states")


@dataclass(frozen=True)
class Figures:
    """What the answer reads off one step: linear in the layers (LINEAR, Rule 1), and what the caching allocator
    reserves beyond the tensors (Rule 2: the deeper copy's, not extrapolated)."""

    tensors: float
    reserved_over: float
    expandable_over: float
    least_tensors: float
    least_extra_s: float
    step_s: float
    least_flops: float
    step_flops: float
    states: float

    def at(self, deeper: Figures, layers: int) -> Figures:
        """These figures for DEPTHS[0] layers and `deeper`'s for DEPTHS[1], at `layers` (Rule 1)."""
        span = (layers - DEPTHS[0]) / (DEPTHS[1] - DEPTHS[0])
        values = {
            k: v + span * (getattr(deeper, k) - v) if k in LINEAR else getattr(deeper, k) for k, v in vars(self).items()
        }
        return Figures(**values)


def figures(config, head: str, setup: Setup, gpu: Gpu, layers: int) -> tuple[Figures, Callable[[], GpuReserve]]:
    """The figures of the step of `config` cut to `layers` layers, and how to replay its least-memory plan."""
    built, prof = profile_step(with_layers(config, layers), head, setup, gpu)
    least = least_plan(prof)
    reserve = gpu_reserve(prof)
    f = Figures(
        prof.peak_bytes,
        reserve.reserved_bytes - prof.peak_bytes,
        reserve.expandable_reserved_bytes - prof.peak_bytes,
        least.peak_bytes,
        least.extra_s,
        prof.step_time_s,
        least.recompute_flops,
        prof.forward_flops + prof.backward_flops,
        states_of(prof),
    )
    return f, lambda: reserve_checker(built, prof, setup, gpu)(least)


def estimate(config, head: str, setup: Setup, gpu: Gpu, layers: int) -> Outcome:
    """`setup`'s outcome for the model of `config` with `layers` layers, from copies with DEPTHS (Rules 1-4)."""
    (one, _), (two, replay) = (figures(config, head, setup, gpu, k) for k in DEPTHS)
    f = one.at(two, layers)
    how = f"estimated from copies with {DEPTHS[0]} and {DEPTHS[1]} of its {layers} layers"
    base = Outcome(setup, NO, states_bytes=int(f.states), least_tensors_bytes=int(f.least_tensors), estimated=how)
    replayed = functools.cache(replay)
    strict = _decide(base, f, two.least_tensors, replayed, int(gpu.memory_bytes / (1 + ESTIMATE_MARGIN)))
    if strict.fits:
        return strict
    loose = _decide(base, f, two.least_tensors, replayed, gpu.memory_bytes)
    return _replace(strict, close=True) if loose.fits else loose  # Rule 4; the least as the GPU's own size has it


def _decide(base: Outcome, f: Figures, deeper_least: float, replay: Callable[[], GpuReserve], budget: int) -> Outcome:
    """NOTE [Does a step fit] on the extrapolated figures (Rules 2-3), for a GPU of `budget` bytes."""
    if f.least_tensors > budget:  # tensors alone over it; tensors under it may still reserve over it (below)
        return _replace(base, least_bytes=int(f.least_tensors))
    for allocator, over in (("", f.reserved_over), (EXPANDABLE, f.expandable_over)):
        if fits_reserve(int(f.tensors + over), budget):
            return _replace(base, verdict=AS_IS, allocator=allocator, reserve_bytes=int(f.tensors + over))
    r = replay()
    timed = f.step_s > 0
    least_extra = f.least_extra_s / f.step_s if timed else f.least_flops / max(f.step_flops, 1)
    for allocator, over, least_over in (
        ("", f.reserved_over, r.reserved_bytes - deeper_least),
        (EXPANDABLE, f.expandable_over, r.expandable_reserved_bytes - deeper_least),
    ):
        unplanned, least = f.tensors + over, f.least_tensors + least_over
        if fits_reserve(int(least), budget):
            room = budget / (1 + RESERVE_MARGIN)
            share = min(max((unplanned - room) / (unplanned - least), 0.0), 1.0) if unplanned > least else 1.0
            return _replace(
                base,
                verdict=WITH_PLAN,
                allocator=allocator,
                least_bytes=int(least),
                least_is_reserve=True,
                extra_fraction=share * least_extra,
                extra_unit="time" if timed else "FLOPs",
            )
    least = f.least_tensors + min(r.reserved_bytes, r.expandable_reserved_bytes) - deeper_least
    return _replace(base, least_bytes=with_margin(int(least)), least_is_reserve=True)


def _replace(base: Outcome, **changes) -> Outcome:
    return dataclasses.replace(base, **changes)
