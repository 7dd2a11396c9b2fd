"""Rule 2's held inputs (NOTE [The memory model of a plan]): a checkpoint keeps its inputs until its
backward is over.

One tensor can be an input of several units: T5 passes its position bias to every layer, a decoder its
attention mask.  Several chosen checkpoints hold it once, over the union of their spans, not once each
(seen on T5: every layer checkpointed measured 48 KiB above a prediction that left keyword inputs out; counted
once per checkpoint it would be as many times too high).  A hold whose holders all start at the same block
cannot be held twice (those units exclude each other) and becomes a plain effect; the others stay `Hold`s,
which `Problem.memory` evaluates exactly, `ilp` models with one OR column per set of holders, and `dp` counts
once per holder (its plans are then safe, not always the cheapest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

from remat.planner.effects import Effect
from remat.types import BlockProfile


class Hold(NamedTuple):
    """`bytes` more live bytes over op indices [start, end), while any unit holding `key` is chosen."""

    key: Hashable
    """The tensor (its number in the profile), or the block, for a profile saved without `held_inputs`."""
    start: int
    end: int
    bytes: int


def unit_holds(first: BlockProfile, end: int) -> tuple[Hold, ...]:
    """What a checkpoint whose first block is `first` holds, until `end` (its backward is over): each input
    autograd does not keep, from the later of `first`'s forward end and the input's own free."""
    items: list[tuple[Hashable, int, int]]
    if first.held_inputs:
        items = [(key, nbytes, max(first.forward_end_op + 1, free)) for key, nbytes, free in first.held_inputs]
    elif first.input_unsaved_bytes:
        items = [(first.name, first.input_unsaved_bytes, first.forward_end_op + 1)]
    else:
        items = []
    return tuple(Hold(key, start, end, nbytes) for key, nbytes, start in items if start < end)


def split(units: list) -> list:
    """`units` with each hold that only units starting at one block have turned into an `Effect`."""
    firsts: dict[Hashable, set] = {}
    for u in units:
        for h in u.holds:
            firsts.setdefault(h.key, set()).add((u.group, u.position))
    out = []
    for u in units:
        alone = tuple(Effect(h.start, h.end, -h.bytes) for h in u.holds if len(firsts[h.key]) == 1)
        if alone:
            shared_only = tuple(h for h in u.holds if len(firsts[h.key]) > 1)
            u = dataclasses.replace(u, effects=u.effects + alone, holds=shared_only)
        out.append(u)
    return out


def shared(units: list, breakpoints: list[int]) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """Per tensor held by units of several blocks: its bytes and, per holder, (unit index, first interval,
    end interval), in the order the units come."""
    bp = np.array(breakpoints, dtype=np.int64)
    by_key: dict[Hashable, tuple[int, list]] = {}
    for pos, u in enumerate(units):
        for h in u.holds:
            k0, k1 = (int(k) for k in np.searchsorted(bp, [h.start, h.end]))
            by_key.setdefault(h.key, (h.bytes, []))[1].append((pos, k0, k1))
    return list(by_key.values())


def covered(held: list[tuple[int, list[tuple[int, int, int]]]], chosen: set[int], n_intervals: int) -> np.ndarray:
    """Bytes the shared holds add in each interval when the units at positions `chosen` are chosen."""
    extra = np.zeros(n_intervals, dtype=np.int64)
    for nbytes, holders in held:
        mask = np.zeros(n_intervals, dtype=bool)
        for pos, k0, k1 in holders:
            if pos in chosen:
                mask[k0:k1] = True
        extra += nbytes * mask
    return extra


def or_columns(held: list[tuple[int, list[tuple[int, int, int]]]], n_intervals: int):
    """For a mixed-integer program: one column z per (tensor, set of holders spanning an interval), with the
    bytes it adds in each interval, and the links z >= x_u for each holder u of its set (z is then the OR of
    them, since it only costs memory).  Returns (matrix intervals x columns, [(column, unit index)])."""
    columns: list[np.ndarray] = []
    links: list[tuple[int, int]] = []
    for nbytes, holders in held:
        sets: dict[frozenset, list[int]] = {}
        for k in range(min(k0 for _, k0, _ in holders), max(k1 for _, _, k1 in holders)):
            holding = frozenset(pos for pos, k0, k1 in holders if k0 <= k < k1)
            if holding:
                sets.setdefault(holding, []).append(k)
        for holding, ks in sets.items():
            column = np.zeros(n_intervals)
            column[ks] = nbytes
            links += [(len(columns), pos) for pos in sorted(holding)]
            columns.append(column)
    matrix = np.column_stack(columns) if columns else np.zeros((n_intervals, 0))
    return matrix, links
