"""What the solvers choose among, and from what data: a *unit* (one checkpoint, selective checkpoint or offload
over sibling blocks), what it frees and holds, and its cost, built from a `StepProfile`'s `BlockProfile`s in one
place (`build_units`; NOTE [The memory model of a plan] in `remat.planner.problem`, Rules 1-7: Rule 1's effects
are computed by `remat.planner.effects`, Rule 2's holds by `remat.planner.holds`).  `remat.planner.problem`
evaluates a choice of them; `dp` and `ilp` make it."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from remat.module_tree import CALLED_DIRECTLY, parent_name, within
from remat.planner.effects import Effect, cached_casts, output_freeable, run_columns, runs_effects, shared_outputs
from remat.planner.effects import inside_frees, split_casts
from remat.planner.calls import call_units, calls_of
from remat.planner.holds import Hold, freeable_outputs, freed_outputs, kept_holds, unit_holds
from remat.planner.rerun import Rerun, rerun_effect, rerun_points, widen
from remat.planner.unit import Group, Unit
from remat.types import Action, BlockProfile, ParallelKind, SelectiveVariant, StepProfile

MAX_SEGMENT = 64  # longest run of siblings considered as one checkpoint
RUN_CONTAINERS = ("Sequential", "ModuleList", CALLED_DIRECTLY)
"""Containers in which remat.apply wraps a run of several siblings as one checkpoint (Rule 5)."""


def build_units(
    prof: StepProfile, max_segment: int = MAX_SEGMENT, offload: tuple[float, float] | None = None
) -> tuple[list[Unit], dict[Group, list[str]], list[BlockProfile]]:
    """The units of `prof` (Rules 1-7), the groups of sibling blocks they are cut from, and those blocks;
    `offload` = (host bandwidth bytes/s, device FLOP/s) adds offload units (Rule 6).  A step sharded with FSDP2
    gets one checkpoint per module (`result.FSDP_NOTE`)."""
    max_segment = 1 if prof.parallel == ParallelKind.FSDP else max_segment
    blocks = [
        b
        for b in prof.blocks
        if b.backward_start_op >= 0
        and b.forward_end_op < b.backward_start_op
        and not b.checkpointed
        and not (b.extra and b.calls > 1)
    ]  # the model checkpoints some itself (apply leaves them to it); an embedder shared by encoder and
    # decoder runs twice, and Rules 1-2 model one forward per block
    groups: dict[Group, list[str]] = {}
    for b in blocks:
        groups.setdefault(Group(b.parent or "", parent_name(b.name)), []).append(b.name)
    by_name = {b.name: b for b in blocks}
    nested = {b.name: frozenset(c.name for c in blocks if within(c.name, b.name)) for b in blocks}
    inside = _inside_frees(by_name)
    units: list[Unit] = []
    live = np.asarray(prof.timeline.live_bytes, dtype=np.int64)
    uncalled = set(called_directly(prof))  # Rule 5: recomputed only
    per_call = calls_of(prof, blocks, uncalled)  # NOTE [A module called more than once]
    build = functools.partial(
        _group_units,
        context=_Context(
            nested,
            (prof.checkpoint_op_s, prof.selective_op_s),
            prof.timed,
            live[:0] if prof.parallel == ParallelKind.FSDP else live,  # Rule 3: not under FSDP (its NOTE)
            freeable_outputs([*blocks, *(c for calls in per_call.values() for c in calls)]),  # Rule 2
            uncalled,
            offload,
            prof.timeline.start_bytes,
            inside,
        ),
    )
    for group, names in groups.items():
        if any(n in per_call for n in names):
            units += call_units(
                names, per_call, by_name, functools.partial(build, group=group, max_segment=max_segment)
            )
        else:
            units += build(names, by_name, group=group, max_segment=max_segment)
    units = widen([u for u in units if not _whole_uncalled(u, groups, uncalled & set(by_name))], live)  # Rule 3
    return units, groups, blocks


class _Context(NamedTuple):
    """What every group's units are built with (`build_units`)."""

    nested: dict[str, frozenset]
    per_op: tuple[float, float]
    """(checkpoint_op_s, selective_op_s) (Rule 7)."""
    timed: bool
    live: np.ndarray
    """The live bytes, for Rule 3's moments (empty: none)."""
    wanted: frozenset
    """`holds.freeable_outputs`: what kept inputs a chosen checkpoint may free (Rule 2)."""
    uncalled: set[str]
    offload: tuple[float, float] | None
    start: int = -1
    """The live bytes before the step's first op (`Timeline.start_bytes`; -1: not known), for a moment from op 0."""
    inside: dict[str, list[Effect]] | None = None
    """Per block, what its children free inside a checkpointed forward (`effects.inside_frees`)."""


def _group_units(
    names: list[str],
    by_name: dict[str, BlockProfile],
    *,
    group: Group,
    context: _Context,
    max_segment: int = MAX_SEGMENT,
    first: int | None = None,
) -> list[Unit]:
    """The units of the sibling blocks `names` (`by_name`: their profiles), or only of names[first] alone."""
    c, units = context, []
    for i in range(len(names)) if first is None else [first]:
        units += _runs_from(
            names, i, 1 if first is not None else max_segment, by_name, group, c.nested,
            per_op=c.per_op, live=c.live, wanted=c.wanted, start=c.start, inside=c.inside,
        )  # fmt: skip
        b = by_name[names[i]]
        if names[i] in c.uncalled:
            continue
        units += _make_selective_units(
            b, group, i, c.nested, per_op=c.per_op, timed=c.timed, live=c.live, wanted=c.wanted, start=c.start
        )  # fmt: skip
        if c.offload is not None and b.call < 0:  # NOTE [A module called more than once], Rule 4
            units += _make_offload_unit(b, group, i, c.nested, *c.offload, wanted=c.wanted)
    return units


def _inside_frees(by_name: dict[str, BlockProfile]) -> dict[str, list[Effect]]:
    """Rule 1: per block, what its children (the nearest candidates inside it) free inside its checkpointed forward."""
    children: dict[str, list[BlockProfile]] = {n: [] for n in by_name}
    for b in by_name.values():
        parent = parent_name(b.name)
        while parent and parent not in by_name:
            parent = parent_name(parent)
        if parent:
            children[parent].append(b)
    return {n: inside_frees(by_name[n], children[n]) for n in by_name}


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


def _runs_from(
    names: list[str],
    i: int,
    max_segment: int,
    by_name: dict[str, BlockProfile],
    group: Group,
    nested: dict[str, frozenset],
    *,
    per_op: tuple[float, float] = (0.0, 0.0),
    live: np.ndarray = np.zeros(0, dtype=np.int64),
    wanted: frozenset = frozenset(),
    start: int = -1,
    inside: dict[str, list[Effect]] | None = None,
) -> list[Unit]:
    """The units for names[i..j], j = i .. i + max_segment - 1, built incrementally (Rules 1-3), also those that
    free nothing, cost memory or apply cannot build (the hand recipes are compared with them).  `per_op`: Rule 7's
    (checkpoint_op_s, selective_op_s); `live`: the live bytes, `start` before op 0; `wanted`: `freeable_outputs`."""
    first, stop = by_name[names[i]], min(len(names), i + max_segment)
    columns, at, runs, shared = _run_effects(names, i, stop, by_name, inside or {})
    rerun = Rerun(live, first, max(by_name[n].forward_end_op for n in names[i:stop]), start)
    units: list[Unit] = []
    flops, seconds, ops, covers = 0, 0.0, 0, frozenset[str]()  # of the whole forwards of names[i..j-1], and covered
    joined = True  # no code that joins the graph runs between the blocks so far (a run can replay them)
    for j in range(i, stop):
        last = by_name[names[j]]
        joined = joined and (j == i or _follows(names[j - 1], last))
        end, covers, run = at[j - i][0], covers | nested[last.name], [by_name[n] for n in names[i : j + 1]]
        held = rerun.held(last, shared[j - i], _from_autocast_cache(run, end), _stats_copied(run))
        moment = rerun_effect(live, runs[j - i], at[j - i], held)
        rerun_ops = ops + last.checkpoint_recompute_ops  # the moment: Rule 3
        frees = freed_outputs(run, columns, j, end, wanted)  # Rule 2
        units.append(
            Unit(
                tuple(names[i : j + 1]),
                group,
                i,
                covers,
                flops + last.checkpoint_recompute_flops,
                seconds + last.checkpoint_recompute_s + rerun_ops * per_op[0],
                (*runs[j - i], *moment),
                j == i or (first.container in RUN_CONTAINERS and joined),
                Action.RECOMPUTE,
                rerun_ops,
                moment_bytes=-sum(e.bytes for e in moment),
                **_run_holds(first, end, wanted, frees),
            )
        )
        flops, seconds, ops = flops + last.forward_flops, seconds + last.forward_s, ops + _forward_ops(last)
    return units


def _stats_copied(run: list[BlockProfile]) -> int:
    """What remat's checkpoint of `run` copies while it re-runs it: its BatchNorms' statistics (Rule 3)."""
    return sum(b.batchnorm_stats_bytes for b in run)


def _run_effects(names: list[str], i: int, stop: int, by_name: dict[str, BlockProfile], inside: dict) -> tuple:
    """Per run names[i..j] (j < `stop`): `effects.run_columns`, where it re-runs (`rerun_points`, Rule 3), Rule 1's
    effects, with what the children of its blocks free inside their forwards (`_inside_frees`), and its shared
    outputs (`effects.shared_outputs`)."""
    columns = run_columns(names, i, stop, by_name)
    at = rerun_points([by_name[n] for n in names[i:stop]])
    runs = runs_effects(columns, i, [t for t, _ in at])
    inside_so_far: list[Effect] = []  # of the run's blocks so far; each run keeps those before it re-runs
    for k, (n, (t, _)) in enumerate(zip(names[i:stop], at)):
        inside_so_far += inside.get(n, [])
        runs[k] += [e for e in inside_so_far if e.start < t]
    return columns, at, runs, shared_outputs(columns, i)


def _run_holds(first: BlockProfile, end: int, wanted: frozenset, frees: tuple) -> dict:
    """Rule 2: what a run whose first block is `first`, recomputed at `end`, holds until its backward is over (its
    `holds` and `kept`), with the outputs it `frees` that other units may keep."""
    held_end = max(end, first.backward_end_op + 1)
    return dict(holds=unit_holds(first, held_end), kept=kept_holds(first, held_end, wanted), frees=frees)


def _from_autocast_cache(blocks: list[BlockProfile], t: int) -> list[list[int]]:
    """[op index, bytes] of the casts of `blocks` autocast's cache still holds when their re-run comes before op `t`
    (a step run inside the autocast region, backward too): the re-run takes them from it, allocating nothing."""
    return [[op, nbytes] for b in blocks for op, nbytes, released in b.autocast_casts if released > t]


def _follows(previous: str, block: BlockProfile) -> bool:
    """`block` runs right after `previous` with no code between them that joins the graph, in registration order:
    a checkpoint of a run can replay them (Rule 5)."""
    return not block.grad_ops_before and not block.foreign_grad_inputs and in_turn([previous, block.name])


def _make_selective_units(
    b: BlockProfile,
    group: Group,
    position: int,
    nested: dict[str, frozenset],
    *,
    per_op: tuple[float, float] = (0.0, 0.0),
    timed: bool = False,
    live: np.ndarray = np.zeros(0, dtype=np.int64),
    wanted: frozenset = frozenset(),
    start: int = -1,
) -> list[Unit]:
    """Selective checkpoints of one block (Rule 4): the matmul policy's and each of `b.selective_variants` (NOTE
    [Which outputs a selective checkpoint keeps]); each frees what it does not keep, caches what it keeps that
    autograd would have dropped, keeps the inputs, and runs its policy on every op of the block twice (Rule 7).
    Of two that free about as much, the one cheaper by Rule 7's cost (`timed` or not) stays: ranked by seconds in
    a profile whose cost is FLOPs, a variant re-running a matmul once pushed out the matmul policy."""
    if b.has_batchnorm or not b.selective_replays:
        return []  # BatchNorm: remat restores its statistics only around a full recompute; autocast's cache:
        # NOTE [A selective checkpoint and autocast's cache] in `remat.measure.cast_replay`
    held_end, at = max(b.backward_start_op, b.backward_end_op + 1), rerun_points([b])[0]
    kept, units, rerun = kept_holds(b, held_end, wanted), [], Rerun(live, b, b.forward_end_op, start)
    policies = b.selective_variants if b.selective_matmul_written else [_matmul_policy(b), *b.selective_variants]
    for v in policies:  # the matmul policy would keep a tensor written in place after: torch refuses it at the re-run
        if v.free_bytes <= 0:
            continue
        seconds = v.recompute_s + v.recompute_ops * per_op[0] + 2 * _forward_ops(b) * per_op[1]
        effects = _selective_effects(b, v, held_end)
        narrow = [Effect(freed, released, -nbytes) for freed, released, nbytes in v.kept_outside if freed < released]
        moment = rerun_effect(live, effects + narrow, at, _selective_held(rerun, b, v))  # Rule 3
        units.append(
            Unit(
                (b.name,),
                group,
                position,
                nested[b.name],
                v.recompute_flops,
                seconds,
                (*effects, *moment),
                True,
                Action.SELECTIVE,
                v.recompute_ops,
                holds=unit_holds(b, held_end),
                keeps=tuple(v.keeps),
                moment_bytes=-sum(e.bytes for e in moment),
                narrow=tuple(narrow),
                kept=kept,
            )
        )
    return _cheapest_apart(units, max(4096, b.internal_bytes // 1000), timed)


def _matmul_policy(b: BlockProfile) -> SelectiveVariant:
    """The selective checkpoint keeping matmul, convolution and attention outputs, from `b`'s `selective_*` figures."""
    return SelectiveVariant(
        [],
        b.selective_free_bytes,
        b.selective_extra_bytes,
        b.selective_recompute_flops,
        b.selective_recompute_s,
        b.selective_recompute_ops,
        b.selective_stranded_bytes,
        b.selective_kept_made,
        b.selective_kept_outside,
        cached_casts(b)[0],
    )


def _cheapest_apart(units: list[Unit], near: int, timed: bool) -> list[Unit]:
    """Rule 4: of units that free within `near` bytes of each other, the cheapest.  `near` is within the ILP's
    tolerance (a variant 8 bytes over the budget made it drop a cheaper unit at it), so a costlier unit must free
    more than this."""
    kept: list[Unit] = []
    for u in sorted(units, key=lambda u: (*u.cost(timed), u.cost_ops)):
        kept += [u] if all(u.reduction_bytes > k.reduction_bytes + near for k in kept) else []
    return kept


def _selective_effects(b: BlockProfile, v: SelectiveVariant, held_end: int) -> list[Effect]:
    """Rule 4: a variant frees what it does not keep until its recomputation (Rule 3); its cache holds what it keeps
    that autograd would have dropped until the recomputation takes it, and what that stops before (stranded) until
    `held_end` (a kept output saved outside the block, from when that frees it until the cache lets it go, is a
    narrow effect: `Unit.narrow`)."""
    t = rerun_points([b])[0][0]
    effects = split_casts(b, v.free_bytes, v.cast_bytes, t)
    if v.extra_bytes > v.stranded_bytes:  # the recompute (Rule 3's moment) consumes the cache
        effects.append(Effect(b.forward_end_op + 1, t, v.stranded_bytes - v.extra_bytes))
    if v.stranded_bytes:  # ... but for what it stops before
        effects.append(Effect(b.forward_end_op + 1, held_end, -v.stranded_bytes))
    return [e for e in effects if e.start < e.end]


def _selective_held(rerun: Rerun, b: BlockProfile, v: SelectiveVariant) -> int | None:
    """What the re-run of a selective checkpoint adds at once (`Rerun.held`), and the kept outputs saved outside the
    block that the previous backward node released just before it, still in the cache for it."""
    casts, t = cached_casts(b)[0], rerun_points([b])[0][0]
    held = rerun.held(b, 0, v.kept_made + (_from_autocast_cache([b], t) if v.cast_bytes == casts else []))
    return None if held is None else held + sum(n for freed, released, n in v.kept_outside if freed == released == t)


def _make_offload_unit(
    b: BlockProfile,
    group: Group,
    position: int,
    nested: dict[str, frozenset],
    bandwidth: float,
    flops_per_s: float,
    *,
    wanted: frozenset = frozenset(),
) -> list[Unit]:
    """Offloading one block's saved tensors to CPU memory (Rule 6); none if it would free nothing."""
    alone = b.output_kept_by == [b.name] or (not b.output_kept_by and b.output_own_bytes > 0)  # its own ops keep all
    output = output_freeable(b) if alone else 0
    freed = b.internal_bytes + output
    if freed <= 0 or b.offload_bytes <= 0 or b.forward_end_op + 1 >= b.backward_start_op:
        return []
    seconds = 2 * b.offload_bytes / bandwidth
    effects = tuple(split_casts(b, freed, cached_casts(b)[0], b.backward_start_op))
    return [
        Unit(
            (b.name,),
            group,
            position,
            nested[b.name],
            math.ceil(seconds * flops_per_s),
            seconds,
            effects,
            True,
            Action.OFFLOAD,
            0,
            b.offload_bytes,
            frees=tuple(
                Hold(key, b.forward_end_op + 1, b.backward_start_op, 0)
                for key in b.output_keys
                if output and key in wanted
            ),
        )
    ]


def _forward_ops(b: BlockProfile) -> int:
    """Ops of a whole forward of `b` (a segment re-runs its non-last blocks entirely)."""
    return max(b.checkpoint_recompute_ops, b.forward_end_op - b.forward_start_op + 1)
