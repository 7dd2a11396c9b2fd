"""Each call of a module whose forward runs more than once per step, as a block of its own.

NOTE [A module called more than once]
  ALBERT runs its one shared layer group 12 times a step; a model may apply one norm or MLP in a loop.  Each call
  saves its own tensors from its own forward until its own backward, and a checkpoint around the module is a
  checkpoint of every call.  Taken as one block, with one span from the first call's forward to the last call's
  backward, its figures are those of no call (an MLP and a LayerNorm applied 4 times: the least plan was predicted
  at 748 MiB, and no checkpoint of them lowered the predicted peak; measured, 556 MiB).  So:
    Rule 1. The profile measures each call as a block (`StepProfile.call_blocks`, `BlockProfile.call`): its forward
            is the ops between the module's forward pre-hook and forward hook for that call; its backward, the
            module's ops from when autograd reaches that call's outputs (a gradient hook on them,
            `BlockIO.call_spans`) until it reaches another call's.  The storages made by those ops are the call's;
            its inputs and outputs are those its hooks saw.
    Rule 2. The planner builds the units of each call as for a module called once and adds them up: one unit of
            the module frees what every call frees, holds what every call holds and costs what every call's
            recomputation costs (`remat.planner.calls`).  A run of siblings is planned where every sibling runs
            as often (the children of a shared nn.Sequential); elsewhere each such module is planned alone.
    Rule 3. Where the calls cannot be told apart (a call's forward that never returned, a profile from before
            version 11), the module is planned from all its calls at once, as one block: safe, it predicts more
            than the step uses, never less.
    Rule 4. Offloading a module called more than once is not planned: which call an input was packed in is not
            recorded, so a call's `offload_bytes` is not known (0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from remat.types import BlockProfile

if TYPE_CHECKING:
    from remat.measure.blocks import _Block


def call_ranges(spans: list[list[int]], n_ops: int) -> list[tuple[range, range]] | None:
    """Rule 1: per call ([forward start, forward end, backward entered] of `BlockIO.call_spans`), its forward ops
    and its backward ops; None where a call's forward never returned (Rule 3)."""
    if len(spans) < 2 or any(s[1] < 0 for s in spans):
        return None
    entries = sorted(s[2] for s in spans if s[2] >= 0)
    ranges = []
    for start, end, entered in spans:
        after = min((e for e in entries if e > entered), default=n_ops)
        ranges.append((range(start, end), range(entered, after) if entered >= 0 else range(0)))
    return ranges


def call_profiles(blocks: dict[str, "_Block"], profiles: list[BlockProfile], timeline) -> list[BlockProfile]:
    """The profile of each call of every candidate in `profiles` (those of `blocks`) that ran more than once and is
    not an extra (Rule 1), in their order and the calls' order."""
    made: dict[str, list] = {}
    out: list[BlockProfile] = []
    for b in profiles:
        whole = blocks[b.name]
        ranges = call_ranges(whole.io.call_spans.get(b.name, []), len(whole.tracker.ops)) if not b.extra else None
        if ranges is None or any(k not in whole.io.call_io.get(b.name, {}) for k in range(len(ranges))):
            continue
        calls = [whole.one_call(k, r) for k, r in enumerate(ranges)]
        made[b.name] = calls
        previous = _previous_calls(whole, made, len(calls))
        out += [c.profile(b.index, timeline, previous[k] if previous else None) for k, c in enumerate(calls)]
    return out


def _previous_calls(block: "_Block", made: dict[str, list], n: int) -> list | None:
    """The calls of the module of the same container that ran just before `block`, if it ran as often."""
    name = block.previous_name()
    before = made.get(name) if name is not None else None
    return before if before is not None and len(before) == n else None
