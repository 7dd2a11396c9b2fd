"""Rule 1 of NOTE [The memory model of a plan] (`remat.planner.problem`): what the blocks of a run stop
holding, and when, as `Effect`s."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from remat.types import BlockProfile


class Effect(NamedTuple):
    """`bytes` fewer live bytes over op indices [start, end).  (A tuple: a 100-stage chain has ~10^5.)"""

    start: int
    end: int
    bytes: int


_effect = tuple.__new__  # Effect((a, b, c)) without NamedTuple's Python-level __new__: ~10^5 per problem


def breakpoints(spans, n: int) -> list[int]:
    """The op indices where any of `spans` (effects or holds: `.start`, `.end`) begins or ends, with 0 and `n` (the
    timeline's length), in order: the bounds of the elementary intervals a plan's memory is evaluated over."""
    points = {0, n}
    for s in spans:
        points.update((s.start, s.end))
    return sorted(p for p in points if 0 <= p <= n)


def run_columns(names: list[str], i: int, stop: int, by_name: dict[str, BlockProfile]) -> list[np.ndarray]:
    """Per block of names[i..stop-1]: where its forward ends, where its output is last read, what it frees
    alone, its saved output, the position of the last block that keeps that output (the output is
    freed too once the run reaches it), the output the model itself holds (`output_freeable`), where
    the block's backward starts, and the position of the first block from names[i] on that keeps its output."""
    pos = {n: k for k, n in enumerate(names)}
    columns: list[list[int]] = [[], [], [], [], [], [], [], []]
    for n in names[i:stop]:
        b = by_name[n]
        keepers = [pos.get(k, -1) for k in b.output_kept_by]
        freeable = output_freeable(b)
        row = (
            b.forward_end_op + 1,
            max(b.forward_end_op, b.output_last_use_op) + 1,  # read later (a skip): held till then
            b.internal_bytes,
            freeable,
            max(keepers) if keepers and min(keepers) >= i else len(names),
            b.output_saved_bytes - freeable,
            b.backward_start_op,
            min((k for k in keepers if k >= i), default=len(names)),
        )
        for column, value in zip(columns, row):
            column.append(value)
    return [np.array(c, dtype=np.int64) for c in columns]


def shared_outputs(columns: list[np.ndarray], m: int, j: int) -> int:
    """Saved outputs of the run of the first `m` blocks of `columns` (`run_columns`; the last one names[j]) that
    blocks of the run and blocks after it both keep (the last block's, read by its own last op and by the next
    block): Rule 1 keeps them, but once the backward of the blocks after the run is over only the run's own saved
    copies held them, and a checkpoint dropped those (NOTE [The memory model of a plan], Rule 3)."""
    output, reach, first = columns[3][:m], columns[4][:m], columns[7][:m]
    return int(output[(first <= j) & (reach > j)].sum())


def freed_effects(starts, out_starts, internal, output, end: int) -> list[Effect]:
    """Rule 1's effects of the blocks of a run: internal bytes from the end of each block's forward, its
    output from the later of that and the output's last read in forward (one effect when they coincide)."""
    same = out_starts == starts
    freed = internal + np.where(same, output, 0)
    keep = (freed != 0) & (starts < end)
    effects = [_effect(Effect, (a, end, f)) for a, f in zip(starts[keep].tolist(), freed[keep].tolist())]
    later = ~same & (output != 0) & (out_starts < end)
    effects += [_effect(Effect, (a, end, f)) for a, f in zip(out_starts[later].tolist(), output[later].tolist())]
    return effects


def output_freeable(b: BlockProfile) -> int:
    """`b`'s saved output, or 0 when the unplanned step holds it past `b`'s own backward (the model returns
    it, as with `output_hidden_states=True`): autograd is not all that keeps it, so a checkpoint frees
    nothing of it, and recomputing it makes a second copy (`recomputed_copies`).  Seen on a 3-layer GPT-2:
    one checkpoint over its layers measured 2.776 MB for 2.743 MB predicted, two hidden states."""
    return 0 if b.output_free_op > b.backward_end_op + 1 else b.output_saved_bytes


def recomputed_copies(held, backward_starts, end: int) -> list[Effect]:
    """The outputs of a run's blocks (not its last) that the model holds anyway (`held` bytes): the
    recomputation at `end` makes a second copy, which the next block's backward releases before the
    block's own backward starts."""
    return [Effect(end, b, -h) for h, b in zip(held.tolist(), backward_starts.tolist()) if h and end < b]
