"""What a long call is doing, for the person waiting: `progress=` of `remat.profile` and `remat.verify`.

A progress callable is called as `progress(phase, done)`: `phase` says in words what runs now ("forward",
"timing the step", "the step with the plan"), `done` how far it got (ops tracked so far, a round's number; 0
where nothing is counted).  `progress=True` writes a line to stderr each time the phase changes, with the
seconds since the call began: it shows in a terminal, a log file and a pipe alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from remat.errors import RematError

Progress = Callable[[str, int], None]


class PhaseLines:
    """A progress callable writing `remat: <what>: <phase> (<seconds> s)` to `stream` (stderr) when the phase
    changes."""

    def __init__(self, what: str, stream: TextIO | None = None):
        self.what = what
        self.stream = stream
        self.start = time.perf_counter()
        self.last: str | None = None

    def __call__(self, phase: str, done: int = 0) -> None:
        if phase == self.last:
            return
        self.last = phase
        seconds = time.perf_counter() - self.start
        print(f"remat: {self.what}: {phase} ({seconds:.1f} s)", file=self.stream or sys.stderr, flush=True)


def resolve(progress: bool | Progress | None, what: str) -> Progress | None:
    """The callable a `progress=` argument means: None/False nothing, True `PhaseLines(what)`, a callable itself."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return PhaseLines(what)
    if callable(progress):
        return progress
    raise RematError(
        f"remat: progress= takes True (a line on stderr per phase), False or None (nothing), or a callable "
        f"progress(phase: str, done: int); saw {type(progress).__name__}. Fix: progress=True."
    )


def say(progress: Progress | None, phase: str, done: int = 0) -> None:
    """`progress(phase, done)` if there is one."""
    if progress is not None:
        progress(phase, done)
