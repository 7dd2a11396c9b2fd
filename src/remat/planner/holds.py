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

from remat.planner.effects import Effect, output_freeable
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
    autograd does not keep, from the later of `first`'s forward end and the input's own free; each input autograd
    keeps for ops outside `first` (`kept_inputs`), from its free on (`kept_holds`: until then)."""
    items: list[tuple[Hashable, int, int]]
    if first.held_inputs:
        items = [(key, nbytes, max(first.forward_end_op + 1, free)) for key, nbytes, free in first.held_inputs]
    elif first.input_unsaved_bytes:
        items = [(first.name, first.input_unsaved_bytes, first.forward_end_op + 1)]
    else:
        items = []
    items += [(key, nbytes, max(first.forward_end_op + 1, free)) for key, nbytes, free in first.kept_inputs]
    return tuple(Hold(key, start, end, nbytes) for key, nbytes, start in items if start < end)


def kept_holds(first: BlockProfile, end: int, freeable: frozenset) -> tuple[Hold, ...]:
    """The inputs autograd keeps for ops outside `first` until after `end` (`kept_inputs`), which a checkpoint whose
    first block is `first` holds too: nothing while those ops keep them, but a chosen checkpoint around those ops
    that frees one (a saved output of its run, Rule 1: `freeable`) leaves this checkpoint holding it (a ReLU's
    output, saved by the ReLU, read by a Dropout after it: the ReLU checkpointed frees it, the Dropout
    checkpointed keeps it).  `Problem.memory` counts them where a chosen unit frees the tensor (`Unit.frees`,
    `held_on`), the ilp with one column per holder (`and_columns`), `dp` as always held (safe)."""
    start = first.forward_end_op + 1
    return tuple(
        Hold(key, start, end, nbytes)
        for key, nbytes, free in first.kept_inputs
        if key in freeable and free >= end and start < end
    )


def freeable_outputs(blocks: list[BlockProfile]) -> frozenset:
    """The saved outputs some run of checkpointed siblings can free (Rule 1: all their keepers are siblings) that
    a block keeps as input for others' ops (`kept_holds`), by tensor number."""
    kept = {key for b in blocks for key, _, _ in b.kept_inputs}
    if not kept:
        return frozenset()
    return frozenset(
        key
        for b in blocks
        if "*" not in b.output_kept_by and output_freeable(b) > 0
        for key in b.output_keys
        if key in kept
    )


def freed_outputs(blocks: list[BlockProfile], columns: list[np.ndarray], j: int, end: int, wanted) -> tuple:
    """The saved outputs in `wanted` (`freeable_outputs`) that the run of `blocks` (its last one at position `j`;
    `columns`: `effects.run_columns` from its first) frees, by Rule 1, from their last read until `end`."""
    if not wanted:
        return ()
    out_starts, output, reach = columns[1], columns[3], columns[4]
    return tuple(
        Hold(key, int(out_starts[m]), end, 0)
        for m, b in enumerate(blocks)
        if reach[m] <= j and output[m] > 0 and out_starts[m] < end
        for key in b.output_keys
        if key in wanted
    )


def held_on(kept: list, chosen: set[int], n_intervals: int) -> np.ndarray:
    """Bytes the kept holds (per tensor: bytes, its holders' and its freers' (unit index, first interval, end
    interval)) add in each interval under the units at positions `chosen`: where a chosen holder holds the tensor
    and a chosen unit freed it (elsewhere autograd keeps it anyway, or nothing holds it)."""
    extra = np.zeros(n_intervals, dtype=np.int64)
    for nbytes, holders, freers in kept:
        held_by, freed = np.zeros(n_intervals, dtype=bool), np.zeros(n_intervals, dtype=bool)
        for spans, mask in ((holders, held_by), (freers, freed)):
            for pos, k0, k1 in spans:
                if pos in chosen:
                    mask[k0:k1] = True
        extra += nbytes * (held_by & freed)
    return extra


def and_columns(kept: list, covers: list[frozenset], n_intervals: int):
    """For a mixed-integer program: one column w per holder of a kept hold (`held_on`), with the bytes it adds in
    each interval (where the holder holds the tensor and some freer frees it), and its link w >= x_b + sum x_a - 1
    over the freers a that can be chosen with the holder b (they all contain the block that made the tensor, so at
    most one is).  Returns (matrix intervals x columns, [(column, holder, [freers])])."""
    columns: list[np.ndarray] = []
    links: list[tuple[int, int, list[int]]] = []
    for nbytes, holders, freers in kept:
        for b, h0, h1 in holders:
            with_b = [(a, f0, f1) for a, f0, f1 in freers if not covers[a] & covers[b]]
            column = np.zeros(n_intervals)
            for _, f0, f1 in with_b:
                column[max(h0, f0) : min(h1, f1)] = nbytes
            if column.any():
                links.append((len(columns), b, [a for a, _, _ in with_b]))
                columns.append(column)
    matrix = np.column_stack(columns) if columns else np.zeros((n_intervals, 0))
    return matrix, links


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
