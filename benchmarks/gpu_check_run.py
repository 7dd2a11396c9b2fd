"""The prepared GPU check's measurements, each in a fresh process (`gpu_check.py --one MODEL --plan FILE --out
F.json`, forked from the parent in --smoke): the plain loop's third step measured, the first step's gradients
compared with the unplanned step's against the noise of two unplanned runs.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import remat
from _common import ROOT
from _models import build_sized as build, call, loss_of

SCRIPT = Path(__file__).resolve().parent / "gpu_check.py"
NOISE_FACTOR = 10
KINDS = ("plan65", "least")
"""The plans of each model: for PLAN_FRACTION of the unplanned step's predicted GPU reserve; the least-memory one."""
MIN_LEFT_S = 20.0
"""A measurement starts only with at least this many seconds of --budget-s left."""
HELD_STEPS, TIMED_STEPS = 3, 3
"""The third step is measured (Adam's state resident); the median of the next TIMED_STEPS is its seconds."""


def profile_options() -> dict:
    """The loop run here, which keeps the output through backward."""
    return {"keep_output": True}


def adam(params):
    return torch.optim.Adam(params)


def _cap(device: str, budget_bytes: int | None) -> dict:
    """The caching allocator capped at the plan's budget (CUDA only: the CPU has no such cap)."""
    if device != "cuda" or budget_bytes is None:
        return {}
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, budget_bytes / total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return {"cap_fraction": fraction, "total_memory_bytes": total}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peaks(device: str) -> dict:
    """The measured step's peaks by CUDA's caching allocator; none on the CPU (reported as n/a)."""
    if device != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def _save_grads(model: torch.nn.Module, path: str) -> None:
    grads = {n: p.grad.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.grad is not None}
    torch.save(grads, path)


def train_loop(model: torch.nn.Module, inputs, loss_fn, device: str, grads_path: str | None) -> dict:
    """The plain loop, Adam kept across steps: the first step's gradients saved, the third step's peaks, the median
    seconds of the next TIMED_STEPS; the output held through backward (remat's loop, keep_output=True)."""
    opt = adam(model.parameters())
    torch.manual_seed(1234)  # the same dropout masks in every process
    seconds, measured = [], {}
    out = loss = None
    for i in range(HELD_STEPS + TIMED_STEPS):
        if i == HELD_STEPS - 1:
            _sync(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = call(model, inputs)
        loss = loss_of(out, loss_fn)
        loss.backward()
        if i == 0 and grads_path:
            _save_grads(model, grads_path)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i == HELD_STEPS - 1:
            measured.update(_peaks(device))
        elif i >= HELD_STEPS:
            seconds.append(time.perf_counter() - t0)
    measured["step_s"] = statistics.median(seconds)
    del out, loss, opt
    return measured


def real_profile(model: torch.nn.Module, inputs, loss_fn, device: str) -> dict:
    """remat.profile in real mode on the device, the loop's optimizer and gradients gone first."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    try:
        prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=adam, **profile_options())
    except Exception as e:  # its failure is a result, not the measurement's
        return {"real_profile_error": f"{type(e).__name__}: {e}"[:800]}
    reserve = prof.gpu_reserve  # real mode's step replayed through the allocator: its blocks handed out whole too
    return {
        "real_profile_peak_bytes": prof.peak_bytes,
        "real_profile_s": round(time.perf_counter() - t0, 2),
        "real_profile_allocated_bytes": reserve.allocated_bytes if reserve else None,
    }


def measure_one(args) -> dict:
    """One model, unplanned or under one plan file, in this process: what the parent compares."""
    t0 = time.perf_counter()
    plan = None if args.plan == "none" else remat.load_plan(args.plan)
    budget = None if plan is None else (plan.budget_bytes or plan.peak_bytes)
    r = {
        "model": args.one,
        "label": args.label,
        "plan_file": args.plan,
        "budget_bytes": budget,
        "device": args.device,
        "torch": torch.__version__,
        "keep_output": bool(profile_options()),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    try:
        if not args.no_cap:
            r.update(_cap(args.device, budget))
        model, inputs, loss_fn = build(args.one, args.size, args.device)
        if plan is not None:
            model = remat.apply(model, plan)
        r.update(train_loop(model, inputs, loss_fn, args.device, args.grads), status="ok")
        if args.real_profile:
            r.update(real_profile(model, inputs, loss_fn, args.device))
    except torch.cuda.OutOfMemoryError as e:
        r.update(status="OOM", message=str(e)[:1000])
    except Exception:  # a failure is a result: the parent prints it in the table
        r.update(status="error", message=traceback.format_exc()[-2000:])
    r["device_name"] = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    r["wall_s"] = round(time.perf_counter() - t0, 2)
    return r


@dataclass(frozen=True)
class RunOptions:
    device: str
    size: str
    plans_dir: Path
    out_dir: Path
    docs: Path
    names: list
    command: str
    budget_s: float = 330.0
    timeout_s: float = 90.0
    jobs: int = 1
    """Measurements at once: 1 on the GPU (timings undisturbed); the CPU smoke test runs 2."""
    fork: Callable[[list[str]], int] | None = None
    """--smoke: gpu_check's `main`, run on `--one` arguments in forked copies of this process, not new interpreters."""
    cap: bool = True
    """Planned steps under the budget's memory fraction (--no-cap: uncapped, to see their own peaks)."""


@dataclass(frozen=True)
class Job:
    model: str
    label: str
    """"unplanned", "noise" (the unplanned step again: the gradients' run-to-run noise), or a plan kind."""
    plan_path: Path | None
    out: Path
    grads: Path
    real_profile: bool = False
    alloc_conf: str = ""
    """PYTORCH_CUDA_ALLOC_CONF the plan needs (`Plan.allocator`): set in its measuring process's environment."""


def jobs_for(name: str, made: dict, opts: RunOptions, tmp: Path) -> list[Job]:
    def job(label, plan_path=None, real=False, alloc_conf=""):
        return Job(name, label, plan_path, tmp / f"{name}.{label}.json", tmp / f"{name}.{label}.pt", real, alloc_conf)

    plans = made["models"][name]["plans"]
    kinds = [k for k in KINDS if "file" in plans.get(k, {})]
    planned = [job(k, opts.plans_dir / plans[k]["file"], alloc_conf=plans[k].get("allocator", "")) for k in kinds]
    return [job("unplanned", real=True), *planned, job("noise")]


def _child_argv(job: Job, opts: RunOptions) -> list[str]:
    argv = ["--one", job.model, "--label", job.label, "--plan", str(job.plan_path or "none"), "--out", str(job.out)]
    argv += ["--grads", str(job.grads), "--device", opts.device, "--size", opts.size]
    return argv + (["--real-profile"] if job.real_profile else []) + ([] if opts.cap else ["--no-cap"])


class _Forked:
    """A measurement in a forked copy of this process (--smoke: no interpreter to start, no torch to import),
    running the same `--one` arguments; `poll`, `kill` and `wait` as a subprocess.Popen has them."""

    def __init__(self, main: Callable[[list[str]], int], argv: list[str], log: Path):
        self.proc = multiprocessing.get_context("fork").Process(target=_forked_main, args=(main, argv, str(log)))
        self.proc.start()

    def poll(self) -> int | None:
        return self.proc.exitcode

    def kill(self) -> None:
        self.proc.kill()

    def wait(self) -> None:
        self.proc.join()


def _forked_main(main: Callable[[list[str]], int], argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)  # a forked process cannot use its parent's OpenMP threads
    main(argv)


def _launch(job: Job, opts: RunOptions):
    """`job` in a fresh process: a new interpreter running gpu_check.py with --one (forked with opts.fork)."""
    log = job.out.with_suffix(".log")
    if opts.fork:
        return _Forked(opts.fork, _child_argv(job, opts), log)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=job.alloc_conf) if job.alloc_conf else None
    cmd = [sys.executable, str(SCRIPT), *_child_argv(job, opts)]
    with open(log, "w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def _outcome(job: Job, code: int | None, limit_s: float) -> dict:
    if code is None:
        return {"status": "timeout", "message": f"killed after {limit_s:.0f} s (--timeout-s / --budget-s)"}
    if job.out.exists():
        return json.loads(job.out.read_text())
    log = job.out.with_suffix(".log")
    tail = log.read_text()[-2000:] if log.exists() else ""
    return {"status": "error", "message": f"exit {code}: {tail}"}


def run_jobs(jobs: list[Job], opts: RunOptions, deadline: float) -> dict[str, dict]:
    """Each job in its own process, opts.jobs at a time, each within what is left of --budget-s and at most
    --timeout-s; a job that cannot start in time is skipped.  {label: the job's result}."""
    results, pending, running = {}, list(jobs), []
    while pending or running:
        while pending and len(running) < opts.jobs:
            job, left_s = pending.pop(0), deadline - time.monotonic()
            if left_s < MIN_LEFT_S:
                results[job.label] = {"status": "skipped", "message": f"--budget-s {opts.budget_s:.0f} ran out"}
                continue
            limit_s = min(opts.timeout_s, left_s)
            running.append((job, _launch(job, opts), time.monotonic() + limit_s, limit_s))
        for item in list(running):
            job, handle, until, limit_s = item
            code = handle.poll()
            if code is None and time.monotonic() < until:
                continue
            if code is None:
                handle.kill()
                handle.wait()
            results[job.label] = _outcome(job, code, limit_s)
            running.remove(item)
        time.sleep(0.05)
    return results


def grad_diff(a: Path, b: Path) -> dict | None:
    """Max |difference| of any gradient element between two runs' first steps (None if either has none)."""
    if not (a.exists() and b.exists()):
        return None
    ga, gb = torch.load(a), torch.load(b)
    if ga.keys() != gb.keys():
        return {"error": f"different parameters have gradients: {sorted(ga.keys() ^ gb.keys())[:5]}"}
    diffs = {k: (ga[k].float() - gb[k].float()).abs().max().item() for k in ga}
    worst = max(diffs, key=diffs.get, default=None)
    return {"max_abs_diff": diffs[worst] if worst else 0.0, "param": worst}


def run_model(name: str, made: dict, opts: RunOptions, deadline: float, tmp: Path) -> dict:
    """Every measurement of one model, then its gradients compared (and their files deleted)."""
    jobs = jobs_for(name, made, opts, tmp)
    results = run_jobs(jobs, opts, deadline)
    runs = {j.label: results[j.label] for j in jobs}
    ref = next(j.grads for j in jobs if j.label == "unplanned")
    grads = {j.label: grad_diff(ref, j.grads) for j in jobs if j.label != "unplanned"}
    for j in jobs:
        j.grads.unlink(missing_ok=True)
    noise = (grads.get("noise") or {}).get("max_abs_diff")
    for kind in KINDS:
        if kind in runs:
            runs[kind]["grads"] = grads.get(kind)
            runs[kind]["grad_verdict"] = grad_verdict(grads.get(kind), noise)
    return {"predicted": made["models"][name], "runs": runs, "grad_noise": noise}


def grad_verdict(diff: dict | None, noise: float | None) -> str:
    """pass: the plan's gradients within NOISE_FACTOR x the noise of two unplanned runs (equal, if no noise)."""
    if not diff or noise is None:
        return "n/a"
    if "error" in diff:
        return "fail"
    return "pass" if diff["max_abs_diff"] <= NOISE_FACTOR * noise else "fail"
