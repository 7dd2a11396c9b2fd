"""The frontier of plans (`remat.frontier`) as a plain, deterministic table (pure function of the data)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from remat.types import Plan
from remat.report.text import console_text, fmt_bytes, fmt_flops, fmt_share, plain_console


def render_frontier(frontier: list[Plan], budget_bytes: int | None = None, chosen: Plan | None = None) -> str:
    """One row per Pareto-optimal plan: predicted peak, extra FLOPs and ops, checkpoints; the budget's fit.

    Example:
        >>> print(render_frontier(remat.frontier(prof), budget_bytes=6 * 2**30))

    The first row is "keep everything" (the unplanned peak, nothing recomputed); each
    later row needs less memory and more recomputation: more FLOPs, or as many FLOPs and
    more ops re-run (`ops`; elementwise ops count 0 FLOPs but not 0 time).  With
    `budget_bytes`, a last column says whether each plan fits and marks the cheapest that
    does: `chosen`, the plan `remat.plan` returned for that budget, when given (it is
    listed if it is not already; `dp` does not break ties of FLOPs and ops by the peak).
    `extra %` is
    the recomputed forward FLOPs as a share of the unplanned step's forward + backward
    FLOPs; `extra s` appears when the plans carry profiled kernel times (a real-mode
    profile), `selective` when a plan checkpoints modules selectively (some ops' outputs kept).

    Known limitations: long frontiers are printed in full (one row per plan).
    """
    console = plain_console()
    if not frontier:
        console.print("no plans")
        return console_text(console)
    first, plural = frontier[0], "s" if len(frontier) > 1 else ""
    console.print(
        f"remat frontier for {first.model}: {len(frontier)} plan{plural} from keep-everything "
        f"({fmt_bytes(first.unplanned_peak_bytes, 'auto')}) down to the least memory "
        f"({fmt_bytes(min(p.peak_bytes for p in frontier), 'auto')})"
    )
    if budget_bytes is not None:
        budget = fmt_bytes(budget_bytes, "auto")
        console.print(f"fits: within the budget of {budget}; cheapest: the least recomputation that fits")
    if chosen is not None and not any(_same_point(p, chosen) for p in frontier):
        frontier = sorted([*frontier, chosen], key=lambda p: -p.peak_bytes)
    console.print(_frontier_table(frontier, budget_bytes, chosen))
    return console_text(console)


def _frontier_table(frontier: list[Plan], budget_bytes: int | None, chosen: Plan | None) -> Table:
    timed = any(p.extra_s > 0 for p in frontier)
    selective = any(p.selective for p in frontier)
    offload = any(p.offload for p in frontier)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("#", justify="right")
    columns = (
        "peak",
        "extra GFLOP",
        "extra %",
        "ops",
        *(("extra s",) if timed else ()),
        "checkpoints",
        *(("selective",) if selective else ()),
        *(("offloaded",) if offload else ()),
    )
    for col in columns:
        table.add_column(col, justify="right")
    if budget_bytes is not None:
        table.add_column("fits", no_wrap=True)
    cheapest_fit = (
        next((p for p in frontier if _same_point(p, chosen)), None)
        if chosen is not None
        else (_cheapest_fitting(frontier, budget_bytes))
    )
    for i, p in enumerate(frontier):
        row = [
            str(i),
            fmt_bytes(p.peak_bytes, "auto"),
            fmt_flops(p.recompute_flops),
            fmt_share(p.recompute_flops, p.step_flops),
            str(p.recompute_ops),
            *((f"{p.extra_s:.3f}",) if timed else ()),
            str(len(p.segments)),
            *((str(len(p.selective)),) if selective else ()),
            *((str(len(p.offload)),) if offload else ()),
        ]
        if budget_bytes is not None:
            row.append(("cheapest" if p is cheapest_fit else "yes") if p.peak_bytes <= budget_bytes else "no")
        table.add_row(*row)
    return table


def _same_point(a: Plan, b: Plan) -> bool:
    return (a.peak_bytes, a.recompute_flops, a.recompute_ops) == (b.peak_bytes, b.recompute_flops, b.recompute_ops)


def _cheapest_fitting(frontier: list[Plan], budget_bytes: int | None) -> Plan | None:
    fitting = [p for p in frontier if budget_bytes is not None and p.peak_bytes <= budget_bytes]
    return min(fitting, key=lambda p: (p.recompute_flops, p.recompute_ops, p.peak_bytes), default=None)
