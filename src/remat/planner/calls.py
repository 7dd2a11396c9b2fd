"""NOTE [A module called more than once] (`remat.measure.calls`), Rule 2: the units of a module whose forward runs
more than once per step are those of its calls, added up."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable
from remat.module_tree import CALLED_DIRECTLY
from remat.planner.holds import Hold
from remat.planner.unit import Unit
from remat.types import BlockProfile, StepProfile


def calls_of(prof: StepProfile, blocks: list[BlockProfile], uncalled: set[str]) -> dict[str, list[BlockProfile]]:
    """The calls of each of `blocks` that ran more than once, where every call has a forward and then a backward
    and the block is not in, or, a never-called nn.Sequential (Rule 3: the others are planned as one block)."""
    wanted = {b.name: b.calls for b in blocks if b.calls > 1 and b.container != CALLED_DIRECTLY}
    found: dict[str, list[BlockProfile]] = {}
    for c in prof.call_blocks:
        if c.name in wanted and c.name not in uncalled:
            found.setdefault(c.name, []).append(c)
    return {
        name: calls
        for name, calls in found.items()
        if len(calls) == wanted[name] and all(0 <= c.forward_end_op < c.backward_start_op for c in calls)
    }


def call_units(
    names: list[str],
    per_call: dict[str, list[BlockProfile]],
    by_name: dict[str, BlockProfile],
    build: Callable[..., list[Unit]],
) -> list[Unit]:
    """The units of the sibling blocks `names`, some of which ran more than once (`per_call`): where all of them ran
    as often, the runs and single blocks of each call added up; else each block alone, those called more than once
    added up over their calls.  `build(names, by_name, first=None)`: the units of a group as for blocks called once
    (`units._group_units`)."""
    counts = {len(per_call[n]) for n in names if n in per_call}
    if all(n in per_call for n in names) and len(counts) == 1:
        return added_up([build(names, {n: per_call[n][k] for n in names}) for k in range(counts.pop())])
    units: list[Unit] = []
    for i, name in enumerate(names):
        if name in per_call:
            units += added_up([build(names, {**by_name, name: call}, first=i) for call in per_call[name]])
        else:
            units += build(names, by_name, first=i)
    return units


def added_up(parts: list[list[Unit]]) -> list[Unit]:
    """One unit per unit that every call's units have (same action, blocks and kept outputs): what each frees and
    holds, and what each costs, together; a tensor several calls hold (a mask passed to each) is held once."""
    keyed = [{u.key: u for u in part} for part in parts]
    out = []
    for key, first in keyed[0].items():
        same = [k.get(key) for k in keyed]
        if any(u is None for u in same):
            continue
        units: list[Unit] = [u for u in same if u is not None]
        out.append(
            dataclasses.replace(
                first,
                cost_flops=sum(u.cost_flops for u in units),
                cost_s=sum(u.cost_s for u in units),
                effects=tuple(itertools.chain.from_iterable(u.effects for u in units)),
                appliable=all(u.appliable for u in units),
                cost_ops=sum(u.cost_ops for u in units),
                holds=_once([h for u in units for h in u.holds]),
                moment_bytes=sum(u.moment_bytes for u in units),
                narrow=tuple(itertools.chain.from_iterable(u.narrow for u in units)),
                kept=_once([h for u in units for h in u.kept]),
                frees=tuple(itertools.chain.from_iterable(u.frees for u in units)),
                calls=len(units),
            )
        )
    return out


def _once(holds: list[Hold]) -> tuple[Hold, ...]:
    """`holds` with those of one tensor made one, from the first start to the last end (the calls' spans nest)."""
    by_key: dict[Hashable, Hold] = {}
    for h in holds:
        seen = by_key.get(h.key)
        by_key[h.key] = h if seen is None else seen._replace(start=min(seen.start, h.start), end=max(seen.end, h.end))
    return tuple(by_key.values())
