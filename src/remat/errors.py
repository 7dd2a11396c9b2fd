"""Errors raised by remat. Every message starts with `remat:` and says what was
expected, what was seen, and how to fix it."""

from __future__ import annotations


def listing(names, most: int) -> str:
    """How a message lists names: the first `most`, comma-separated, then " ..." if there are more."""
    names = list(names)
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


class RematError(Exception):
    """A user-facing error: bad input, an unsupported model part, an impossible request."""


class NoLoss(RematError):
    """The model's output holds no loss, and no loss_fn says how to make one."""


class UnsupportedOp(RematError):
    """Fake mode met an op it cannot run without real data."""

    def __init__(self, message: str, op: str):
        super().__init__(message)
        self.op = op


class InfeasibleBudget(RematError):
    """No plan reaches the budget. `.min_bytes` is the smallest budget that one does; for a budget under what
    every step holds (parameters, gradients, optimizer state), refused before a compiled search, it is that: a
    bound under the least."""

    def __init__(self, message: str, min_bytes: int, budget_bytes: int):
        super().__init__(message)
        self.min_bytes = min_bytes
        self.budget_bytes = budget_bytes
