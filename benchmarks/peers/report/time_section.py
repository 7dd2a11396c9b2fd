"""The "In measured time" section of the peers report: issue 15's criterion rendered from the verdicts of
time_verdicts.py.  At each peer point, remat's fastest measured point at no more than the peer's process peak,
its verdict (with the figures of `run.py --recheck` where a doubtful point was measured again), the counts of
wins, ties and losses before and after the recheck, and remat's fastest point at report 004's −35%."""

from __future__ import annotations

from .fmt import mib, table
from .time_verdicts import TIME_TOL, at_oneflow_memory, doubtful, rechecked, time_verdicts

HEADERS = [
    "model",
    "peer point",
    "peer process MiB",
    "peer time",
    "remat's fastest at that peak",
    "remat process MiB",
    "remat time",
    "verdict",
]


def measured_remat_compiled(data: dict) -> bool:
    """The run measured remat + torch.compile points (`remat_compiled` in a model's compile worker)."""
    return any("remat_compiled" in (R.get("compile") or {}) for R in data["models"].values())


def time_headline(data: dict, models: list[str]) -> list[str]:
    """The counts of `in_time_section` alone (docs/benchmarks.md's span), or nothing where no point was timed."""
    _, pairs, _ = _verdicts(data, models)
    return [_counts_line(pairs, measured_remat_compiled(data)), ""] if pairs else []


def in_time_section(data: dict, models: list[str]) -> list[str]:
    """Issue 15's criterion: the same or a lower process peak for no more measured time, remat + compile included."""
    rows, pairs, oneflow = _verdicts(data, models)
    if not rows:
        return []
    return [
        "## In measured time (issue 15's criterion)",
        "",
        _counts_line(pairs, measured_remat_compiled(data)),
        "",
        table(HEADERS, rows),
        "",
        "Report 004's −35%: remat's fastest measured point at ≤ 65% of the unplanned process peak:",
        "",
        table(["model", "point: process peak saved, time against eager without checkpointing"], oneflow),
        "",
    ]


def _verdicts(data: dict, models: list[str]) -> tuple[list, list, list]:
    """(table rows, (verdict, verdict measured again or None) pairs, report 004 rows) of the models timed."""
    rows, pairs, oneflow = [], [], []
    for m in models:
        R = data["models"][m]
        if R["eager"].get("worker_error"):
            continue
        for v in time_verdicts(R["eager"], R.get("compile")):
            r = rechecked(v, R) if doubtful(v) else None
            pairs.append((v, r))
            rows.append(_row(m, v, r))
        best = at_oneflow_memory(R["eager"], R.get("compile"))
        oneflow.append(
            [m, f"{best['label']}: −{best['reduction']:.0%} at {best['time']:.2f}×" if best else "none measured"]
        )
    return rows, pairs, oneflow


def _row(m: str, v: dict, r: dict | None) -> list:
    """The table row of verdict `v` on model `m`, with `r`, the verdict measured again, when there is one."""
    return [
        m,
        v["peer"],
        mib(v["rss"]),
        f"{v['time']:.2f}×",
        v.get("remat") or "—",
        mib(v.get("remat_rss")),
        f"{v['remat_time']:.2f}×" if v.get("remat") else "—",
        f"**{v['verdict']}**" + (f": {v['why']}" if v["why"] else "") + _recheck_cell(r),
    ]


def _counts_line(pairs: list[tuple[dict, dict | None]], compiled: bool = True) -> str:
    """Wins, ties and losses over (verdict, verdict measured again or None) pairs, before and after the recheck;
    `compiled`: the run measured remat + torch.compile points."""
    counts, after = {"wins": 0, "ties": 0, "loses": 0}, {"wins": 0, "ties": 0, "loses": 0}
    for v, r in pairs:
        counts[v["verdict"]] += 1
        after[r["verdict"] if r else v["verdict"]] += 1
    noisy = sum(v["verdict"] == "loses" and bool(v.get("noise")) for v, _ in pairs)
    again = [r for _, r in pairs if r]
    return (
        "At each peer point, remat's fastest measured point "
        + (
            "(an eager plan, or remat + torch.compile) "
            if compiled
            else "(an eager plan: this run measured no remat + torch.compile) "
        )
        + f"whose process peak is no higher than the peer's (+ max(1 MiB, 1%)): remat **wins {counts['wins']}**, "
        f"**ties {counts['ties']}**, **loses {counts['loses']}** of {len(pairs)}"
        + (f" ({noisy} of the losses within the rounds' noise: the per-round ratios overlap)" if noisy else "")
        + (
            f"; with {len(again)} of them (losses within noise, ties remat was slower in) measured again over "
            f"more rounds in one process (`run.py "
            f"--recheck`: the same peer point, the remat point judged against it and remat's points aimed at it), "
            f"**wins {after['wins']}**, **ties "
            f"{after['ties']}**, **loses {after['loses']}**"
            if again
            else ""
        )
        + ". Times are the median per-round "
        f"ratio to the eager step without checkpointing, interleaved; within ±{TIME_TOL:.0%} of the peer's is "
        "a tie on time. Every peak here is the process counter, eager or compiled."
    )


def _recheck_cell(r: dict | None) -> str:
    """A doubtful point measured again (`run.py --recheck`), as the end of its verdict cell."""
    if not r:
        return ""
    return (
        f"; measured again {r['date']} over {r['rounds']} rounds in one process: {r['remat']} {r['remat_time']:.2f}× at "
        f"{mib(r['remat_rss'])} MiB, the peer {r['time']:.2f}× at {mib(r['rss'])} MiB: **{r['verdict']}**"
        + (f" ({r['why']})" if r["why"] else "")
    )
