"""Worker: every eager strategy on one model, in one fresh interpreter (run by run.py).

    MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1 python benchmarks/peers/worker_eager.py SPEC.json OUT.json

Order: (1) the MEASURING.md figure of the unplanned step (this process is fresh: RSS before
the model is built, ru_maxrss after one step); (2) remat.profile of the unplanned model and
remat.plan at every budget x solver (timed: the planning time); (3) for every peer strategy
and every distinct remat plan: remat's tracker peak (remat.profile, real mode, on the model as
the strategy modified it), FLOPs and gradients (FlopCounterMode, seed 0), the process peak
(VmHWM reset before the step, see common.rss_step_peak); (4) remat plans matched to each peer
point (budget = the peer's measured peak); (5) step times, all strategies interleaved.
"""

from __future__ import annotations

import gc
import json
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

try:
    import transformers  # noqa: F401  (imported before the baseline RSS is read)

    transformers.logging.set_verbosity_error()
except ImportError:  # pragma: no cover
    pass

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remat  # noqa: E402
from common import (  # noqa: E402
    adam,
    adam_params,
    compare_grads,
    flops_and_grads,
    rss_now,
    rss_step_peak,
    static_bytes,
    step,
    zero_grads,
)
from models import build  # noqa: E402
from strategies import Applied, applicable, family, how, label  # noqa: E402

warnings.filterwarnings("ignore")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


TOL_TRACKER = 64 * 1024


def tol_process(peak: float) -> float:
    """Noise of the process method (page and heap granularity): max(1 MiB, 1%)."""
    return max(2**20, 0.01 * peak)


def plan_key(plan: remat.Plan) -> str:
    return "remat:" + json.dumps([plan.segments, sorted(getattr(plan, "selective", [])), sorted(getattr(plan, "offload", []))])


def plan_spec(plan: remat.Plan) -> dict:
    sel = list(getattr(plan, "selective", []))
    off = list(getattr(plan, "offload", []))  # remat versions that also plan offload to CPU memory
    what = f"{len(plan.segments)} ckpt" + (f" + {len(sel)} selective" if sel else "") + (f" + {len(off)} offload" if off else "")
    return {"kind": "remat", "plan": plan.to_json(), "label": f"remat {plan.solver} ({what})",
            "segments": plan.segments, "selective": sel}


def main(spec: dict) -> dict:
    torch.set_num_threads(int(spec["threads"]))
    t_start = time.perf_counter()
    # (1) the fresh-process figure of the unplanned step
    gc.collect()
    base = rss_now()
    bench = build(spec["model"], spec["size"])
    model = bench.model
    fn = lambda: bench.loss(bench.call())  # noqa: E731
    opt = adam(model)
    step(bench, fn, opt)
    fresh_none = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    del opt
    zero_grads(model)
    gc.collect()
    out: dict = {"model": spec["model"], "size": spec["size"], "describe": bench.describe(),
                 "fresh_none_rss": fresh_none, "static_bytes": static_bytes(bench),
                 "params": sum(p.numel() for p in model.parameters())}

    # (2) remat: profile + plans (planning time)
    t0 = time.perf_counter()
    prof = remat.profile(model, bench.inputs, loss_fn=bench.loss_fn, optimizer=adam_params)
    profile_s = time.perf_counter() - t0
    out.update(profile_s=profile_s, unplanned_tracker_peak=prof.peak_bytes, peak_phase=prof.peak_phase,
               n_blocks=len(prof.blocks), step_flops=prof.forward_flops + prof.backward_flops)
    configs: dict[str, dict] = {}  # key -> {"spec": ..., results}
    order: list[str] = []

    def add(key, s, **meta):
        if key not in configs:
            configs[key] = {"key": key, "spec": s, "label": label(s), "family": family(s), "how": how(bench, s), **meta}
            order.append(key)
        return key

    add("none", {"kind": "none"})
    skipped = []
    peers = [{"kind": "every_block"}, *({"kind": "ckpt_seq", "k": k} for k in spec["sweep"]), {"kind": "chen"}, {"kind": "sac"}]
    for s in peers:
        why = applicable(bench, s)
        if why:
            if s["kind"] != "ckpt_seq" or s["k"] == 2:
                skipped.append({"label": label(s) if s["kind"] != "ckpt_seq" else "checkpoint_sequential(k)", "why": why})
            continue
        add(json.dumps(s), s)

    plans = []  # one row per (budget, solver)
    for frac in spec["budgets"]:
        for solver in spec["solvers"]:
            t0 = time.perf_counter()
            row = {"budget_frac": frac, "budget_bytes": int(frac * prof.peak_bytes), "solver": solver}
            try:
                p = remat.plan(prof, frac, solver=solver)
                row["plan_s"] = time.perf_counter() - t0
                row.update(status="ok", predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops,
                           solver_used=p.solver, n_segments=len(p.segments),
                           n_selective=len(getattr(p, "selective", [])))
                row["key"] = add(plan_key(p), plan_spec(p), predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)
            except remat.InfeasibleBudget as e:
                row.update(status="infeasible", plan_s=time.perf_counter() - t0, min_bytes=e.min_bytes)
            except remat.RematError as e:
                row.update(status="error", plan_s=time.perf_counter() - t0, error=str(e).split(". Fix")[0])
            plans.append(row)
            log(f"  plan {frac:.0%} {solver}: {row['status']} {row.get('plan_s', 0):.2f}s")
    t0 = time.perf_counter()
    front = remat.frontier(prof)
    out["frontier_s"] = time.perf_counter() - t0
    out["frontier_solver_points"] = {"auto": len(front)}
    # remat.frontier(solver="auto") can stop early (seen: HiGHS "Solve error" at one budget, which ilp
    # reads as infeasible; docs/peers.md "Bugs found"): add dp's frontier where dp applies, keep the Pareto set.
    try:
        t0 = time.perf_counter()
        front_dp = remat.frontier(prof, solver="dp")
        out["frontier_dp_s"] = time.perf_counter() - t0
        out["frontier_solver_points"]["dp"] = len(front_dp)
    except remat.RematError:
        front_dp = []
    merged = sorted(front + front_dp, key=lambda p: (p.recompute_flops, p.peak_bytes))
    pareto = []
    for p in merged:
        if not pareto or p.peak_bytes < pareto[-1].peak_bytes:
            pareto.append(p)
    front = pareto
    out["frontier"] = [{"peak": p.peak_bytes, "flops": p.recompute_flops, "solver": p.solver} for p in front]
    # measure up to `frontier_points` plans of the frontier too (evenly spread), for the measured curve
    n = int(spec.get("frontier_points", 0))
    if n and len(front) > 1:
        picks = front[1:] if len(front) - 1 <= n else [front[1 + round(i * (len(front) - 2) / max(1, n - 1))] for i in range(n)]
    else:
        picks = []
    for p in picks:
        add(plan_key(p), plan_spec(p), predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)

    # diagnostic: every block that has a selective unit, selective (hand-built with remat's own make_plan):
    # what the planner predicts for it against what it measures (docs/peers.md "Bugs found", selective on the
    # last block).  Not a remat decision: shown in the per-model table, left out of the verdicts.
    try:
        from remat.planner.api import make_plan
        from remat.planner.problem import Problem

        problem = Problem.from_profile(prof)
        sel = [u for u in problem.units if u.action == "selective" and problem.is_useful(u)]
        if len(sel) >= 2 and Problem.compatible(sel):
            p = make_plan(prof, problem, sel, "hand-built", None)
            s = plan_spec(p)
            s["label"] = f"diagnostic: selective on all {len(sel)} blocks (hand-built)"
            k = add("diag:" + plan_key(p), s, predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)
            configs[k]["family"] = "diagnostic"
    except Exception as e:  # internal API: the diagnostic must not stop the run
        log(f"  diagnostic skipped: {type(e).__name__}: {e}")

    # (3) measure
    ref_flops, ref_grads = flops_and_grads(bench, fn)
    out["none_flops"] = ref_flops

    def measure(key):
        c = configs[key]
        if "tracker_peak" in c or "error" in c:
            return c
        a = Applied(bench, c["spec"])
        applied = False
        try:
            a.on()
            applied = True
            t0 = time.perf_counter()
            p = remat.profile(model, bench.inputs, loss_fn=bench.loss_fn, optimizer=adam_params)
            c["tracker_s"] = time.perf_counter() - t0
            c["tracker_peak"], c["tracker_phase"] = p.peak_bytes, p.peak_phase
            fl, g = flops_and_grads(bench, fn)
            c["flops"], c["extra_flops"] = fl, fl - ref_flops
            c["grads"] = compare_grads(ref_grads, g)
            c["rss_peak"] = rss_step_peak(bench, fn)
        except Exception as e:  # a strategy that fails on this model is a result, not a crash
            c["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if applied:
                a.off()
            zero_grads(model)
        log(f"  {c['label']:<40} tracker {c.get('tracker_peak', 0) / 2**20:8.1f} MiB  rss {c.get('rss_peak', 0) / 2**20:8.1f}"
            f"  +{c.get('extra_flops', 0) / 1e9:7.2f} GFLOP  {c.get('error', '')}")
        return c

    for key in list(order):
        measure(key)
    none = configs["none"]
    offset = none["rss_peak"] - none["tracker_peak"]  # process figure minus tracker figure, unplanned

    # (4) remat at each peer's measured peak.  Budget = the peer's peak plus a tolerance: TOL_TRACKER for
    # tracker peaks (byte-exact, but a strategy can differ by a few hundred bytes of bookkeeping: seen 512 B),
    # and for torch.compile (process peaks only) the peak minus the unplanned process-tracker offset, plus
    # tol_process(), the process method's noise.  report.verdicts compares with the same tolerances.
    matched = []
    peer_points = [(configs[k]["label"], configs[k]["tracker_peak"], "tracker", configs[k].get("extra_flops"))
                   for k in order if configs[k]["family"] not in ("none", "remat", "diagnostic") and "tracker_peak" in configs[k]]
    peer_points += [(c["label"], c["rss_peak"] - offset, "rss", c.get("extra_flops")) for c in spec.get("compile_points", [])]
    for lab, peak, method, _ in peer_points:
        tol = TOL_TRACKER if method == "tracker" else tol_process(peak + offset)
        budget = int(peak + tol)
        row = {"peer": lab, "budget_bytes": budget, "peer_budget_bytes": int(peak), "tol_bytes": int(tol), "method": method}
        t0 = time.perf_counter()
        try:
            try:
                p = remat.plan(prof, budget, solver="auto")
            except remat.InfeasibleBudget as e:
                if e.min_bytes > budget:
                    raise
                # remat's own message says a plan fits (least < budget): the ILP failed, not the budget
                # (HiGHS "Solve error"; docs/peers.md "Bugs found").  Take dp's plan, and say so.
                row["solver_note"] = (f"plan(solver='auto') raised InfeasibleBudget although its least is "
                                      f"{e.min_bytes} B < budget {budget} B; dp's plan used")
                p = remat.plan(prof, budget, solver="dp")
            row.update(status="ok", plan_s=time.perf_counter() - t0, predicted_peak=p.peak_bytes,
                       predicted_flops=p.recompute_flops)
            row["key"] = add(plan_key(p), plan_spec(p), predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)
            measure(row["key"])
        except remat.InfeasibleBudget as e:
            row.update(status="infeasible", plan_s=time.perf_counter() - t0, min_bytes=e.min_bytes)
        except remat.RematError as e:
            row.update(status="error", error=str(e).split(". Fix")[0])
        matched.append(row)
    for key in order:
        measure(key)  # plans from (2) not measured yet

    # (5) interleaved step times
    ok = [k for k in order if "error" not in configs[k]]
    appl = {k: Applied(bench, configs[k]["spec"]) for k in ok}
    opt = adam(model)
    times = {k: [] for k in ok}
    for r in range(spec["rounds"] + 1):  # round 0 is the warm-up
        for k in ok:
            appl[k].on()
            try:
                t0 = time.perf_counter()
                step(bench, fn, opt)
                dt = time.perf_counter() - t0
            finally:
                appl[k].off()
            opt.zero_grad(set_to_none=True)
            if r:
                times[k].append(dt)
    for k in ok:
        c = configs[k]
        c["step_s"] = statistics.median(times[k])
        c["time_ratio"] = statistics.median(t / b for t, b in zip(times[k], times["none"]))
        c["time_ratios"] = [t / b for t, b in zip(times[k], times["none"])]
    out.update(configs=[configs[k] for k in order], plans=plans, matched=matched, skipped=skipped,
               rss_offset=offset, threads=torch.get_num_threads(), elapsed_s=time.perf_counter() - t_start)
    return out


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    res = main(spec)
    Path(sys.argv[2]).write_text(json.dumps(res))
