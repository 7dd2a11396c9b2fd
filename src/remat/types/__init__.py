"""All of remat's public data, in one place: what a profile, a plan, a verification and an
explanation hold, and what goes into their JSON.

Every class is a frozen dataclass of plain values whose field names carry their units
(`*_bytes`, `*_s`, `*_flops`); the words they are made of are the enums of `kinds`.
Nothing here measures, plans or prints: `str()` of each is the report that
`remat.report` registers (see `remat.types._text`).
"""

from remat.types.explanation import PLAN_FAILED, CheckpointCallSite, CheckpointRegion, Explanation, Finding
from remat.types.kinds import KEEP_ALL_SOLVER, Action, Mode, ParallelKind, Recipe, Severity, Solver, Step
from remat.types.plan import BY_HAND, PLAN_FORMAT, PLAN_VERSION, Plan, PlannedBlock, load_plan
from remat.types.profile import (
    CATEGORIES,
    PHASES,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    BlockProfile,
    SelectiveVariant,
    Breakdown,
    StepProfile,
    Timeline,
)
from remat.types.verification import VerifyReport

__all__ = [
    "BY_HAND",
    "CATEGORIES",
    "KEEP_ALL_SOLVER",
    "PHASES",
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "Action",
    "BlockProfile",
    "SelectiveVariant",
    "Breakdown",
    "CheckpointCallSite",
    "CheckpointRegion",
    "Explanation",
    "PLAN_FAILED",
    "Finding",
    "Mode",
    "ParallelKind",
    "Plan",
    "PlannedBlock",
    "Recipe",
    "Severity",
    "Solver",
    "Step",
    "StepProfile",
    "Timeline",
    "VerifyReport",
    "load_plan",
]
