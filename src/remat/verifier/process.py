"""The process's own memory counters: a measure of a step that is not remat's tracker.

NOTE [Measuring a step by the process]
  Rule 1. The process is started with glibc's mmap threshold at 64 KiB
          (`PROCESS_ENV`): every large tensor then gets a mapping of its own that is
          given back on free, so resident memory follows the live tensors.
  Rule 2. The resident set is read from /proc/self/statm; its high-water mark is
          VmHWM in /proc/self/status (not `ru_maxrss`, which Linux carries over from
          the parent across fork and exec).  Writing 5 to /proc/self/clear_refs resets
          the mark to the current resident set (Linux >= 4.0).
  Rule 3. A step's peak is VmHWM after it minus the resident set before the model is
          built (`step_peak_bytes`): tensors plus a few MB of interpreter and autograd
          overhead, so it is the truth remat's figures are held against
          (../shared/MEASURING.md).  Code torch loads lazily on first use is loaded
          before that baseline by a one-parameter step with the same optimizer: the
          first optimizer imports torch._dynamo (seen: 75 MB of resident code, which
          would otherwise count as the step's).

`python -m remat.verifier.process TARGET [--plan F] [--optimizer adam|sgd|none]` runs one
plain training step of a TARGET in this fresh process and prints `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch

from remat.applier.apply import apply
from remat.measure.step import compute_loss, normalize_inputs
from remat.target import load_target
from remat.types import load_plan

PROCESS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MKL_DISABLE_FAST_MM": "1"}
"""Rule 1: the environment in which resident memory follows the live tensors."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """The process's resident set now (Rule 2)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def high_water_mark_bytes() -> int:
    """The process's peak resident set since it started or since `reset_high_water_mark` (Rule 2)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError("no VmHWM line in /proc/self/status: the process's peak is read on Linux only")


def reset_high_water_mark() -> None:
    """Make the peak resident set equal to the current one (Rule 2)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@dataclass(frozen=True)
class ProcessPeak:
    """One step measured by the process that ran it (Rule 3)."""

    peak_bytes: int
    """VmHWM after the step minus the resident set before the model was built."""
    build_bytes: int
    """Resident set added by building the model, its inputs and the optimizer."""


def step_peak_bytes(target: str, plan_path: str | None = None, optimizer: str = "adam") -> ProcessPeak:
    """Run one plain step of `target` in a fresh interpreter (Rule 1) and return its peak (Rule 3).

    Example:
        >>> step_peak_bytes("remat.zoo:mlp_report000").peak_bytes

    Known limitations: Linux only (/proc); the step is the first one of a new optimizer.
    """
    cmd = [sys.executable, "-m", "remat.verifier.process", target, "--optimizer", optimizer]
    if plan_path is not None:
        cmd += ["--plan", str(plan_path)]
    env = {**os.environ, **PROCESS_ENV}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return ProcessPeak(**json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"the measuring process failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _measure_here(target: str, plan_path: str | None, optimizer: str) -> ProcessPeak:
    _warm_up(optimizer)
    gc.collect()  # every module is imported by now: its code is not counted in the step
    before = resident_bytes()
    model, inputs, loss_fn = load_target(target)
    opt = _optimizer(optimizer, model)
    if plan_path is not None:
        apply(model, load_plan(plan_path))
    built = resident_bytes()
    step = normalize_inputs(inputs)
    out = model(*step.args, **step.kwargs)
    compute_loss(out, loss_fn).backward()
    if opt is not None:
        opt.step()
    return ProcessPeak(high_water_mark_bytes() - before, built - before)


def _warm_up(optimizer: str) -> None:
    """A training step of one parameter: loads what torch loads on first use (Rule 3)."""
    tiny = torch.nn.Linear(1, 1)
    opt = _optimizer(optimizer, tiny)
    tiny(torch.ones(1, 1)).sum().backward()
    if opt is not None:
        opt.step()


def _optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    if name == "adam":
        return torch.optim.Adam(model.parameters())
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01)
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m remat.verifier.process")
    parser.add_argument("target")
    parser.add_argument("--plan", default=None)
    parser.add_argument("--optimizer", choices=("adam", "sgd", "none"), default="adam")
    args = parser.parse_args()
    if os.environ.get("REMAT_THREADS"):
        torch.set_num_threads(int(os.environ["REMAT_THREADS"]))
    result = _measure_here(args.target, args.plan, args.optimizer)
    print("RESULT " + json.dumps(asdict(result)), flush=True)
