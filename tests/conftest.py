"""Suite-wide settings: one intra-op thread.

On the 2-core machines this project runs on, two intra-op threads make small steps
10-20x slower when anything else runs; tests assert bytes and FLOPs, never times.
"""

import importlib
import os

import torch

torch.set_num_threads(1)

# The suite checks what timing reports and how plans use it, never how precise it is: one round of timed
# steps per profile and per verify (users get REPEATS = 3 and TIME_ROUNDS = 5); test_seconds.py passes its own.
importlib.import_module("remat.measure.timing").REPEATS = 1
importlib.import_module("remat.verifier.verify").TIME_ROUNDS = 1
# The command line's progress lines on stderr (a line per phase where stderr is no terminal, as under pytest) off:
# tests read its messages; test_cli.py turns them on where it checks them.
os.environ["REMAT_PROGRESS"] = "off"


import pytest  # noqa: E402

from remat.verifier.process import step_peak_bytes  # noqa: E402

PROCESS_TARGETS = __file__.replace("conftest.py", "process_targets.py")


@pytest.fixture
def process_peak(monkeypatch):
    """`process_peak(factory, plan_path=None, step="steady", accumulate=1, keep_output=True)`: the peak of the measured step
    of a plain training loop (one Adam kept across steps; the third step in steady mode) of
    tests/process_targets.py:`factory`, measured by the process that ran it in a fresh interpreter
    (NOTE [Measuring a step by the process]), never by remat's tracker.  One intra-op thread, as in this suite."""
    monkeypatch.setenv("REMAT_THREADS", "1")

    def measure(
        factory: str, plan_path=None, step: str = "steady", accumulate: int = 1, keep_output: bool = True
    ) -> int:
        return step_peak_bytes(
            f"{PROCESS_TARGETS}:{factory}", plan_path, step=step, accumulate=accumulate, keep_output=keep_output
        ).peak_bytes

    return measure
