"""How a `StepProfile` written by an older remat reads: each version's JSON upgraded to the next (`UPGRADES`,
for `remat.types._json.load`)."""

from __future__ import annotations

from collections.abc import Callable


def _from_version_2(data: dict) -> dict:
    """Version 2 profiles measured the first step of the optimizer as given."""
    return _from_version_3({**data, "step": "first"})


def _from_version_3(data: dict) -> dict:
    """Version 3 profiles timed ops on the tracked step only (real mode), and fake ones not at all."""
    return _from_version_4({**data, "timing": "tracked" if data.get("step_s") else ""})


def _from_version_4(data: dict) -> dict:
    """Version 4 profiles had no selective variants: their plans keep matmul-like outputs only."""
    return _from_version_5(data)


def _from_version_5(data: dict) -> dict:
    """Version 5 profiles measured a loop that keeps the output through backward."""
    return {**data, "keep_output": True}


UPGRADES: dict[int, Callable[[dict], dict]] = {
    2: _from_version_2,
    3: _from_version_3,
    4: _from_version_4,
    5: _from_version_5,
    6: dict,
    7: dict,
}
"""Version -> what makes it the next one's JSON (version 6 reads as 7 as it is; version 7 as 8, without what is
freed before a block's first forward and backward op: read as 0, a checkpoint's recomputation counts from the
timeline's figure there)."""
