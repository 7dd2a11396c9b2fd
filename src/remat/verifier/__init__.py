"""Verifying a plan: the step with and without it, and the process's own memory counters."""

from remat.verifier.verify import verify

__all__ = ["verify"]
