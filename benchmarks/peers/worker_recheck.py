"""Worker: the same torch.compile budgets and remat + compile plans as an earlier compile worker's, measured
again in one fresh interpreter with more interleaved rounds (run by `run.py --recheck`).

    run_fresh("peers/worker_recheck.py:run", spec)   (benchmarks/_worker.py, under remat.verifier.process.PROCESS_ENV)

SPEC: {"model", "size", "threads", "rounds", "budgets": [torch.compile budgets], "plans": [remat + compile
record keys of the earlier run]}.  A key (remat_compiled.py) is [segments, selective, selective_keeps,
compiler_budget]: the plan is rebuilt from it on remat.profile's keep-everything plan, not searched for again,
so what is re-measured is exactly the earlier run's plan.  Each point is compiled, its process peak measured
and its step timed against eager without checkpointing as worker_compile.py does (the same functions).
"""

from __future__ import annotations

import json
import time
import warnings

import torch

from remat._torch_compat.compiler import compiled_as_compiled

import remat_compiled  # noqa: E402
from _common import describe_plan  # noqa: E402
import worker_compile  # noqa: E402  (its Inductor settings: no FX graph or AOTAutograd cache)
from measure import flops_and_grads  # noqa: E402
from strategies import rebuilt_plan  # noqa: E402

warnings.filterwarnings("ignore")


def plan_of(prof, key: str):
    """The plan a remat + compile record's key names, on this process's profile."""
    segments, selective, keeps, knob = json.loads(key)
    return rebuilt_plan(prof, segments=segments, selective=selective, selective_keeps=keeps, compiler_budget=knob)


@compiled_as_compiled()  # as worker_compile.run: no recompile limit, and never uncompiled silently
def run(spec: dict) -> dict:
    t_start = time.perf_counter()
    bench, eager = worker_compile.warmed(spec)
    prof, _ = remat_compiled.profile_first(bench)
    _, ref_grads = flops_and_grads(bench, eager)
    out = {"model": spec["model"], "budgets": [], "remat_compiled": []}
    variants = {}
    for b in spec["budgets"]:
        record, call = worker_compile.compile_at(bench, eager, b, ref_grads)
        out["budgets"].append(record)
        if call is not None:
            variants[b] = (bench, call)
    for i, key in enumerate(spec["plans"]):
        plan = plan_of(prof, key)
        fig, pair = remat_compiled._one(
            bench, plan, ref_grads, worker_compile.counting_backend, worker_compile.fresh_function, f"recheck_{i}"
        )
        out["remat_compiled"].append(dict(fig, key=key, plan=describe_plan(plan)))
        if pair is not None:
            variants[key] = pair
        worker_compile.log(
            f"  remat + compile ({describe_plan(plan)}): "
            f"rss {fig.get('rss_peak', 0) / 2**20:.1f} MiB {fig.get('error', '')}"
        )
    worker_compile.time_interleaved(bench, eager, variants, out, spec["rounds"])
    out.update(rounds=spec["rounds"], threads=torch.get_num_threads(), elapsed_s=time.perf_counter() - t_start)
    return out
