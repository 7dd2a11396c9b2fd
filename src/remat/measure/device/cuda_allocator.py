"""The CUDA caching allocator, replayed: what a step's allocations reserve on the GPU, and the least cap it runs under.

NOTE [The caching allocator's reserve]
  A budget is the GPU's memory, and what runs out there is the caching allocator's reserve, not the sum of live
  tensors (NOTE [The budget is the GPU's memory] in `remat.verifier.verify`).  On an H200 (2026-11-26,
  docs/validation.md section 6.1) no plan remat made ran under a cap equal to its budget: uncapped, their
  reserved peaks were 11-66% over it, and with the default allocator even `max_memory_allocated` was 1.0-2.4% over
  the sum of live tensors, because it counts whole cached blocks handed out unsplit.  This module replays a
  step's allocations and frees, in order, through a model of torch's `CUDACachingAllocator`
  (c10/cuda/CUDACachingAllocator.cpp, torch 2.11) and reports what it would allocate and reserve.

  Rule 1. Sizes are rounded up to 512 bytes.  A request of at most 1 MiB comes from the small pool, others from
          the large pool; each pool hands out the smallest cached free block that fits (then the lowest address).
  Rule 2. With no such block, a new segment is reserved: 2 MiB for a small request, 20 MiB for a request under
          10 MiB, else the request rounded up to 2 MiB.
  Rule 3. A block larger than the request is split when what remains is at least 512 bytes (small pool, or any
          pool with expandable segments) or more than 1 MiB (large pool); otherwise the whole block is allocated
          and counted as allocated (the unsplit blocks above).  A freed block merges with free neighbours.
  Rule 4. With `expandable_segments:True` each pool is one address range mapped in pages of 2 MiB (small) or
          20 MiB (large): a request no cached block fits is placed at the lowest gap whose free space reaches it,
          and the pages it touches are mapped; reserved is the pages mapped.
  Rule 5. Under a cap (`set_per_process_memory_fraction`), a segment or page that would take the reserve over it
          first makes the allocator release every cached segment (page) holding no allocated byte; if the
          request still does not fit, the step runs out of memory.
  Rule 6. The step replayed is the tracker's, three times, as a training loop runs it
          (NOTE [What counts as live memory] gives each storage's first and last op): the parameters, buffers and
          inputs first; in the first
          step the optimizer's state appears at the optimizer's first op and the library workspaces at the
          step's start; from the second step on, what the previous step left alive (the output the loop holds,
          the loss) is freed where the tracker saw the step free it.  Within an op its outputs come first, then
          its kernel scratch, freed before the next op's frees.  The third step is the one measured.
  What it cannot see: allocations no tracker sees (inside a kernel library beyond what
  NOTE [CUDA memory that is no tensor] models), other streams, and the order of frees within one op.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from remat.measure.tracker import rounded_bytes
from remat.types.reserve import GpuReserve

MiB = 1 << 20
ROUND = 512
"""The allocator's block granularity: every request is rounded up to it (remat's tracker rounds CUDA storages so)."""
SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
MIN_LARGE_ALLOC = 10 * MiB
LARGE_BUFFER = 20 * MiB
ROUND_LARGE = 2 * MiB


class OutOfMemory(Exception):
    """The replayed step asked for more than the cap (Rule 5)."""


def rounded(n: int) -> int:
    """Rule 1: a request as the allocator sizes it (an empty tensor still takes one block)."""
    return max(ROUND, rounded_bytes(n, ROUND))


def segment_size(size: int) -> int:
    """Rule 2: the segment reserved for a request of `size` (rounded) bytes that no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    small: bool
    seg: int
    start: int
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def end(self) -> int:
        return self.start + self.size


class _Pool:
    """One pool's free blocks, sorted by (size, segment, start): Rule 1's best fit is a bisect."""

    def __init__(self):
        self.order: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}

    def add(self, b: _Block) -> None:
        key = (b.size, b.seg, b.start)
        self.blocks[key] = b
        bisect.insort(self.order, key)

    def remove(self, b: _Block) -> None:
        key = (b.size, b.seg, b.start)
        del self.order[bisect.bisect_left(self.order, key)]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.order, (size, -1, -1))
        return self.blocks[self.order[i]] if i < len(self.order) else None


class CachingAllocator:
    """Rules 1-3 and 5, the default settings: `malloc(n) -> block`, `free(block)`; `allocated`, `reserved` and
    their peaks in bytes.  `cap`: the most it may reserve (None: no cap)."""

    def __init__(self, cap: int | None = None):
        self.cap = cap
        self.pools = {True: _Pool(), False: _Pool()}
        self.seg_bytes: dict[int, int] = {}
        self._segments = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def malloc(self, nbytes: int) -> _Block:
        size = rounded(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = pool.best_fit(size)
        if block is None:
            block = self._new_space(small, size)
        pool.remove(block)
        if self._splits(small, block.size - size):
            rest = _Block(small, block.seg, block.start + size, block.size - size, True, block, block.next)
            if block.next:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.add(rest)
        block.free = False
        self._map(block)
        self._count(block.size, 0)
        return block

    def free(self, block: _Block) -> None:
        pool = self.pools[block.small]
        block.free = True
        self._count(-block.size, 0)
        for other in (block.prev, block.next):
            if other is not None and other.free:
                pool.remove(other)
                block = self._merge(block, other)
        pool.add(block)

    def release_cached(self) -> None:
        """Rule 5: every segment that is one free block goes back to the GPU."""
        for pool in self.pools.values():
            for b in [b for b in pool.blocks.values() if b.prev is None and b.next is None]:
                pool.remove(b)
                self._count(0, -self.seg_bytes.pop(b.seg))

    # -- the default allocator's policy (Rules 2, 3) ----------------------------------------------------------
    def _splits(self, small: bool, remaining: int) -> bool:
        return remaining >= ROUND if small else remaining > SMALL_SIZE

    def _new_space(self, small: bool, size: int) -> _Block:
        """A new segment for `size`, as one free block in its pool (Rule 2; under a cap, Rule 5)."""
        seg_bytes = segment_size(size)
        self._fit(seg_bytes)
        self._segments += 1
        seg = self._segments
        self.seg_bytes[seg] = seg_bytes
        self._count(0, seg_bytes)
        block = _Block(small, seg, 0, seg_bytes)
        self.pools[small].add(block)
        return block

    def _map(self, block: _Block) -> None:
        """Default segments are reserved whole when made: nothing to map."""

    def _fit(self, more: int) -> None:
        """Rule 5: room for `more` reserved bytes under the cap, releasing cached memory first; else OutOfMemory."""
        if self.cap is None or self.reserved + more <= self.cap:
            return
        self.release_cached()
        if self.reserved + more > self.cap:
            raise OutOfMemory(f"asked for {more} more bytes with {self.reserved} of {self.cap} reserved")

    def _merge(self, a: _Block, b: _Block) -> _Block:
        first, second = (a, b) if a.start < b.start else (b, a)
        first.size += second.size
        first.next = second.next
        if second.next:
            second.next.prev = first
        return first

    def _count(self, allocated: int, reserved: int) -> None:
        self.allocated += allocated
        self.reserved += reserved
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)


UNBOUNDED = 1 << 60
"""The size of an expandable pool's address range: more than any GPU has."""


class ExpandableAllocator(CachingAllocator):
    """Rule 4 (and 5): each pool one address range, mapped in pages; blocks split down to 512 bytes."""

    def __init__(self, cap: int | None = None):
        super().__init__(cap)
        self.mapped: dict[bool, set[int]] = {True: set(), False: set()}
        self.heads = {small: _Block(small, int(small), 0, UNBOUNDED) for small in (True, False)}
        """Each range's block at address 0: a merge keeps the lower block, so it stays the first."""
        for head in self.heads.values():
            self.pools[head.small].add(head)

    def _splits(self, small: bool, remaining: int) -> bool:
        return remaining >= ROUND

    def _new_space(self, small: bool, size: int) -> _Block:  # the unbounded block always fits
        raise AssertionError("an expandable pool always has room")

    def _map(self, block: _Block) -> None:
        page = SMALL_BUFFER if block.small else LARGE_BUFFER
        pages = set(range(block.start // page, (block.end + page - 1) // page)) - self.mapped[block.small]
        if not pages:
            return
        self._fit(len(pages) * page)
        self.mapped[block.small] |= pages
        self._count(0, len(pages) * page)

    def release_cached(self) -> None:
        """Rule 5: every mapped page holding no allocated byte is unmapped."""
        for small, pages in self.mapped.items():
            page = SMALL_BUFFER if small else LARGE_BUFFER
            used = set()
            for b in self._allocated_blocks(small):
                used |= set(range(b.start // page, (b.end + page - 1) // page))
            self._count(0, -len(pages - used) * page)
            self.mapped[small] = pages & used

    def _allocated_blocks(self, small: bool) -> Iterable[_Block]:
        b: _Block | None = self.heads[small]
        while b is not None:
            if not b.free:
                yield b
            b = b.next


# -- Rule 6: a profiled step, replayed as a loop runs it ---------------------------------------------------------

BEFORE_LOOP = ("params", "buffers", "inputs", "grads", "gathered")
"""Categories of what exists before the loop's first step (the optimizer's state and the workspaces come in it)."""


@dataclass(frozen=True)
class Replayed:
    """The third step of a replayed loop: the allocator's peaks, or where it ran out under its cap."""

    allocated_bytes: int
    reserved_bytes: int
    out_of_memory: str = ""


def replay(records, scratch: list[int], phases: list[str], allocator: CachingAllocator, steps: int = 3) -> Replayed:
    """Rule 6: `records` (the tracker's storage records: nbytes, alloc_step, free_step, category), `scratch` per op
    and the ops' `phases`, run `steps` times through `allocator`; its peaks over the last step."""
    n = len(phases)
    scratch = scratch if len(scratch) == n else [0] * n
    pre = [r for r in records if r.alloc_step < 0]
    made = [r for r in records if r.alloc_step >= 0]
    held = [
        r
        for r in pre
        if r.category not in (*BEFORE_LOOP, "optimizer", "workspaces") and r.free_step is not None and r.free_step < n
    ]
    carry = _carried(held, [r for r in made if r.free_step is None or r.free_step >= n])
    allocs, frees = _by_op(made, held, n)
    first_opt = next((k for k, p in enumerate(phases) if p == "optimizer"), n)
    late = {id(r) for r in pre if r.category == "optimizer"}
    try:
        for r in pre:
            if r.category in BEFORE_LOOP:
                allocator.malloc(r.nbytes)
        live: dict[int, _Block] = {}
        for step in range(steps):
            if step == steps - 1:
                allocator.reset_peaks()
            for r in pre if step == 0 else ():
                if r.category == "workspaces":
                    live[id(r)] = allocator.malloc(r.nbytes)
            live = _one_step(
                allocator,
                live,
                (allocs, frees, scratch),
                carry,
                [r for r in pre if id(r) in late] if step == 0 else [],
                first_opt,
            )
    except OutOfMemory as e:
        return Replayed(allocator.peak_allocated, allocator.peak_reserved, str(e))
    return Replayed(allocator.peak_allocated, allocator.peak_reserved)


def _carried(held: list, ends: list) -> dict[int, int]:
    """What one step leaves alive for the next (the output the loop holds, the loss): each record the tracker saw
    exist before the step and freed in it (`held`) matched, by size, to one of the step's own survivors.
    {id(survivor): id(held record)}."""
    by_size: dict[int, list] = {}
    for r in ends:
        by_size.setdefault(r.nbytes, []).append(r)
    out = {}
    for h in held:
        if by_size.get(h.nbytes):
            out[id(by_size[h.nbytes].pop())] = id(h)
    return out


def _by_op(made: list, held: list, n: int) -> tuple[dict, dict]:
    allocs: dict[int, list] = {}
    frees: dict[int, list] = {}
    for r in made:
        allocs.setdefault(r.alloc_step, []).append(r)
        frees.setdefault(n if r.free_step is None else min(r.free_step, n), []).append(r)
    for r in held:
        frees.setdefault(r.free_step, []).append(r)
    return allocs, frees


def _one_step(
    allocator: CachingAllocator, live: dict, by_op: tuple, carry: dict[int, int], late: list, first_opt: int
) -> dict[int, _Block]:
    """One step: at each op the frees the tracker saw before it, its outputs, its scratch (Rule 6).  `live` maps
    record ids to blocks, the previous step's survivors under the held record they stand for; returns the map for
    the next step."""
    allocs, frees, scratch = by_op
    for k in range(len(scratch) + 1):
        for r in frees.get(k, ()):
            if id(r) in carry and k == len(scratch):
                live[carry[id(r)]] = live.pop(id(r))  # alive into the next step, as the record it stands for
            elif id(r) in live:
                allocator.free(live.pop(id(r)))
        if k == len(scratch):
            break
        if k == first_opt:
            for r in late:
                live[id(r)] = allocator.malloc(r.nbytes)
        for r in allocs.get(k, ()):
            live[id(r)] = allocator.malloc(r.nbytes)
        if scratch[k]:
            blocks = [allocator.malloc(part) for part in _scratch_blocks(scratch[k])]
            for b in blocks:
                allocator.free(b)
    return live


def _scratch_blocks(nbytes: int) -> list[int]:
    """An op's scratch as the blocks a kernel asks for: a workspace or staging buffer in whole MiB, and what is left
    under a MiB (semaphores, small buffers) as one small block of its own."""
    small = nbytes % MiB
    return [b for b in (nbytes - small, small) if b] if nbytes > MiB else [nbytes]


def gpu_reserve(records, scratch: list[int], phases: list[str]) -> GpuReserve:
    """A tracked CUDA step replayed with the default allocator and with expandable segments (Rule 6)."""
    default = replay(records, scratch, phases, CachingAllocator())
    expandable = replay(records, scratch, phases, ExpandableAllocator())
    return GpuReserve(
        default.allocated_bytes, default.reserved_bytes, expandable.reserved_bytes, expandable.allocated_bytes
    )
