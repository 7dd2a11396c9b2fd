"""What the solvers choose among: a *unit* (one checkpoint, selective checkpoint or offload over sibling blocks)
and its cost, NOTE [The memory model of a plan] in `remat.planner.problem` (Rules 1-7)."""

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
    """Bytes the unit frees while fully held (Rules 1 and 2): its effects less its holds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reduction_bytes", sum(e.bytes for e in self.effects) - sum(h.bytes for h in self.holds))
