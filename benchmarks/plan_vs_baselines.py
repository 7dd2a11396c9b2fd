"""remat's plans against the hand recipes, the predictions against measurement, and planning speed.

Three sections, written with the date, machine, torch version and thread count to
benchmarks/results/plan_vs_baselines.md (+ .json); the frontier plots go to docs/frontier_*.png.

  1. Against the baselines (fake mode: predicted, exact bytes and FLOPs): for budgets of
     30, 40, ..., 90% of the unplanned peak, remat's extra FLOPs (dp and ilp) beside the
     best `checkpoint_sequential(k)` that fits, "checkpoint every block" and Chen's sqrt(n),
     all predicted on the same step with the same memory model.
  2. The prediction holds (real mode): the checkpoint applied by hand (checkpoint_sequential
     with use_reentrant=False on an nn.Sequential, remat's own segments as hand-written
     non-reentrant checkpoints, checkpoint_wrapper around GPT-2 layers, and for remat's
     selective checkpoints torch's create_selective_checkpoint_contexts), measured with
     remat.profile and with the process's own RSS (fresh interpreter, MALLOC_MMAP_THRESHOLD_=65536,
     MEASURING.md), against the plan's predicted peak and extra FLOPs.
  3. Speed: remat.plan(solver="dp") on a 100-stage chain, remat.plan(solver="ilp") on GPT-2
     medium (24 layers) built under FakeTensorMode, "auto" and "ilp" on a 16-layer Llama's timed profile.

    python benchmarks/plan_vs_baselines.py            # full (about 30 min on 2 shared cores)
    python benchmarks/plan_vs_baselines.py --quick    # budgets 50/70/90%, smaller models, no process RSS,
                                                      # no plots; writes results/plan_vs_baselines.quick.md
    python benchmarks/plan_vs_baselines.py --from-json benchmarks/results/plan_vs_baselines.json  # re-render

The tables are rendered from the run's data (_plan_report.py); the hand-applied checkpoints are
`_models.apply_by_hand`, measured in a fresh interpreter (`_common.run_fresh(STEP, ...)`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

import remat
from remat.cli import pareto
from remat.planner import Problem, baseline_plans, dp
from remat.report.plot import plot_frontier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STEP, machine_info, run_fresh, write_results  # noqa: E402
from _models import apply_by_hand, build  # noqa: E402
from _plan_report import SEQ, prediction_row, render, speed_row, verdict  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"
BUDGETS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
QUICK_BUDGETS = (0.5, 0.7, 0.9)
TITLE = "remat plans vs the hand recipes"


def profile(name: str, kwargs: dict, fake: bool) -> remat.StepProfile:
    model, inputs, _ = build(name, kwargs, fake=fake)
    return remat.profile(model, inputs, optimizer=torch.optim.Adam, mode="fake" if fake else "real")


def as_hand_recipe(plan: remat.Plan) -> dict:
    return {"kind": "plan", "segments": plan.segments, "selective": list(plan.selective)}


def describe(plan: remat.Plan) -> str:
    sel = len(plan.selective)
    return f"{len(plan.segments)} checkpoints" + (f" + {sel} selective" if sel else "")


def try_plan(prof: remat.StepProfile, budget: int, solver: str):
    t0 = time.perf_counter()
    try:
        p = remat.plan(prof, budget, solver=solver)
    except remat.InfeasibleBudget as e:
        return None, e.min_bytes, time.perf_counter() - t0
    except remat.RematError:  # e.g. dp on a profile that is not one chain
        return None, None, time.perf_counter() - t0
    return p, None, time.perf_counter() - t0


def summary(p: remat.Plan | None) -> dict | None:
    if p is None:
        return None
    return {"flops": p.recompute_flops, "peak_bytes": p.peak_bytes, "segments": len(p.segments)}


# -- 1. against the baselines -----------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    key: str
    label: str
    model: str
    kwargs: dict


def table_cases(quick: bool) -> list[Case]:
    cases = [
        Case("hetero", "heterogeneous chain: 14 x [Linear, GELU], widths 64..2048, batch 8192", "hetero", {}),
        Case(
            "chain001",
            "report-001 chain: 32 x [Linear(1024), ReLU] + Sigmoid, batch 8192",
            "chain",
            {"batch": 8192, "blocks": 8 if quick else 32},
        ),
        Case(
            "gpt2",
            "GPT-2 small: 12 x 768, 12 heads, vocab 50257, seq 1024, batch 8",
            "gpt2",
            {"n_layer": 12, "n_embd": 768, "n_head": 12, "seq": 1024, "batch": 8, "vocab": 50257},
        ),
        Case(
            "bert",
            "BERT base: 12 x 768, 12 heads, vocab 30522, seq 512, batch 16",
            "bert",
            {"n_layer": 12, "hidden": 768, "heads": 12, "seq": 512, "batch": 16, "vocab": 30522},
        ),
    ]
    if quick:
        cases[1].label = "report-001 chain, 8 blocks of [Linear(1024), ReLU] + Sigmoid, batch 8192"
    return cases


def unrestricted_dp(prof: remat.StepProfile) -> Problem | None:
    """The same problem with every run of siblings allowed as one checkpoint (also on an nn.ModuleList,
    which remat.apply cannot wrap): what the DP would reach if apply could build those segments."""
    problem = Problem.from_profile(prof)
    if all(getattr(u, "appliable", True) for u in problem.units):
        return None
    units = [dataclasses.replace(u, appliable=True) for u in problem.units]
    return Problem(problem.live, units, problem.groups, problem.block_spans, problem.model)


def best_fitting(baselines: dict[str, remat.Plan], budget: int, only_sequential: bool) -> dict | None:
    """The recipe with the fewest extra FLOPs that fits, as {"name", **summary}."""
    names = [n for n, p in baselines.items() if (n.startswith(SEQ) or not only_sequential) and p.peak_bytes <= budget]
    if not names:
        return None
    name = min(names, key=lambda n: (baselines[n].recompute_flops, baselines[n].peak_bytes))
    return {"name": name, **summary(baselines[name])}


def budget_entry(prof: remat.StepProfile, baselines: dict, wide: Problem | None, f: float) -> dict:
    """remat's dp and ilp plans and every recipe at one budget (a fraction f of the unplanned peak)."""
    budget = int(f * prof.peak_bytes)
    got = {s: try_plan(prof, budget, s) for s in ("dp", "ilp")}
    fitting = {
        name: summary(p) if p is not None and p.peak_bytes <= budget else None
        for name, p in (("every_block", baselines.get("every-block")), ("chen", baselines.get("chen")))
    }
    entry = {
        "budget_fraction": f,
        "budget_bytes": budget,
        **{s: {"plan": summary(p), "min_bytes": least, "seconds": seconds} for s, (p, least, seconds) in got.items()},
        "best_sequential": best_fitting(baselines, budget, only_sequential=True),
        "best": best_fitting(baselines, budget, only_sequential=False),
        **fitting,
    }
    if wide is not None:
        chosen = dp.solve(wide, budget)
        entry["dp_segments_allowed"] = {"flops": wide.cost(chosen), "peak_bytes": wide.peak(chosen)} if chosen else None
    entry["outcome"] = verdict(entry)[1]
    return entry


def compare(case: Case, prof: remat.StepProfile, plots: bool, budgets=BUDGETS) -> dict:
    baselines = baseline_plans(prof)
    wide = unrestricted_dp(prof)
    entries = []
    for f in budgets:
        entries.append(budget_entry(prof, baselines, wide, f))
        print(f"  {case.key:<10} {f:.0%}  {verdict(entries[-1])[0]}", flush=True)
    if plots:
        path = DOCS / f"frontier_{case.key}.png"
        plot_frontier(
            pareto(remat.frontier(prof, max_points=256)),
            path,
            budget_bytes=int(0.5 * prof.peak_bytes),
            baselines=baselines,
        )
        print(f"  wrote {path}", flush=True)
    return {
        "label": case.label,
        "unplanned_peak_bytes": prof.peak_bytes,
        "step_flops": prof.forward_flops + prof.backward_flops,
        "blocks": len(prof.blocks),
        "budgets": entries,
    }


def against_baselines(quick: bool) -> dict:
    out = {}
    for case in table_cases(quick):
        t = time.perf_counter()
        prof = profile(case.model, case.kwargs, fake=True)
        out[case.key] = compare(case, prof, plots=not quick, budgets=QUICK_BUDGETS if quick else BUDGETS)
        print(f"  ({case.key}: {time.perf_counter() - t:.0f} s)", flush=True)
    return out


# -- 2. the prediction holds -------------------------------------------------------------------------


def prediction_cases(quick: bool) -> list[dict]:
    if quick:
        chain_kw, ks = {"width": 512, "blocks": 8, "batch": 2048}, (4,)
        gpt_kw = {"n_layer": 4, "n_embd": 128, "n_head": 4, "seq": 128, "batch": 2, "vocab": 2048}
    else:
        chain_kw, ks = {"width": 1024, "blocks": 32, "batch": 8192}, (2, 4, 8, 16, 32)  # MEASURING.md's chain
        gpt_kw = {"n_layer": 4, "n_embd": 512, "n_head": 8, "seq": 512, "batch": 2, "vocab": 8192}
    w, blocks = chain_kw["width"], chain_kw["blocks"]
    cases = [
        {
            "model": "chain",
            "kwargs": chain_kw,
            "label": f"report-001 chain {blocks} x [Linear({w}), ReLU] + Sigmoid, batch {chain_kw['batch']}",
            "recipes": [f"checkpoint_sequential({k})" for k in ks if k <= blocks],
        },
        {
            "model": "hetero",
            "kwargs": {"batch": 8192},
            "label": "heterogeneous chain, batch 8192",
            "plans": ("middle", "least"),
        },
        {
            "model": "gpt2",
            "kwargs": gpt_kw,
            "label": f"HF GPT-2 4 x {gpt_kw['n_embd']}, seq {gpt_kw['seq']}, batch 2",
            "recipes": ["every-block"],
            "plans": () if quick else ("middle", "least"),
        },
    ]
    return [c for c in cases if not (quick and c["model"] == "hetero")]


def frontier_pick(prof: remat.StepProfile, which: str) -> remat.Plan:
    """A plan of the frontier: the one with the least memory, or the one halfway along it."""
    plans = pareto(remat.frontier(prof, max_points=256))
    return plans[-1] if which == "least" else plans[len(plans) // 2]


def checkpoints_to_try(case: dict, prof: remat.StepProfile) -> list[tuple[str, remat.Plan, dict]]:
    """(name, the plan that predicts it, how to apply it by hand) for no checkpoint, each recipe and each plan."""
    recipes = baseline_plans(prof)
    todo = [("no checkpoint", remat.plan(prof, 1.0), {"kind": "none"})]  # the unplanned step: keep everything
    for name in case.get("recipes", []):
        how = (
            {"kind": "sequential", "k": int(name[len(SEQ) : -1])}
            if name.startswith(SEQ)
            else as_hand_recipe(recipes[name])
        )
        todo.append((name, recipes[name], how))
    for which in case.get("plans", ()):
        p = frontier_pick(prof, which)
        todo.append((f"remat {p.solver} plan, {which} of the frontier ({describe(p)})", p, as_hand_recipe(p)))
    return todo


def prediction(quick: bool, threads: int) -> list[dict]:
    data = []
    for case in prediction_cases(quick):
        prof = profile(case["model"], case["kwargs"], fake=False)
        offset = None
        for name, predicted, how in checkpoints_to_try(case, prof):
            model, inputs, _ = build(case["model"], case["kwargs"])
            measured = remat.profile(apply_by_hand(model, how), inputs, optimizer=torch.optim.Adam)
            proc = (
                None
                if quick
                else run_fresh(
                    STEP,
                    {
                        "model": case["model"],
                        "kwargs": case["kwargs"],
                        "how": how,
                        "method": "process",
                        "threads": threads,
                    },
                )["proc_peak"]
            )
            if offset is None and proc is not None:  # unplanned: process minus tensors = the procedure's overhead
                offset = proc - measured.peak_bytes
            data.append(
                {
                    "model": case["label"],
                    "checkpoint": name,
                    "predicted_peak_bytes": predicted.peak_bytes,
                    "profile_peak_bytes": measured.peak_bytes,
                    "process_peak_bytes": proc,
                    "process_overhead_bytes": offset,
                    "predicted_flops": predicted.recompute_flops,
                    "measured_flops": measured.recompute_flops,
                    "predicted_recompute_s": predicted.recompute_s,
                    "measured_peak_phase": measured.peak_phase,
                }
            )
            row = prediction_row(data[-1])
            print(f"  {case['label'][:30]:<30} {name[:50]:<50} {row[4]:>7} {row[6]:>7} {row[7]:>7}", flush=True)
    return data


# -- 3. speed ----------------------------------------------------------------------------------------


def speed(quick: bool) -> list[dict]:
    data = []
    prof = profile("chain100", {}, fake=True)
    for f in (0.5,) if quick else (0.5, 0.7, 0.9, 0.3):
        data.append(timed_plan("dp", "100-stage chain: 50 x [Linear, GELU], widths 64..2048, batch 4096", prof, f))
    prof = profile("gpt2_medium", {}, fake=True)
    for f in (0.5,) if quick else BUDGETS:
        data.append(timed_plan("ilp", "GPT-2 medium: 24 x 1024, seq 1024, batch 8 (FakeTensorMode)", prof, f))
    prof = profile("llama", dict(n_layer=16, hidden=1024, heads=16, seq=1024, batch=4, vocab=8192), fake=True)
    label = "Llama: 16 x 1024, seq 1024, batch 4 (FakeTensorMode, seconds)"  # auto plans it with dp: one chain
    return data + [timed_plan(solver, label, prof, 0.6) for solver in ("auto", "ilp")]


def timed_plan(solver: str, label: str, prof: remat.StepProfile, f: float) -> dict:
    prof = dataclasses.replace(prof)  # an object no call planned: the problem is built anew (`Problem.of`)
    p, least, seconds = try_plan(prof, int(f * prof.peak_bytes), solver)
    again = try_plan(prof, int(f * prof.peak_bytes), solver)[2]
    entry = dict(solver=solver, model=label, blocks=len(prof.blocks), budget_fraction=f, seconds=seconds)
    entry |= dict(seconds_again=again, feasible=p is not None, unplanned_peak_bytes=prof.peak_bytes, min_bytes=least)
    entry |= {"flops": p.recompute_flops, "peak_bytes": p.peak_bytes} if p else {}
    print(
        f"  {solver} {label[:40]:<40} {f:.0%} {seconds:7.2f} s (again {again:.2f} s)  {speed_row(entry)[4]}", flush=True
    )
    return entry


# -- main ----------------------------------------------------------------------------------------------

SECTIONS = {
    "baselines": ("1. against the baselines (fake mode)", lambda args: against_baselines(args.quick)),
    "prediction": ("2. the prediction holds (real mode)", lambda args: prediction(args.quick, args.threads)),
    "speed": ("3. speed", lambda args: speed(args.quick)),
}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="budgets 50/70/90%%, smaller models, no process-RSS runs, no plots (about 1 min)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--only",
        choices=tuple(SECTIONS),
        action="append",
        help="run only this section (repeatable); results then go to plan_vs_baselines.partial.md",
    )
    ap.add_argument("--from-json", metavar="PATH", help="re-render an earlier run's results JSON (no measuring)")
    return ap.parse_args()


def from_json(path: str) -> None:
    saved = json.loads(Path(path).read_text())
    name = Path(path).name.removesuffix(".json")
    out = write_results(name, TITLE, saved["machine"], saved["command"], render(saved["data"]), saved["data"])
    print(f"re-rendered {out}")


def main() -> None:
    args = parse_args()
    if args.from_json:
        return from_json(args.from_json)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    info = machine_info(args.threads)
    data: dict = {}
    for key, (title, run) in SECTIONS.items():
        if key in (args.only or SECTIONS):
            t = time.perf_counter()
            print(title, flush=True)
            data[key] = run(args)
            print(f"  ({time.perf_counter() - t:.0f} s)", flush=True)
    data.update(
        elapsed_s=time.perf_counter() - t0,
        cores=os.cpu_count(),
        loadavg_end=", ".join(f"{x:.1f}" for x in os.getloadavg()),
    )
    name = "plan_vs_baselines" + (".quick" if args.quick else "") + (".partial" if args.only else "")
    command = (
        "python benchmarks/plan_vs_baselines.py"
        + (" --quick" if args.quick else "")
        + "".join(f" --only {o}" for o in args.only or ())
    )
    path = write_results(name, TITLE, info, command, render(data), data)
    print(f"wrote {path} ({data['elapsed_s']:,.0f} s)")


if __name__ == "__main__":
    main()
