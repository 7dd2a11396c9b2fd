"""The planned step on CUDA run under a cap of its budget: what each run saw, and the verdict.

The rules are NOTE [The budget is the GPU's memory] in `remat.verifier.verify`; this module is their
arithmetic, pure (no CUDA), so that it is tested with numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from remat.types.reserve import EXPANDABLE

EXPANDABLE_FIX = "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch is imported"
FRESH_PROCESS = "fresh process"
THIS_PROCESS = "this process, after empty_cache"


@dataclass(frozen=True)
class OomFigures:
    """The numbers in a `torch.cuda.OutOfMemoryError` message, in bytes; None where the message lacks one."""

    tried: int | None = None
    """"Tried to allocate X": the block asked for."""
    allowed: int | None = None
    """"X allowed": the cap `set_per_process_memory_fraction` set."""
    allocated: int | None = None
    """"X is allocated by PyTorch"."""
    unallocated: int | None = None
    """"X is reserved by PyTorch but unallocated": cached blocks too small or split (fragmentation)."""
    free: int | None = None
    """"of which X is free": the GPU's own free memory."""

    @property
    def in_use(self) -> int | None:
        """What the caching allocator held (reserved) when it ran out: allocated + reserved but unallocated."""
        if self.allocated is None or self.unallocated is None:
            return None
        return self.allocated + self.unallocated


_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"([0-9][0-9.,]*) (bytes|KiB|MiB|GiB|TiB)"
_PATTERNS = {
    "tried": r"Tried to allocate " + _SIZE,
    "allowed": _SIZE + r" allowed",
    "allocated": _SIZE + r" is allocated by PyTorch",
    "unallocated": _SIZE + r" is reserved by PyTorch but unallocated",
    "free": r"of which " + _SIZE + r" is free",
}


def parse_oom(message: str) -> OomFigures:
    """The figures of torch's out-of-memory message (torch's `format_size`: two decimals, binary units)."""
    found = {}
    for name, pattern in _PATTERNS.items():
        m = re.search(pattern, message)
        if m:
            found[name] = round(float(m.group(1).replace(",", "")) * _UNITS[m.group(2)])
    return OomFigures(**found)


def _own(f: OomFigures, held: int) -> OomFigures:
    """`f` less what the process held besides the step (`CappedStep.held_bytes`)."""
    if not held:
        return f
    less = lambda n: None if n is None else max(0, n - held)  # noqa: E731
    return OomFigures(f.tried, less(f.allowed), less(f.allocated), f.unallocated, f.free)


def gib(n: int) -> str:
    """Bytes as torch's messages write them: "1.86 GiB", "292.00 MiB"."""
    unit = next((u for u in ("TiB", "GiB", "MiB", "KiB") if abs(n) >= _UNITS[u]), "bytes")
    return f"{n} bytes" if unit == "bytes" else f"{n / _UNITS[unit]:,.2f} {unit}"


@dataclass(frozen=True)
class CappedStep:
    """One run of the step's loop on CUDA, in a process capped at `cap_bytes` (None: not capped)."""

    allocated_bytes: int = 0
    """`torch.cuda.max_memory_allocated()` over the measured step (0 where it ran out of memory)."""
    reserved_bytes: int = 0
    """`torch.cuda.max_memory_reserved()` over the measured step: the caching allocator's segments."""
    out_of_memory: str = ""
    """The `torch.cuda.OutOfMemoryError` message where the step ran out of memory; "" where it ran."""
    alloc_conf: str = ""
    """PYTORCH_CUDA_ALLOC_CONF of the process ("": torch's default allocator)."""
    cap_bytes: int | None = None
    held_bytes: int = 0
    """What the process held besides the step (a run in the caller's process: remat's own copies): added to its
    cap, and taken off its figures and off those of its out-of-memory message."""

    @property
    def ran(self) -> bool:
        return not self.out_of_memory

    @property
    def expandable(self) -> bool:
        return EXPANDABLE in self.alloc_conf.replace(" ", "")

    def holds(self, budget: int) -> bool:
        """It ran, and the allocator never reserved more than `budget`."""
        return self.ran and self.reserved_bytes <= budget


@dataclass(frozen=True)
class CapVerdict:
    """What the capped runs say about the plan's budget (Rules 3 and 4 of the NOTE)."""

    ok: bool
    allocator: str
    """Which allocator the budget held with: "default allocator", EXPANDABLE, or "" (it did not hold)."""
    message: str
    fix: str = ""
    shortfall_bytes: int = 0
    """How much lower the budget must be (reserved minus budget) where nothing held; 0 otherwise."""


def needs_expandable_rerun(budget: int | None, capped: CappedStep) -> bool:
    """Rule 3: the default allocator's capped step ran out of memory or reserved over the budget."""
    return budget is not None and not capped.holds(budget) and not capped.expandable


def needs_uncapped_run(budget: int | None, capped: CappedStep, expandable: CappedStep | None) -> bool:
    """Rule 4: nothing held under the cap, and no run says how much the step reserves: run it without a cap."""
    if budget is None or capped.holds(budget) or (expandable is not None and expandable.holds(budget)):
        return False
    return not capped.ran


def device_full(step: CappedStep) -> bool:
    """It ran out of memory because the GPU had no more free, not because of its cap: the block asked for is more
    than the GPU had free, and, where the message says what the cap allowed, within it."""
    f = _own(parse_oom(step.out_of_memory), step.held_bytes)
    if step.ran or f.tried is None or f.free is None or f.free >= f.tried:
        return False
    return f.allowed is None or f.in_use is None or f.in_use + f.tried <= f.allowed


def why_not(step: CappedStep, budget: int, allocated: int | None = None) -> str:
    """Why `step` did not hold `budget`, in torch's numbers."""
    under = ""
    if allocated is not None and 0 < allocated <= budget:
        under = f", though its allocated peak, {gib(allocated)}, is {1 - allocated / budget:.0%} under the budget"
    if step.ran:
        return (
            f"reserved {gib(step.reserved_bytes)}, over the budget {gib(budget)} by "
            f"{gib(step.reserved_bytes - budget)}{under}"
        )
    f = _own(parse_oom(step.out_of_memory), step.held_bytes)
    if f.tried is None:
        return f"ran out of memory under a cap of {gib(budget)}: {step.out_of_memory.split('. ')[0]}{under}"
    held = ""
    if f.allocated is not None and f.unallocated is not None:  # what `f.in_use` adds up
        held = (
            f" with {gib(f.allocated + f.unallocated)} of {gib(f.allowed or budget)} in use ({gib(f.allocated)} allocated, "
            f"{gib(f.unallocated)} reserved but unallocated)"
        )
    full = ""
    if f.free is not None and f.free < f.tried:
        full = f"; the GPU itself had only {gib(f.free)} free (other processes hold it)"
    return f"ran out of memory under a cap of {gib(budget)}: asked for {gib(f.tried)}{held}{under}{full}"


def shortfall(
    budget: int, capped: CappedStep, uncapped_reserved: int | None, allocated: int | None
) -> tuple[int, bool]:
    """(bytes the budget must come down by, exact): the reserved peak without a cap minus the budget where it
    was measured; else, from the out-of-memory message, what was reserved plus what was asked for, minus the
    budget (a least figure); else the allocated peak minus the budget."""
    if uncapped_reserved is not None and uncapped_reserved > budget:
        return uncapped_reserved - budget, True
    if capped.ran and capped.reserved_bytes > budget:
        return capped.reserved_bytes - budget, True
    f = _own(parse_oom(capped.out_of_memory), capped.held_bytes)
    if f.in_use is not None and f.tried is not None:
        return max(0, f.in_use + f.tried - budget), False
    return max(0, (allocated or budget) - budget), False


def judge_cap(
    budget: int | None,
    allocated: int | None,
    capped: CappedStep,
    expandable: CappedStep | None = None,
    uncapped_reserved: int | None = None,
) -> CapVerdict:
    """The verdict of Rules 2-4 from the numbers: `allocated` is the planned step's allocated peak (of a run
    without a cap where the capped one ran out), `capped` the run under the cap with the default allocator,
    `expandable` the rerun with EXPANDABLE (None: not run), `uncapped_reserved` the reserved peak of a run with
    no cap (None: not run)."""
    if budget is None or capped.holds(budget):
        return _held(budget, capped)
    why = f"with the default allocator it {why_not(capped, budget, allocated)}"
    if expandable is not None and expandable.holds(budget):
        return CapVerdict(
            True,
            EXPANDABLE,
            f"{why}; with {EXPANDABLE} it ran: reserved "
            f"{gib(expandable.reserved_bytes)}, allocated {gib(expandable.allocated_bytes)}",
            f"the budget holds only with it: {EXPANDABLE_FIX} in your training too",
        )
    if device_full(capped) and not (expandable is not None and expandable.ran):
        return CapVerdict(
            False,
            "",
            why,
            "the GPU was full, not the budget: free the GPU (other processes hold it, "
            "the one that called verify among them) for the budget, and verify again",
        )
    over = allocated is not None and allocated > budget
    if expandable is None and not capped.expandable and not over:
        return CapVerdict(
            False,
            "",
            f"{why}; {EXPANDABLE} was not tried here",
            f"{EXPANDABLE_FIX}, then verify again; if it still runs out, plan a lower budget",
        )
    if expandable is not None:
        why += f"; with {EXPANDABLE} it {why_not(expandable, budget)}"
    short, exact = shortfall(budget, capped, uncapped_reserved, allocated)
    by = gib(short) if exact else f"at least {gib(short)}"
    return CapVerdict(
        False,
        "",
        why,
        f"the plan needs a budget {by} lower (reserved minus budget): plan again for {gib(budget - short)} or less",
        short,
    )


def _held(budget: int | None, capped: CappedStep) -> CapVerdict:
    """The verdict where there is no budget to cap at, or the step ran under its cap."""
    if budget is None:
        return CapVerdict(
            capped.ran,
            "default allocator" if capped.ran else "",
            "no budget to cap at" + ("" if capped.ran else f": {capped.out_of_memory.split('. ')[0]}"),
        )
    which = EXPANDABLE if capped.expandable else "default allocator"
    return CapVerdict(
        True,
        which,
        f"ran under a cap of its budget {gib(budget)} with the {which}: "
        f"reserved {gib(capped.reserved_bytes)}, allocated {gib(capped.allocated_bytes)}",
    )


@dataclass(frozen=True)
class CudaCheck:
    """The CUDA runs of `remat.verify` (NOTE [The budget is the GPU's memory]): JSON-serialisable."""

    where: str
    """FRESH_PROCESS, or THIS_PROCESS where the model could not be rebuilt in a fresh interpreter."""
    capacity_bytes: int
    """The GPU's `total_memory`."""
    budget_bytes: int | None
    capped: CappedStep
    """The planned step under the cap of its budget, with the default allocator."""
    expandable: CappedStep | None = None
    """The same with EXPANDABLE (Rule 3); None where it was not needed or could not be run."""
    uncapped: CappedStep | None = None
    """The planned step without a cap, where nothing held under it (Rule 4): its reserved peak sizes the fix."""
    unplanned: CappedStep | None = None
    """The step without the plan, without a cap."""
    why_here: str = ""
    """Why the step ran in this process and not a fresh one ("" in a fresh one)."""

    def verdict(self, tracked_bytes: int | None = None) -> CapVerdict:
        """`judge_cap` of these runs; the allocated peak is a run's that went through, else `tracked_bytes`."""
        ran = [s for s in (self.capped, self.expandable, self.uncapped) if s is not None and s.ran]
        allocated = ran[0].allocated_bytes if ran else tracked_bytes
        reserved = self.uncapped.reserved_bytes if self.uncapped is not None and self.uncapped.ran else None
        return judge_cap(self.budget_bytes, allocated, self.capped, self.expandable, reserved)
