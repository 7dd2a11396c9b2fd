"""Explain a hand-made checkpointing attempt: findings with measured bytes, and the fix (`remat.explain`)."""

from remat.lint.api import explain
from remat.lint.finding import CheckpointRegion, Explanation, Finding

__all__ = ["CheckpointRegion", "Explanation", "Finding", "explain"]
