"""Worker: an earlier eager worker's doubtful points, an eager peer and the remat plan it was judged against,
measured again in one fresh interpreter (run by `run.py --recheck`).

    run_fresh("peers/worker_recheck_eager.py:run", spec)   (benchmarks/_worker.py, under remat.verifier.process.PROCESS_ENV)

SPEC: {"model", "size", "threads", "rounds", "configs": [{"key", "spec"}: the strategies as the earlier run's
eager worker recorded them]}.  Each strategy is rebuilt from its spec: a remat plan from the checkpoints, selective
modules and offloads the spec records, on remat.profile's keep-everything plan, not planned again; so what is
re-measured is exactly the earlier run's point.  The measuring is worker_eager.py's (the same
functions): tracker peak, FLOPs and gradients, the process peak, then step times interleaved with the unplanned
step only, over more rounds.
"""

from __future__ import annotations

import time

import torch

from strategies import rebuilt_plan  # noqa: E402
from worker_eager import EagerRun  # noqa: E402


def with_plan(run: EagerRun, spec: dict) -> dict:
    """A strategy's spec with its remat plan rebuilt (the results JSON keeps the plan's modules, not the plan)."""
    if spec["kind"] != "remat" or "plan" in spec:
        return spec
    if spec["selective"] and "selective_keeps" not in spec:
        raise ValueError(
            f"{spec['label']}: recorded before the results kept which ops a selective checkpoint keeps; "
            "measure that model again instead"
        )
    plan = rebuilt_plan(
        run.prof,
        segments=spec["segments"],
        selective=spec["selective"],
        selective_keeps=spec.get("selective_keeps", {}),
        offload=spec.get("offload", []),
    )
    return dict(spec, plan=plan.to_json())


def run(spec: dict) -> dict:
    torch.set_num_threads(int(spec["threads"]))
    t_start = time.perf_counter()
    run = EagerRun(spec)
    run.prof = run.profile()
    run.add("none", {"kind": "none"})
    for c in spec["configs"]:
        run.add(c["key"], with_plan(run, c["spec"]))
    run.measure_all()
    run.time_steps()
    return dict(
        configs=[run.configs[k] for k in run.order],
        rounds=spec["rounds"],
        threads=torch.get_num_threads(),
        elapsed_s=time.perf_counter() - t_start,
    )
