"""The process's own memory counters: a measure of a step that is not remat's tracker.

NOTE [Measuring a step by the process]
  Rule 1. The process runs with glibc's mmap threshold at 64 KiB (`PROCESS_ENV` for a fresh
          interpreter, `mallopt` in a forked one): every large tensor then gets a mapping of
          its own that is given back on free, so resident memory follows the live tensors.
  Rule 2. The resident set is read from /proc/self/statm; its high-water mark is
          VmHWM in /proc/self/status (not `ru_maxrss`, which Linux carries over from
          the parent across fork and exec).  Writing 5 to /proc/self/clear_refs resets
          the mark to the current resident set (Linux >= 4.0).
  Rule 3. The step is measured in the user's loop (`loop_peak_bytes`): one optimizer kept across
          steps, `out = model(x); loss = loss_fn(out); loss.backward()` per pass, `opt.step()` and
          `zero_grad(set_to_none=True)` per step; in steady mode the third step is measured, as
          ../shared/MEASURING.md says.  Its peak is VmHWM after it minus the resident set before it,
          plus the tensor bytes resident before it (parameters, buffers, inputs, optimizer state, the
          previous output and loss, DDP's gradient buckets): tensors plus a few MB of interpreter and
          autograd overhead.  Under DDP or FSDP2 every rank runs this loop, and each measures its own.
  Rule 4. A fresh interpreter (`step_peak_bytes`, a TARGET) first runs a one-parameter step with
          the same optimizer: the first optimizer imports torch._dynamo (seen: 75 MB of resident
          code), which would otherwise count in a first step.
  Rule 5. A model that lives in the caller's process is measured in a forked copy of it
          (`forked_peak_bytes`): the caller's model, optimizer and memory are untouched.  The copy
          runs on one thread: a forked process cannot use its parent's OpenMP threads.
  Rule 6. On CUDA the counter is the caching allocator's `max_memory_allocated()` over the measured
          step, minus what was allocated before it, plus the step's resident tensors (`cuda_peak_bytes`).

`python -m remat.verifier.process TARGET [--plan F] [--optimizer adam|sgd|none] [--step steady|first]
[--accumulate K]` runs the loop of a TARGET in this fresh process and prints `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn as nn

from remat.applier.apply import apply
from remat.errors import RematError
from remat.procmem import (
    PROCESS_ENV,
    CopyFailed,
    high_water_mark_bytes,
    in_forked_copy,
    reset_high_water_mark,
    resident_bytes,
)
from remat.measure.loop import Loop, clear_grads, optimizer_step_of_loop, resident_tensors, storage_bytes, tensors_in
from remat.measure.parallel import ddp_bucket_total
from remat.measure.step import make_optimizer, normalize_inputs
from remat.target import load_target
from remat.types import Step, load_plan

@dataclass(frozen=True)
class ProcessPeak:
    """One step measured by the process that ran it (Rule 3)."""

    peak_bytes: int
    """The measured step's peak: VmHWM over it minus the resident set before it, plus its resident tensors."""
    resident_bytes: int
    """Tensor bytes resident before the measured step (parameters, buffers, inputs, optimizer state, ...)."""
    step_s: float = 0.0
    """Wall seconds of a step of the loop as it ran here: the fastest step timed after the first (which holds
    compilation and the optimizer state's creation), or the first when it is the only one.  A forked copy runs
    on one thread."""


def step_peak_bytes(
    target: str, plan_path: str | None = None, optimizer: str = "adam", step: str = "steady", accumulate: int = 1
) -> ProcessPeak:
    """Run the loop of `target` in a fresh interpreter (Rules 1 and 4) and return its measured step's peak.

    Example:
        >>> step_peak_bytes("remat.zoo:mlp_report000").peak_bytes

    Known limitations: Linux only (/proc).
    """
    cmd = [sys.executable, "-m", "remat.verifier.process", target, "--optimizer", optimizer, "--step", step]
    cmd += ["--accumulate", str(accumulate)]
    if plan_path is not None:
        cmd += ["--plan", str(plan_path)]
    env = {**os.environ, **PROCESS_ENV}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return ProcessPeak(**json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"the measuring process failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def loop_peak_bytes(model: nn.Module, inputs: Any, loss_fn, opt: torch.optim.Optimizer | None, loop: Loop,
                    timed_steps: int = 0) -> ProcessPeak:
    """Run the user's training loop on `model` here and measure its last step by this process (Rule 3); then
    `timed_steps` more steps, timed only, for a steadier `step_s`."""
    step = normalize_inputs(inputs)
    steps = 3 if loop.step == Step.STEADY else 1
    held: list = []
    seconds = []
    for i in range(steps + timed_steps):
        if i == steps - 1:
            gc.collect()
            resident = storage_bytes(resident_tensors(model, step, opt) + tensors_in(held)) + ddp_bucket_total(model)
            reset_high_water_mark()
            before = resident_bytes()
        start = time.perf_counter()
        optimizer_step_of_loop(model, step, loss_fn, opt, loop, held)
        clear_grads(model, opt)
        seconds.append(time.perf_counter() - start)
        if i == steps - 1:
            peak = high_water_mark_bytes() - before + resident
    return ProcessPeak(peak, resident, min(seconds[1:] or seconds))


def cuda_peak_bytes(model: nn.Module, inputs: Any, loss_fn, opt: torch.optim.Optimizer | None, loop: Loop,
                    timed_steps: int = 0) -> ProcessPeak:
    """The same loop on CUDA, counted by the caching allocator (Rule 6).  Changes the model: run it on a snapshot."""
    step = normalize_inputs(inputs)
    held: list = []
    seconds = []
    clear_grads(model, opt)
    steps = 3 if loop.step == Step.STEADY else 1
    for i in range(steps + timed_steps):
        torch.cuda.synchronize()
        if i < steps:
            resident = storage_bytes(resident_tensors(model, step, opt) + tensors_in(held), rounding=512)
            resident += ddp_bucket_total(model, rounding=512)
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        optimizer_step_of_loop(model, step, loss_fn, opt, loop, held)
        clear_grads(model, opt)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        if i == steps - 1:
            peak = torch.cuda.max_memory_allocated() - before + resident
    return ProcessPeak(peak, resident, min(seconds[1:] or seconds))


def forked_peak_bytes(model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop, timed_steps: int = 0) -> ProcessPeak:
    """`loop_peak_bytes` in a forked copy of this process (Rules 1 and 5): nothing here is changed.

    Known limitations: Linux with glibc; the copy runs on one thread."""

    def measure() -> dict:
        return asdict(loop_peak_bytes(model, inputs, loss_fn, make_optimizer(optimizer, model), loop, timed_steps))

    try:
        return ProcessPeak(**in_forked_copy(measure))
    except CopyFailed as e:
        raise RematError(
            f"remat: the step failed in the process that measures it: {e}. Expected the step that ran in "
            "remat's tracker to run again in a copy of this process. Fix: report this to remat."
        ) from e


def _measure_here(target: str, plan_path: str | None, optimizer: str, loop: Loop) -> ProcessPeak:
    _warm_up(optimizer)
    model, inputs, loss_fn = load_target(target)
    opt = _optimizer(optimizer, model)
    if plan_path is not None:
        apply(model, load_plan(plan_path))
    return loop_peak_bytes(model, inputs, loss_fn, opt, loop)


def _warm_up(optimizer: str) -> None:
    """A training step of one parameter: loads what torch loads on first use (Rule 4)."""
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
    parser.add_argument("--step", choices=tuple(Step), default=Step.STEADY)
    parser.add_argument("--accumulate", type=int, default=1)
    args = parser.parse_args()
    if os.environ.get("REMAT_THREADS"):
        torch.set_num_threads(int(os.environ["REMAT_THREADS"]))
    result = _measure_here(args.target, args.plan, args.optimizer, Loop.of(args.step, args.accumulate))
    print("RESULT " + json.dumps(asdict(result)), flush=True)
