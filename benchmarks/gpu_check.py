"""One prepared GPU check (issue 34): plans made on a laptop, in fake mode, tested on a real GPU.

    python benchmarks/gpu_check.py --make-plans     # here, no GPU: fake-mode profiles and plans, committed
    python benchmarks/gpu_check.py [--run]          # on the GPU: every model unplanned and planned, < 6 min
    python benchmarks/gpu_check.py --smoke          # the whole pipeline on the CPU at tiny sizes (the test)

--make-plans profiles each model with `remat.profile(..., mode="fake", device="cuda", hardware="H100")`
(Adam, the steady step, the output kept through backward) and writes, to benchmarks/results/gpu_check/,
`<model>.plan65.json` (a plan for 65% of what the unplanned step is predicted to reserve on the GPU),
`<model>.least.json` (the least-memory plan, for the least budget its predicted reserve fits) and `made.json`
(the predictions, date, machine, torch and transformers versions, remat's commit).  Both plans are made as
`remat plan TARGET --budget B` makes them: fitted to the caching allocator's replayed reserve (NOTE [A plan fits
the GPU's reserve]); a plan that needs `expandable_segments:True` is measured with it.
The GPU run loads those files and never plans again, so it checks what a laptop user gets.

On the GPU each measurement is a fresh process (`--one MODEL --plan FILE --out F.json`): the model built on
the device from the same seed, Adam, a plain loop (`out = model(**batch); loss = out.loss; loss.backward();
opt.step(); opt.zero_grad(set_to_none=True)`), the third step's `max_memory_allocated` and
`max_memory_reserved`, the median of 3 more steps' seconds; a planned step runs under
`set_per_process_memory_fraction(budget / total memory)`.  The first step's gradients are compared with
those of the unplanned step, against the noise of two unplanned runs (pass: within 10x).  The first
unplanned process also runs `remat.profile` in real mode.  Writes the table to docs/validation.md between
its markers and the raw results to benchmarks/results/gpu_check/gpu_<device>_<date>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

T0 = time.monotonic()
"""When this script started: --budget-s counts from here, imports included."""
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "gpu_check"
DOCS = ROOT / "docs" / "validation.md"
START, END = "<!-- gpu_check:start -->", "<!-- gpu_check:end -->"
SECTION_TITLE = "## 6. The prepared GPU check (`benchmarks/gpu_check.py`)"
MiB = 2**20
PLAN_FRACTION = 0.65
NOISE_FACTOR = 10
KINDS = ("plan65", "least")
"""The plans of each model: for PLAN_FRACTION of the unplanned step's predicted GPU reserve, and the least-memory
plan for the least budget it fits."""
MIN_LEFT_S = 20.0
"""A measurement starts only with at least this many seconds of --budget-s left."""
PLANNED_FOR = {"full": {"device": "cuda", "hardware": "H100"}, "smoke": {"device": "cpu", "hardware": "cpu"}}
"""The device a size's plans are made for in fake mode: the GPU's, or --smoke's CPU (where a CUDA step's fixed
64 MiB of cuBLAS workspaces would leave tiny models no plan at 65%)."""
HELD_STEPS, TIMED_STEPS = 3, 3
"""The third step is measured (Adam's state resident); the median of the next TIMED_STEPS is its seconds."""


def _import_paths() -> None:
    """This tree's remat from src/ when `import remat` would not find it there (not installed: the GPU machine
    has no network; or installed from another copy, which would check the wrong code); the benchmarks' helpers."""
    import importlib.util

    src = ROOT / "src"
    found = importlib.util.find_spec("remat")
    if found is None or not Path(found.origin).resolve().is_relative_to(src.resolve()):
        sys.path.insert(0, str(src))
    for path in (HERE, HERE / "peers"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


_import_paths()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import remat  # noqa: E402
from remat import zoo  # noqa: E402

import models as peer_models  # noqa: E402  (benchmarks/peers/models.py)
from _models import Autocast, call, loss_of, replace_submodule  # noqa: E402


# -- the models (random weights, nothing downloaded) ---------------------------------------------------------


def _bert(kw: dict, device_type: str):
    """remat.zoo.bert: BertForMaskedLM from a config (hidden and attention dropout 0.1, its defaults), labels."""
    return (*zoo.bert(**kw), None)


def _llama_gqa(kw: dict, device_type: str):
    """A Llama-style decoder with grouped-query attention (SDPA), its forward under bf16 autocast.  The zoo's
    Llama builders (benchmarks/cuda_truth.py, peers/models.py) give every head its own K/V: hence this one."""
    tf = zoo._hf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=kw["hidden"],
        intermediate_size=kw["mlp"],
        num_hidden_layers=kw["n_layer"],
        num_attention_heads=kw["heads"],
        num_key_value_heads=kw["kv_heads"],
        vocab_size=kw["vocab"],
        max_position_embeddings=kw["seq"],
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = Autocast(tf.LlamaForCausalLM(cfg), device_type)
    ids = torch.randint(0, kw["vocab"], (kw["batch"], kw["seq"]))
    return model, {"input_ids": ids, "labels": ids}, None


def _t5(kw: dict, device_type: str):
    """T5ForConditionalGeneration from a config (dropout 0.1), encoder input and decoder labels."""
    tf = zoo._hf()
    torch.manual_seed(0)
    cfg = tf.T5Config(
        vocab_size=kw["vocab"],
        d_model=kw["d_model"],
        d_kv=kw["d_kv"],
        d_ff=kw["d_ff"],
        num_layers=kw["n_layer"],
        num_heads=kw["heads"],
        dropout_rate=0.1,
        use_cache=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = tf.T5ForConditionalGeneration(cfg)
    ids = torch.randint(2, kw["vocab"], (kw["batch"], kw["seq"]))
    labels = torch.randint(2, kw["vocab"], (kw["batch"], kw["target"]))
    return model, {"input_ids": ids, "labels": labels}, None


def _unet_bn(kw: dict, device_type: str):
    """The peers' convolutional U-Net (skip concatenations), each GroupNorm replaced by a BatchNorm2d."""
    bench = peer_models.BUILDERS["unet"](dict(kw))
    for name, m in list(bench.model.named_modules()):
        if isinstance(m, nn.GroupNorm):
            replace_submodule(bench.model, name, nn.BatchNorm2d(m.num_channels))
    return bench.model, bench.inputs, bench.loss_fn


def _resmlp(kw: dict, device_type: str):
    """remat.zoo.skipnet (the encoder's outputs added back to the mirrored decoder blocks) with
    nn.Dropout(0.1) at the end of every block; sum loss."""
    model, x = zoo.skipnet(width=kw["width"], depth=kw["depth"], batch=kw["batch"])
    for block in (*model.down, *model.up):
        block.append(nn.Dropout(0.1))
    return model, x, None


@dataclass(frozen=True)
class Spec:
    title: str
    build: Callable[[dict, str], tuple]
    """(kw, autocast device type) -> (model, inputs, loss_fn or None)"""
    sizes: dict
    """"full" (the GPU check) and "smoke" (the CPU test) -> the builder's keyword arguments."""


MODELS = {
    "bert": Spec(
        "BertForMaskedLM, dropout 0.1, fp32",
        _bert,
        {
            "full": dict(n_layer=6, hidden=768, heads=12, seq=512, batch=8, vocab=8192),
            "smoke": dict(n_layer=2, hidden=32, heads=2, seq=64, batch=8, vocab=64),
        },
    ),
    "llama_gqa": Spec(
        "LlamaForCausalLM, GQA 16/4 heads, SDPA, bf16 autocast",
        _llama_gqa,
        {
            "full": dict(n_layer=8, hidden=1024, mlp=2816, heads=16, kv_heads=4, seq=1024, batch=4, vocab=8192),
            "smoke": dict(n_layer=2, hidden=32, mlp=64, heads=4, kv_heads=2, seq=64, batch=8, vocab=64),
        },
    ),
    "t5": Spec(
        "T5ForConditionalGeneration, dropout 0.1, fp32",
        _t5,
        {
            "full": dict(
                n_layer=6, d_model=512, d_kv=64, d_ff=2048, heads=8, seq=512, target=128, batch=8, vocab=32128
            ),
            "smoke": dict(n_layer=2, d_model=32, d_kv=8, d_ff=64, heads=4, seq=64, target=32, batch=8, vocab=64),
        },
    ),
    "unet_bn": Spec(
        "U-Net, BatchNorm, skip concatenations, fp32",
        _unet_bn,
        {"full": dict(ch=32, depth=3, image=128, batch=16), "smoke": dict(ch=8, depth=2, image=32, batch=8)},
    ),
    "resmlp": Spec(
        "MLP with skips (zoo.skipnet), dropout 0.1, fp32",
        _resmlp,
        {"full": dict(width=1024, depth=4, batch=16384), "smoke": dict(width=32, depth=4, batch=1024)},
    ),
}


def build(name: str, size: str, device: str, autocast_device: str | None = None):
    """`(model, inputs, loss_fn)` built on `device` from the seed: the same module names on every machine.
    `autocast_device`: the device type the bf16 model's autocast names ("cuda" for a plan made on the CPU)."""
    spec = MODELS[name]
    with torch.device(device):  # loss targets and inputs on the device too
        model, inputs, loss_fn = spec.build(spec.sizes[size], autocast_device or device)
    return model.train(), inputs, loss_fn


def profile_options() -> dict:
    """`keep_output=True` (the loop that keeps the output through backward, the one run here) where remat.profile
    has the option; remat before it measured that loop anyway."""
    import inspect

    return {"keep_output": True} if "keep_output" in inspect.signature(remat.profile).parameters else {}


def adam(params):
    return torch.optim.Adam(params)


def git_commit() -> str:
    """`git rev-parse HEAD` of this tree, or "?" in a copy without its .git (the device tool sends files)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


# -- step 1, here: fake-mode profiles and plans ----------------------------------------------------------------


def _plan_summary(plan, path: Path) -> dict:
    reserve = plan.gpu_reserve
    return {
        "file": path.name,
        "peak_bytes": plan.peak_bytes,
        "budget_bytes": plan.budget_bytes,
        "segments": len(plan.segments),
        "selective": len(plan.selective),
        "offload": len(plan.offload),
        "recompute_fraction": plan.recompute_fraction,
        "solver": plan.solver,
        "allocator": plan.allocator,
        "reserved_bytes": reserve.reserved_bytes if reserve else None,
        "allocated_bytes": reserve.allocated_bytes if reserve else None,
        "expandable_allocated_bytes": reserve.expandable_allocated_bytes if reserve else None,
        "expandable_reserved_bytes": reserve.expandable_reserved_bytes if reserve else None,
    }


def _makers(model, inputs, loss_fn, prof, hardware: str) -> dict[str, Callable]:
    """The two plans, as `remat plan TARGET --budget B` makes them: for a CUDA step fitted to the replayed GPU
    reserve (NOTE [A plan fits the GPU's reserve]).  plan65: for PLAN_FRACTION of what the unplanned step reserves
    (of its tensors on the CPU); least: the least-memory plan, for the least budget whose reserve it fits."""
    from remat.gpu_fit import fit_gpu

    def fitted(budget: int):
        first = remat.plan(prof, budget)
        if prof.gpu_reserve is None:
            return first
        return fit_gpu(model, (inputs, loss_fn, adam), prof, first, None, profile_options() | {"hardware": hardware})

    def least():
        fewest = remat.frontier(prof, max_points=2)[-1]
        if prof.gpu_reserve is None:
            return fewest
        try:
            return fitted(fewest.peak_bytes)
        except remat.InfeasibleBudget as e:  # the least budget the GPU's reserve fits
            return fitted(e.min_bytes)

    unplanned = prof.gpu_reserve.reserved_bytes if prof.gpu_reserve else prof.peak_bytes
    return {"plan65": lambda: fitted(int(PLAN_FRACTION * unplanned)), "least": least}


def plan_model(name: str, size: str, plans_dir: Path) -> dict:
    """The fake-mode prediction of `name`'s unplanned step (on an H100; --smoke: on this CPU, which runs it) and
    its two plans, saved beside each other."""
    target = PLANNED_FOR[size]
    model, inputs, loss_fn = build(name, size, "cpu", autocast_device=target["device"])
    t0 = time.perf_counter()
    prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=adam, mode="fake", **target, **profile_options())
    reserve = prof.gpu_reserve
    row = {
        "title": MODELS[name].title,
        "size": MODELS[name].sizes[size],
        "params": sum(p.numel() for p in model.parameters()),
        "unplanned_peak_bytes": prof.peak_bytes,
        "unplanned_reserved_bytes": reserve.reserved_bytes if reserve else None,
        "unplanned_allocated_bytes": reserve.allocated_bytes if reserve else None,
        "profile_s": round(time.perf_counter() - t0, 1),
        "plans": {},
    }
    t0 = time.perf_counter()
    for kind, make in _makers(model, inputs, loss_fn, prof, target["hardware"]).items():
        try:
            plan = make()
        except remat.RematError as e:  # an infeasible budget is a result: the GPU run skips that plan
            row["plans"][kind] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        path = plans_dir / f"{name}.{kind}.json"
        plan.save(path)
        row["plans"][kind] = _plan_summary(plan, path)
    row["plan_s"] = round(time.perf_counter() - t0, 1)
    return row


def make_plans(size: str, plans_dir: Path, names: list[str], command: str) -> dict:
    """Every model's prediction and plans, and made.json (when, where, with what) in `plans_dir`."""
    from _common import git_state, machine_info

    plans_dir.mkdir(parents=True, exist_ok=True)
    made = {
        "date": utc_now(),
        "machine": machine_info(),
        "torch": torch.__version__,
        "transformers": _transformers_version(),
        "remat_commit": git_commit(),
        "src_dirty": git_state()["src_dirty"],
        "size": size,
        "profile": {"mode": "fake", **PLANNED_FOR[size], "optimizer": "Adam", **profile_options()},
        "plan_fraction": PLAN_FRACTION,
        "command": command,
        "models": {},
    }
    t0 = time.perf_counter()
    for name in names:
        made["models"][name] = row = plan_model(name, size, plans_dir)
        peaks = ", ".join(f"{k} {_mib(p.get('peak_bytes'))}" for k, p in row["plans"].items())
        print(
            f"{name}: unplanned {_mib(row['unplanned_peak_bytes'])} MiB predicted; {peaks} "
            f"(profile {row['profile_s']} s, plans {row['plan_s']} s)",
            flush=True,
        )
    made["make_plans_s"] = round(time.perf_counter() - t0, 1)
    (plans_dir / "made.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "not installed"


def _mib(n) -> str:
    return "—" if n is None else f"{n / MiB:,.1f}"


# -- step 2, on the GPU: one measurement in a fresh process (--one) --------------------------------------------


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


def _save_grads(model: nn.Module, path: str) -> None:
    grads = {n: p.grad.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.grad is not None}
    torch.save(grads, path)


def train_loop(model: nn.Module, inputs, loss_fn, device: str, grads_path: str | None) -> dict:
    """The plain loop, Adam kept across steps: the first step's gradients saved after its backward, the third
    step's peaks, the median seconds of the next TIMED_STEPS.  `out` and `loss` are rebound only when the next
    forward returns, and the output is held through backward (remat's loop, keep_output=True)."""
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


def real_profile(model: nn.Module, inputs, loss_fn, device: str) -> dict:
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


# -- step 2, the parent: every measurement, the gradients compared ---------------------------------------------


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
    fork: bool = False
    """Measuring processes forked from this one (--smoke) rather than new interpreters (the GPU run)."""
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
    return [
        job("unplanned", real=True),
        *(
            job(k, opts.plans_dir / plans[k]["file"], alloc_conf=plans[k].get("allocator", ""))
            for k in KINDS
            if "file" in plans.get(k, {})
        ),
        job("noise"),
    ]


def _child_argv(job: Job, opts: RunOptions) -> list[str]:
    argv = [
        "--one",
        job.model,
        "--label",
        job.label,
        "--plan",
        str(job.plan_path or "none"),
        "--out",
        str(job.out),
        "--grads",
        str(job.grads),
        "--device",
        opts.device,
        "--size",
        opts.size,
    ]
    return argv + (["--real-profile"] if job.real_profile else []) + ([] if opts.cap else ["--no-cap"])


class _Forked:
    """A measurement in a forked copy of this process (--smoke: no interpreter to start, no torch to import),
    running the same `--one` arguments; `poll`, `kill` and `wait` as a subprocess.Popen has them."""

    def __init__(self, argv: list[str], log: Path):
        self.proc = multiprocessing.get_context("fork").Process(target=_forked_main, args=(argv, str(log)))
        self.proc.start()

    def poll(self) -> int | None:
        return self.proc.exitcode

    def kill(self) -> None:
        self.proc.kill()

    def wait(self) -> None:
        self.proc.join()


def _forked_main(argv: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)  # a forked process cannot use its parent's OpenMP threads
    main(argv)


def _launch(job: Job, opts: RunOptions):
    """`job` in a fresh process: a new interpreter running this script with --one (forked with opts.fork)."""
    log = job.out.with_suffix(".log")
    if opts.fork:
        return _Forked(_child_argv(job, opts), log)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=job.alloc_conf) if job.alloc_conf else None
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *_child_argv(job, opts)],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )


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


def run_all(opts: RunOptions) -> dict:
    """Every model's measurements within --budget-s (from the script's start); the table printed, the results
    and the docs section written."""
    made = json.loads((opts.plans_dir / "made.json").read_text())
    if made["size"] != opts.size:
        raise SystemExit(
            f"remat: the plans in {opts.plans_dir} are for size {made['size']!r}, this run is "
            f"{opts.size!r}. Fix: python benchmarks/gpu_check.py --make-plans first."
        )
    here = {"torch": torch.__version__.split("+")[0], "transformers": _transformers_version()}
    for lib, version in here.items():
        if made[lib].split("+")[0] != version:  # a plan fits the step of the software it was profiled with
            print(f"note: the plans were made with {lib} {made[lib]}, this machine has {version}", flush=True)
    res = {
        "date": utc_now(),
        "command": opts.command,
        "budget_s": opts.budget_s,
        "made": made,
        "models": {},
        "cap": opts.cap,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name in opts.names:
            res["models"][name] = run_model(name, made, opts, T0 + opts.budget_s, Path(tmp))
            print(f"{name}: done at {time.monotonic() - T0:.0f} s", flush=True)
    res["elapsed_s"] = round(time.monotonic() - T0, 1)
    res.update(_device_of(res), transformers=_transformers_version())
    write_results(res, opts)
    return res


def _device_of(res: dict) -> dict:
    """The device name and torch version, as the measuring processes saw them."""
    for m in res["models"].values():
        for r in m["runs"].values():
            if "device_name" in r:
                return {"device": r["device_name"], "torch": r["torch"]}
    return {"device": "?", "torch": torch.__version__}


# -- the report: data -> markdown -----------------------------------------------------------------------------


def _err(predicted, measured) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if predicted and measured else "n/a"


def _mib_or_na(n) -> str:
    return "n/a" if n is None else _mib(n)


def _status(r: dict) -> str:
    if r.get("status") == "ok":
        return "yes" if "cap_fraction" in r else "no cap"
    return f"**{r.get('status', '?')}**"


def _grad_cell(r: dict, noise) -> str:
    g = r.get("grads")
    if not g or noise is None:
        return "n/a"
    if "error" in g:
        return f"**fail**: {g['error'][:80]}"
    verdict = r["grad_verdict"] if r["grad_verdict"] == "pass" else f"**{r['grad_verdict']}**"
    return f"{g['max_abs_diff']:.1e} vs {NOISE_FACTOR * noise:.1e}: {verdict}"


def _unplanned_row(name: str, m: dict) -> str:
    r, pred = m["runs"]["unplanned"], m["predicted"]["unplanned_peak_bytes"]
    real, replayed = r.get("real_profile_peak_bytes"), r.get("real_profile_allocated_bytes")
    real_cell = (
        f"{_mib(real)} ({_err(real, r.get('peak_allocated_bytes'))})"
        if real is not None
        else r.get("real_profile_error", "n/a")[:80]
    )
    if replayed is not None:
        real_cell += f"; replayed {_mib(replayed)} ({_err(replayed, r.get('peak_allocated_bytes'))})"
    noise = "n/a" if m["grad_noise"] is None else f"noise {m['grad_noise']:.1e}"
    return (
        f"| {name} | unplanned | {_mib(pred)} | "
        f"{_allocated_cells(m['predicted'].get('unplanned_allocated_bytes'), pred, r)} | "
        f"{_reserved_cell(m['predicted'].get('unplanned_reserved_bytes'), r)} | — | "
        f"{_status(r)} | {noise} | {real_cell} | {_seconds(r)} |"
    )


def _plan_row(name: str, kind: str, m: dict) -> str:
    p = m["predicted"]["plans"][kind]
    if kind not in m["runs"]:
        return f"| {name} | {kind}: no plan | {' '.join(p.get('error', '?').split())[:200]} |" + " |" * 9
    r = m["runs"][kind]
    what = (
        f"{kind}: {p['segments']} ckpt + {p['selective']} selective"
        + (f" + {p['offload']} offload" if p.get("offload") else "")
        + (f", {p['allocator']}" if p.get("allocator") else "")
    )
    return (
        f"| {name} | {what} | {_mib(p['peak_bytes'])} | "
        f"{_allocated_cells(_planned(p, r, 'allocated_bytes'), p['peak_bytes'], r)} | "
        f"{_reserved_cell(_planned(p, r, 'reserved_bytes'), r)} | "
        f"{_mib(r.get('budget_bytes') or p['budget_bytes'] or p['peak_bytes'])} | {_status(r)} | "
        f"{_grad_cell(r, m['grad_noise'])} | — | {_seconds(r)} |"
    )


def _allocated_cells(replayed, tensors: int, r: dict) -> str:
    """max_memory_allocated: the laptop's replay of the allocator beside the measured figure, and the error of the
    replay (of the tensors, for plans made before the replay's allocated bytes were kept)."""
    measured = r.get("peak_allocated_bytes")
    if replayed is None:
        return f"{_mib_or_na(measured)} | {_err(tensors, measured)}"
    return f"{_mib(replayed)} / {_mib_or_na(measured)} | {_err(replayed, measured)}"


def _planned(p: dict, r: dict, figure: str) -> int | None:
    """The replay's `figure` ("allocated_bytes", "reserved_bytes") under the allocator the plan's step ran with
    (expandable segments or not); None where the plans were made before it was kept."""
    expandable = "expandable_segments:True" in (r.get("alloc_conf") or "")
    return p.get("expandable_" + figure) if expandable else p.get(figure)


def _reserved_cell(predicted, r: dict) -> str:
    """max_memory_reserved measured, after the replayed reserve predicted on the laptop when there is one."""
    measured = r.get("peak_reserved_bytes")
    if predicted is None:
        return _mib_or_na(measured)
    return f"{_mib(predicted)} / {_mib_or_na(measured)} ({_err(predicted, measured)})"


def _seconds(r: dict) -> str:
    return f"{r['step_s']:.3f}" if r.get("step_s") is not None else "—"


def _failures(res: dict) -> list[str]:
    """One line per measurement that did not run to the end: OOM, error, timeout or skipped."""
    lines = []
    for name, m in res["models"].items():
        for label, r in m["runs"].items():
            if r.get("status") != "ok":
                msg = " ".join(str(r.get("message", "")).split())[:300]
                lines.append(f"- {name} / {label}: {r.get('status')}: {msg}")
    return lines


def render(res: dict) -> str:
    """The dated section: what ran where, the table, and every measurement that did not finish."""
    made, capped = res["made"], res.get("cap", True)
    allocator = f"`PYTORCH_CUDA_ALLOC_CONF={res['alloc_conf']}`" if res.get("alloc_conf") else "the default allocator"
    lines = [
        f"Run {res['date']} on **{res['device']}**, torch {res['torch']}, transformers {res['transformers']}: "
        f"`{res['command']}` ({res['elapsed_s']:.0f} s of a {res['budget_s']:.0f} s budget), {allocator}, "
        f"{'planned steps capped at their budget' if capped else 'planned steps not capped (--no-cap)'}.  Plans made "
        f"{made['date']} by `{made['command']}` on {made['machine'].get('cpu', '?')} (torch {made['torch']}, "
        f"transformers {made['transformers']}, remat {made['remat_commit'][:10]}"
        f"{' + uncommitted src/ changes' if made.get('src_dirty') else ''}): fake mode, `device="
        f'"{made["profile"]["device"]}", hardware="{made["profile"]["hardware"]}"`, Adam, the output kept '
        "through backward.",
        "",
        "| model | plan | tensors MiB (laptop, fake) | max_memory_allocated MiB: replayed on the laptop / measured | error | "
        "reserved MiB: replayed on the laptop / measured | budget (cap) MiB | ran under the cap | grad max \\|diff\\| vs 10x noise | "
        "real-mode profile MiB: tensors (error); replayed (error) | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        lines.append(_unplanned_row(name, m))
        lines += [_plan_row(name, kind, m) for kind in KINDS if kind in m["predicted"]["plans"]]
    failures = _failures(res)
    lines += [
        "",
        "Every measurement ran to the end." if not failures else "Measurements that did not finish:",
        *failures,
        "",
        "Error: (replayed - measured) / measured of max_memory_allocated, the replay being the "
        "laptop's fake step run through a model of the caching allocator (of its tensors where a run has no "
        "replay).  Each row a fresh process, the third step "
        "of the loop with Adam"
        + (
            "; a plan's step under `torch.cuda.set_per_process_memory_fraction(budget / total memory)`"
            if capped
            else "; no step capped"
        )
        + ".  Gradients: the first step's, max |difference| from the unplanned run's, against "
        f"{NOISE_FACTOR}x that of a second unplanned run (the noise).  Raw results: `{res['results_file']}`.",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, body: str) -> None:
    """`body` between the markers of `path`, replacing what was there; the section added at the end if absent."""
    text = path.read_text() if path.exists() else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + START + "\n" + body + END + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION_TITLE}\n\n{START}\n{body}{END}\n"
    path.write_text(text)


def _in_tree(path: Path, device: str) -> str:
    """Where the docs say the raw results are: in this tree, or, written outside it on a GPU (the device tool's
    $OUT), where they belong once copied back."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(RESULTS.relative_to(ROOT) / path.name) if device != "CPU" else str(path)


def write_results(res: dict, opts: RunOptions) -> None:
    slug = "".join(c if c.isalnum() else "_" for c in res["device"]).strip("_")
    out = opts.out_dir / f"gpu_{slug}_{time.strftime('%Y-%m-%dT%H%M', time.gmtime())}.json"
    res["results_file"] = _in_tree(out, res["device"])
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    publish(res, docs=opts.docs)
    print(f"wrote {out} and the section of {opts.docs}", flush=True)


def publish(*runs: dict, docs: Path) -> None:
    """The tables of one run or more (--from-json A,B,...), printed and written to the section of `docs`."""
    body = "\n".join(render(res) for res in runs)
    write_section(docs, body)
    print(body, flush=True)


# -- the command line ------------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--make-plans", action="store_true", help="profile and plan here, in fake mode (no GPU)")
    what.add_argument("--run", action="store_true", help="measure on the GPU (the default)")
    what.add_argument("--smoke", action="store_true", help="the whole pipeline on the CPU at tiny sizes")
    what.add_argument("--from-json", metavar="F[,F]", help="the docs section again from runs' raw results")
    what.add_argument("--one", metavar="MODEL", help="(internal) one measurement in this process")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--budget-s", type=float, default=330.0, help="the whole run's seconds; what is left is skipped")
    ap.add_argument("--timeout-s", type=float, default=90.0, help="seconds of one measuring process")
    ap.add_argument("--jobs", type=int, default=0, help="measurements at once (default 1; --smoke 2)")
    ap.add_argument("--plans-dir", default=str(RESULTS), help="where --make-plans writes and the run reads")
    ap.add_argument("--out-dir", default=None, help="results (default: --plans-dir; --smoke: a new temp dir)")
    ap.add_argument("--docs", default=None, help="the file whose section is written (default docs/validation.md)")
    for internal in ("--label", "--plan", "--out", "--grads", "--device", "--size"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    ap.add_argument("--real-profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-cap", action="store_true", help="planned steps without the budget's memory cap")
    return ap.parse_args(argv)


def _run_options(args, argv: list[str], names: list[str]) -> RunOptions:
    if args.smoke:
        out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="gpu_check_smoke_"))
        make_plans("smoke", out_dir, names, _cmdline(argv) + " (its planning step)")
        docs = Path(args.docs) if args.docs else out_dir / "validation.md"
        if DOCS.exists() and not docs.exists():
            shutil.copy(DOCS, docs)  # the real section replaced in a copy: docs/validation.md is not touched
        return RunOptions(
            "cpu",
            "smoke",
            out_dir,
            out_dir,
            docs,
            names,
            _cmdline(argv),
            args.budget_s,
            args.timeout_s,
            args.jobs or 2,
            fork=True,
            cap=not args.no_cap,
        )
    plans_dir = Path(args.plans_dir)
    return RunOptions(
        "cuda",
        "full",
        plans_dir,
        Path(args.out_dir) if args.out_dir else plans_dir,
        Path(args.docs) if args.docs else DOCS,
        names,
        _cmdline(argv),
        args.budget_s,
        args.timeout_s,
        args.jobs or 1,
        cap=not args.no_cap,
    )


def _cmdline(argv: list[str]) -> str:
    return " ".join(["python benchmarks/gpu_check.py", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.one:
        Path(args.out).write_text(json.dumps(measure_one(args), indent=1))
        return 0
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        print(f"remat: unknown models {unknown}; expected some of {list(MODELS)}.", file=sys.stderr)
        return 2
    if args.from_json:
        runs = [(Path(f), json.loads(Path(f).read_text())) for f in args.from_json.split(",")]
        publish(
            *(dict(res, results_file=_in_tree(path, res["device"])) for path, res in runs),
            docs=Path(args.docs) if args.docs else DOCS,
        )
        return 0
    if args.make_plans:
        make_plans("full", Path(args.plans_dir), names, _cmdline(argv))
        return 0
    if not args.smoke and not torch.cuda.is_available():
        print(
            "remat: gpu_check.py measures on a CUDA GPU, and this machine has none. Fix: run it where "
            "torch.cuda.is_available() is True, or run --make-plans (here) or --smoke (the CPU test).",
            file=sys.stderr,
        )
        return 2
    run_all(_run_options(args, argv, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
