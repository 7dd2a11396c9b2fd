"""Rule 1 of NOTE [The memory model of a plan] (`remat.planner.problem`): what the blocks of a run stop
holding, and when, as `Effect`s."""

from __future__ import annotations

import operator
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
    spans = spans if isinstance(spans, list) else list(spans)
    points = {0, n, *map(_start, spans), *map(_end, spans)}
    return sorted(p for p in points if 0 <= p <= n)


_start, _end = operator.attrgetter("start"), operator.attrgetter("end")


def run_columns(names: list[str], i: int, stop: int, by_name: dict[str, BlockProfile]) -> list[np.ndarray]:
    """Per block of names[i..stop-1]: where its forward ends, where its output is last read, what it frees
    alone, its saved output (but the part only its own ops keep), the position of the last block that keeps that
    output (the output is freed too once the run reaches it), the output the model itself holds
    (`output_freeable`), where the block's backward starts, the position of the first block from names[i] on that
    keeps its output, the saved output only its own ops keep with the op it is freed from (`own_output`), and the
    casts autocast's cache holds with the op they are freed from (`cached_casts`)."""
    pos = {n: k for k, n in enumerate(names)}
    columns: list[list[int]] = [[], [], [], [], [], [], [], [], [], [], [], []]
    spans = [(by_name[n].forward_start_op, by_name[n].forward_end_op) for n in names]
    for n in names[i:stop]:
        b = by_name[n]
        keepers = [pos.get(k, -1) for k in b.output_kept_by]
        freeable, own = output_freeable(b), own_output(b)
        casts, released = cached_casts(b)
        row = (
            b.forward_end_op + 1,
            max(b.forward_end_op, _reader_end(b.output_last_use_op, spans)) + 1,  # read later (a skip): held till then
            b.internal_bytes - casts,
            freeable - own,
            max(keepers) if keepers and min(keepers) >= i else len(names),
            b.output_saved_bytes - freeable,
            b.backward_start_op,
            min((k for k in keepers if k >= i), default=len(names)),
            own,
            b.output_own_free_op,
            casts,
            max(b.forward_end_op + 1, released),
        )
        for column, value in zip(columns, row):
            column.append(value)
    return [np.array(c, dtype=np.int64) for c in columns]


def _reader_end(read: int, spans: list[tuple[int, int]]) -> int:
    """Where an output last read at op `read` is let go: at the end of the forward of the sibling that read it (the
    caller's variable, an nn.Sequential's or a layer loop's, holds a module's input until it returns: a run ending in
    a bottleneck that reads its input once was predicted 1 MiB low, 2026-12-02), else at the read."""
    return next((end for start, end in spans if start <= read <= end), read)


def shared_outputs(columns: list[np.ndarray], i: int) -> list[int]:
    """Per run names[i..i+k] (k = 0, 1, ...; `columns`: `run_columns` from names[i]), its saved outputs that blocks
    of the run and blocks after it both keep (the last block's, read by its own last op and by the next block):
    Rule 1 keeps them, but once the backward of the blocks after the run is over only the run's own saved copies
    held them, and a checkpoint dropped those (NOTE [The memory model of a plan], Rule 3)."""
    output, reach, first = columns[3], columns[4], columns[7]
    k = np.arange(len(output))
    j = i + k[:, None]  # [run, block]: the run's last block
    shared = (k[None, :] <= k[:, None]) & (first[None, :] <= j) & (reach[None, :] > j)
    return (shared * output[None, :]).sum(axis=1).tolist()


def runs_effects(columns: list[np.ndarray], i: int, ends: list[int]) -> list[list[Effect]]:
    """Rule 1's effects of each run names[i..i+k] (k = 0, 1, ...; `columns`: `run_columns` from names[i]), recomputed
    from ends[k] on, all runs at once (a 100-stage chain has ~4,400 runs and ~10^5 effects).  Per run, in order:
    each block's internal bytes from the end of its forward; its saved output from the later of that and the
    output's last read in forward (one effect when they coincide), once the run reaches the last block keeping it;
    then, for each of its blocks but the last whose output the model holds anyway (`held` bytes), the second copy
    the recomputation at ends[k] makes, which the next block's backward releases before the block's own backward
    starts; then each block's saved output that only its own ops keep (`own_output`), from the step's backward; last,
    the casts of its parameters autocast's cache holds, from when it lets go (`cached_casts`)."""
    starts, out_starts, internal, output, reach, held, backward_starts, _, own, own_starts, cast, cast_starts = columns
    k = np.arange(len(starts))
    end, inside = np.asarray(ends, dtype=np.int64)[:, None], k[None, :] <= k[:, None]  # [run, block]
    out = np.where(reach[None, :] <= i + k[:, None], output[None, :], 0)
    same = (out_starts == starts)[None, :]
    freed = internal[None, :] + np.where(same, out, 0)
    alone = inside & (freed != 0) & (starts[None, :] < end)
    later = inside & ~same & (out != 0) & (out_starts[None, :] < end)
    copies = inside & (k[None, :] < k[:, None]) & (held[None, :] != 0) & (end < backward_starts[None, :])
    mine = inside & (own[None, :] != 0) & (own_starts[None, :] < end)
    casts = inside & (cast[None, :] != 0) & (cast_starts[None, :] < end)
    (a, x), (b, y), (c, z), (d, w), (e, v) = (
        _masked_effects(alone, starts[None, :], end, freed),
        _masked_effects(later, out_starts[None, :], end, out),
        _masked_effects(copies, end, backward_starts[None, :], -held[None, :]),
        _masked_effects(mine, own_starts[None, :], end, own[None, :]),
        _masked_effects(casts, cast_starts[None, :], end, cast[None, :]),
    )
    return [
        a[x[r] : x[r + 1]] + b[y[r] : y[r + 1]] + c[z[r] : z[r + 1]] + d[w[r] : w[r + 1]] + e[v[r] : v[r + 1]]
        for r in range(len(ends))
    ]


def _masked_effects(
    mask: np.ndarray, begin: np.ndarray, finish: np.ndarray, nbytes: np.ndarray
) -> tuple[list, list[int]]:
    """The effects where `mask` [run, block] holds, in order of run then block, each over [begin, finish) of
    `nbytes` (arrays broadcast to the mask's shape), and the index where each run's begin in that list."""
    run, block = np.nonzero(mask)
    a, b, v = (np.broadcast_to(x, mask.shape)[run, block].tolist() for x in (begin, finish, nbytes))
    effects = [_effect(Effect, e) for e in zip(a, b, v)]
    return effects, [0, *np.cumsum(np.bincount(run, minlength=mask.shape[0])).tolist()]


def output_freeable(b: BlockProfile) -> int:
    """`b`'s saved output, or 0 when the unplanned step holds it past `b`'s own backward (the model returns
    it, as with `output_hidden_states=True`): autograd is not all that keeps it, so a checkpoint frees
    nothing of it, and recomputing it makes a second copy (`runs_effects`).  Seen on a 3-layer GPT-2:
    one checkpoint over its layers measured 2.776 MB for 2.743 MB predicted, two hidden states."""
    return 0 if b.output_free_op > b.backward_end_op + 1 else b.output_saved_bytes


def own_output(b: BlockProfile) -> int:
    """The part of `b`'s saved output that only its own ops keep (`output_own_bytes`): a run holding `b` frees it from
    `output_own_free_op`, whoever keeps the rest; 0 where the model holds an output past `b`'s backward."""
    return b.output_own_bytes if output_freeable(b) else 0


def cached_casts(b: BlockProfile) -> tuple[int, int]:
    """The part of `b`'s internal bytes that autocast's cache holds too (`autocast_casts`: casts of its parameters),
    and the op before which the cache has let go of all of it: a checkpoint frees them from the later of that and
    the end of `b`'s forward (NOTE [A weight autocast casts] in `remat.measure.tracker`)."""
    return sum(n for _, n, _ in b.autocast_casts), max((r for *_, r in b.autocast_casts), default=-1)


def inside_frees(b: BlockProfile, children: list[BlockProfile]) -> list[Effect]:
    """Rule 1, inside a checkpointed forward: nothing there saves for backward, so each of `children` (the candidates
    directly inside `b`, each called once within `b`'s forward) lets go of its own internal activations when it
    returns, not when `b` does (BART's least unit was predicted 28,412 bytes high, its self-attention's held through
    its MLP).  What a child's internal ops hold inside it stays counted to its end, and its casts that autocast's
    cache holds are left to `cached_casts`.  Each effect lasts until `b`'s forward ends, where `b`'s own effect
    frees them all."""
    if b.calls != 1:
        return []
    inside = [c for c in children if c.calls == 1 and b.forward_start_op <= c.forward_start_op]
    frees = [(c.forward_end_op + 1, c.internal_bytes - cached_casts(c)[0]) for c in inside]
    return [Effect(start, b.forward_end_op + 1, n) for start, n in frees if n > 0 and start <= b.forward_end_op]


def split_casts(b: BlockProfile, freed: int, casts: int, end: int) -> list[Effect]:
    """What a unit acting on `b` alone frees until op `end`: `freed` bytes from the end of its forward, but `casts`
    of them (`cached_casts`) only once autocast's cache lets go of them (none if not before `end`)."""
    start, released = b.forward_end_op + 1, max(b.forward_end_op + 1, cached_casts(b)[1])
    effects = [Effect(start, end, freed - casts), Effect(released, end, casts)]
    return [e for e in effects if e.start < e.end and e.bytes]
