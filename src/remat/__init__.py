"""remat: activation checkpointing for PyTorch that works the first time."""

from remat.errors import RematError, UnsupportedOp
from remat.measure import profile
from remat.types import BlockProfile, Breakdown, StepProfile, Timeline

__version__ = "0.1.0"

__all__ = [
    "BlockProfile",
    "Breakdown",
    "RematError",
    "StepProfile",
    "Timeline",
    "UnsupportedOp",
    "profile",
]
