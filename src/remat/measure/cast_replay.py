"""Whether torch's selective checkpoint can replay a block's forward under autocast: `BlockProfile.selective_replays`
and the variants that keep no cast.

NOTE [A selective checkpoint and autocast's cache]
  torch's selective checkpoint (2.13) stores each op's output, or a mark to run it again, under the op and the count
  of its calls so far, and answers the re-run's n-th call of an op with the forward's n-th.  Every op of the re-run
  must have a forward call of the same op at the same count.  Autocast's cache breaks that for casts: a cast it
  serves runs no `_to_copy` at all, so where the cache serves the forward and the re-run different casts, the counts
  of `_to_copy` shift.
  Rule 1. The cache still holds at the re-run a cast the block's forward made (the step's backward runs inside the
          autocast region): the re-run runs fewer casts.  A variant keeping a cast then hands
          the re-run's cast of an input that is not cached (it needs no gradient) the forward's first stored cast,
          a bias's or a weight's.  On a 3-layer bf16 MLP run inside one region, the first Linear's variant keeping
          its casts raised "aten.view.default encountered during backward but not found in storage", and with a
          1-D input (the bias's shape) the same replay took the bias's cast for the input's and the layer's weight
          gradients changed, silently (2026-12-02, `tests/test_autocast_casts.py`).  No variant keeping a cast
          is offered then; variants keeping other outputs are sound, as the cache serves nothing else.
  Rule 2. The forward took from the cache a cast made before the block (a weight tied to an earlier layer's, a
          module of another call), and the cache lets go of it before the re-run: the re-run runs a cast the
          forward did not, and torch raises ("invocation index ... not found in storage") or replays the wrong
          tensor ("mat2 must be a matrix").  Seen on the bf16 MLP with its second layer's first weight tied to
          the first layer's, and on Hugging Face's ALBERT, whose one layer runs once per layer: the matmul policy
          of its calls after the first raised in backward (2026-12-02, `tests/test_autocast_casts.py`).  No
          selective checkpoint of such a block is offered.  A plain checkpoint stores nothing by count and is sound
          in both cases.
  A block called more than once, planned from all its calls, counts a cast read again in another call by Rule 2 too:
  read again within one call, forward and re-run both take it from the cache, and that is sound, but the calls are
  not told apart here (then no selective checkpoint, never a wrong one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from remat.measure.tracker import StorageRecord
from remat.types import SelectiveVariant

CAST = "_to_copy("
"""How a cast's signature starts (`remat.ops.op_signature`)."""


@dataclass(frozen=True)
class CastReplay:
    served: bool
    """Rule 1: the cache serves the re-run a cast the block's forward made."""
    anew: bool
    """Rule 2: the forward took from the cache a cast the re-run makes anew."""


def cast_replay(
    records: list[StorageRecord], forward: list[int], rerun: int, released: Callable[[StorageRecord], int], calls: int
) -> CastReplay:
    """NOTE [A selective checkpoint and autocast's cache] for a block whose forward ran the ops `forward` (timeline
    indices, in order), re-run before op `rerun`; `released(r)`: the op before which the cache let go of cast `r`;
    `calls`: how many forward calls `forward` holds."""
    if not forward or rerun < 0:
        return CastReplay(False, False)
    casts, ran = [r for r in records if r.autocast_cast], set(forward)
    served = any(r.alloc_step in ran and released(r) > rerun for r in casts)
    anew = any(
        released(r) <= rerun
        and any(k in ran and (r.alloc_step < forward[0] or (calls > 1 and k != r.cast_reads[0])) for k in r.cast_reads)
        for r in casts
    )
    return CastReplay(served, anew)


def replayable(variants: list[SelectiveVariant], replay: CastReplay) -> list[SelectiveVariant]:
    """The variants torch's selective checkpoint replays soundly (Rules 1-2)."""
    if replay.anew:
        return []
    return [v for v in variants if not (replay.served and any(k.startswith(CAST) for k in v.keeps))]
