"""One prepared GPU check (issue 34): plans made on a laptop, in fake mode, tested on a real GPU.

    python benchmarks/gpu_check.py --make-plans     # here, no GPU: fake-mode profiles and plans, committed
    python benchmarks/gpu_check.py [--run]          # on the GPU: every model unplanned and planned, < 6 min
    python benchmarks/gpu_check.py --smoke          # the whole pipeline on the CPU at tiny sizes (the test)

--make-plans profiles each model with `remat.profile(..., mode="fake", device="cuda", hardware="H100")` (Adam,
the output kept through backward) and writes, to benchmarks/results/gpu_check/, `<model>.plan65.json` (for 65% of
the unplanned step's predicted GPU reserve), `<model>.least.json` (the least-memory plan) and `made.json` (the
predictions; when, where and with what).  Both plans are fitted to the caching allocator's replayed reserve as
`remat plan TARGET --budget B` fits them (NOTE [A plan fits the GPU's reserve]).  The GPU run loads those files
and never plans again: each measurement in a fresh process (gpu_check_run.py), the table written to
docs/validation.md between its markers, the raw results to results/gpu_check/gpu_<device>_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

T0 = time.monotonic()
"""When this script started: --budget-s counts from here, imports included."""
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "validation.md"
PLAN_FRACTION = 0.65
PLANNED_FOR = {"full": {"device": "cuda", "hardware": "H100"}, "smoke": {"device": "cpu", "hardware": "cpu"}}
"""The device a size's plans are made for in fake mode: the GPU's, or --smoke's CPU (where a CUDA step's fixed
64 MiB of cuBLAS workspaces would leave tiny models no plan at 65%)."""


def _import_paths() -> None:
    """This tree's remat from src/ when `import remat` would not find it there (not installed: the GPU machine
    has no network; or installed from another copy, which would check the wrong code); the benchmarks' helpers."""
    import importlib.util

    src = ROOT / "src"
    found = importlib.util.find_spec("remat")
    if found is None or not Path(found.origin).resolve().is_relative_to(src.resolve()):
        sys.path.insert(0, str(src))
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


_import_paths()

import torch  # noqa: E402

import remat  # noqa: E402

from _catalog import GPU_CHECK as MODELS, GPU_CHECK_TITLES, SIZES  # noqa: E402
from _common import git_state, machine_info  # noqa: E402
from _models import build_sized as build, call, loss_of  # noqa: E402, F401  (gpu_snapshot.py runs the same loop)
from gpu_check_report import END, RESULTS, SECTION_TITLE, START, _in_tree, _mib, publish, render  # noqa: E402, F401
from gpu_check_report import write_results, write_section  # noqa: E402, F401
from gpu_check_run import KINDS, RunOptions, adam, measure_one, profile_options  # noqa: E402, F401
from gpu_check_run import run_model, train_loop  # noqa: E402, F401


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
    summary = {"file": path.name, "peak_bytes": plan.peak_bytes, "budget_bytes": plan.budget_bytes}
    summary |= {k: len(getattr(plan, k)) for k in ("segments", "selective", "offload")}
    summary |= {k: getattr(plan, k) for k in ("recompute_fraction", "solver", "allocator")}
    figures = ("reserved_bytes", "allocated_bytes", "expandable_allocated_bytes", "expandable_reserved_bytes")
    return summary | {k: getattr(plan.gpu_reserve, k) if plan.gpu_reserve else None for k in figures}


def _makers(model, inputs, loss_fn, prof, hardware: str) -> dict[str, Callable]:
    """The two plans: plan65 for PLAN_FRACTION of the unplanned step's reserve (of its tensors on the CPU), least
    the least-memory plan, for the least budget whose reserve it fits."""
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
    """The fake-mode prediction of `name`'s unplanned step (on an H100; --smoke: this CPU) and its plans, saved."""
    target = PLANNED_FOR[size]
    model, inputs, loss_fn = build(name, size, "cpu", autocast_device=target["device"])
    t0 = time.perf_counter()
    prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=adam, mode="fake", **target, **profile_options())
    reserve = prof.gpu_reserve
    row = {
        "title": GPU_CHECK_TITLES[name],
        "size": SIZES[size][name],
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
        times = f"(profile {row['profile_s']} s, plans {row['plan_s']} s)"
        print(f"{name}: unplanned {_mib(row['unplanned_peak_bytes'])} MiB predicted; {peaks} {times}", flush=True)
    made["make_plans_s"] = round(time.perf_counter() - t0, 1)
    (plans_dir / "made.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "not installed"


def run_all(opts: RunOptions) -> dict:
    """Every model's measurements within --budget-s (from the script's start); the results and section written."""
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
    res = dict(date=utc_now(), command=opts.command, budget_s=opts.budget_s, made=made, models={}, cap=opts.cap)
    res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
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
    command = _cmdline(argv)
    kw = dict(names=names, command=command, budget_s=args.budget_s, timeout_s=args.timeout_s, cap=not args.no_cap)
    if args.smoke:
        out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="gpu_check_smoke_"))
        make_plans("smoke", out_dir, names, command + " (its planning step)")
        docs = Path(args.docs) if args.docs else out_dir / "validation.md"
        if DOCS.exists() and not docs.exists():
            shutil.copy(DOCS, docs)  # the real section replaced in a copy: docs/validation.md is not touched
        return RunOptions("cpu", "smoke", out_dir, out_dir, docs, **kw, jobs=args.jobs or 2, fork=main)
    plans_dir = Path(args.plans_dir)
    out_dir = Path(args.out_dir) if args.out_dir else plans_dir
    docs = Path(args.docs) if args.docs else DOCS
    return RunOptions("cuda", "full", plans_dir, out_dir, docs, **kw, jobs=args.jobs or 1)


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
        docs = Path(args.docs) if args.docs else DOCS
        publish(*(dict(res, results_file=_in_tree(path, res["device"])) for path, res in runs), docs=docs)
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
