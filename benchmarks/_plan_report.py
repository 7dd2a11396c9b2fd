"""The tables of plan_vs_baselines.py, rendered from its data (results/plan_vs_baselines*.json):
pure functions, so that `python benchmarks/plan_vs_baselines.py --from-json F` re-renders a run."""

from __future__ import annotations

from _common import MiB, md_table

SEQ = "checkpoint_sequential("

BASELINES_NOTE = """\
Each cell: extra forward GFLOP of recomputation (predicted peak as % of the unplanned peak).
All figures are predictions of the same memory model (NOTE [The memory model of a plan]) on the
same fake-mode profile; the recipes are `remat.planner.baseline_plans`.  "best
checkpoint_sequential" is the k in 2..n with the fewest extra FLOPs among those that fit the budget;
the last column compares remat (the better of dp and ilp) with the best of every recipe that fits."""

PREDICTION_NOTE = """\
Predicted: the plan's `peak_bytes` and `recompute_flops` from the unplanned real-mode profile.
remat.profile: a real-mode profile of the model with the checkpoint applied by hand.  process: the
peak RSS (VmHWM) after one plain step minus `statm` RSS before the model is built, in a fresh
interpreter with MALLOC_MMAP_THRESHOLD_=65536 (MEASURING.md).  It includes the procedure's own
overhead (kernel code paged in on first use, OpenMP and autograd threads, BLAS buffers), measured
on the unplanned step as process − remat.profile and subtracted in "process − overhead"."""

SPEED_NOTE = """\
Wall-clock seconds of one `remat.plan(profile, fraction, solver=...)` call, profile already made, on a profile
object no call planned before (it includes building the problem from the profile); "again": the same call once
more, which reuses that problem (`Problem.of`), as a sweep of budgets does.  Shared 2-core machine: times vary
up to 2x."""


def render(data: dict) -> list[tuple[str, str]]:
    """The (heading, body) sections of the results document, from the run's data."""
    sections = []
    if "baselines" in data:
        tables = [baselines_table(case) for case in data["baselines"].values()]
        sections.append(("Against the baselines", BASELINES_NOTE + "\n\n" + "\n\n".join(tables)))
    if "prediction" in data:
        table = md_table(PREDICTION_HEADERS, [prediction_row(r) for r in data["prediction"]])
        sections.append(("The prediction holds", PREDICTION_NOTE + "\n\n" + table))
    if "speed" in data:
        headers = ["solver", "model", "candidate blocks", "budget", "outcome", "remat.plan seconds", "again", "target"]
        sections.append(("Speed", SPEED_NOTE + "\n\n" + md_table(headers, [speed_row(r) for r in data["speed"]])))
    sections.append(
        (
            "",
            f"Total run time {data['elapsed_s']:,.0f} s; load average at the end {data['loadavg_end']} "
            f"(1, 5, 15 min) on {data['cores']} cores: other work was running, so seconds are upper bounds.",
        )
    )
    return sections


# -- 1. against the baselines ------------------------------------------------------------------------


def cell(p: dict | None, peak: int, prefix: str = "") -> str:
    if p is None:
        return "—"
    return f"{prefix}{p['flops'] / 1e9:,.2f} ({100 * p['peak_bytes'] / peak:.1f}%)"


def verdict(entry: dict) -> tuple[str, str]:
    """remat (the better of dp and ilp) against the best recipe that fits: the text and the outcome."""
    mine = min((p for p in (entry["dp"]["plan"], entry["ilp"]["plan"]) if p), key=lambda p: p["flops"], default=None)
    best = entry["best"]
    if mine is None and best is None:
        return "nothing fits", "none"
    if mine is None:
        return f"**LOSES**: no remat plan, {best['name']} fits", "loses"
    if best is None:
        return "only remat fits", "wins"
    d = mine["flops"] - best["flops"]
    if d < 0:
        share = f" ({-100 * d / best['flops']:.0f}% less)" if best["flops"] else ""
        return f"lower by {-d / 1e9:,.2f} GFLOP{share} than {best['name']}", "wins"
    if d == 0:
        return f"equal to {best['name']}", "ties"
    return f"**HIGHER** by {d / 1e9:,.2f} GFLOP than {best['name']}", "loses"


def _solver_cell(got: dict, peak: int) -> str:
    if got["plan"]:
        return cell(got["plan"], peak)
    least = got["min_bytes"]
    return f"infeasible (least {least / MiB:,.0f} MiB)" if least is not None else "n/a (not a chain)"


def baselines_row(entry: dict, peak: int) -> list[str]:
    seq = entry["best_sequential"]
    row = [
        f"{entry['budget_fraction']:.0%}",
        _solver_cell(entry["dp"], peak),
        _solver_cell(entry["ilp"], peak),
        cell(seq, peak, f"k={seq['name'][len(SEQ) : -1]}: ") if seq else "none fits",
        cell(entry["every_block"], peak) if entry["every_block"] else "does not fit",
        cell(entry["chen"], peak) if entry["chen"] else "does not fit",
    ]
    if "dp_segments_allowed" in entry:
        row.append(cell(entry["dp_segments_allowed"], peak))
    return row + [verdict(entry)[0]]


def baselines_table(case: dict) -> str:
    peak, budgets = case["unplanned_peak_bytes"], case["budgets"]
    headers = ["budget", "remat dp", "remat ilp", "best checkpoint_sequential that fits", "every block", "chen"]
    if budgets and "dp_segments_allowed" in budgets[0]:
        headers.append("dp if multi-layer segments were allowed (not appliable on nn.ModuleList)")
    headers.append("remat vs the best recipe that fits")
    head = (
        f"**{case['label']}** (Adam, fake mode): unplanned peak {peak / MiB:,.1f} MiB, "
        f"step {case['step_flops'] / 1e9:,.1f} GFLOP, {case['blocks']} candidate blocks."
    )
    return head + "\n\n" + md_table(headers, [baselines_row(e, peak) for e in budgets])


# -- 2. the prediction holds -------------------------------------------------------------------------

PREDICTION_HEADERS = [
    "model",
    "checkpoint (applied by hand)",
    "predicted peak MiB",
    "remat.profile MiB",
    "vs predicted",
    "process MiB",
    "vs predicted",
    "process − overhead, vs predicted",
    "predicted extra GFLOP",
    "measured extra GFLOP",
    "predicted extra s",
]


def _pct(measured: int, predicted: int) -> str:
    return f"{100 * (measured - predicted) / predicted:+.1f}%"


def prediction_row(r: dict) -> list[str]:
    pp, proc_peak, offset = r["predicted_peak_bytes"], r["process_peak_bytes"], r["process_overhead_bytes"]
    proc = (
        ["not run (--quick)"] * 3
        if proc_peak is None
        else [f"{proc_peak / MiB:,.1f}", _pct(proc_peak, pp), _pct(proc_peak - offset, pp)]
    )
    return [
        r["model"],
        r["checkpoint"],
        f"{pp / MiB:,.1f}",
        f"{r['profile_peak_bytes'] / MiB:,.1f}",
        _pct(r["profile_peak_bytes"], pp),
        *proc,
        f"{r['predicted_flops'] / 1e9:,.3f}",
        f"{r['measured_flops'] / 1e9:,.3f}",
        f"{r['predicted_recompute_s']:.2f}",
    ]


# -- 3. speed ----------------------------------------------------------------------------------------


def speed_row(r: dict) -> list:
    if r["feasible"]:
        outcome = f"{r['flops'] / 1e9:,.1f} GFLOP, peak {100 * r['peak_bytes'] / r['unplanned_peak_bytes']:.1f}%"
    else:
        outcome = f"infeasible (least {r['min_bytes'] / MiB:,.0f} MiB, found by the same call)"
    target = 1.0 if r["solver"] in ("dp", "auto") else 10.0
    met = f"< {target:g} s: " + ("met" if r["seconds"] < target else "**missed**")
    again = f"{r['seconds_again']:.2f}" if "seconds_again" in r else ""  # runs before 2026-11-29 did not time it
    row = [r["solver"], r["model"], r["blocks"], f"{r['budget_fraction']:.0%}", outcome, f"{r['seconds']:.2f}"]
    return [*row, again, met]
