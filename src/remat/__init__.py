"""remat: activation checkpointing for PyTorch that works the first time."""

from remat.errors import InfeasibleBudget, RematError, UnsupportedOp
from remat.measure import profile
from remat.planner import Plan, frontier, load_plan, plan
from remat.rewrite import VerifyReport, apply, auto, checkpoint, remove, verify
from remat.lint import Explanation, Finding, explain
from remat.types import BlockProfile, Breakdown, StepProfile, Timeline

__version__ = "0.1.0"

__all__ = [
    "Explanation",
    "Finding",
    "explain",
    "VerifyReport",
    "apply",
    "auto",
    "checkpoint",
    "remove",
    "verify",
    "InfeasibleBudget",
    "Plan",
    "frontier",
    "load_plan",
    "plan",
    "BlockProfile",
    "Breakdown",
    "RematError",
    "StepProfile",
    "Timeline",
    "UnsupportedOp",
    "profile",
]
