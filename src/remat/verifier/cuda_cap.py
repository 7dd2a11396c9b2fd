"""The planned CUDA step run under a cap of its budget: NOTE [The budget is the GPU's memory] (in
`remat.verifier.verify`), Rules 1-4.  The runner's side (`python -m remat.verifier.process ... --device cuda
--budget-bytes N`) and `remat.verify`'s side (`cuda_check`); the verdict's arithmetic is `remat.types.capped`."""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from remat._torch_compat.distributed import is_compiled
from remat.applier.apply import apply, remove
from remat.errors import RematError
from remat.measure.loop import Loop, clear_grads, resident_tensors, storage_bytes
from remat.measure.step import StateSnapshot, make_optimizer, normalize_inputs
from remat.procmem import PROCESS_ENV
from remat.target import load_target
from remat.types import Plan, load_plan
from remat.types.capped import (
    EXPANDABLE,
    FRESH_PROCESS,
    THIS_PROCESS,
    CappedStep,
    CudaCheck,
    needs_expandable_rerun,
    needs_uncapped_run,
)
from remat.verifier import process
from remat.verifier.process import ProcessPeak, Unloadable, cuda_peak_bytes, run_measuring, step_peak_bytes

CUDA_ONLY = ("--device-fraction", "--budget-bytes", "--alloc-conf", "--saved")


def add_cuda_options(parser: argparse.ArgumentParser) -> None:
    """The runner's options for a CUDA step (Rule 1)."""
    parser.add_argument("--device", default=None, help="where the TARGET's factory builds: cpu (default) or cuda[:i]")
    parser.add_argument(
        "--device-fraction",
        type=float,
        default=None,
        metavar="F",
        help="cap the caching allocator at F of the GPU's memory (set_per_process_memory_fraction)",
    )
    parser.add_argument(
        "--budget-bytes",
        type=int,
        default=None,
        metavar="N",
        help="cap the caching allocator at N bytes: a fraction N / total_memory (at most 1)",
    )
    parser.add_argument(
        "--alloc-conf",
        default=None,
        metavar="S",
        help="run with PYTORCH_CUDA_ALLOC_CONF=S (set before torch is imported: the runner restarts)",
    )
    parser.add_argument(
        "--saved",
        default=None,
        metavar="F",
        help="instead of a TARGET, a file torch.save wrote: {model, inputs, loss_fn, optimizer}",
    )


def check_runner_args(args: argparse.Namespace, cuda_available: bool) -> None:
    """The runner's options that make no sense together, refused with a `remat:` error before anything runs."""
    if (args.target is None) == (args.saved is None):
        seen = "both" if args.target is not None else "neither"
        raise RematError(
            f"remat: the runner measures a TARGET or a model saved with --saved F; saw {seen}. Fix: give exactly one."
        )
    if args.device_fraction is not None and args.budget_bytes is not None:
        raise RematError(
            f"remat: --device-fraction {args.device_fraction} and --budget-bytes {args.budget_bytes} "
            "both set the cap; expected one. Fix: give --budget-bytes (the plan's budget) alone."
        )
    if args.device_fraction is not None and not 0 < args.device_fraction <= 1:
        raise RematError(
            f"remat: --device-fraction is a fraction of the GPU's memory, in (0, 1]; saw "
            f"{args.device_fraction}. Fix: give e.g. --device-fraction 0.5, or --budget-bytes N."
        )
    if args.budget_bytes is not None and args.budget_bytes <= 0:
        raise RematError(
            f"remat: --budget-bytes is the plan's budget in bytes, more than 0; saw {args.budget_bytes}. "
            "Fix: give the budget the plan was made for (`Plan.budget_bytes`)."
        )
    if args.alloc_conf is not None and not all(":" in part for part in args.alloc_conf.split(",")):
        raise RematError(
            f"remat: --alloc-conf is PYTORCH_CUDA_ALLOC_CONF, key:value[,key:value]; saw "
            f"{args.alloc_conf!r}. Fix: give e.g. --alloc-conf {EXPANDABLE}."
        )
    _check_device(args, cuda_available)


def _check_device(args: argparse.Namespace, cuda_available: bool) -> None:
    try:
        kind = "cpu" if args.device is None else torch.device(args.device).type
    except RuntimeError:
        kind = args.device
    if kind not in ("cpu", "cuda"):
        raise RematError(
            f"remat: --device {args.device}: the runner measures a step on cpu or cuda. "
            "Fix: give --device cuda (or cuda:N), or leave --device out for the CPU."
        )
    given = [o for o in CUDA_ONLY if getattr(args, o[2:].replace("-", "_")) is not None]
    if kind == "cpu" and given:
        raise RematError(
            f"remat: {given[0]} is for a CUDA step (its caching allocator), but the step runs on the "
            "CPU (no --device cuda). Expected --device cuda with it. Fix: add --device cuda, or drop "
            f"{given[0]}: a CPU step's peak is the process's high-water mark."
        )
    if kind == "cuda" and not cuda_available:
        raise RematError(
            f"remat: --device {args.device} runs the step on a GPU, but this machine has no CUDA device "
            f"(torch {torch.__version__}). Fix: run it on a machine with a GPU, or leave --device out."
        )


def wants_restart(alloc_conf: str | None) -> bool:
    """The allocator's settings asked for are not yet in the environment torch read them from."""
    return alloc_conf is not None and any(os.environ.get(k) != v for k, v in process.alloc_env(alloc_conf).items())


def measure_on_cuda(args: argparse.Namespace, loop: Loop) -> ProcessPeak:
    """The runner on CUDA: the cap set before anything is allocated, the model built (or loaded) under it, the
    plan applied and the loop measured; running out of memory is a result, with torch's message."""
    device = torch.device(args.device)
    if device.index is not None:
        torch.cuda.set_device(device)
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = args.device_fraction or (min(1.0, args.budget_bytes / total) if args.budget_bytes else None)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        model, inputs, loss_fn, opt = _built(args)
        if args.plan is not None:
            apply(model, load_plan(args.plan))
        return cuda_peak_bytes(model, inputs, loss_fn, opt, loop)
    except (torch.cuda.OutOfMemoryError, RematError) as e:
        return ProcessPeak(0, 0, out_of_memory=out_of_memory(e))


def out_of_memory(e: BaseException) -> str:
    """torch's message where `e` is, or was raised from, a `torch.cuda.OutOfMemoryError` (the loop's user code turns
    it into a `remat:` error, `run_user_code`); `e` raised again otherwise."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, torch.cuda.OutOfMemoryError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        raise e
    return str(cause)


def _built(args: argparse.Namespace) -> tuple[nn.Module, Any, Any, torch.optim.Optimizer | None]:
    if args.target is not None:
        model, inputs, loss_fn = load_target(args.target, device=args.device)
        return model, inputs, loss_fn, process._optimizer(args.optimizer, model)
    try:
        saved = torch.load(args.saved, weights_only=False)
    except (ImportError, AttributeError, pickle.UnpicklingError) as e:
        print(f"cannot load {args.saved} in a fresh interpreter: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(process.UNLOADABLE_EXIT) from e
    model = saved["model"]
    return model, saved["inputs"], saved["loss_fn"], make_optimizer(saved["optimizer"], model)


# -- remat.verify's side -----------------------------------------------------------------------------------------

Run = Callable[[bool, "int | None", "str | None"], "tuple[CappedStep, int | None]"]
"""(planned, cap bytes or None, PYTORCH_CUDA_ALLOC_CONF or None) -> (the run, its Rule-6 peak or None)."""


def user_alloc_conf() -> str:
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def with_expandable(conf: str) -> str:
    """`conf` with expandable segments on (Rule 3)."""
    kept = [p for p in conf.split(",") if p.strip() and not p.strip().startswith("expandable_segments")]
    return ",".join(kept + [EXPANDABLE])


def cuda_check(
    model: nn.Module, step_args: tuple, plan: Plan, loop: Loop, target: str | None = None
) -> tuple[CudaCheck, int | None]:
    """Rules 1-4 for `model` (unplanned; `step_args` = (inputs, loss_fn, optimizer)): the runs, and the Rule-6 peak
    of the planned run that went through (None if none did), for `VerifyReport.independent_peak_bytes`."""
    device = next(p.device for p in model.parameters())
    capacity = torch.cuda.get_device_properties(device).total_memory
    gc.collect()
    torch.cuda.empty_cache()  # what this process cached is the fresh one's to use
    with tempfile.TemporaryDirectory(prefix="remat-cap-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan.save(plan_path)
        run, where, why = _fresh_run(model, step_args, loop, (str(device), str(plan_path), tmp), target)
        try:
            unplanned = run(False, None, None)[0] if run is not None else None
        except Unloadable as e:
            last = (str(e).strip().splitlines() or ["no message"])[-1]
            run, why = None, f"the model cannot be loaded in a fresh interpreter ({last})"
        if run is None:
            run, where = _Here(model, step_args, plan, loop), THIS_PROCESS
            unplanned = run(False, None, None)[0]
        check, peak = _planned_runs(run, plan.budget_bytes, isinstance(run, _Here))
    return CudaCheck(where, capacity, plan.budget_bytes, unplanned=unplanned, why_here=why, **check), peak


def _planned_runs(run: Run, budget: int | None, here: bool) -> tuple[dict, int | None]:
    """The planned step under the cap; again with expandable segments (Rule 3), and without a cap (Rule 4), where
    needed.  In this process, where torch read its allocator's settings when it started, there is no rerun."""
    capped, peak = run(True, budget, None)
    runs = {"capped": capped, "expandable": None, "uncapped": None}
    if needs_expandable_rerun(budget, capped) and not here:
        runs["expandable"], again = run(True, budget, with_expandable(user_alloc_conf()))
        peak = peak if peak is not None else again
    if needs_uncapped_run(budget, capped, runs["expandable"]):
        runs["uncapped"], again = run(True, None, None)
        peak = peak if peak is not None else again
    return runs, peak


def _fresh_run(
    model: nn.Module, step_args: tuple, loop: Loop, paths: tuple[str, str, str], target: str | None
) -> tuple[Run | None, str, str]:
    """(the runs in fresh interpreters, FRESH_PROCESS, "") where the model can be rebuilt in one: from `target`
    when the optimizer is one the runner names, else from `torch.save`; (None, "", why not) otherwise."""
    device, plan_path, tmp = paths
    inputs, loss_fn, optimizer = step_args
    name = _runner_optimizer(optimizer)
    if target is not None and name is not None:

        def of_target(planned: bool, cap: int | None, conf: str | None):
            peak = step_peak_bytes(
                target,
                plan_path if planned else None,
                name,
                str(loop.step),
                loop.accumulate,
                keep_output=loop.keep_output,
                device=device,
                budget_bytes=cap,
                alloc_conf=conf,
            )
            return _step(peak, conf, cap)

        return of_target, FRESH_PROCESS, ""
    why = _cannot_save(model)
    saved = str(Path(tmp) / "step.pt")
    if not why:
        try:
            torch.save({"model": model, "inputs": inputs, "loss_fn": loss_fn, "optimizer": optimizer}, saved)
        except (pickle.PicklingError, AttributeError, TypeError, RuntimeError) as e:
            why = f"torch.save cannot save it ({type(e).__name__}: {e})"
    if why:
        return None, "", why
    base = [sys.executable, "-m", "remat.verifier.process", "--saved", saved, "--step", str(loop.step)]
    base += ["--accumulate", str(loop.accumulate)] + ([] if loop.keep_output else ["--loss-only"])
    env = {**os.environ, **PROCESS_ENV, "PYTHONPATH": os.pathsep.join([os.getcwd()] + [p for p in sys.path if p])}

    def of_saved(planned: bool, cap: int | None, conf: str | None):
        cmd = base + (["--plan", plan_path] if planned else []) + process.device_options(device, cap, conf)
        return _step(run_measuring(cmd, {**env, **process.alloc_env(conf)}), conf, cap)

    return of_saved, FRESH_PROCESS, ""


def _runner_optimizer(optimizer) -> str | None:
    """The runner's name for `optimizer` where it is one of the command line's (`remat.cli.common`)."""
    if optimizer is None:
        return "none"
    named = getattr(optimizer, "__module__", "") == "remat.cli.common" and getattr(optimizer, "__name__", "")
    return named if named in ("adam", "sgd") else None


def _cannot_save(model: nn.Module) -> str:
    """Why a fresh interpreter could not load `model` from torch.save, seen before saving it ("" if none is)."""
    if is_compiled(model):
        return "a compiled model is measured where it was compiled"
    local = sorted({type(m).__qualname__ for m in model.modules() if type(m).__module__ == "__main__"})
    if local:
        return f"its class {local[0]} is defined in __main__, which a fresh interpreter cannot import"
    return ""


def _step(peak: ProcessPeak, conf: str | None, cap: int | None) -> tuple[CappedStep, int | None]:
    step = CappedStep(
        peak.allocated_peak_bytes,
        peak.reserved_peak_bytes,
        peak.out_of_memory,
        conf if conf is not None else user_alloc_conf(),
        cap,
    )
    return step, (None if peak.out_of_memory else peak.peak_bytes)


@dataclass
class _Here:
    """Runs in this process (Rule 2's fallback): after `gc.collect()` and `torch.cuda.empty_cache()`, under the
    cap plus what this process holds besides the step, the fraction set back to 1.0 after."""

    model: nn.Module
    step_args: tuple
    plan: Plan
    loop: Loop

    def __call__(self, planned: bool, cap: int | None, conf: str | None) -> tuple[CappedStep, int | None]:
        inputs, loss_fn, optimizer = self.step_args
        opt = make_optimizer(optimizer, self.model)
        snapshot = StateSnapshot(self.model, opt, normalize_inputs(inputs).tensors())
        if planned:
            apply(self.model, self.plan)
        try:
            return _capped_here(self.model, (inputs, loss_fn, opt), self.loop, cap)
        finally:
            if planned:
                remove(self.model)
            snapshot.restore()
            gc.collect()
            torch.cuda.empty_cache()


def _capped_here(model: nn.Module, step_args: tuple, loop: Loop, cap: int | None) -> tuple[CappedStep, int | None]:
    inputs, loss_fn, opt = step_args
    clear_grads(model, opt)
    gc.collect()
    torch.cuda.empty_cache()
    device = next(p.device for p in model.parameters())
    resident = storage_bytes(resident_tensors(model, normalize_inputs(inputs), opt), rounding=512)
    held = max(0, torch.cuda.memory_allocated(device) - resident)
    total = torch.cuda.get_device_properties(device).total_memory
    if cap is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, (cap + held) / total), device)
    try:
        peak = cuda_peak_bytes(model, inputs, loss_fn, opt, loop)
    except (torch.cuda.OutOfMemoryError, RematError) as e:
        message = out_of_memory(e)
        return CappedStep(out_of_memory=message, alloc_conf=user_alloc_conf(), cap_bytes=cap, held_bytes=held), None
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    step = CappedStep(
        max(0, peak.allocated_peak_bytes - held),
        max(0, peak.reserved_peak_bytes - held),
        "",
        user_alloc_conf(),
        cap,
        held,
    )
    return step, peak.peak_bytes
