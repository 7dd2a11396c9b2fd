"""remat side by side with every peer, in one run: memory, recomputation, time, planning time.

    python benchmarks/peers/run.py            # the default zoo, remat + torch.compile included (about
                                              # 3 h on 2 cores; --no-compile ~20 min); writes
                                              # benchmarks/results/peers.{md,json}, docs/peers.md,
                                              # docs/peers_<model>.png and the span between
                                              # <!-- peers:begin/end --> in docs/benchmarks.md
    python benchmarks/peers/run.py --large    # issue 15's zoo, every unplanned step >= 1 GiB, with
                                              # remat + torch.compile as a peer (30-40 min a model;
                                              # BERT's compile worker alone > 50 min, 2026-12-07);
                                              # writes benchmarks/results/peers_large.{md,json},
                                              # docs/peers_large.md and docs/peers_large_<model>.png
    python benchmarks/peers/run.py --quick    # CI smoke test (< 3 min); writes
                                              # benchmarks/results/peers_quick.{md,json}, plots to a temp dir
    python benchmarks/peers/run.py --models gpt2,bert --rounds 9    # a subset, more timing rounds
    python benchmarks/peers/run.py --from-json benchmarks/results/peers.json   # re-render only
    python benchmarks/peers/run.py --recheck benchmarks/results/peers_large_unet.json   # its losses within
                                              # noise and the ties remat was slower in measured again:
                                              # compiled points over 9 rounds (~4 min), eager over 30
    python benchmarks/peers/repro_bugs.py     # the remat bugs this benchmark found (run.py runs it too)
    python benchmarks/peers/rockmate_probe.py # (network) re-try Rockmate as shipped; run.py reads its result

Per model, two fresh interpreters (MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1
OMP_WAIT_POLICY=PASSIVE, fixed torch thread count): worker_compile.py (torch.compile at each
activation_memory_budget) then worker_eager.py (no checkpointing, every block, checkpoint_sequential
sweep, Chen, selective op checkpointing, remat at each budget x solver and at each peer's
measured peak).  See docs/peers.md for what each figure means.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402

import report  # noqa: E402
from _catalog import LARGE_ORDER, ORDER, SIZES  # noqa: E402
from _common import git_state, load_average, machine_info, run_fresh  # noqa: E402
from passes import WORKER_ENV, at_peers_of, compile_spec, compiled_at_peers, recheck, run_worker  # noqa: E402
from strategies import label  # noqa: E402

PROFILES = {
    "default": dict(
        size="default",
        rounds=3,
        budgets=[0.3, 0.5, 0.7, 0.9],
        solvers=["dp", "ilp", "chen"],
        compile_budgets=[1.0, 0.9, 0.5, 0.1],
        frontier_points=2,
        sweep_max=None,
        remat_compiled=[0.65],
        remat_compiled_at_peers=True,
    ),
    # issue 15: steps of 3-7 s, so fewer budgets; remat + torch.compile at every torch.compile point and at
    # 65% of the eager peak (report 004's -35%)
    "large": dict(
        size="large",
        rounds=3,
        budgets=[0.5, 0.65],
        solvers=["auto"],
        compile_budgets=[1.0, 0.5],
        frontier_points=0,
        sweep_max=None,
        remat_compiled=[0.65],
        remat_compiled_at_peers=True,
    ),
    "quick": dict(
        size="quick",
        rounds=2,
        budgets=[0.5, 0.8],
        solvers=["dp", "ilp", "chen"],
        compile_budgets=[1.0, 0.5],
        frontier_points=0,
        sweep_max=4,
        remat_compiled=[0.65],
    ),
}
QUICK_MODELS = ["chain001", "gpt2"]
QUICK_COMPILE_MODELS = ["chain001"]


def sweep_for(model: str, size: str, sweep_max: int | None) -> list[int]:
    """checkpoint_sequential segment counts: 2..N for short sequences; for report 001's chain the
    user's sweep (2, 4, 8, 10, 16) plus the ends."""
    if model not in ("mlp000", "chain001"):
        return [2]  # not applicable; the worker records why
    n = SIZES[size]["mlp000"]["layers"] if model == "mlp000" else SIZES[size]["chain001"]["blocks"] + 1
    ks = list(range(2, n + 1)) if n <= 9 else sorted({2, 3, 4, 6, 8, 10, 16, n})
    if sweep_max:
        ks = [k for k in ks if k <= sweep_max]
    return ks


def inductor_cache_state() -> dict:
    """Inductor's on-disk cache at the start (compile seconds depend on it: a cold cache compiles every kernel)."""
    d = Path(
        os.environ.get("TORCHINDUCTOR_CACHE_DIR") or Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    )
    n = sum(1 for _ in d.rglob("*.so")) if d.exists() else 0
    return {"dir": str(d), "compiled_kernels_at_start": n}


def run_bugs() -> dict | None:
    """repro_bugs.py in a fresh interpreter: is each remat bug found by this benchmark still there?"""
    t0 = time.perf_counter()
    try:
        res = run_fresh("peers/repro_bugs.py:check_all", {}, env_extra=WORKER_ENV, timeout=600)
    except (RuntimeError, subprocess.SubprocessError) as e:
        print(f"bugs      {time.perf_counter() - t0:6.0f} s  ERROR {str(e)[:2000]}", flush=True)
        return None
    print(f"bugs      {time.perf_counter() - t0:6.0f} s", flush=True)
    return res


def rockmate_status() -> dict:
    """Live: is `rockmate` importable here and is there a GPU?  Plus the probe's record."""
    live = {"importable_here": importlib.util.find_spec("rockmate") is not None, "cuda": torch.cuda.is_available()}
    probe_path = BENCH / "results" / "peers_rockmate.json"
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else None
    if live["importable_here"] and live["cuda"]:
        status = "importable and CUDA present: run it with benchmarks/peers/rockmate_probe.py"
    elif probe is not None:
        status = probe["status"]
    else:
        status = "not runnable on CPU (CUDA-only; rkgb 2.0.0 sdist incomplete) — probe not run"
    return {"live": live, "probe": probe, "status": status}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke test: two tiny models, few rounds (< 3 min)")
    ap.add_argument("--large", action="store_true", help="issue 15's zoo at >= 1 GiB, remat + compile as a peer")
    ap.add_argument("--models", help=f"comma-separated subset of {','.join(ORDER)}")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in every worker (default 2)")
    ap.add_argument("--rounds", type=int, help="interleaved timing rounds after one warm-up round")
    ap.add_argument("--compile-budgets", help="comma-separated activation_memory_budget values ('' for none)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", help="results basename in benchmarks/results (default peers or peers_quick)")
    ap.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/peers.md and docs/peers_<model>.png (default: on unless --quick)",
    )
    ap.add_argument("--no-bugs", action="store_true", help="skip repro_bugs.py (the remat bugs this benchmark found)")
    ap.add_argument(
        "--from-json",
        metavar="PATH",
        help="re-render the tables, plots and docs from an earlier run's results JSON (no measuring); "
        "several, comma-separated, are merged (runs made model by model)",
    )
    ap.add_argument(
        "--at-peers-of",
        metavar="PATH",
        help="measure only remat + torch.compile at the eager peers' peaks that an earlier run's "
        "remat + compile points did not reach (a second compile worker), spliced into that run",
    )
    ap.add_argument(
        "--recompile",
        action="store_true",
        help="with --at-peers-of: run the compile worker again first and replace the earlier run's",
    )
    ap.add_argument(
        "--recheck",
        metavar="PATH",
        help="measure again, in one fresh process, each peer point an earlier run's remat lost within "
        "the rounds' noise or tied more slowly, the remat point it was judged against and remat's points "
        "aimed at it: a "
        "torch.compile budget against remat + compile over --rounds (default 9) interleaved rounds, "
        "an eager peer against an eager remat plan over --rounds (default 30); added to that run",
    )
    ap.add_argument(
        "--timeout", type=int, default=3600, help="seconds per worker (BERT's compile worker: 34 min; --large: over 50)"
    )
    args = ap.parse_args(argv)
    if args.recompile and not args.at_peers_of:
        ap.error("--recompile re-runs the compile worker of an earlier run; give that run with --at-peers-of PATH")
    return args


def merged(paths: list[str]) -> dict:
    """Runs of one profile made model by model (`--models m --out peers_large_m`), as one run: the first run's
    machine and profile, every run's models, the runs' minutes summed and their commands listed."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    data = runs[0]
    if any(_comparable(r["profile"]) != _comparable(data["profile"]) for r in runs):
        raise SystemExit("--from-json: the runs to merge were made with different profiles")
    for r in runs[1:]:
        data["models"].update(r["models"])
    data["machine"]["elapsed_s"] = sum(r["machine"]["elapsed_s"] for r in runs)
    data["machine"]["loadavg_at_end"] = runs[-1]["machine"]["loadavg_at_end"]
    data["machine"]["git_per_run"] = [r["machine"]["git"] for r in runs]
    data["command"] = "; ".join(r["command"] for r in runs)
    data["bugs"] = next((r["bugs"] for r in reversed(runs) if r.get("bugs")), None)
    return data


def _comparable(profile: dict) -> dict:
    """What makes runs comparable: the profile less whether the second compile pass ran with the run (a run made
    before it existed gets it from --at-peers-of; each of its points says `pass: at eager peers`)."""
    return {k: v for k, v in profile.items() if k != "remat_compiled_at_peers"}


def from_json(args: argparse.Namespace) -> int:
    """Re-render an earlier run's results (no measuring), several runs merged when comma-separated: the docs
    unless it was a --quick run.  Where none of them re-checked the bugs (runs made with --no-bugs), repro_bugs.py
    runs now (seconds), unless --no-bugs."""
    paths = args.from_json.split(",")
    data = merged(paths)
    if not data.get("bugs") and not args.no_bugs and data["profile"]["size"] != "quick":
        # the runs merged were made with --no-bugs (model by model): the bugs section is checked now, and says so
        data["bugs"] = run_bugs()
        data["bugs_note"] = f"run at the re-render, {time.strftime('%Y-%m-%d')}, commit {git_state()['commit']}"
    name = args.out or Path(paths[0]).stem
    docs = (not data["profile"]["size"] == "quick") if args.docs is None else args.docs
    print(f"re-rendered {report.write_all(data, name=name, docs=docs)}")
    return 0


def run_profile(args: argparse.Namespace) -> dict:
    """The sizes, rounds and budgets of this run: the default or quick profile, with the options applied."""
    prof = dict(PROFILES["quick" if args.quick else "large" if args.large else "default"])
    if args.rounds:
        prof["rounds"] = args.rounds
    if args.compile_budgets is not None:
        prof["compile_budgets"] = [float(x) for x in args.compile_budgets.split(",") if x]
    if args.no_compile:
        prof["compile_budgets"] = []
    if prof["compile_budgets"] and 1.0 not in prof["compile_budgets"]:
        prof["compile_budgets"] = [1.0] + prof["compile_budgets"]
    return prof


def run_info(args: argparse.Namespace) -> dict:
    info = machine_info(args.threads)
    info["OMP_WAIT_POLICY"] = WORKER_ENV["OMP_WAIT_POLICY"]
    info["git"] = git_state()
    info["inductor_cache"] = inductor_cache_state()
    info["loadavg_at_start"] = load_average()
    return info


def measure_model(m: str, prof: dict, args: argparse.Namespace, with_compile: bool) -> dict:
    """The compile worker (when asked), then the eager worker, which matches remat to the compile points."""
    t0 = time.perf_counter()
    comp = None
    if prof["compile_budgets"] and with_compile:
        comp = run_worker("worker_compile", compile_spec(m, prof, args), args.timeout)
    points = []
    if comp and "budgets" in comp:
        points = [
            {
                "label": label({"kind": "compile", "budget": r["budget"]}),
                "rss_peak": r["rss_peak"],
                "extra_flops": r.get("extra_flops"),
            }
            for r in comp["budgets"]
            if "rss_peak" in r
        ]
    eager = run_worker(
        "worker_eager",
        {
            "model": m,
            "size": prof["size"],
            "threads": args.threads,
            "rounds": prof["rounds"],
            "budgets": prof["budgets"],
            "solvers": prof["solvers"],
            "frontier_points": prof["frontier_points"],
            "sweep": sweep_for(m, prof["size"], prof["sweep_max"]),
            "compile_points": points,
        },
        args.timeout,
    )
    if prof.get("remat_compiled_at_peers") and comp and "remat_compiled" in comp:
        compiled_at_peers(m, prof, args, eager, comp)
    err = eager.get("worker_error") or (comp or {}).get("worker_error")
    print(f"{m:<9} {time.perf_counter() - t0:6.0f} s" + (f"  ERROR {err}" if err else ""), flush=True)
    if err:
        print((eager.get("log_tail") or (comp or {}).get("log_tail") or "")[-2000:], flush=True)
    return {"eager": eager, "compile": comp}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return from_json(args)
    if args.at_peers_of:
        return at_peers_of(args, PROFILES)
    if args.recheck:
        return recheck(args)
    prof = run_profile(args)
    models = (
        args.models.split(",")
        if args.models
        else (QUICK_MODELS if args.quick else LARGE_ORDER if args.large else ORDER)
    )
    compile_models = QUICK_COMPILE_MODELS if (args.quick and not args.models) else models
    name = args.out or ("peers_quick" if args.quick else "peers_large" if args.large else "peers")
    docs = (not args.quick) if args.docs is None else args.docs
    cmd = "python benchmarks/peers/run.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else "")

    t_start = time.perf_counter()
    info = run_info(args)
    results = {m: measure_model(m, prof, args, m in compile_models) for m in models}
    info["elapsed_s"] = time.perf_counter() - t_start
    info["loadavg_at_end"] = load_average()
    rock = rockmate_status()
    bugs = None if args.quick or args.no_bugs else run_bugs()
    data = {"machine": info, "command": cmd, "profile": prof, "models": results, "rockmate": rock, "bugs": bugs}
    md_path = report.write_all(data, name=name, docs=docs)
    print(f"\n{time.perf_counter() - t_start:.0f} s in all; wrote {md_path}")
    failed = [m for m, r in results.items() if r["eager"].get("worker_error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
