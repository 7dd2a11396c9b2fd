"""The process's own memory counters: a measure of a step that is not remat's tracker.

NOTE [Measuring a step by the process]
  Rule 1. The process runs with glibc's mmap threshold at 64 KiB (`PROCESS_ENV` for a fresh
          interpreter, `mallopt` in a forked one): every large tensor then gets a mapping of
          its own that is given back on free, so resident memory follows the live tensors.
          Free heap memory is held (`map_large_allocations`) when the copy starts and again before
          each step of the loop: a forked copy inherits tensors its parent put on the heap
          (whose own threshold had risen), and once the copy frees them (`zero_grad`) their
          resident memory would serve the measured step unseen (seen: 20 MiB of a 245 MiB
          step), or hold a tensor the step frees and leave its memory resident (seen: 8 MiB).
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
          step, minus what was allocated before it, plus the step's resident tensors and cuBLAS's
          workspaces (as much of what was allocated before it beyond those tensors as two workspaces
          take: the rest is other memory of this process; `cuda_peak_bytes`).

`python -m remat.verifier.process TARGET [--plan F] [--optimizer adam|sgd|none] [--step steady|first]
[--accumulate K] [--loss-only]` runs the loop of a TARGET in this fresh process and prints `RESULT {json}`.
On CUDA, `--device cuda [--budget-bytes N | --device-fraction F] [--alloc-conf S] [--saved F]` caps the caching
allocator and measures its reserve too (NOTE [The budget is the GPU's memory] in `remat.verifier.verify`).
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
    map_large_allocations,
    in_forked_copy,
    reset_high_water_mark,
    resident_bytes,
)
from remat.measure.device.cuda_workspaces import cublas_workspace_bytes, device_arch
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
    allocated_peak_bytes: int = 0
    """On CUDA, `torch.cuda.max_memory_allocated()` over the measured step: all of the process's allocations."""
    reserved_peak_bytes: int = 0
    """On CUDA, `torch.cuda.max_memory_reserved()` over the measured step: the caching allocator's segments."""
    out_of_memory: str = ""
    """On CUDA, the `torch.cuda.OutOfMemoryError` message where the loop ran out of memory (under a cap,
    NOTE [The budget is the GPU's memory]); "" where it ran."""


def step_peak_bytes(
    target: str,
    plan_path: str | None = None,
    optimizer: str = "adam",
    step: str = "steady",
    accumulate: int = 1,
    *,
    keep_output: bool = True,
    device: str | None = None,
    budget_bytes: int | None = None,
    alloc_conf: str | None = None,
) -> ProcessPeak:
    """Run the loop of `target` in a fresh interpreter (Rules 1 and 4) and return its measured step's peak.

    Example:
        >>> step_peak_bytes("remat.zoo:mlp_report000").peak_bytes

    On CUDA (`device`), the process's caching allocator can be capped at `budget_bytes` and run with
    PYTORCH_CUDA_ALLOC_CONF=`alloc_conf` (NOTE [The budget is the GPU's memory]).

    Known limitations: Linux only (/proc).
    """
    cmd = [sys.executable, "-m", "remat.verifier.process", target, "--optimizer", optimizer, "--step", step]
    cmd += ["--accumulate", str(accumulate)] + ([] if keep_output else ["--loss-only"])
    if plan_path is not None:
        cmd += ["--plan", str(plan_path)]
    cmd += device_options(device, budget_bytes, alloc_conf)
    return run_measuring(cmd, {**os.environ, **PROCESS_ENV, **alloc_env(alloc_conf)})


def device_options(device: str | None, budget_bytes: int | None, alloc_conf: str | None) -> list[str]:
    """The runner's options for a CUDA step: where it runs, its cap, its allocator's settings."""
    cmd = [] if device is None else ["--device", device]
    cmd += [] if budget_bytes is None else ["--budget-bytes", str(budget_bytes)]
    return cmd + ([] if alloc_conf is None else ["--alloc-conf", alloc_conf])


def alloc_env(alloc_conf: str | None) -> dict[str, str]:
    """The environment that sets the caching allocator's settings before torch is imported (both of the names
    torch reads: PYTORCH_ALLOC_CONF, which newer releases read first, and PYTORCH_CUDA_ALLOC_CONF)."""
    return {} if alloc_conf is None else {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf, "PYTORCH_ALLOC_CONF": alloc_conf}


UNLOADABLE_EXIT = 3
"""The runner's exit status where the model saved for it (`--saved`) cannot be loaded in a fresh interpreter."""


class Unloadable(Exception):
    """The fresh interpreter could not load the saved model (its class is not importable there)."""


def run_measuring(cmd: list[str], env: dict[str, str]) -> ProcessPeak:
    """Run the runner's command line `cmd` and read its `RESULT`; its `remat:` error is raised as one."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return ProcessPeak(**json.loads(line[len("RESULT ") :]))
    if done.returncode == UNLOADABLE_EXIT:
        raise Unloadable(done.stderr.strip()[-2000:])
    refused = [line for line in done.stderr.splitlines() if line.startswith("remat: ")]
    if refused:
        raise RematError(refused[-1])
    raise RuntimeError(f"the measuring process failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def loop_peak_bytes(
    model: nn.Module, inputs: Any, loss_fn, opt: torch.optim.Optimizer | None, loop: Loop, timed_steps: int = 0
) -> ProcessPeak:
    """Run the user's training loop on `model` here and measure its last step by this process (Rule 3); then
    `timed_steps` more steps, timed only, for a steadier `step_s`."""
    step = normalize_inputs(inputs)
    steps = 3 if loop.step == Step.STEADY else 1
    held: list = []
    seconds = []
    for i in range(steps + timed_steps):
        if i < steps:
            gc.collect()
            map_large_allocations()  # Rule 1: what earlier steps freed on the heap serves no counted step unseen
        if i == steps - 1:
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


def cuda_peak_bytes(
    model: nn.Module, inputs: Any, loss_fn, opt: torch.optim.Optimizer | None, loop: Loop, timed_steps: int = 0
) -> ProcessPeak:
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
            peak = torch.cuda.max_memory_allocated() - before + resident + _workspaces(before - resident, model)
            allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    return ProcessPeak(peak, resident, min(seconds[1:] or seconds), allocated, reserved)


def _workspaces(untracked: int, model: nn.Module) -> int:
    """Rule 6: of what the allocator held before the step beyond its resident tensors, the cuBLAS workspaces of
    the two threads that run matmuls (NOTE [CUDA memory that is no tensor], Rule 1), which the step holds too;
    the rest (another model, a snapshot of this one) is not the step's."""
    device = next((p.device for p in model.parameters()), torch.device("cuda"))
    return min(max(0, untracked), 2 * cublas_workspace_bytes(device_arch(device)))


def forked_peak_bytes(
    model: nn.Module, inputs: Any, loss_fn, optimizer, loop: Loop, timed_steps: int = 0
) -> ProcessPeak:
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


def runner_parser() -> argparse.ArgumentParser:
    from remat.verifier.cuda_cap import add_cuda_options  # it imports this module

    parser = argparse.ArgumentParser(prog="python -m remat.verifier.process")
    parser.add_argument("target", nargs="?")
    parser.add_argument("--plan", default=None)
    parser.add_argument("--optimizer", choices=("adam", "sgd", "none"), default="adam")
    parser.add_argument("--step", choices=tuple(Step), default=Step.STEADY)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--loss-only", action="store_true")
    add_cuda_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The runner: a TARGET's loop (or a saved model's, on CUDA) measured in this fresh process; `RESULT {json}`."""
    from remat.verifier.cuda_cap import check_runner_args, measure_on_cuda, wants_restart

    argv = sys.argv[1:] if argv is None else argv
    args = runner_parser().parse_args(argv)
    try:
        check_runner_args(args, (args.device or "").startswith("cuda") and torch.cuda.is_available())
    except RematError as e:
        print(str(e), file=sys.stderr)
        return 2
    if wants_restart(args.alloc_conf):  # torch reads the allocator's settings from the environment at its start
        env = {**os.environ, **alloc_env(args.alloc_conf)}
        os.execve(sys.executable, [sys.executable, "-m", "remat.verifier.process", *argv], env)
    if os.environ.get("REMAT_THREADS"):
        torch.set_num_threads(int(os.environ["REMAT_THREADS"]))
    loop = Loop.of(args.step, args.accumulate, not args.loss_only)
    if args.device is not None and torch.device(args.device).type == "cuda":
        result = measure_on_cuda(args, loop)
    else:
        result = _measure_here(args.target, args.plan, args.optimizer, loop)
    print("RESULT " + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
