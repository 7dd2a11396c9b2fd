"""Selective checkpoints of one block that keep other outputs than its matmuls': `BlockProfile.selective_variants`.

NOTE [Which outputs a selective checkpoint keeps]
  torch's selective checkpointing (`create_selective_checkpoint_contexts`) asks a policy, for each op a
  checkpointed block runs, whether to keep its output or to run the op again in backward.  remat's first
  policy keeps the outputs of matmuls, convolutions and attention (`remat.ops.SAVE_OPS`, as torchtitan does)
  and recomputes the rest, whatever they cost.  The variants here let the planner choose per op instead:
  Rule 1. A *class* is the ops of the block's forward with one `remat.ops.op_signature` (name and argument
          shapes: a transformer's up and down projections are two classes, its layers' norms one), among
          those a checkpoint re-runs (up to the last whose output autograd saves inside the block).
          Keeping a class costs the bytes of its outputs: those autograd saves stay (the checkpoint no
          longer frees them), those it does not save go into the selective cache until the block's
          backward; it spares the re-run of its ops.  A class whose outputs take no bytes of their own
          (views) is always re-run: keeping a view would keep its base; so is one whose output a later op
          writes in place (`StorageRecord.written`: torch refuses a cached tensor that changed); a block that
          writes a matmul's output so is offered no matmul policy (`BlockProfile.selective_matmul_written`).
  Rule 2. Classes are ranked by seconds spared per byte kept, dearest first, the seconds the roofline
          predicts (`OpRecord.predicted_s`; FLOPs per byte break ties, then the order they first ran in).  Not
          the clock's: measured, a tril and a matmul of a GPT-2 block swapped places from one profile to the
          next (even in powers of two), and so did the variants and the plans; the planner weighs each
          variant's measured seconds (Rule 3).  A variant keeps the first k: for j
          = 1 .. VARIANTS, the fewest whose bytes reach j / (VARIANTS + 1) of what all classes take, and
          j / (VARIANTS + 1) of the classes (one dear class can hold most of the bytes): from a variant
          that frees almost everything and re-runs the dearest ops, to one that frees little and re-runs
          only the cheapest.
  Rule 3. A variant's figures are read as the matmul policy's (`BlockProfile.selective_*`,
          NOTE [The memory model of a plan], Rule 4): `free_bytes`, the block's internal activations not output by a
          kept class; `extra_bytes`, the kept classes' forward outputs autograd does not save; the ops re-run,
          those of Rule 1 outside the kept classes.  An op after the last one re-run whose signature is
          kept is cached too, and the recomputation stops before it takes that out of the cache: those
          bytes (`stranded_bytes`, part of `extra_bytes`) stay until the block's backward is over.
  Rule 4. A variant keeping no class (a plain checkpoint does that for less), every class, what the matmul
          policy keeps, or so much that its cache takes what it frees, is dropped, and so is one that
          repeats another.
  Rule 5. What the cache does to the recomputation's moment (`cache_facts`, for every policy): the ops it takes
          from the cache allocate nothing when the block re-runs (`kept_made`), and a kept output that an op
          outside the block saves (the block's output, saved by the next one) stays in the cache after that op's
          backward freed it in the unplanned step, until the recomputation takes it (`kept_outside`).  Seen on
          the last of four `nn.TransformerEncoderLayer`s, variants keeping its norms' class (norm2's output is
          the block's, saved by the head): 135,560,724 bytes measured where 131,482,644 were predicted (-3.0%).
          One that nothing saves but an op after the forward reads (the logits the loss reads, a weight's cast
          autocast's cache holds) adds to the cache's bytes only once the unplanned step frees it, the same way
          (`BlockOps.lingers`): counted from the block's end, the demo GPT-2's `lm_head` counted 32 MiB of logits
          the loop holds anyway, and a bf16 layer's selective units were up to 8,448 bytes high (2026-12-02, `tests/test_autocast_casts.py`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from remat.measure.tracker import OpRecord, StorageRecord
from remat.types import SelectiveVariant

VARIANTS = 3
"""Cuts of each kind per block (Rule 2): at most twice as many variants, besides the matmul policy."""


@dataclass
class _Class:
    signature: str
    first: int
    ops: list[OpRecord] = field(default_factory=list)
    saved_bytes: int = 0
    cached_bytes: int = 0
    lingering_bytes: int = 0  # part of `cached_bytes` the unplanned step holds past the forward (`BlockOps.lingers`)

    @property
    def bytes(self) -> int:
        return self.saved_bytes + self.cached_bytes

    def rank(self) -> tuple:
        spared_s, spared_flops = sum(op.predicted_s for op in self.ops), sum(op.flops for op in self.ops)
        return (-spared_s / self.bytes, -spared_flops / self.bytes, self.first)


@dataclass(frozen=True)
class BlockOps:
    """What a checkpoint of one block runs: `rerun`, (timeline index, op) of the ops it re-runs; `after`, of its
    later forward ops; `records`, the storages made inside it; `saved_outside`, the ids of those an op outside it
    saves; `released`, where the cache lets go of a kept output: (where the block re-runs, `BlockProfile.rerun_op`,
    the end of its backward)."""

    rerun: list[tuple[int, OpRecord]]
    after: list[tuple[int, OpRecord]]
    records: list[StorageRecord]
    saved_outside: set[int]
    released: tuple[int, int]

    def lingers(self, r: StorageRecord) -> bool:
        """`r`, an output autograd does not save, is still held by the unplanned step after the block's forward (an op
        after it reads it: the block's output, cast by the caller): a cache keeping it holds it no earlier than the
        step frees it (Rule 5)."""
        end = (self.after or self.rerun)[-1][0] if self.rerun or self.after else -1
        return r.category == "temporaries" and (r.free_step is None or r.free_step > end + 1)


def cache_facts(kept: Callable[[OpRecord], bool], block: BlockOps) -> tuple[list[list[int]], list[list[int]]]:
    """Rule 5: ([op index, bytes] the ops `kept` re-runs take from the cache, [freed, released, bytes] what the cache
    holds past the unplanned step of the outputs ops outside the block save)."""
    made_at = {k for k, op in block.rerun if kept(op)}
    stranded_at = {k for k, op in block.after if kept(op)}
    made: dict[int, int] = defaultdict(int)
    outside = []
    for r in block.records:
        if not r.op:
            continue  # first seen inside the block, not made by an op of it
        if r.alloc_step in made_at:
            made[r.alloc_step] += r.nbytes
            released = block.released[0]
        elif r.alloc_step in stranded_at:
            released = block.released[1]
        else:
            continue
        held = id(r) in block.saved_outside or block.lingers(r)
        if held and r.free_step is not None and r.free_step <= released:
            outside.append([r.free_step, released, r.nbytes])
    return [[k, b] for k, b in sorted(made.items())], outside


def written_at(block: BlockOps) -> set[int]:
    """Timeline indices of the block's ops whose output a later op writes in place (`StorageRecord.written`): torch's
    selective checkpoint refuses such an output from its cache (Rule 1)."""
    return {r.alloc_step for r in block.records if r.written and r.op}


def selective_variants(
    block: BlockOps, internal: list[StorageRecord], matmul_keeps: set[str]
) -> list[SelectiveVariant]:
    """The variants of one block.  `internal`: its activations kept only inside it; `matmul_keeps`: the signatures
    the matmul policy keeps (Rule 4)."""
    rerun, after, changed = block.rerun, block.after, written_at(block)
    classes = _classes(block, internal)
    written = {op.signature for k, op in (*rerun, *after) if k in changed}  # a kept signature is cached after too
    ranked = sorted((c for c in classes.values() if c.bytes > 0 and c.signature not in written), key=_Class.rank)
    variants: list[SelectiveVariant] = []
    for k in _cuts([c.bytes for c in ranked]):
        keeps = {c.signature for c in ranked[:k]}
        if 0 < k < len(ranked) and keeps != matmul_keeps:
            variant = _variant(keeps, rerun, internal, classes, _stranded(keeps, block))
            made, outside = cache_facts(lambda op: op.signature in keeps, block)  # noqa: B023 (called at once)
            variants.append(dataclasses.replace(variant, kept_made=made, kept_outside=outside))
    return [v for v in variants if v.free_bytes > v.extra_bytes]


def _cuts(sizes: list[int]) -> list[int]:
    """Rule 2: how many of the ranked classes each variant keeps, by their share of the bytes and of their count."""
    total, cumulative, cuts = sum(sizes), 0, set()
    for k, size in enumerate(sizes):
        for j in range(1, VARIANTS + 1):
            if cumulative < total * j / (VARIANTS + 1) <= cumulative + size:
                cuts.add(k + 1)
        cumulative += size
    return sorted(cuts | {round(len(sizes) * j / (VARIANTS + 1)) for j in range(1, VARIANTS + 1)})


def _classes(block: BlockOps, internal: list[StorageRecord]) -> dict[str, _Class]:
    classes: dict[str, _Class] = {}
    made_by: dict[int, _Class] = {}
    for k, op in block.rerun:
        made_by[k] = classes.setdefault(op.signature, _Class(op.signature, k))
        made_by[k].ops.append(op)
    saved = {id(r) for r in internal}
    for r in block.records:
        c = made_by.get(r.alloc_step) if r.op else None  # made by an op of the class, not first seen there
        if c is None:
            continue
        if id(r) in saved:
            c.saved_bytes += r.nbytes
        elif r.category == "temporaries" and r.phase == "forward":
            c.cached_bytes += r.nbytes
            c.lingering_bytes += r.nbytes if block.lingers(r) else 0
    return classes


def _stranded(keeps: set[str], block: BlockOps) -> int:
    """Rule 3: bytes the policy caches from ops after the last one re-run (one of a kept signature there), but those
    the unplanned step holds past the forward (Rule 5's `kept_outside`)."""
    made = {k for k, op in block.after if op.signature in keeps}
    return sum(
        r.nbytes
        for r in block.records
        if r.op and r.alloc_step in made and r.category == "temporaries" and not block.lingers(r)
    )


def _variant(keeps: set[str], rerun, internal, classes: dict[str, _Class], stranded: int) -> SelectiveVariant:
    ops = [op for _, op in rerun if op.signature not in keeps]
    kept = sum(classes[s].saved_bytes for s in keeps)
    made_by = {k: op.signature for k, op in rerun}
    casts = sum(r.nbytes for r in internal if r.autocast_cast and made_by.get(r.alloc_step) not in keeps)
    return SelectiveVariant(
        keeps=sorted(keeps, key=lambda s: classes[s].first),
        free_bytes=sum(r.nbytes for r in internal) - kept,
        extra_bytes=sum(classes[s].cached_bytes - classes[s].lingering_bytes for s in keeps) + stranded,
        recompute_flops=sum(op.flops for op in ops),
        recompute_s=sum(op.seconds for op in ops),
        recompute_ops=len(ops),
        stranded_bytes=stranded,
        cast_bytes=casts,
    )
