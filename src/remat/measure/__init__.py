"""Measurement of one training step: the tracker, fake mode, candidate modules."""

from remat.measure.profiling import profile

__all__ = ["profile"]
