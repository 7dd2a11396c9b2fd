"""What the rules of `remat.explain` read (`Evidence`, gathered by `remat.explainer.api`), and the
text helpers they share.  The rules themselves: `remat.explainer.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from remat._torch_compat import DropoutBase
from remat.errors import listing
from remat.planner.problem import Problem
from remat.report.text import fmt_bytes, fmt_flops
from remat.types import CheckpointRegion, Plan, StepProfile


@dataclass(frozen=True)
class Evidence:
    """Everything the rules read (see `remat.explainer.api`)."""

    modules: dict[str, nn.Module]
    plain: StepProfile
    """The step without the model's checkpoints (measured)."""
    written: StepProfile | None
    """The step as written (measured); None if it cannot run."""
    written_error: str
    regions: list[CheckpointRegion]
    recomputed: set[str]
    """Modules whose forward ran again in backward, as written."""
    problem: Problem
    """The planner's problem on `plain`."""
    plan: Plan
    least_peak_bytes: int
    """The lowest peak any plan reaches (predicted)."""
    kv_cache: tuple[int, int] | None
    """(peak with the KV cache, peak with use_cache=False), measured; None if no cache is built."""
    observed_bytes: int | None
    reserved_bytes: int | None
    compiled: bool = False
    """The model explained runs compiled (`torch.compile(model)` or `model.compile()`)."""
    compiler_budget: float = 1.0
    """torch.compile's activation memory budget set in this process when explain ran (torch's config; 1.0 its
    default)."""


def dropouts(ev: Evidence, names=None) -> list[str]:
    """The dropout modules among `names` (every module: None) that draw random numbers (training, p > 0)."""
    names = ev.modules if names is None else names
    return [n for n in names if isinstance(m := ev.modules.get(n), DropoutBase) and m.training and m.p > 0]


def _b(n: int) -> str:
    return fmt_bytes(n, "auto")


def _gflop(flops: int) -> str:
    return f"{fmt_flops(flops)} GFLOP"


def _few(names, n: int = 3) -> str:
    """The first `n` names, "..." for the rest."""
    names = list(names)
    return listing(names, n)
