"""Explaining a hand-made checkpointing attempt: findings with measured bytes, and the fix (`remat.explain`)."""

from remat.explainer.api import explain

__all__ = ["explain"]
