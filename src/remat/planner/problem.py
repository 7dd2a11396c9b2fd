"""The planning problem: which checkpoint units to use, and what each one does to memory.

NOTE [The memory model of a plan]
  The profile gives L(t), the live bytes after each op t of the unplanned step.  A
  *unit* is a run of consecutive sibling candidates (one block, or a segment) wrapped
  in one non-reentrant checkpoint.  For a unit U with blocks c_1..c_m:
    Rule 1. Block c stops holding r_c bytes from the end of its forward until U's
            backward starts (when U is recomputed, they come back as in the unplanned
            step): r_c = c's internal activations + its saved output if every op that
            saves that output is inside U.
    Rule 2. The checkpoint keeps U's inputs: the part autograd would not have kept
            (`input_unsaved_bytes` of c_1) is held from the end of c_1's forward until
            c_1's backward is over (the checkpoint releases its inputs last).
    Rule 3. A plan's live bytes are L(t) minus the sum of its units' effects at t; its
            predicted peak is the max over t.  A unit's cost is the forward FLOPs of
            c_1..c_{m-1} plus c_m's `checkpoint_recompute_flops` (torch stops
            recomputing after the last saved tensor).
    Rule 4. A *selective* unit (one block) frees only `selective_free_bytes` (what is
            not the output of a matmul, convolution or attention op), and holds
            `selective_extra_bytes` (those outputs autograd would have dropped but the
            selective cache keeps) until the block's backward is over; it costs
            `selective_recompute_flops`.
    Rule 5. Solvers only use units that remat.apply can build (a run of several blocks
            only inside an nn.Sequential) and that free bytes at some moment.
  The model is conservative inside a checkpointed block's own forward (its
  intermediate tensors are counted as if saved) and ignores the recompute's
  short-lived temporaries; docs/benchmarks.md compares it with measurements.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

from remat.types import BlockProfile, StepProfile

MAX_SEGMENT = 64  # longest run of siblings considered as one checkpoint


@dataclass(frozen=True, slots=True)
class Effect:
    """`bytes` fewer live bytes over op indices [start, end)."""

    start: int
    end: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Unit:
    """Consecutive sibling blocks wrapped in one checkpoint."""

    blocks: tuple[str, ...]
    group: str
    """Container the blocks belong to (their shared dotted prefix)."""
    position: int
    """Index of the first block in its group."""
    covers: frozenset[str]
    """The blocks and every candidate nested in them: no other unit may touch these."""
    cost_flops: int
    cost_s: float
    effects: tuple[Effect, ...]
    appliable: bool = True
    """remat.apply can build it: one block, or a run of siblings inside an nn.Sequential."""
    action: str = "recompute"
    """"recompute" (a checkpoint) or "selective" (keep matmul outputs, recompute the rest)."""
    cost_ops: int = 0
    """Ops re-run: among plans of equal FLOPs, solvers prefer fewer (elementwise ops count 0 FLOPs)."""

    @property
    def key(self) -> tuple:
        return (self.action, *self.blocks)

    @property
    def reduction_bytes(self) -> int:
        """Bytes the unit frees while fully held (Rules 1 and 2)."""
        return sum(e.bytes for e in self.effects)



class Problem:
    """Units and the timeline, with the exact evaluation every solver is judged by."""

    def __init__(
        self,
        live: list[int],
        units: list[Unit],
        groups: dict[str, list[str]],
        block_spans: dict[str, tuple[int, int]],
        model: str = "",
    ):
        self.live = live
        self.units = units
        self.groups = groups
        self.block_spans = block_spans
        """{block: (first op after its forward, first op of its backward)}"""
        self.model = model
        self.index = {u.key: i for i, u in enumerate(units)}

    @classmethod
    def from_profile(cls, prof: StepProfile, max_segment: int = MAX_SEGMENT) -> "Problem":
        blocks = [b for b in prof.blocks if b.backward_start_op >= 0 and b.forward_end_op < b.backward_start_op]
        groups: dict[str, list[str]] = {}
        for b in blocks:
            groups.setdefault(_group_of(b), []).append(b.name)
        by_name = {b.name: b for b in blocks}
        nested = {b.name: frozenset(c.name for c in blocks if c.name == b.name or c.name.startswith(b.name + "."))
                  for b in blocks}
        units: list[Unit] = []
        for group, names in groups.items():
            for i in range(len(names)):
                for j in range(i, min(len(names), i + max_segment)):
                    run = [by_name[n] for n in names[i : j + 1]]
                    units.append(_make_unit(run, group, i, nested, len(run) == 1 or run[0].container == "Sequential"))
                selective = _make_selective_unit(by_name[names[i]], group, i, nested)
                if selective is not None:
                    units.append(selective)
        spans = {b.name: (b.forward_end_op + 1, b.backward_start_op) for b in blocks}
        return cls(list(prof.timeline.live_bytes), units, groups, spans, prof.model)

    # -- evaluation (Rule 3) ---------------------------------------------------------------
    @cached_property
    def breakpoints(self) -> list[int]:
        points = {0, len(self.live)}
        for u in self.units:
            for e in u.effects:
                points.update((e.start, e.end))
        return sorted(p for p in points if 0 <= p <= len(self.live))

    @cached_property
    def interval_max(self) -> list[int]:
        """Max of L(t) over each elementary interval [breakpoints[k], breakpoints[k+1])."""
        bp = self.breakpoints
        return [max(self.live[bp[k] : bp[k + 1]]) for k in range(len(bp) - 1)]

    def coefficients(self, unit: Unit) -> dict[int, int]:
        """{interval k: bytes the unit removes there}."""
        bp, out = self.breakpoints, {}
        for e in unit.effects:
            for k in range(bisect.bisect_left(bp, e.start), bisect.bisect_left(bp, e.end)):
                out[k] = out.get(k, 0) + e.bytes
        return out

    @cached_property
    def coefficient_table(self) -> list[dict[int, int]]:
        return [self.coefficients(u) for u in self.units]

    @cached_property
    def useful(self) -> list[bool]:
        """Per unit: apply can build it and it frees bytes at some moment (the only units solvers consider)."""
        return [u.appliable and any(b > 0 for b in coef.values()) for u, coef in zip(self.units, self.coefficient_table)]

    def is_useful(self, unit: Unit) -> bool:
        return self.useful[self.index[unit.key]]

    def unit(self, *blocks: str, action: str = "recompute") -> Unit:
        return self.units[self.index[(action, *blocks)]]

    def memory(self, chosen: list[Unit]) -> list[int]:
        """Predicted max live bytes in each elementary interval under `chosen`."""
        mem = list(self.interval_max)
        for u in chosen:
            for k, b in self.coefficient_table[self.index[u.key]].items():
                mem[k] -= b
        return mem

    def peak(self, chosen: list[Unit]) -> int:
        return max(self.memory(chosen))

    def cost(self, chosen: list[Unit]) -> int:
        return sum(u.cost_flops for u in chosen)

    @staticmethod
    def compatible(chosen: list[Unit]) -> bool:
        seen: set[str] = set()
        for u in chosen:
            if seen & u.covers:
                return False
            seen |= u.covers
        return True


def _group_of(b: BlockProfile) -> str:
    container = b.name.rsplit(".", 1)[0] if "." in b.name else ""
    return f"{b.parent or ''}|{container}"


def _make_unit(run: list[BlockProfile], group: str, position: int, nested: dict[str, frozenset], appliable: bool) -> Unit:
    """The unit for `run` (also one that frees nothing or costs memory: the hand recipes use those)."""
    names = {b.name for b in run}
    last, first = run[-1], run[0]
    end = last.backward_start_op
    effects = []
    for b in run:
        freed = b.internal_bytes
        if b.output_kept_by and set(b.output_kept_by) <= names:
            freed += b.output_saved_bytes
        if freed:
            effects.append(Effect(b.forward_end_op + 1, end, freed))
    if first.input_unsaved_bytes:  # Rule 2: held until the checkpoint's backward is over
        effects.append(Effect(first.forward_end_op + 1, max(end, first.backward_end_op + 1), -first.input_unsaved_bytes))
    effects = [e for e in effects if e.start < e.end]
    covers = frozenset().union(*(nested[n] for n in names))
    cost = sum(b.forward_flops for b in run[:-1]) + last.checkpoint_recompute_flops
    cost_s = sum(b.forward_s for b in run[:-1]) + (
        last.forward_s * last.checkpoint_recompute_flops / last.forward_flops if last.forward_flops else last.forward_s
    )
    ops = sum(_forward_ops(b) for b in run[:-1]) + last.checkpoint_recompute_ops
    return Unit(tuple(b.name for b in run), group, position, covers, cost, cost_s, tuple(effects), appliable,
                "recompute", ops)


def _make_selective_unit(b: BlockProfile, group: str, position: int, nested: dict[str, frozenset]) -> Unit | None:
    """Selective checkpointing of one block (Rule 4): frees what is not a matmul-like output,
    caches the matmul-like outputs autograd would have dropped, keeps the inputs."""
    if b.selective_free_bytes <= 0 or b.has_batchnorm:
        return None  # nothing to free; or BatchNorm, whose statistics remat restores only around a full recompute
    held_end = max(b.backward_start_op, b.backward_end_op + 1)
    effects = [Effect(b.forward_end_op + 1, b.backward_start_op, b.selective_free_bytes)]
    if b.selective_extra_bytes:
        effects.append(Effect(b.forward_end_op + 1, held_end, -b.selective_extra_bytes))
    if b.input_unsaved_bytes:
        effects.append(Effect(b.forward_end_op + 1, held_end, -b.input_unsaved_bytes))
    covers = nested[b.name]
    effects = tuple(e for e in effects if e.start < e.end)
    return Unit((b.name,), group, position, covers, b.selective_recompute_flops, b.selective_recompute_s, effects,
                True, "selective", b.selective_recompute_ops)


def _forward_ops(b: BlockProfile) -> int:
    """Ops of a whole forward of `b` (a segment re-runs its non-last blocks entirely)."""
    return max(b.checkpoint_recompute_ops, b.forward_end_op - b.forward_start_op + 1)
