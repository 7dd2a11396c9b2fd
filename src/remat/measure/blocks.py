"""Per candidate module: what it keeps for backward, what a checkpoint around it would free
and cost, read off the tracker's records after the step (`BlockProfile`).

See NOTE [When a saved tensor is attributed to a module] and NOTE [Recomputation] in `remat.measure.tracker`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from remat._torch_compat import (
    BatchNormBase,
    checkpoint_wrapper_type,
)
from remat.measure.block_io import BlockIO
from remat.measure.cast_replay import cast_replay, replayable
from remat.measure.calls import call_profiles
from remat.measure.chains import uncalled_chains, with_chains
from remat.measure.selective import BlockOps, cache_facts, selective_variants, written_at
from remat.measure.tracker import OpRecord, StorageRecord, Tracker
from remat.hf import checkpointed_by_hf
from remat.module_tree import class_name, container_kind, enclosing, parent_name, within
from remat.ops import RANDOM_OPS, SAVE_OPS
from remat.types import BlockProfile, SelectiveVariant


def block_profiles(
    tracker: Tracker, io: BlockIO, live: list[int], freed_before: list[int]
) -> tuple[list[BlockProfile], list[BlockProfile]]:
    """One BlockProfile per candidate that ran, in the order their forwards first started; an nn.Sequential the
    model never called whose children ran in turn counts as run by them
    (NOTE [An nn.Sequential the model never calls]).  `freed_before[k]`: what `live[k - 1]` counts that is gone
    when op k starts.  Then one per call of those that ran more than once (`calls.call_profiles`)."""
    ran = with_chains(io.order, uncalled_chains(tracker, io), io)
    parents = {n: enclosing(n, ran) for n in ran}
    siblings = {n: [m for m in ran if parents[m] == parents[n]] for n in ran}
    keys = {id(r): k for k, r in enumerate(tracker.records)}
    blocks = {name: _Block(tracker, io, name, parents, siblings[name], keys) for name in ran}
    profiles = [b.profile(i, (live, freed_before), _previous(b, blocks)) for i, b in enumerate(blocks.values())]
    return profiles, call_profiles(blocks, profiles, (live, freed_before))


def _previous(block: "_Block", blocks: dict[str, "_Block"]) -> "_Block | None":
    """The module of the same container that ran just before `block`, if any."""
    name = block.previous_name()
    return blocks[name] if name is not None else None


@dataclass
class _Block:
    """The records of one candidate, gathered once; `profile` turns them into figures."""

    tracker: Tracker
    io: BlockIO
    name: str
    parents: dict[str, str | None]
    siblings: list[str]
    keys: dict[int, int]
    """Position of each storage record in the tracker's list, by id: the same tensor's number everywhere."""
    call: int = -1
    """The one forward call it describes (NOTE [A module called more than once] in `remat.measure.calls`), -1: all."""
    ranges: tuple[range, ...] = ()
    """The timeline's ops of that call, its forward and its backward; () for all its calls."""

    def previous_name(self) -> str | None:
        """The module of the same container that ran just before this one, if any."""
        same = [m for m in self.siblings if parent_name(m) == parent_name(self.name)]
        k = same.index(self.name)
        return same[k - 1] if k > 0 else None

    def one_call(self, call: int, ranges: tuple[range, ...]) -> "_Block":
        """This module's `call`-th forward call alone, whose ops are `ranges` (NOTE [A module called more than once])."""
        return _Block(self.tracker, self.io, self.name, self.parents, self.siblings, self.keys, call, ranges)

    def _in(self, k: int) -> bool:
        return not self.ranges or any(k in r for r in self.ranges)

    def _here(self, step: int, module: str) -> bool:
        """A pack by `module` at op `step` was inside the block (inside this call of it)."""
        return within(module, self.name) and self._in(step)

    def _kept_only_here(self, rec: StorageRecord) -> bool:
        """Every op that saved `rec` for backward ran inside the block (inside this call of it)."""
        return bool(rec.packs) and all(self._here(step, m) for step, m in rec.packs)

    def __post_init__(self) -> None:
        ops = self.tracker.ops
        steps = itertools.chain.from_iterable(self.ranges) if self.ranges else range(len(ops))  # in order
        self.mine = [k for k in steps if within(ops[k].module, self.name)]
        self.fwd_k = [k for k in self.mine if ops[k].phase in ("forward", "loss")]
        self.bwd_k = [k for k in self.mine if ops[k].phase == "backward"]
        self.fwd = [ops[k] for k in self.fwd_k]
        self.bwd = [ops[k] for k in self.bwd_k if not ops[k].recompute]
        self.recomputed = [ops[k] for k in self.bwd_k if ops[k].recompute]
        self.rerun_op = self._first_unpack()
        calls, rerun = 1 if self.ranges else self.io.calls[self.name], max([self.rerun_op, *self.bwd_k[:1]])
        self.replay = cast_replay(self.tracker.records, self.fwd_k, rerun, self._cast_released, calls)
        self.checkpoint_ops = _recomputed_ops(self.fwd, self.name)
        self.selective_ops = _recomputed_ops(self.fwd, self.name, selective=True)
        io = self.io.call_io[self.name][self.call] if self.call >= 0 else None
        self.outputs = io[2] if io else self.io.outputs.get(self.name, [])
        self.inputs = io[0] if io else self.io.inputs.get(self.name, [])
        self.grad_inputs = io[1] if io else self.io.grad_inputs.get(self.name, [])
        out_ids = {id(r) for r in self.outputs}
        mine_records = [r for r in self.tracker.records if within(r.module, self.name) and self._in(r.alloc_step)]
        self.acts = [r for r in mine_records if r.category == "activations"]
        end = self.fwd_k[-1] + 1 if self.fwd_k else 0  # saved, then freed inside its forward: nothing to free
        self.internal = [r for r in self.acts if id(r) not in out_ids and self._kept_only_here(r) and _after(r, end)]
        self.module = self.io.modules[self.name]
        self.block_ops = self._block_ops(mine_records)
        self.cached = [  # what the matmul policy's cache adds (NOTE [Which outputs a selective checkpoint keeps])
            r
            for r in mine_records
            if r.op in SAVE_OPS
            and r.category == "temporaries"
            and r.phase == "forward"
            and not self.block_ops.lingers(r)
        ]
        self.variants = self._selective_variants(self.block_ops)

    def profile(self, index: int, timeline: tuple[list[int], list[int]], previous: "_Block | None") -> BlockProfile:
        """`timeline`: the live bytes after each op and what of them is gone when the next op starts."""
        live, freed_before = timeline
        kind = self._checkpoint_kind()
        previous_end = previous.fwd_k[-1] if previous is not None and previous.fwd_k else None
        bns = [m for m in self.module.modules() if isinstance(m, BatchNormBase) and m.training]
        return BlockProfile(
            name=self.name,
            type=class_name(self.module),
            index=index,
            depth=self._depth(),
            parent=self.parents[self.name],
            calls=self.io.calls[self.name],
            **self._bytes(),
            **self._costs(),
            peak_bytes=max((live[k] for k in self.mine), default=0),
            **self._spans(freed_before),
            checkpointed=bool(kind),
            checkpoint_kind=kind,
            has_dropout=any(op.name in RANDOM_OPS for op in self.fwd),
            has_batchnorm=bool(bns),
            batchnorm_stats_bytes=sum(b.numel() * b.element_size() for m in bns for b in m.buffers(recurse=False)),
            container=container_kind(self.io.containers.get(self.name), self.io.forward_ran),
            extra=self.name in self.io.extras,
            grad_ops_before=self._grad_ops_before(previous_end),
            selective_variants=self.variants,
            selective_replays=not self.replay.anew,
            selective_matmul_written=self._matmul_output_written(),
            foreign_grad_inputs=self._foreign_grad_inputs(previous),
            call=self.call,
        )

    def _foreign_grad_inputs(self, previous: "_Block | None") -> int:
        """Inputs that require grad and did not come from, or through, the previous sibling (0 for a first one)."""
        if previous is None:
            return 0
        theirs = {id(r) for r in (*previous.inputs, *previous.outputs)}
        return sum(id(r) not in theirs for r in self.grad_inputs)

    def _last_rerun(self) -> int:
        """Timeline index of the last op a checkpoint around the block re-runs (-1: none)."""
        return self.fwd_k[len(self.checkpoint_ops) - 1] if self.checkpoint_ops else -1

    def _block_ops(self, mine_records: list[StorageRecord]) -> BlockOps:
        """What a checkpoint of the block runs and its cache holds (NOTE [Which outputs a selective checkpoint keeps])."""
        ops, n = self.tracker.ops, len(self.checkpoint_ops)
        outside = {id(r) for r in mine_records if r.category == "activations" and not self._kept_only_here(r)}
        start, end = (self.bwd_k[0], self.bwd_k[-1]) if self.bwd_k else (-1, -1)
        start = max(start, self.rerun_op)  # the re-run takes what the cache keeps (`BlockProfile.rerun_op`)
        return BlockOps(
            [(k, ops[k]) for k in self.fwd_k[:n]],
            [(k, ops[k]) for k in self.fwd_k[n:]],
            mine_records,
            outside,
            (start, max(start, end + 1)),  # as the planner's held_end
        )

    def _selective_variants(self, block: BlockOps) -> list[SelectiveVariant]:
        """NOTE [Which outputs a selective checkpoint keeps]."""
        matmul_keeps = {op.signature for _, op in block.rerun if op.name in SAVE_OPS}
        return replayable(selective_variants(block, self.internal, matmul_keeps), self.replay)

    def _matmul_output_written(self) -> bool:
        """An output the matmul policy would keep, made by the block's forward and written in place after
        (`BlockProfile.selective_matmul_written`)."""
        written = written_at(self.block_ops)
        return any(k in written for k, op in self.block_ops.rerun if op.name in SAVE_OPS)

    def _grad_ops_before(self, previous_end: int | None) -> int:
        """Forward ops between the end of the previous module of the same container and this one's start
        that join the graph (loop code, or another module called in between)."""
        if previous_end is None or not self.fwd_k:
            return 0
        return sum(op.reads_grad for op in self.tracker.ops[previous_end + 1 : self.fwd_k[0]])

    def _depth(self) -> int:
        depth, p = 0, self.parents[self.name]
        while p is not None:
            depth, p = depth + 1, self.parents[p]
        return depth

    def _checkpoint_kind(self) -> str:
        """How the step checkpoints this module: "" when its forward did not run again in backward (also a
        checkpoint wrapper whose checkpoint is turned off, as `remat.explain` does); "remat" when what re-runs is
        remat's own checkpoints (remat.apply, remat.checkpoint, around it or inside it), not the model's."""
        if not self.recomputed:
            return ""
        ours = self.io.remat_checkpointed
        if (
            ours
            and not checkpointed_by_hf(self.module)
            and all(any(within(op.module, w) for w in ours) for op in self.recomputed)
        ):
            return "remat"  # every op re-run is inside one of remat's checkpoints (around it, or inside it)
        wrapper = checkpoint_wrapper_type()
        return "checkpoint_wrapper" if wrapper is not None and isinstance(self.module, wrapper) else "recomputed"

    def _bytes(self) -> dict[str, Any]:
        saved_outputs = [r for r in self.outputs if r.category == "activations"]
        own, own_free = self._own_outputs(saved_outputs)
        others = [r for r in saved_outputs if all(r is not o for o in own)]  # `output_kept_by`'s: BLOOM's states
        unsaved_inputs = self._unsaved_inputs()
        n_ops = len(self.tracker.ops)
        made, outside = cache_facts(lambda op: op.name in SAVE_OPS, self.block_ops)  # the matmul policy's
        return dict(
            saved_bytes=_sum(self.acts),
            output_bytes=_sum(self.outputs),
            output_saved_bytes=_sum(saved_outputs),
            output_last_use_op=self._held_until(max((r.last_forward_use for r in saved_outputs), default=-1)),
            output_free_op=max((_output_freed_at(r, n_ops) for r in saved_outputs), default=-1),
            input_bytes=_sum(self.inputs),
            internal_bytes=_sum(self.internal),
            output_kept_by=_kept_by(others, self.siblings, self.name, self._here),
            input_unsaved_bytes=_sum(unsaved_inputs),
            held_inputs=[[self.keys[id(r)], r.nbytes, _freed_at(r, n_ops)] for r in unsaved_inputs],
            kept_inputs=[[self.keys[id(r)], r.nbytes, _freed_at(r, n_ops)] for r in self._kept_inputs()],
            output_keys=[self.keys[id(r)] for r in saved_outputs],
            autocast_casts=[[r.alloc_step, r.nbytes, self._cast_released(r)] for r in self.internal if r.autocast_cast],
            output_own_bytes=_sum(own),
            output_own_free_op=own_free,
            selective_free_bytes=_sum(r for r in self.internal if r.op not in SAVE_OPS),
            selective_extra_bytes=_sum(self.cached),
            selective_stranded_bytes=_sum(r for r in self.cached if r.alloc_step > self._last_rerun()),
            selective_kept_made=made,
            selective_kept_outside=outside,
            offload_bytes=0  # NOTE [A module called more than once], Rule 4
            if self.ranges
            else _sum(
                r
                for r in self.tracker.records
                if r.saved
                and r.category in ("inputs", "activations", "temporaries")
                and any(within(m, self.name) for _, m in r.packs)
            ),
        )

    def _cast_released(self, rec: StorageRecord) -> int:
        """The op before which autocast's cache let go of `rec` (NOTE [A weight autocast casts]); the step's length if
        it did not in the step."""
        return next((k for k in self.tracker.cache_clears if k > rec.alloc_step), len(self.tracker.ops))

    def _own_outputs(self, saved_outputs: list[StorageRecord]) -> tuple[list[StorageRecord], int]:
        """`BlockProfile.output_own_bytes` (its records) and `output_own_free_op`: saved outputs only its own ops save
        and read, freed by the end of its backward (the caller dropped them); none without a backward op after it."""
        ops, end = self.tracker.ops, (self.bwd_k[-1] + 1 if self.bwd_k else -1)
        here = [r for r in saved_outputs if self._kept_only_here(r) and _output_freed_at(r, len(ops)) <= end]
        own = [
            r
            for r in here
            if r.last_forward_use >= 0 and self._here(r.last_forward_use, ops[r.last_forward_use].module)
        ]
        after = self.fwd_k[-1] if own else len(ops)
        backward = next((k for k in range(after, len(ops)) if ops[k].phase == "backward"), -1)
        let_go = [self.io.let_go.get(id(r), backward) for r in own]  # NOTE [When the caller lets go of an output]
        return (own if backward >= 0 else []), min(backward, max(let_go, default=backward))

    def _held_until(self, read: int) -> int:
        """The last forward read of the output, or, when the enclosing module's own code made it (a loop keeping
        outputs in a list for skip connections, a local read after the loop), the end of that module's forward:
        a variable there holds the output until the module returns, whether or not autograd saves it."""
        if read < 0:
            return read
        reader = self.tracker.ops[read].module
        if within(reader, self.name) or any(within(reader, s) for s in self.siblings):
            return read
        ops = self.tracker.ops
        return max(
            (k for k in range(read, len(ops)) if ops[k].phase == "forward" and within(ops[k].module, reader)),
            default=read,
        )

    def _unsaved_inputs(self) -> list[StorageRecord]:
        """Inputs (positional and keyword) that autograd does not keep: a checkpoint holds them (Rule 2)."""
        return [r for r in self.inputs if not r.saved and r.category in ("activations", "temporaries")]

    def _kept_inputs(self) -> list[StorageRecord]:
        """Inputs that autograd keeps only for ops outside the block (`BlockProfile.kept_inputs`)."""
        return [
            r
            for r in self.inputs
            if r.saved
            and r.category in ("activations", "temporaries")
            and r.packs
            and not any(self._here(step, m) for step, m in r.packs)
        ]

    def _costs(self) -> dict[str, Any]:
        return dict(
            forward_flops=_flops(self.fwd),
            backward_flops=_flops(self.bwd),
            recompute_flops=_flops(self.recomputed),
            checkpoint_recompute_flops=_flops(self.checkpoint_ops),
            selective_recompute_flops=_flops(self.selective_ops),
            selective_recompute_s=sum(op.seconds for op in self.selective_ops),
            checkpoint_recompute_s=sum(op.seconds for op in self.checkpoint_ops),
            forward_s=sum(op.seconds for op in self.fwd),
            backward_s=sum(op.seconds for op in self.bwd),
            checkpoint_recompute_ops=len(self.checkpoint_ops),
            selective_recompute_ops=len(self.selective_ops),
        )

    def _spans(self, freed_before: list[int]) -> dict[str, Any]:
        fwd, bwd, rerun = self.fwd_k, self.bwd_k, self.rerun_op
        return dict(
            rerun_op=rerun,
            freed_before_rerun_bytes=freed_before[rerun] if rerun >= 0 else 0,
            forward_start_op=fwd[0] if fwd else -1,
            forward_end_op=fwd[-1] if fwd else -1,
            backward_start_op=bwd[0] if bwd else -1,
            backward_end_op=bwd[-1] if bwd else -1,
            freed_before_forward_bytes=freed_before[fwd[0]] if fwd else 0,
            freed_before_backward_bytes=freed_before[bwd[0]] if bwd else 0,
        )

    def _first_unpack(self) -> int:
        """`BlockProfile.rerun_op`: the first op before which backward unpacked a tensor an op inside the block packed,
        its first backward op or before (NOTE [When a checkpoint re-runs] in `remat.measure.tracker`); -1: none."""
        if not self.bwd_k:
            return -1
        ops = self.tracker.ops
        unpacks = [  # in backward only (a gradient taken inside a forward is no re-run); a call's backward has its
            u  # unpacks (an op packs its inputs before it runs: `step` may be the op before, outside the call)
            for r in self.tracker.records
            for (step, m), u in zip(r.packs, r.unpacks)
            if 0 <= u < len(ops) and ops[u].phase == "backward" and within(m, self.name) and self._in(u)
        ]
        return min(unpacks, default=-1)


def _freed_at(rec: StorageRecord, n_ops: int) -> int:
    """The op index at which the step freed `rec`: `n_ops` (the step's length) if it never did."""
    return n_ops if rec.free_step is None else rec.free_step


def _after(rec: StorageRecord, k: int) -> bool:
    """`rec` is not freed before op `k` starts (unlike `live_at`, also where it is made later: a model's own checkpoint)."""
    return rec.free_step is None or rec.free_step > k


def _output_freed_at(rec: StorageRecord, n_ops: int) -> int:
    """As `_freed_at`, but `n_ops` + 1 where the step did not free an output before its last op was over: a record
    ends at `n_ops` also when the loop lets go of the output after the step (the model returned it), so a block whose
    backward is the step's last op (no optimizer) would count as the output's last holder (`output_freeable`)."""
    k = _freed_at(rec, n_ops)
    return n_ops + 1 if k >= n_ops else k


def _sum(records) -> int:
    return sum(r.nbytes for r in records)


def _flops(ops: list[OpRecord]) -> int:
    return sum(op.flops for op in ops)


def _recomputed_ops(fwd_ops: list[OpRecord], block: str, selective: bool = False) -> list[OpRecord]:
    """The ops a checkpoint around `block` re-runs: up to the last one that had run when an op inside it packed
    a tensor (NOTE [Recomputation]); selective checkpointing takes the SAVE_OPS from its cache instead."""
    last = -1
    for i, op in enumerate(fwd_ops):
        if any(within(m, block) for m in op.packs_after):
            last = i
    return [op for op in fwd_ops[: last + 1] if not (selective and op.name in SAVE_OPS)]


def _kept_by(records: list[StorageRecord], siblings: list[str], name: str, here) -> list[str]:
    """The siblings whose ops pack any of `records`, "*" for a packer outside all of them, or in another call of
    block `name` (`here(step, module)`: the pack was in the call profiled; NOTE [A module called more than once])."""
    found: list[str] = []
    for rec in records:
        for step, m in rec.packs:
            owner = next((s for s in siblings if within(m, s)), "*")
            owner = "*" if owner == name and not here(step, m) else owner
            if owner not in found:
                found.append(owner)
    return sorted(found)
