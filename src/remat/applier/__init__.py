"""Applying a plan: checkpoints and offload hooks installed on a model in place, and removed again."""

from remat.applier.apply import applied, apply, checkpoint, remove, taken_off

__all__ = ["applied", "apply", "checkpoint", "remove", "taken_off"]
