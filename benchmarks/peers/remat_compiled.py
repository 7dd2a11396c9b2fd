"""remat + torch.compile as a peer point (issue 15), measured in worker_compile.py's process.

remat's plan is made for the compiled step (remat.auto's search, NOTE [Plans for a compiled step]:
candidates compiled and measured by remat's own independent counter on a compiled copy of the model) and
applied to another copy (so the compiled budgets keep their own model and no guard fails between
interleaved timing rounds), then the whole step is compiled with Inductor at activation_memory_budget 1.0
(the compiler's default: remat decides what is recomputed), or at the plan's `compiler_budget` where remat's
search measured torch.compile's own budget the fastest to fit (NOTE [The compiler's budget as a plan]; the
step here compiles model and loss as one graph, so the budget is set for it as the torch.compile points set
theirs), and measured exactly as a torch.compile budget: first-call seconds, FLOPs of the compiled graphs, gradients against eager without checkpointing,
the process peak of one step, and step time.

Where: at each torch.compile budget's measured peak (the budget remat is given is that torch.compile budget as a
plan of remat's, measured by the counter remat's search judges plans by, plus the process method's tolerance:
`own_budgets`), and at fractions of the eager tracker peak (report 004's -35%).
A second pass (run.py, `remat_at_peers` in the spec) measures it instead at the process peaks of the eager
peers (every block, selective op checkpointing, ...) that no remat + compile point of the first pass reached.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import time

import torch

import remat
from remat.applier.compiler_budget import compiling_under
from remat.compiled_plans import compiler_plan, measure_compiled, plan_for

from _common import describe_plan, timed
from measure import adam_params, compare_grads, grads_of, rss_step_peak, zero_grads
from strategies import label


def tol_process(peak: float) -> float:
    return max(2**20, 0.01 * peak)  # as worker_eager.tol_process


def profile_first(bench):
    """remat.profile of the eager model, before anything is compiled in this process."""
    t0 = time.perf_counter()
    prof = remat.profile(bench.model, bench.inputs, loss_fn=bench.loss_fn, optimizer=adam_params)
    return prof, time.perf_counter() - t0


def targets(
    out: dict, prof, fractions: list[float], compiled_peak: int = 0, peers: list[dict] = ()
) -> list[tuple[str, int, int]]:
    """(where, budget bytes, the peer's process peak + tolerance or 0) of each remat + compile point.  A peer point's process peak (`peers`: {"label",
    "rss_peak"} of eager peers measured by worker_eager.py, else each torch.compile budget measured here) becomes
    a budget on the counter remat judges a compiled step by: less the offset between this process's peak of the
    unplanned compiled step (budget 1.0) and remat.profile's `compiled_peak_bytes` of it (the eager offset, tracker
    to process, where that is missing: it kept remat's compiled budgets ~60 MiB tighter than the peer's)."""
    offset = out["eager_rss_peak"] - prof.peak_bytes
    unplanned = [r["rss_peak"] for r in out.get("budgets", []) if r.get("budget") == 1.0 and "rss_peak" in r]
    if unplanned and compiled_peak:
        offset = unplanned[0] - compiled_peak
    peers = list(peers) or [
        {"label": label({"kind": "compile", "budget": r["budget"]}), "rss_peak": r["rss_peak"]}
        for r in out.get("budgets", [])
        if "rss_peak" in r
    ]  # the first pass: compile's points
    pts = []
    for p in peers:
        allowed = int(p["rss_peak"] + tol_process(p["rss_peak"]))
        pts.append((p["label"], int(allowed - offset), allowed))
    return pts + [(f"{f:.0%} of the eager peak", int(f * prof.peak_bytes), 0) for f in fractions]


def measure_points(bench, prof, out: dict, spec: dict, ref_grads: dict, *, backend_for, fresh_function) -> dict:
    """Plan for the compiled step (remat.auto's search: NOTE [Plans for a compiled step]), apply, compile and
    measure every point; returns key -> (bench copy, compiled call) to time.

    Re-aimed up to REAIMS times (`aimed`): remat's counter and this process's disagree by more than the offset of the
    unplanned step once a plan checkpoints (2 MiB one way on GPT-2, 4 the other on BERT).  Where a plan's process
    peak here is over the peer's (+ tolerance), or more than REAIM_ROOM tolerances under it with remat's checkpoints
    in it, remat.auto is given the peer's peak (+ tolerance) again converted by this plan's own offset (its peak by
    remat's search less its peak here), and that plan is measured too (another point of remat's: the verdicts take
    the fastest point within the peer's peak).  Until 2026-12-05 the budget was only lowered by the overshoot here,
    which left a plan that remat's counter put under its budget by more than that chosen again (the Llama at
    torch.compile's 0.1).
    Until 2026-12-06 only once: BERT's every-block peak (24.9 MiB) was missed by the plan re-aimed for it (27.9 MiB),
    whose own offset (12.4 MiB, the first plan's 14.7) aims a third search 2.4 MiB lower."""
    records, calls, by_plan = [], {}, {}
    cmodel = torch.compile(copy.deepcopy(bench.model))
    t0 = time.perf_counter()
    cprof = remat.profile(cmodel, bench.inputs, loss_fn=bench.loss_fn, optimizer=adam_params)
    out.update(remat_compiled_profile_s=time.perf_counter() - t0, remat_compiled_peak=cprof.compiled_peak_bytes)
    peers = spec.get("remat_at_peers", [])

    def point(where: str, budget: int) -> dict:
        row = _searched(cmodel, bench, cprof, where, budget)
        if row["status"] == "ok":
            if row["key"] not in by_plan:
                name = f"remat_compiled_{len(by_plan)}"
                by_plan[row["key"]] = _one(bench, row.pop("plan_obj"), ref_grads, backend_for, fresh_function, name)
                if by_plan[row["key"]][1] is not None:
                    calls[row["key"]] = by_plan[row["key"]][1]
            row.pop("plan_obj", None)
            row.update(by_plan[row["key"]][0])
        records.append(row)
        return row

    aims = {} if peers else own_budgets(cmodel, bench, cprof, out.get("budgets", []))
    for where, budget, allowed in targets(out, prof, spec.get("remat_fractions", []), cprof.compiled_peak_bytes, peers):
        aimed(point, where, aims.get(where, budget), allowed)
    out["remat_compiled"] = records
    return calls


def aimed(point, where: str, aim: int, allowed: int) -> None:
    """`point(where, budget)` searched, applied and measured at `aim`, then searched again (up to REAIMS times, each
    by the last plan's own offset) while the plan measured here misses the peer's peak `allowed` or leaves room; the
    same plan chosen again, or none measured, ends it.  Where the search finds the peer's peak infeasible, the least
    it reached (+ tolerance) is searched for and measured instead: remat's counter and this process's disagree by
    several MiB once a plan checkpoints, and that plan may land (on 2026-12-05 GPT-2's and ViT's every-block peaks
    were infeasible, the least reached 2.5 and 1.6 MiB over the aim on remat's counter, and nothing was measured)."""
    row = point(where, aim)
    if allowed and row["status"] == "infeasible" and row.get("min_bytes"):
        aim = int(row["min_bytes"] + tol_process(row["min_bytes"]))
        row = point(f"{where} (least reached)", aim)
    for n in range(1, REAIMS + 1):
        if not (allowed and row.get("rss_peak") and _reaim(row, allowed)):
            return
        again = point(f"{where} (re-aimed{'' if n == 1 else f' {n}x'})", reaimed_budget(row, allowed, aim))
        if again.get("key") == row.get("key") or not again.get("rss_peak"):
            return
        row, aim = again, again["budget_bytes"]


def own_budgets(cmodel, bench, cprof, budgets: list[dict]) -> dict[str, int]:
    """Where remat.auto aims at each torch.compile point: that budget itself as a plan of remat's (`compiler_budget`),
    measured by the counter remat's search judges plans by, + tolerance; the unplanned compiled step's peak for budget
    1.0.  Converted by the unplanned step's offset instead, the aim missed the peer's own configuration as remat's
    counter saw it: at the Llama's budget 0.9 (2026-12-05) by 1.8 MiB, and remat's search could not choose the very
    plan the peer runs.  A budget that remat's copy cannot compile or run keeps the offset's aim."""
    step, aims = (bench.inputs, bench.loss_fn, adam_params), {}
    for r in budgets:
        if "rss_peak" not in r:
            continue
        if r["budget"] >= 1.0:
            peak = cprof.compiled_peak_bytes
        else:
            try:
                peak = measure_compiled(cmodel, compiler_plan(cprof, cprof.peak_bytes, r["budget"]), step)[0].peak_bytes
            except remat.RematError:
                continue
        aims[label({"kind": "compile", "budget": r["budget"]})] = int(peak + tol_process(peak))
    return aims


REAIM_ROOM = 3
"""Tolerances under the peer's peak from which a plan with remat's checkpoints is searched for again."""
REAIMS = 3
"""Searches again at most per point; the same plan chosen again, or none measured, ends them."""


def _reaim(row: dict, allowed: int) -> bool:
    """Whether a point's plan measured here missed the peer's peak, or left room a faster plan could use."""
    if row["rss_peak"] > allowed:
        return True
    segments, selective, _, _ = json.loads(row["key"])
    return bool(segments or selective) and allowed - row["rss_peak"] > REAIM_ROOM * tol_process(allowed)


def reaimed_budget(row: dict, allowed: int, budget: int) -> int:
    """The peer's peak (+ tolerance) `allowed`, on remat's counter by this plan's own offset: its peak by remat's search
    less its peak here (`budget`, the one it was searched for, where the search did not say)."""
    return allowed + (row.get("search_measured_peak") or budget) - row["rss_peak"]


def _searched(cmodel, bench, cprof, where: str, budget: int) -> dict:
    """remat.auto's search for one budget (not applied): the record, with the plan under "plan_obj"."""
    row = {"at": where, "budget_bytes": budget}
    t0 = time.perf_counter()
    try:
        plan = plan_for(cmodel, (bench.inputs, bench.loss_fn, adam_params), cprof, budget)
    except remat.InfeasibleBudget as e:
        return dict(row, status="infeasible", min_bytes=e.min_bytes, why=str(e))
    key = json.dumps(
        [plan.segments, sorted(plan.selective), plan.selective_keeps, plan.compiler_budget], sort_keys=True
    )
    return dict(
        row,
        status="ok",
        key=key,
        plan=describe_plan(plan),
        plan_obj=plan,
        predicted_peak=plan.peak_bytes,
        predicted_flops=plan.recompute_flops,
        search_s=time.perf_counter() - t0,
        search_measured_peak=plan.measured_peak_bytes,
        search_step_s=plan.measured_step_s,
        search_note=plan.notes[0] if plan.notes else "",
        search_candidates=plan.notes[1] if len(plan.notes) > 1 else "",
    )


def _one(bench, plan, ref_grads: dict, backend_for, fresh_function, name: str):
    """One plan on a copy of the model, compiled: its figures, and (bench copy, call) or None."""
    fig = {"fw_flops": 0, "bw_flops": 0, "graphs": 0}
    b2 = dataclasses.replace(bench, model=copy.deepcopy(bench.model))  # parameter names taken before apply
    knob = plan.compiler_budget  # < 1.0: remat chose the compiler's own budget, which this step compiles with
    remat.apply(b2.model, dataclasses.replace(plan, compiler_budget=1.0))  # its checkpoints, if any

    def eager():
        return b2.loss(b2.call())

    compiled = torch.compile(fresh_function(eager, name), backend=backend_for(fig))

    def call():  # the budget as remat.apply sets it, random numbers kept (NOTE [The compiler's budget as a plan])
        with compiling_under(knob):
            return compiled()

    try:
        zero_grads(b2.model)
        t0 = time.perf_counter()
        call().backward()
        first = time.perf_counter() - t0
        zero_grads(b2.model)
        steady = statistics.median(timed(lambda: call().backward()) for _ in range(2))
        fig.update(compile_s=max(0.0, first - steady), flops=fig["fw_flops"] + fig["bw_flops"])
        fig["grads_vs_eager"] = compare_grads(ref_grads, grads_of(b2, call))
        fig["rss_peak"] = rss_step_peak(b2, call)
        ok = (b2, call)
    except Exception as e:  # a failure is a result
        fig["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        ok = None
    zero_grads(b2.model)
    return fig, ok
