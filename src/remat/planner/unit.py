"""A unit: what the solvers choose among (one checkpoint, selective checkpoint or offload over sibling blocks), with
what it frees and holds and what it costs (`remat.planner.units` builds them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from remat.planner.effects import Effect
from remat.planner.holds import Hold
from remat.types import Action


class Group(NamedTuple):
    """Sibling candidates, the blocks a run of units is cut from."""

    parent: str
    """The candidate enclosing them ("" for blocks inside no other candidate)."""
    container: str
    """Dotted path of the module that holds them."""


@dataclass(frozen=True, slots=True)
class Unit:
    """Consecutive sibling blocks wrapped in one checkpoint."""

    blocks: tuple[str, ...]
    group: Group
    position: int
    """Index of the first block in its group."""
    covers: frozenset[str]
    """The blocks and every candidate nested in them: no other unit may touch these."""
    cost_flops: int
    cost_s: float
    effects: tuple[Effect, ...]
    appliable: bool = True
    """remat.apply can build it: one block, or a run of siblings inside an nn.Sequential or nn.ModuleList."""
    action: Action = Action.RECOMPUTE
    """RECOMPUTE (a checkpoint), SELECTIVE (keep some outputs, recompute the rest) or OFFLOAD."""
    cost_ops: int = 0
    """Ops re-run: among plans of equal FLOPs, solvers prefer fewer (elementwise ops count 0 FLOPs)."""
    transfer_bytes: int = 0
    """Offload: bytes copied to CPU memory and back (`cost_flops` is then a FLOP-equivalent, Rule 6)."""
    holds: tuple[Hold, ...] = ()
    """Inputs held that units starting at other blocks may hold too (Rule 2): not in `effects`."""
    keeps: tuple[str, ...] = ()
    """A selective unit's variant: the signatures of the ops whose outputs it keeps; () the matmul policy."""
    calls: int = 1
    """How many forward calls of its blocks it checkpoints (NOTE [A module called more than once]); dp plans only
    units of one."""
    moment_bytes: int = 0
    """Bytes its recomputation adds, at its last block's first backward op, to the most of the elementary interval
    that starts there (Rule 3, `remat.planner.rerun`): its last effect, of minus this, and not in `reduction_bytes`."""
    narrow: tuple[Effect, ...] = ()
    """Effects that would start where no other effect or hold starts or ends (a kept output's hold in a selective
    cache, Rule 4): `rerun.widen` spreads them over the elementary intervals of the others into `effects`."""
    spread_bytes: int = 0
    """What spreading `narrow` added to the sum of `effects` beyond their own bytes: not in `reduction_bytes`."""
    kept: tuple[Hold, ...] = ()
    """Inputs autograd keeps for ops outside the unit, which it holds on where a chosen unit frees them
    (`holds.kept_holds`, `frees`): not in `holds`; `dp` counts them as always held (`reduction_bytes` too)."""
    frees: tuple[Hold, ...] = ()
    """The saved outputs the unit frees that another unit may hold as a kept input (`holds.freed_outputs`; bytes 0)."""

    @property
    def key(self) -> tuple:
        return (self.action, *self.blocks, *self.keeps)

    @property
    def cost_ns(self) -> int:
        """Rule 7: `cost_s` in the whole nanoseconds solvers count (exact sums)."""
        return round(self.cost_s * 1e9)

    def cost(self, timed: bool) -> tuple[int, int]:
        """Rule 7: (cost, tie-break): (nanoseconds, FLOPs) when the profile is timed, else (FLOPs, ops re-run)."""
        return (self.cost_ns, self.cost_flops) if timed else (self.cost_flops, self.cost_ops)

    reduction_bytes: int = field(init=False, compare=False)
    """Bytes the unit frees while fully held (Rules 1 and 2): its effects less its holds, but for the moment of its
    recomputation (Rule 3)."""

    def __post_init__(self) -> None:
        freed = sum(e.bytes for e in (*self.effects, *self.narrow)) - sum(h.bytes for h in (*self.holds, *self.kept))
        freed += self.moment_bytes + self.spread_bytes
        object.__setattr__(self, "reduction_bytes", freed)
