"""remat: activation checkpointing for PyTorch that works the first time.

The public contract: the names below (docs/architecture.md says which part owns each; the README shows them in use).
"""

from remat import report as _report  # noqa: F401  (registers the text reports that str() of the data shows)
from remat.applier import apply, checkpoint, remove
from remat.errors import InfeasibleBudget, RematError, UnsupportedOp
from remat.explainer import explain
from remat.entry import auto, profile
from remat.planner import frontier, plan
from remat.types import (
    BlockProfile,
    SelectiveVariant,
    Breakdown,
    Explanation,
    Finding,
    Plan,
    StepProfile,
    Timeline,
    VerifyReport,
    load_plan,
)
from remat.verifier import verify

__version__ = "0.1.0"

__all__ = [
    "BlockProfile",
    "SelectiveVariant",
    "Breakdown",
    "Explanation",
    "Finding",
    "InfeasibleBudget",
    "Plan",
    "RematError",
    "StepProfile",
    "Timeline",
    "UnsupportedOp",
    "VerifyReport",
    "apply",
    "auto",
    "checkpoint",
    "explain",
    "frontier",
    "load_plan",
    "plan",
    "profile",
    "remove",
    "verify",
]
