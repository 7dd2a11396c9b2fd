"""Worker: every eager strategy on one model, in one fresh interpreter (run by run.py).

    run_fresh("peers/worker_eager.py:run", spec)   (benchmarks/_worker.py, under remat.verifier.process.PROCESS_ENV)

Order: (1) the MEASURING.md figure of the unplanned step (this process is fresh: RSS before
the model is built, VmHWM after one step); (2) remat.profile of the unplanned model and
remat.plan at every budget x solver (timed: the planning time); (3) for every peer strategy
and every distinct remat plan: remat's tracker peak (remat.profile, real mode, on the model as
the strategy modified it), FLOPs and gradients (FlopCounterMode, seed 0), the process peak
(heap trimmed and VmHWM reset before the step, see measure.rss_step_peak); (4) remat plans matched to each peer
point (budget = the peer's measured peak); (5) step times, all strategies interleaved.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import warnings

import torch

import remat
from remat.planner import Problem, make_plan
from remat.verifier.process import high_water_mark_bytes, resident_bytes

from measure import (  # noqa: E402
    adam,
    adam_params,
    compare_grads,
    flops_and_grads,
    rss_step_peak,
    static_bytes,
    step,
    zero_grads,
)
from _models import make_bench as build  # noqa: E402
from strategies import Applied, applicable, family, how, label  # noqa: E402

warnings.filterwarnings("ignore")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


TOL_TRACKER = 64 * 1024


def tol_process(peak: float) -> float:
    """Noise of the process method (page and heap granularity): max(1 MiB, 1%)."""
    return max(2**20, 0.01 * peak)


def plan_key(plan: remat.Plan) -> str:
    return "remat:" + json.dumps(
        [plan.segments, sorted(getattr(plan, "selective", [])), sorted(getattr(plan, "offload", []))]
    )


def plan_spec(plan: remat.Plan) -> dict:
    sel = list(getattr(plan, "selective", []))
    off = list(getattr(plan, "offload", []))  # remat versions that also plan offload to CPU memory
    what = (
        f"{len(plan.segments)} ckpt"
        + (f" + {len(sel)} selective" if sel else "")
        + (f" + {len(off)} offload" if off else "")
    )
    return {
        "kind": "remat",
        "plan": plan.to_json(),
        "label": f"remat {plan.solver} ({what})",
        "segments": plan.segments,
        "selective": sel,
        "selective_keeps": dict(plan.selective_keeps),
        "offload": off,
    }


def pareto(plans: list) -> list:
    """The plans no other beats in both extra FLOPs and peak, fewest FLOPs first."""
    out = []
    for p in sorted(plans, key=lambda p: (p.recompute_flops, p.peak_bytes)):
        if not out or p.peak_bytes < out[-1].peak_bytes:
            out.append(p)
    return out


def spread(front: list, n: int) -> list:
    """Up to n plans of the frontier after its first (keep-everything) point, evenly spread."""
    if not n or len(front) <= 1:
        return []
    if len(front) - 1 <= n:
        return front[1:]
    return [front[1 + round(i * (len(front) - 2) / max(1, n - 1))] for i in range(n)]


class EagerRun:
    """Every eager strategy on one Bench; `configs` (key -> figures) in the order they were added."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.out: dict = {}
        self.configs: dict[str, dict] = {}
        self.order: list[str] = []
        self.fresh_figure()

    def fresh_figure(self) -> None:
        """(1) The MEASURING.md figure of the unplanned step: this process is fresh."""
        gc.collect()
        base = resident_bytes()
        self.bench = bench = build(self.spec["model"], self.spec["size"])
        self.model = bench.model
        self.fn = lambda: bench.loss(bench.call())
        opt = adam(self.model)
        step(bench, self.fn, opt)
        fresh_none = high_water_mark_bytes() - base
        del opt
        zero_grads(self.model)
        gc.collect()
        self.out.update(
            model=self.spec["model"],
            size=self.spec["size"],
            describe=bench.describe(),
            fresh_none_rss=fresh_none,
            fresh_none_reader="VmHWM",
            static_bytes=static_bytes(bench),
            params=sum(p.numel() for p in self.model.parameters()),
        )

    def profile(self):
        return remat.profile(self.model, self.bench.inputs, loss_fn=self.bench.loss_fn, optimizer=adam_params)

    def add(self, key: str, s: dict, **meta) -> str:
        if key not in self.configs:
            self.configs[key] = {
                "key": key,
                "spec": s,
                "label": label(s),
                "family": family(s),
                "how": how(self.bench, s),
                **meta,
            }
            self.order.append(key)
        return key

    def add_plan(self, p: remat.Plan) -> str:
        return self.add(plan_key(p), plan_spec(p), predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)

    def add_peers(self) -> None:
        self.add("none", {"kind": "none"})
        skipped = []
        peers = [
            {"kind": "every_block"},
            *({"kind": "ckpt_seq", "k": k} for k in self.spec["sweep"]),
            {"kind": "chen"},
            {"kind": "sac"},
        ]
        for s in peers:
            why = applicable(self.bench, s)
            if not why:
                self.add(json.dumps(s), s)
            elif s["kind"] != "ckpt_seq" or s["k"] == 2:
                skipped.append(
                    {"label": label(s) if s["kind"] != "ckpt_seq" else "checkpoint_sequential(k)", "why": why}
                )
        self.out["skipped"] = skipped

    def plan_budgets(self) -> None:
        """(2) remat.profile once, then remat.plan at every budget x solver (timed: the planning time)."""
        t0 = time.perf_counter()
        self.prof = prof = self.profile()
        self.out.update(
            profile_s=time.perf_counter() - t0,
            unplanned_tracker_peak=prof.peak_bytes,
            peak_phase=prof.peak_phase,
            n_blocks=len(prof.blocks),
            step_flops=prof.forward_flops + prof.backward_flops,
        )
        plans = []  # one row per (budget, solver)
        for frac in self.spec["budgets"]:
            for solver in self.spec["solvers"]:
                row = {"budget_frac": frac, "budget_bytes": int(frac * prof.peak_bytes), "solver": solver}
                t0 = time.perf_counter()
                try:
                    p = remat.plan(prof, frac, solver=solver)
                    row["plan_s"] = time.perf_counter() - t0
                    row.update(
                        status="ok",
                        predicted_peak=p.peak_bytes,
                        predicted_flops=p.recompute_flops,
                        solver_used=p.solver,
                        n_segments=len(p.segments),
                        n_selective=len(getattr(p, "selective", [])),
                    )
                    row["key"] = self.add_plan(p)
                except remat.InfeasibleBudget as e:
                    row.update(status="infeasible", plan_s=time.perf_counter() - t0, min_bytes=e.min_bytes)
                except remat.RematError as e:
                    row.update(status="error", plan_s=time.perf_counter() - t0, error=str(e).split(". Fix")[0])
                plans.append(row)
                log(f"  plan {frac:.0%} {solver}: {row['status']} {row.get('plan_s', 0):.2f}s")
        self.out["plans"] = plans

    def frontier(self) -> None:
        """remat.frontier(solver="auto") can stop early (seen: HiGHS "Solve error" at one budget, which ilp
        reads as infeasible; docs/peers.md "Bugs found"): add dp's frontier where dp applies, keep the
        Pareto set; measure up to `frontier_points` plans of it too (evenly spread)."""
        t0 = time.perf_counter()
        front = remat.frontier(self.prof)
        self.out["frontier_s"] = time.perf_counter() - t0
        self.out["frontier_solver_points"] = {"auto": len(front)}
        try:
            t0 = time.perf_counter()
            front_dp = remat.frontier(self.prof, solver="dp")
            self.out["frontier_dp_s"] = time.perf_counter() - t0
            self.out["frontier_solver_points"]["dp"] = len(front_dp)
        except remat.RematError:
            front_dp = []
        front = pareto(front + front_dp)
        self.out["frontier"] = [{"peak": p.peak_bytes, "flops": p.recompute_flops, "solver": p.solver} for p in front]
        for p in spread(front, int(self.spec.get("frontier_points", 0))):
            self.add_plan(p)

    def diagnostic(self) -> None:
        """Every block that has a selective unit, selective (hand-built with remat's own make_plan): what the
        planner predicts for it against what it measures (docs/peers.md "Bugs found", selective on the last
        block).  Not a remat decision: shown in the per-model table, left out of the verdicts."""
        try:
            problem = Problem.from_profile(self.prof)
            sel = [u for u in problem.units if u.action == "selective" and problem.is_useful(u)]
            if len(sel) >= 2 and Problem.compatible(sel):
                p = make_plan(self.prof, problem, sel, "hand-built", None)
                s = plan_spec(p)
                s["label"] = f"diagnostic: selective on all {len(sel)} blocks (hand-built)"
                k = self.add("diag:" + plan_key(p), s, predicted_peak=p.peak_bytes, predicted_flops=p.recompute_flops)
                self.configs[k]["family"] = "diagnostic"
        except Exception as e:  # internal API: the diagnostic must not stop the run
            log(f"  diagnostic skipped: {type(e).__name__}: {e}")

    def measure(self, key: str) -> dict:
        """(3) remat's tracker peak, FLOPs and gradients, and the process peak, of one strategy (once)."""
        c = self.configs[key]
        if "tracker_peak" in c or "error" in c:
            return c
        a = Applied(self.bench, c["spec"])
        applied = False
        try:
            a.on()
            applied = True
            t0 = time.perf_counter()
            p = self.profile()
            c["tracker_s"] = time.perf_counter() - t0
            c["tracker_peak"], c["tracker_phase"] = p.peak_bytes, p.peak_phase
            fl, g = flops_and_grads(self.bench, self.fn)
            c["flops"], c["extra_flops"] = fl, fl - self.ref_flops
            c["grads"] = compare_grads(self.ref_grads, g)
            c["rss_peak"] = rss_step_peak(self.bench, self.fn)
        except Exception as e:  # a strategy that fails on this model is a result, not a crash
            c["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if applied:
                a.off()
            zero_grads(self.model)
        log(
            f"  {c['label']:<40} tracker {c.get('tracker_peak', 0) / 2**20:8.1f} MiB  rss {c.get('rss_peak', 0) / 2**20:8.1f}"
            f"  +{c.get('extra_flops', 0) / 1e9:7.2f} GFLOP  {c.get('error', '')}"
        )
        return c

    def measure_all(self) -> None:
        self.ref_flops, self.ref_grads = flops_and_grads(self.bench, self.fn)
        self.out["none_flops"] = self.ref_flops
        for key in list(self.order):
            self.measure(key)
        none = self.configs["none"]
        self.offset = none["rss_peak"] - none["tracker_peak"]  # process figure minus tracker figure, unplanned

    def peer_points(self) -> list[tuple[str, float, str]]:
        """(label, peak to match, method) of every measured peer point and every torch.compile point."""
        points = [
            (c["label"], c["tracker_peak"], "tracker")
            for c in map(self.configs.get, self.order)
            if c["family"] not in ("none", "remat", "diagnostic") and "tracker_peak" in c
        ]
        return points + [(c["label"], c["rss_peak"] - self.offset, "rss") for c in self.spec.get("compile_points", [])]

    def match_peers(self) -> None:
        """(4) remat at each peer's measured peak.  Budget = the peer's peak plus a tolerance: TOL_TRACKER for
        tracker peaks (byte-exact, but a strategy can differ by a few hundred bytes of bookkeeping: seen 512 B),
        and for torch.compile (process peaks only) the peak minus the unplanned process-tracker offset, plus
        tol_process(), the process method's noise.  report.verdicts compares with the same tolerances."""
        matched = []
        for lab, peak, method in self.peer_points():
            tol = TOL_TRACKER if method == "tracker" else tol_process(peak + self.offset)
            budget = int(peak + tol)
            row = {
                "peer": lab,
                "budget_bytes": budget,
                "peer_budget_bytes": int(peak),
                "tol_bytes": int(tol),
                "method": method,
            }
            t0 = time.perf_counter()
            try:
                p = self.plan_at(budget, row)
                row.update(
                    status="ok",
                    plan_s=time.perf_counter() - t0,
                    predicted_peak=p.peak_bytes,
                    predicted_flops=p.recompute_flops,
                )
                row["key"] = self.add_plan(p)
                self.measure(row["key"])
            except remat.InfeasibleBudget as e:
                row.update(status="infeasible", plan_s=time.perf_counter() - t0, min_bytes=e.min_bytes)
            except remat.RematError as e:
                row.update(status="error", error=str(e).split(". Fix")[0])
            matched.append(row)
        self.out["matched"] = matched
        for key in self.order:
            self.measure(key)  # plans from (2) not measured yet

    def plan_at(self, budget: int, row: dict) -> remat.Plan:
        try:
            return remat.plan(self.prof, budget, solver="auto")
        except remat.InfeasibleBudget as e:
            if e.min_bytes > budget:
                raise
            # remat's own message says a plan fits (least < budget): the ILP failed, not the budget
            # (HiGHS "Solve error"; docs/peers.md "Bugs found").  Take dp's plan, and say so.
            row["solver_note"] = (
                f"plan(solver='auto') raised InfeasibleBudget although its least is "
                f"{e.min_bytes} B < budget {budget} B; dp's plan used"
            )
            return remat.plan(self.prof, budget, solver="dp")

    def time_steps(self) -> None:
        """(5) Step times, all strategies interleaved, each round starting one strategy further on (no strategy
        always runs after the same one); round 0 is the warm-up."""
        ok = [k for k in self.order if "error" not in self.configs[k]]
        appl = {k: Applied(self.bench, self.configs[k]["spec"]) for k in ok}
        opt = adam(self.model)
        times = {k: [] for k in ok}
        for r in range(self.spec["rounds"] + 1):
            for k in ok[r % len(ok) :] + ok[: r % len(ok)]:
                appl[k].on()
                try:
                    t0 = time.perf_counter()
                    step(self.bench, self.fn, opt)
                    dt = time.perf_counter() - t0
                finally:
                    appl[k].off()
                opt.zero_grad(set_to_none=True)
                if r:
                    times[k].append(dt)
        for k in ok:
            ratios = [t / b for t, b in zip(times[k], times["none"])]
            self.configs[k].update(
                step_s=statistics.median(times[k]), time_ratio=statistics.median(ratios), time_ratios=ratios
            )


def run(spec: dict) -> dict:
    torch.set_num_threads(int(spec["threads"]))
    t_start = time.perf_counter()
    run = EagerRun(spec)
    run.add_peers()
    run.plan_budgets()
    run.frontier()
    run.diagnostic()
    run.measure_all()
    run.match_peers()
    run.time_steps()
    run.out.update(
        configs=[run.configs[k] for k in run.order],
        rss_offset=run.offset,
        threads=torch.get_num_threads(),
        elapsed_s=time.perf_counter() - t_start,
    )
    return run.out
