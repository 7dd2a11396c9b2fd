"""Rewriting a model so its training step follows a plan (in place, reversible), and checking it."""

from remat.rewrite.apply import applied, apply, auto, checkpoint, remove
from remat.rewrite.verify import VerifyReport, verify

__all__ = ["VerifyReport", "applied", "apply", "auto", "checkpoint", "remove", "verify"]
