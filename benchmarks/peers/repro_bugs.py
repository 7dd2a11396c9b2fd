"""Minimal reproductions of the remat bugs the peers benchmark ran into (docs/peers.md, "Bugs found").

    python benchmarks/peers/repro_bugs.py                 # prints each check; exit 0 either way
    python benchmarks/peers/repro_bugs.py --worker '{}'   # also prints `RESULT {json}` (run.py runs this)

Each check says `present` (the bug reproduces) or `fixed` / `not reproduced`.  Small models from benchmarks/_models.py,
one thread, a few seconds each.

1. chen_apply    `remat.plan(prof, b, solver="chen")` on layers kept in an nn.ModuleList returns segments of
                 several ModuleList children, which `remat.apply` rejects (only nn.Sequential runs can be one
                 checkpoint).  src/remat/planner/chen.py `units_for` does not filter `Unit.appliable`.
2. ilp_solve     `ilp._solve` (src/remat/planner/ilp.py) passes byte-sized coefficients to HiGHS; at some
                 budgets HiGHS answers "Status 4: Solve error", `_solve` returns None, `remat.plan(...,
                 solver="ilp"/"auto")` raises InfeasibleBudget whose own `min_bytes` is below the budget, and
                 `remat.frontier` (auto -> ilp) stops early.  (`ilp.min_peak` already scales its rows.)
3. selective_last  a selective unit on the LAST transformer layer is predicted above what it measures
                 (Problem._make_selective_unit, src/remat/planner/problem.py, Rule 4): every other layer is
                 exact.  The planner then finds "selective on every layer" worse than on all but the last,
                 and never plans it, while torchtitan-style SAC on every layer measures lower.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

import remat
from remat import zoo
from remat.planner import Problem, dp, ilp, make_plan
from remat.planner.problem import chain_group

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

from measure import adam_params  # noqa: E402
from _models import make_bench as build  # noqa: E402


def _profile(b):
    return remat.profile(b.model, b.inputs, loss_fn=b.loss_fn, optimizer=adam_params)


def chen_apply() -> dict:
    b = build("mlp000", "quick")
    prof = _profile(b)
    out = {"model": "mlp000 (quick)", "container": type(b.model.layers).__name__}
    try:
        p = remat.plan(prof, 0.8, solver="chen")
    except remat.RematError as e:  # refusing to plan what apply cannot build is a fix too
        return {**out, "status": "fixed", "plan_refuses": str(e)[:300]}
    out["segments"] = p.segments
    try:
        remat.apply(b.model, p)
        remat.remove(b.model)
        out["status"] = "fixed"
    except remat.RematError as e:
        out.update(status="present", error=str(e).split(". Fix")[0])
    return out


def ilp_solve() -> dict:
    """Sweep budgets from remat's least peak to the unplanned peak on report 000's MLP at the development
    run's size; count the budgets where ilp.solve returns None although dp finds a plan."""
    torch.manual_seed(0)
    model, x = zoo.mlp_report000(hidden=128, intermediate=512, layers=8, seq=256, batch=8)
    prof = remat.profile(model, x, optimizer=adam_params)
    problem = Problem.from_profile(prof)
    group = chain_group(problem)
    lo, hi = dp.min_peak(problem, [group]), prof.peak_bytes
    n, failed = 60, []
    # evenly spread budgets, plus the one the development run hit (remat.frontier's last point there - 1 B)
    for budget in [lo + (hi - lo) * i // n for i in range(n)] + [43274759]:
        if ilp.solve(problem, budget) is None and dp.solve(problem, budget, [group]) is not None:
            failed.append(budget)
    out = {
        "model": "mlp000 (hidden 128, 8 layers, seq 256, batch 8)",
        "budgets_tried": n + 1,
        "least": lo,
        "unplanned": hi,
        "ilp_none_where_dp_plans": len(failed),
        "first_failing_budget": failed[0] if failed else None,
    }
    if failed:
        b = failed[0]
        try:
            remat.plan(prof, b, solver="ilp")
        except remat.InfeasibleBudget as e:
            out["plan_error_min_bytes"] = e.min_bytes
    out["frontier_auto_last"] = remat.frontier(prof)[-1].peak_bytes
    out["frontier_dp_last"] = remat.frontier(prof, solver="dp")[-1].peak_bytes
    out["status"] = "present" if failed or out["frontier_auto_last"] > out["frontier_dp_last"] else "not reproduced"
    return out


def selective_last(name: str = "gpt2") -> dict:
    b = build(name, "quick")
    prof = _profile(b)
    problem = Problem.from_profile(prof)
    sel = [u for u in problem.units if u.action == "selective"]
    rows = []
    for chosen in (sel[:-1], sel[-1:], sel):
        p = make_plan(prof, problem, chosen, "hand-built", None)
        remat.apply(b.model, p)
        try:
            measured = _profile(b).peak_bytes
        finally:
            remat.remove(b.model)
        rows.append({"selective": [u.blocks[0] for u in chosen], "predicted": p.peak_bytes, "measured": measured})
    out = {"model": f"{name} (quick)", "rows": rows}
    out["status"] = "present" if any(r["measured"] < r["predicted"] - 4096 for r in rows) else "fixed"
    return out


CHECKS = {
    "chen_apply": chen_apply,
    "ilp_solve": ilp_solve,
    "selective_last_gpt2": selective_last,
    "selective_last_bert": lambda: selective_last("bert"),
}


def check_all(spec: dict | None = None) -> dict:
    """Every check, each printed as it ends; a check that cannot run says why."""
    torch.set_num_threads(1)
    res = {}
    for name, fn in CHECKS.items():
        try:
            res[name] = fn()
        except Exception as e:  # the repro itself must not crash the benchmark
            res[name] = {"status": "could not run", "error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(name, json.dumps(res[name]), flush=True)
    return res


if __name__ == "__main__":
    check_all()
