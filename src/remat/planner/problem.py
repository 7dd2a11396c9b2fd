"""The planning problem: the units of a profile (`remat.planner.units`) on its timeline, and the exact evaluation
of a choice of them (memory in each interval, peak, cost) that every solver is judged by.

NOTE [The memory model of a plan]
  The profile gives L(t), the live bytes after each op t of the unplanned step.  A
  *unit* is a run of consecutive sibling candidates (one block, or a segment) wrapped
  in one non-reentrant checkpoint.  For a unit U with blocks c_1..c_m:
    Rule 1. Block c stops holding r_c bytes from the end of its forward until U is
            recomputed (Rule 3; they come back as in the unplanned step): r_c = c's internal activations + its saved output if every op that
            saves that output is inside U; the output only from its last read in forward
            on (`output_last_use_op`: a skip connection holds it until then), read by a sibling
            only once that sibling returns (the caller's variable holds its input), and never
            if the model holds it past c's backward (it returns it: `output_hidden_states`;
            then U's recomputation makes a second copy, held until c's backward starts).
            A saved output only c's own ops save and read, which the caller drops, is freed
            from the step's first backward op whoever keeps c's other outputs
            (`output_own_bytes`: wav2vec2's feature projection also returns its normalised
            input, saved by its Linear alone; it was predicted 102,144 bytes high before).
            A parameter's cast that autocast's cache holds too (`autocast_casts`) is freed only
            once the cache lets go, by every kind of unit (NOTE [A weight autocast casts]).
            Inside U's forward nothing is saved, so each candidate directly inside c, called
            once, lets go of its internal activations when it returns, before c does
            (`effects.inside_frees`: BART's least unit was predicted 28,412 bytes high).
    Rule 2. The checkpoint keeps U's inputs, positional and keyword: each one autograd would
            not have kept (`held_inputs` of c_1) is held from the later of the end of c_1's
            forward and its own free until c_1's backward is over (the checkpoint releases
            its inputs last); a tensor several chosen units hold is held once, over the
            union of their spans (`remat.planner.holds`).  An input autograd keeps only for ops
            outside c_1 (`kept_inputs`: a ReLU's output a Dropout reads) costs nothing while they
            keep it, and is held from c_1's forward end where a chosen unit frees it (Rule 1 of
            a unit around those ops): the ilp has a column for it, `dp` counts it as always held
            (`holds.kept_holds`).
    Rule 3. A plan's live bytes are L(t) minus the sum of its units' effects at t; its
            predicted peak is the max over t.  A unit's cost is the forward FLOPs of
            c_1..c_{m-1} plus c_m's `checkpoint_recompute_flops` (torch stops
            recomputing at c_m's last pack: NOTE [Recomputation]).  U's recomputation runs when
            backward first unpacks a tensor saved inside U (`rerun_op`, mostly at or after c_m's
            first backward op: NOTE [When a checkpoint re-runs]), after the previous backward node
            released what L counts after the op before (`freed_before_rerun_bytes`); it holds at
            once what the unplanned forward grew by over the ops it re-runs (for a run
            from the step's first op, from the bytes before it: `Timeline.start_bytes`),
            plus the inputs it keeps that the forward freed on the way and the BatchNorm
            statistics remat copies while it re-runs (`batchnorm_stats_bytes`); an output that U's ops
            and later ones both save is gone before it (`effects.shared_outputs`), not one
            only later ones save (BLOOM's states beside the weights only its own ops keep:
            `output_kept_by` leaves those out; predicted 16,384 bytes low at its re-run).  At that op the
            plan's live bytes are at least that moment's (`remat.planner.rerun`:
            as what it adds to the most of the elementary interval starting there).  Not
            under FSDP: a block's forward all-gathers its parameters, which its
            recomputation does not (a 2-layer GPT-2 on 2 ranks: a checkpoint's moment
            said 2,367,480 bytes where the planned step peaked at 2,173,176).
    Rule 4. A *selective* unit (one block) frees only `selective_free_bytes` (what is
            not the output of a matmul, convolution or attention op; a variant keeping
            other outputs, its own: NOTE [Which outputs a selective checkpoint keeps]), and holds
            `selective_extra_bytes` (those outputs autograd would have dropped but the
            selective cache keeps) until its recomputation (Rule 3's moment, which
            takes them out of the cache; `selective_stranded_bytes`, made after the last
            op it re-runs, stay until the backward is over); its inputs are held as in
            Rule 2; it costs `selective_recompute_flops`.  Its recomputation is Rule 3's
            moment, less what it takes from the cache (`kept_made`); a kept output an op
            outside the block saves or reads later stays in the cache until then, from the
            unplanned step's free of it (`kept_outside`).  Of a
            block's selective units, one costlier than another must free max(4 KiB, 0.1%
            of internal bytes) more.
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
  intermediate tensors are counted as if saved), and in a recomputed block's backward by at most the bytes of a
  gradient that autograd reduces to an input's shape (a Linear's bias): the unplanned step frees a node's saved
  tensors after that reduction (`sum_to`, when the node's outputs are checked), a recomputed one is gone before it,
  the node having held the only reference (found 2026-11-28 on a layer called twice: 256 bytes over, never under).
  docs/benchmarks.md compares it with measurements.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from remat.module_tree import main_chain
from remat.planner import holds as held
from remat.planner.effects import breakpoints
from remat.planner.units import MAX_SEGMENT, Group, Unit, build_units  # the solvers import them from here too
from remat.types import Action, StepProfile

SECONDS_NOISE = 0.02
"""Rule 8: measured seconds within this share of the step's of each other count as equal."""


_last_problem: tuple | None = None
"""`Problem.of`'s last: (the profile, (max_segment, offload), its problem)."""


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
        self.solver_cache: dict = {}
        """What a solver builds from the problem alone, not the budget, kept for its next budget (`dp._chain`)."""

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
        units, groups, blocks = build_units(prof, max_segment, offload)
        spans = {b.name: (b.forward_end_op + 1, b.backward_start_op) for b in blocks}
        extras = frozenset(b.name for b in blocks if b.extra)
        slack = round(SECONDS_NOISE * prof.step_time_s * 1e9) if prof.timing == "measured" else 0  # Rule 8
        return cls(
            list(prof.timeline.live_bytes),
            held.split(units),
            groups,
            spans,
            prof.model,
            extras,
            timed=prof.timed,
            cost_slack=slack,
        )

    @classmethod
    def of(
        cls, prof: StepProfile, max_segment: int = MAX_SEGMENT, offload: tuple[float, float] | None = None
    ) -> "Problem":
        """`from_profile`, or the problem built last when asked again for the same profile (the same object) and
        options.  Nothing in a problem depends on the budget (its tables, `solver_cache`), so a sweep of budgets
        (`remat.plan` at several, `remat.auto`'s search, a frontier after a plan) builds it once: the units of a
        100-stage chain take most of a 1 s plan.  One problem is kept, with its profile, until the next."""
        global _last_problem
        options, last = (max_segment, offload), _last_problem
        if last is not None and last[0] is prof and last[1] == options:
            return last[2]
        problem = cls.from_profile(prof, max_segment, offload)
        _last_problem = (prof, options, problem)
        return problem

    def within(self, groups: list[Group]) -> "Problem":
        """The same timeline with only the units of `groups`: the plans that checkpoint nothing outside them."""
        units = [u for u in self.units if u.group in groups]
        return Problem(
            self.live,
            units,
            {g: self.groups[g] for g in groups},
            self.block_spans,
            self.model,
            self.extras,
            timed=self.timed,
            cost_slack=self.cost_slack,
        )

    # -- evaluation (Rule 3) ---------------------------------------------------------------
    @cached_property
    def breakpoints(self) -> list[int]:
        return breakpoints((s for u in self.units for s in (*u.effects, *u.holds, *u.kept)), len(self.live))

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
        """coefficient_table with each unit's shared and kept holds counted as its own: what `dp` plans with."""
        return self._stacked(kept=True)

    @cached_property
    def hopeful_table(self) -> list[tuple[int, np.ndarray]]:
        """stacked_table without the kept holds (Rule 2), which only add bytes: what `dp`'s hopeful pass plans with
        (`remat.planner.chain.plan`)."""
        return self._stacked(kept=False)

    def _stacked(self, kept: bool) -> list[tuple[int, np.ndarray]]:
        if not any(u.holds or (kept and u.kept) for u in self.units):
            return self.coefficient_table
        return self._table(
            [
                (*u.effects, *((h.start, h.end, -h.bytes) for h in (*u.holds, *(u.kept if kept else ()))))
                for u in self.units
            ]
        )

    @cached_property
    def shared_holds(self) -> list[tuple[int, list[tuple[int, int, int]]]]:
        return held.shared(self.units, self.breakpoints)

    @cached_property
    def kept_holds(self) -> list[tuple[int, list[tuple[int, int, int]], list[tuple[int, int, int]]]]:
        """Per tensor a unit holds as a kept input (`Unit.kept`, Rule 2): its bytes, and (unit index, first
        interval, end interval) of each holder and of each unit that frees it (`Unit.frees`)."""
        bp = np.array(self.breakpoints, dtype=np.int64)
        found: dict = {}
        for pos, u in enumerate(self.units):
            for h in u.kept:
                found.setdefault(h.key, (h.bytes, [], []))[1].append((pos, *self._intervals(bp, h)))
        for pos, u in enumerate(self.units):
            for f in u.frees:
                if f.key in found:
                    found[f.key][2].append((pos, *self._intervals(bp, f)))
        return list(found.values())

    @staticmethod
    def _intervals(bp: np.ndarray, span) -> tuple[int, int]:
        return int(np.searchsorted(bp, span.start)), int(np.searchsorted(bp, span.end))

    @cached_property
    def and_columns(self) -> tuple[np.ndarray, list[tuple[int, int, list[int]]]]:
        return held.and_columns(self.kept_holds, [u.covers for u in self.units], len(self.interval_max))

    @cached_property
    def or_columns(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        return held.or_columns(self.shared_holds, len(self.interval_max))

    def _table(self, effects: list) -> list[tuple[int, np.ndarray]]:
        """Built from all effects at once: each unit's span of intervals [k0, k1] laid end to end in one array of
        differences, whose running sum is each unit's row (a unit's differences sum to 0, so the sum is 0 again at
        the start of the next).  A 100-stage chain has ~4,400 units, ~10^5 effects and ~200 intervals."""
        bp = np.array(self.breakpoints, dtype=np.int64)
        flat = [e for u in effects for e in u]
        counts = np.array([len(e) for e in effects], dtype=np.int64)
        if not flat:
            return [(0, np.zeros(0, dtype=np.int64)) for _ in effects]
        starts = np.searchsorted(bp, [e[0] for e in flat])
        ends = np.searchsorted(bp, [e[1] for e in flat])
        values = np.array([e[2] for e in flat], dtype=np.int64)
        some = counts > 0
        k0, k1 = np.zeros_like(counts), np.zeros_like(counts)
        begins = (np.cumsum(counts) - counts)[some]
        k0[some], k1[some] = np.minimum.reduceat(starts, begins), np.maximum.reduceat(ends, begins)
        length = np.where(some, k1 - k0 + 1, 0)
        offset = np.cumsum(length) - length
        at = np.repeat(offset - k0, counts)
        diff = np.zeros(int(length.sum()), dtype=np.int64)
        np.add.at(diff, at + starts, values)
        np.add.at(diff, at + ends, -values)
        rows = np.cumsum(diff)
        return [
            (k, rows[o : o + n - 1]) if n else (0, np.zeros(0, dtype=np.int64))
            for k, o, n in zip(k0.tolist(), offset.tolist(), length.tolist())
        ]

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
        if self.kept_holds:
            mem += held.held_on(self.kept_holds, {self.position(u) for u in chosen}, len(mem))
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


def chain_group(problem: Problem) -> Group:
    """The group of the chain (`remat.module_tree.main_chain` of the problem's blocks): what `dp` and
    the hand recipes plan."""
    names = main_chain([n for names in problem.groups.values() for n in names if n not in problem.extras])
    group = next((g for g, members in problem.groups.items() if names and names[0] in members), None)
    if group is None or not any(problem.is_useful(u) for u in problem.units if u.group == group):
        raise NotAChain("no block of the chain frees memory when checkpointed")
    return group
