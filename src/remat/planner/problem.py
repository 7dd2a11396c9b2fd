"""The planning problem: which checkpoint units to use, and what each one does to memory.

NOTE [The memory model of a plan]
  The profile gives L(t), the live bytes after each op t of the unplanned step.  A
  *unit* is a run of consecutive sibling candidates (one block, or a segment) wrapped
  in one non-reentrant checkpoint.  For a unit U with blocks c_1..c_m:
    Rule 1. Block c stops holding r_c bytes from the end of its forward until U's
            backward starts (when U is recomputed, they come back as in the unplanned
            step): r_c = c's internal activations + its saved output if every op that
            saves that output is inside U; the output only from its last read in forward
            on (`output_last_use_op`: a skip connection holds it until then), and never
            if the model holds it past c's backward (it returns it: `output_hidden_states`;
            then U's recomputation makes a second copy, held until c's backward starts).
    Rule 2. The checkpoint keeps U's inputs, positional and keyword: each one autograd would
            not have kept (`held_inputs` of c_1) is held from the later of the end of c_1's
            forward and its own free until c_1's backward is over (the checkpoint releases
            its inputs last); a tensor several chosen units hold is held once, over the
            union of their spans (`remat.planner.holds`).
    Rule 3. A plan's live bytes are L(t) minus the sum of its units' effects at t; its
            predicted peak is the max over t.  A unit's cost is the forward FLOPs of
            c_1..c_{m-1} plus c_m's `checkpoint_recompute_flops` (torch stops
            recomputing after the last saved tensor).
    Rule 4. A *selective* unit (one block) frees only `selective_free_bytes` (what is
            not the output of a matmul, convolution or attention op; a variant keeping
            other outputs, its own: NOTE [Which outputs a selective checkpoint keeps]), and holds
            `selective_extra_bytes` (those outputs autograd would have dropped but the
            selective cache keeps) until the block's backward starts (the recompute
            takes them out of the cache; `selective_stranded_bytes`, made after the last
            op it re-runs, stay until the backward is over); its inputs are held as in
            Rule 2; it costs `selective_recompute_flops`.  Of a block's selective units,
            one costlier than another must free max(4 KiB, 0.1% of internal bytes) more.
    Rule 5. Solvers only use units that remat.apply can build (a run of several blocks
            only of consecutive children, in the order they are registered, of an
            nn.Sequential whose forward chains them, or of an nn.ModuleList or an
            nn.Sequential the model never calls whose children its code calls in turn:
            NOTE [A run of nn.ModuleList entries as one checkpoint],
            NOTE [An nn.Sequential the model never calls]) and that free bytes at some moment.  Such a never-called
            Sequential, a block standing for the run of its children, is only recomputed:
            a selective checkpoint or an offload acts on a forward, and its forward never runs.
    Rule 6. An *offload* unit (one block; only for a CUDA step, with a host bandwidth B
            and a device FLOP rate F) copies what the block's ops save to CPU memory in
            forward and back in backward: it frees the bytes of Rule 1 over the same
            span, keeps no inputs (no recomputation), and costs
            2 * `offload_bytes` / B seconds, weighed against recomputation as that many
            seconds of FLOPs at rate F (a FLOP-equivalent; not overlapped with compute).
    Rule 7. A plan's cost is its units' seconds if the profile is timed (those of the ops
            re-run, plus `checkpoint_op_s` per op re-run, plus for a selective unit
            `selective_op_s` twice per op of the block), FLOPs breaking ties; else FLOPs, ops
            re-run breaking ties.  Seconds count in whole nanoseconds (`Unit.cost_ns`): exact sums, and
            a plan's seconds are the sum the solver ranked.  Wherever units are ranked (a
            block's selective units, Rule 4), it is by this cost.
  Rule 8. Measured seconds are noisy (1-2% of a step between two profiles).  The frontier counts
            plans within `cost_slack` (SECONDS_NOISE of the step's seconds) of each other as equally
            cheap: its table listed rows at the same FLOPs and seconds, to the digits shown.  Plans
            themselves stay the cheapest as measured (the fewest FLOPs within the slack sat at its
            edge and changed more with noise).  Predicted seconds are not noisy: no slack.
  Rule 9. Plans of one cost, tie-break and peak are put in a stable order (`remat.planner.order`).
  The model is conservative inside a checkpointed block's own forward (its
  intermediate tensors are counted as if saved) and ignores the recompute's
  short-lived temporaries; docs/benchmarks.md compares it with measurements.
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from remat.module_tree import CALLED_DIRECTLY, main_chain, parent_name, within
from remat.planner import holds as held
from remat.planner.effects import Effect, freed_effects, output_freeable, recomputed_copies, run_columns
from remat.planner.holds import unit_holds
from remat.planner.units import Group, Unit  # the solvers import them from here too
from remat.types import Action, BlockProfile, ParallelKind, SelectiveVariant, StepProfile

MAX_SEGMENT = 64  # longest run of siblings considered as one checkpoint
SECONDS_NOISE = 0.02
"""Rule 8: measured seconds within this share of the step's of each other count as equal."""
RUN_CONTAINERS = ("Sequential", "ModuleList", CALLED_DIRECTLY)
"""Containers in which remat.apply wraps a run of several siblings as one checkpoint (Rule 5)."""


class NotAChain(ValueError):
    """The blocks do not run as a chain (forward in order, backward in reverse), or none frees memory."""


class Problem:
    """Units and the timeline, with the exact evaluation every solver is judged by."""

    def __init__(
        self,
        live: list[int],
        units: list[Unit],
        groups: dict[Group, list[str]],
        block_spans: dict[str, tuple[int, int]],
        model: str = "",
        extras: frozenset[str] = frozenset(),
        *,
        timed: bool = False,
        cost_slack: int = 0,
    ):
        self.live = live
        self.timed = timed
        """Rule 7: the cost is seconds (FLOPs break ties), else FLOPs (ops re-run break ties)."""
        self.cost_slack = cost_slack
        """Rule 8: frontier points within this cost of each other count as equally cheap (measured nanoseconds)."""
        self.extras = extras
        """Blocks outside the model's blocks (`BlockProfile.extra`): units, but never the chain."""
        self.units = units
        self.groups = groups
        self.block_spans = block_spans
        """{block: (first op after its forward, first op of its backward)}"""
        self.model = model
        self.index = {u.key: i for i, u in enumerate(units)}
        self._position = {id(u): i for i, u in enumerate(units)}  # hot paths: no hashing of long keys

    def position(self, unit: Unit) -> int:
        """Index of `unit` in `units` (the same object, or one equal to it)."""
        i = self._position.get(id(unit))
        return i if i is not None and self.units[i] is unit else self.index[unit.key]

    @classmethod
    def from_profile(
        cls, prof: StepProfile, max_segment: int = MAX_SEGMENT, offload: tuple[float, float] | None = None
    ) -> "Problem":
        """The units of `prof`; `offload` = (host bandwidth bytes/s, device FLOP/s) adds offload units (Rule 6).
        A step sharded with FSDP2 gets one checkpoint per module (`result.FSDP_NOTE`)."""
        max_segment = 1 if prof.parallel == ParallelKind.FSDP else max_segment
        blocks = [
            b for b in prof.blocks
            if b.backward_start_op >= 0 and b.forward_end_op < b.backward_start_op and not b.checkpointed
            and not (b.extra and b.calls > 1)
        ]  # the model checkpoints some itself (apply leaves them to it); an embedder shared by encoder and
        # decoder runs twice, and Rules 1-2 model one forward per block
        groups: dict[Group, list[str]] = {}
        for b in blocks:
            groups.setdefault(Group(b.parent or "", parent_name(b.name)), []).append(b.name)
        by_name = {b.name: b for b in blocks}
        nested = {b.name: frozenset(c.name for c in blocks if within(c.name, b.name)) for b in blocks}
        units: list[Unit] = []
        per_op = (prof.checkpoint_op_s, prof.selective_op_s)
        uncalled = set(called_directly(prof))  # Rule 5: recomputed only
        for group, names in groups.items():
            for i in range(len(names)):
                units += _runs_from(names, i, max_segment, by_name, group, nested, per_op=per_op)
                if names[i] in uncalled:
                    continue
                units += _make_selective_units(by_name[names[i]], group, i, nested, per_op=per_op, timed=prof.timed)
                if offload is not None:
                    units += _make_offload_unit(by_name[names[i]], group, i, nested, *offload)
        units = [u for u in units if not _whole_uncalled(u, groups, uncalled & set(by_name))]
        spans = {b.name: (b.forward_end_op + 1, b.backward_start_op) for b in blocks}
        extras = frozenset(b.name for b in blocks if b.extra)
        slack = round(SECONDS_NOISE * prof.step_time_s * 1e9) if prof.timing == "measured" else 0  # Rule 8
        return cls(list(prof.timeline.live_bytes), held.split(units), groups, spans, prof.model, extras,
                   timed=prof.timed, cost_slack=slack)

    # -- evaluation (Rule 3) ---------------------------------------------------------------
    @cached_property
    def breakpoints(self) -> list[int]:
        points = {0, len(self.live)}
        for u in self.units:
            points.update(p for e in u.effects for p in (e.start, e.end))
            points.update(p for h in u.holds for p in (h.start, h.end))
        return sorted(p for p in points if 0 <= p <= len(self.live))

    @cached_property
    def interval_max(self) -> list[int]:
        """Max of L(t) over each elementary interval [breakpoints[k], breakpoints[k+1])."""
        bp = self.breakpoints
        return [max(self.live[bp[k] : bp[k + 1]]) for k in range(len(bp) - 1)]

    @cached_property
    def interval_max_array(self) -> np.ndarray:
        return np.array(self.interval_max, dtype=np.int64)

    @cached_property
    def coefficient_table(self) -> list[tuple[int, np.ndarray]]:
        """Per unit, (k0, a): the unit removes a[k - k0] bytes in interval k, 0 outside a's span, by its
        effects (its shared holds are `shared_holds`)."""
        return self._table([u.effects for u in self.units])

    @cached_property
    def stacked_table(self) -> list[tuple[int, np.ndarray]]:
        """coefficient_table with each unit's shared holds counted as its own: what `dp` plans with."""
        if not any(u.holds for u in self.units):
            return self.coefficient_table
        return self._table([(*u.effects, *((h.start, h.end, -h.bytes) for h in u.holds)) for u in self.units])

    @cached_property
    def shared_holds(self) -> list[tuple[int, list[tuple[int, int, int]]]]:
        return held.shared(self.units, self.breakpoints)

    @cached_property
    def or_columns(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        return held.or_columns(self.shared_holds, len(self.interval_max))

    def _table(self, effects: list) -> list[tuple[int, np.ndarray]]:
        """Built from all effects at once (searchsorted, then a running sum per unit): a 100-stage chain has
        ~4,400 units and ~200 intervals."""
        bp = np.array(self.breakpoints, dtype=np.int64)
        counts = [len(e) for e in effects]
        starts = np.searchsorted(bp, [e[0] for u in effects for e in u])
        ends = np.searchsorted(bp, [e[1] for u in effects for e in u])
        values = np.array([e[2] for u in effects for e in u], dtype=np.int64)
        table, at = [], 0
        for c in counts:
            if c == 0:
                table.append((0, np.zeros(0, dtype=np.int64)))
                continue
            a, b, v = starts[at : at + c], ends[at : at + c], values[at : at + c]
            at += c
            k0, k1 = int(a.min()), int(b.max())
            diff = np.zeros(k1 - k0 + 1, dtype=np.int64)
            np.add.at(diff, a - k0, v)
            np.add.at(diff, b - k0, -v)
            table.append((k0, np.cumsum(diff[:-1])))
        return table

    @cached_property
    def coefficient_matrix(self) -> np.ndarray:
        """coefficient_table as a dense float matrix: row k, column u = bytes unit u frees in interval k."""
        rows = np.zeros((len(self.interval_max), len(self.units)))
        for i, (k0, a) in enumerate(self.coefficient_table):
            rows[k0 : k0 + len(a), i] = a
        return rows

    @cached_property
    def exclusive_sets(self) -> list[np.ndarray]:
        """Per block covered by more than one unit, a 0/1 row over the units that cover it (at most one may be
        chosen: `compatible`)."""
        blocks = sorted({b for u in self.units for b in u.covers})
        out = []
        for b in blocks:
            row = np.array([1.0 if b in u.covers else 0.0 for u in self.units])
            if row.sum() > 1:
                out.append(row)
        return out

    @cached_property
    def useful(self) -> list[bool]:
        """Per unit: apply can build it and it frees bytes at some moment (the only units solvers consider)."""
        return [u.appliable and bool((a > 0).any()) for u, (_, a) in zip(self.units, self.coefficient_table)]

    def is_useful(self, unit: Unit) -> bool:
        return self.useful[self.position(unit)]

    def unit(self, *blocks: str, action: Action = Action.RECOMPUTE) -> Unit:
        return self.units[self.index[(action, *blocks)]]

    def memory(self, chosen: list[Unit]) -> list[int]:
        """Predicted max live bytes in each elementary interval under `chosen`."""
        mem = self.interval_max_array.copy()
        for u in chosen:
            k0, a = self.coefficient_table[self.position(u)]
            mem[k0 : k0 + len(a)] -= a
        if self.shared_holds:
            mem += held.covered(self.shared_holds, {self.position(u) for u in chosen}, len(mem))
        return mem.tolist()

    def peak(self, chosen: list[Unit]) -> int:
        return max(self.memory(chosen), default=0)

    def cost_of(self, unit: Unit) -> tuple[int, int]:
        """Rule 7: (cost, tie-break) of a unit for this profile (`Unit.cost`)."""
        return unit.cost(self.timed)

    def cost(self, chosen: list[Unit]) -> int:
        return sum(self.cost_of(u)[0] for u in chosen)

    def tie(self, chosen: list[Unit]) -> int:
        return sum(self.cost_of(u)[1] for u in chosen)

    @staticmethod
    def compatible(chosen: list[Unit]) -> bool:
        seen: set[str] = set()
        for u in chosen:
            if seen & u.covers:
                return False
            seen |= u.covers
        return True


def _whole_uncalled(unit: Unit, groups: dict[Group, list[str]], blocks: set[str]) -> bool:
    """A run of all the children of a never-called nn.Sequential that is a block itself: the unit of that block is
    the same checkpoint (NOTE [An nn.Sequential the model never calls], Rule 2), and plans name it."""
    container = unit.group.container
    return container in blocks and len(unit.blocks) > 1 and len(unit.blocks) == len(groups[unit.group])


def called_directly(prof: StepProfile) -> list[str]:
    """The nn.Sequential modules whose forward the profiled step never ran, their children called by the model's
    code (NOTE [An nn.Sequential the model never calls] in `remat.measure.chains`), in order: `Plan.called_directly`."""
    return list(dict.fromkeys(parent_name(b.name) for b in prof.blocks if b.container == CALLED_DIRECTLY))


def in_turn(names: list[str]) -> bool:
    """Rule 5: `names`, children of one container in the order the step called them, are consecutive in the order
    they are registered (positions 3, 4, 5; a loop over `reversed(layers)` or `layers[::2]` is not).  Children
    registered by name (an nn.Sequential built from an OrderedDict) are taken to be, as remat.apply checks."""
    ends = [n.rsplit(".", 1)[-1] for n in names]
    if not all(e.isdigit() for e in ends):
        return True
    return all(int(b) == int(a) + 1 for a, b in zip(ends, ends[1:]))


def chain_group(problem: Problem) -> Group:
    """The group of the chain (`remat.module_tree.main_chain` of the problem's blocks): what `dp` and
    the hand recipes plan."""
    names = main_chain([n for names in problem.groups.values() for n in names if n not in problem.extras])
    group = next((g for g, members in problem.groups.items() if names and names[0] in members), None)
    if group is None or not any(problem.is_useful(u) for u in problem.units if u.group == group):
        raise NotAChain("no block of the chain frees memory when checkpointed")
    return group


def _runs_from(names: list[str], i: int, max_segment: int, by_name: dict[str, BlockProfile], group: Group,
               nested: dict[str, frozenset], *, per_op: tuple[float, float] = (0.0, 0.0)) -> list[Unit]:
    """The units for names[i..j], j = i .. i + max_segment - 1, built incrementally (Rules 1-2); also those
    that free nothing, cost memory or that apply cannot build (the hand recipes are compared with them).
    `per_op` = (checkpoint_op_s, selective_op_s) of the profile (Rule 7)."""
    first = by_name[names[i]]
    appliable_multi = first.container in RUN_CONTAINERS
    stop = min(len(names), i + max_segment)
    starts, out_starts, internal, output, reach, held, backward_starts = run_columns(names, i, stop, by_name)
    units: list[Unit] = []
    covers: frozenset[str] = frozenset()
    flops, seconds, ops = 0, 0.0, 0  # of the whole forwards of names[i..j-1]
    joined = True  # no code that joins the graph runs between the blocks so far (a run can replay them)
    for j in range(i, stop):
        last = by_name[names[j]]
        joined = joined and (j == i or (not last.grad_ops_before and not last.foreign_grad_inputs
                                         and in_turn([names[j - 1], last.name])))
        covers = covers | nested[last.name]
        end = last.backward_start_op
        m = j - i + 1
        effects = freed_effects(starts[:m], out_starts[:m], internal[:m], np.where(reach[:m] <= j, output[:m], 0), end)
        effects += recomputed_copies(held[: m - 1], backward_starts[: m - 1], end)
        rerun = ops + last.checkpoint_recompute_ops
        units.append(Unit(
            tuple(names[i : j + 1]), group, i, covers,
            flops + last.checkpoint_recompute_flops, seconds + last.checkpoint_recompute_s + rerun * per_op[0],
            tuple(effects), j == i or (appliable_multi and joined), Action.RECOMPUTE, rerun,
            holds=unit_holds(first, max(end, first.backward_end_op + 1)),  # Rule 2: until its backward is over
        ))
        flops += last.forward_flops
        seconds += last.forward_s
        ops += _forward_ops(last)
    return units


def _make_selective_units(b: BlockProfile, group: Group, position: int, nested: dict[str, frozenset], *,
                          per_op: tuple[float, float] = (0.0, 0.0), timed: bool = False) -> list[Unit]:
    """Selective checkpoints of one block (Rule 4): the matmul policy's and each of `b.selective_variants` (NOTE
    [Which outputs a selective checkpoint keeps]); each frees what it does not keep, caches what it keeps that
    autograd would have dropped, keeps the inputs, and runs its policy on every op of the block twice (Rule 7).
    Of two that free about as much, the one cheaper by Rule 7's cost (`timed` or not) stays: ranked by seconds in
    a profile whose cost is FLOPs, a variant re-running a matmul once pushed out the matmul policy."""
    if b.has_batchnorm:
        return []  # BatchNorm: remat restores its statistics only around a full recompute
    held_end = max(b.backward_start_op, b.backward_end_op + 1)
    matmuls = SelectiveVariant([], b.selective_free_bytes, b.selective_extra_bytes, b.selective_recompute_flops,
                               b.selective_recompute_s, b.selective_recompute_ops, b.selective_stranded_bytes)
    units = []
    for v in (matmuls, *b.selective_variants):
        if v.free_bytes <= 0:
            continue
        effects = [Effect(b.forward_end_op + 1, b.backward_start_op, v.free_bytes)]
        if v.extra_bytes > v.stranded_bytes:  # the recompute at the block's backward start consumes the cache
            effects.append(Effect(b.forward_end_op + 1, b.backward_start_op, v.stranded_bytes - v.extra_bytes))
        if v.stranded_bytes:  # ... but for what it stops before
            effects.append(Effect(b.forward_end_op + 1, held_end, -v.stranded_bytes))
        seconds = v.recompute_s + v.recompute_ops * per_op[0] + 2 * _forward_ops(b) * per_op[1]
        units.append(Unit((b.name,), group, position, nested[b.name], v.recompute_flops, seconds,
                          tuple(e for e in effects if e.start < e.end), True, Action.SELECTIVE, v.recompute_ops,
                          holds=unit_holds(b, held_end), keeps=tuple(v.keeps)))
    near = max(4096, b.internal_bytes // 1000)  # Rule 4: within the ILP's tolerance (a variant 8 bytes over the
    kept: list[Unit] = []  # budget made it drop a cheaper unit at it), so a costlier unit must free more than this
    for u in sorted(units, key=lambda u: (*u.cost(timed), u.cost_ops)):
        kept += [u] if all(u.reduction_bytes > k.reduction_bytes + near for k in kept) else []
    return kept


def _make_offload_unit(
    b: BlockProfile, group: Group, position: int, nested: dict[str, frozenset], bandwidth: float, flops_per_s: float
) -> list[Unit]:
    """Offloading one block's saved tensors to CPU memory (Rule 6); none if it would free nothing."""
    freed = b.internal_bytes + (output_freeable(b) if b.output_kept_by == [b.name] else 0)
    if freed <= 0 or b.offload_bytes <= 0 or b.forward_end_op + 1 >= b.backward_start_op:
        return []
    seconds = 2 * b.offload_bytes / bandwidth
    effects = (Effect(b.forward_end_op + 1, b.backward_start_op, freed),)
    return [Unit((b.name,), group, position, nested[b.name], math.ceil(seconds * flops_per_s), seconds, effects,
                 True, Action.OFFLOAD, 0, b.offload_bytes)]


def _forward_ops(b: BlockProfile) -> int:
    """Ops of a whole forward of `b` (a segment re-runs its non-last blocks entirely)."""
    return max(b.checkpoint_recompute_ops, b.forward_end_op - b.forward_start_op + 1)
