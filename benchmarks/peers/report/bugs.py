"""The section of the peers report on the remat bugs this benchmark found (repro_bugs.py's data)."""

from __future__ import annotations

from .fmt import table


def bugs_section(data: dict) -> list[str]:
    b = data.get("bugs")
    if not b:
        return []
    L = [
        "## Bugs found by this benchmark",
        "",
        "Reproduced in this run by `python benchmarks/peers/repro_bugs.py` (small models, seconds; `present` = still "
        "there, `fixed` / `not reproduced` = no longer reproduces)"
        + (f"; {data['bugs_note']}" if data.get("bugs_note") else "")
        + ".",
        "",
    ]
    L += _chen(b.get("chen_apply", {})) + _ilp(b.get("ilp_solve", {})) + _selective_last(b)
    L.append("")
    L.append(
        "Fixed before this run (commit 1b9603e): remat planned no segments for an nn.Sequential *subclass*; the "
        "development run's report-001 chain was one, which made remat lose every checkpoint_sequential point there."
    )
    return L + [""]


def _chen(c: dict) -> list[str]:
    if c.get("plan_refuses"):
        return [
            f"1. **solver='chen' planned segments that remat.apply rejects** — {c.get('status')}: on {c.get('model')} "
            f"`remat.plan(prof, 0.8, solver='chen')` now raises `{c['plan_refuses'][:160]}…`."
        ]
    if not c:
        return []
    return [
        f"1. **solver='chen' plans segments that remat.apply rejects** — {c.get('status')}. On {c.get('model')} "
        f"(layers in an `{c.get('container')}`), `remat.plan(prof, 0.8, solver='chen')` returns segments "
        f"{c.get('segments')}; `remat.apply` raises `{c.get('error', '')}`. Cause: "
        "`src/remat/planner/chen.py` `units_for` takes every unit of the span, also those with "
        "`Unit.appliable == False` (a run of several children of anything but an nn.Sequential). Every "
        '`remat chen` row below that says "apply fails" is this bug.'
    ]


def _ilp(i: dict) -> list[str]:
    if not (i and "budgets_tried" in i):
        return []
    first = (
        f" (first: {i['first_failing_budget']:,} B; there `remat.plan(..., solver='ilp')` "
        f"raises InfeasibleBudget whose own least is {i.get('plan_error_min_bytes', 0):,} B)"
        if i.get("first_failing_budget")
        else ""
    )
    cause = (
        'Cause: `src/remat/planner/ilp.py` `_solve` gives HiGHS byte-sized coefficients (seen: "HiGHS '
        'Status 4: Solve error") and reads any result without a solution as infeasible. '
        if i.get("status") == "present"
        else 'The cause was `src/remat/planner/ilp.py` `_solve` (seen at 1b9603e: HiGHS "Status 4: Solve error" '
        "on byte-sized rows, read as infeasible); since 24a57a6 it tries the program's other forms (scaled "
        "rows, byte rows, presolve off) and a stop without an answer is a `remat:` error, never "
        '"infeasible" (`tests/test_plan.py::test_ilp_never_contradicts_itself_across_budgets`). '
    )
    return [
        f"2. **The ILP reports feasible budgets as infeasible** — {i.get('status')}. On {i.get('model')}, over "
        f"{i['budgets_tried']} budgets evenly spread from remat's least peak ({i['least']:,} B) to the unplanned "
        f"peak ({i['unplanned']:,} B), `ilp.solve` returned no plan at {i['ilp_none_where_dp_plans']} where "
        f"`dp.solve` finds one"
        + first
        + f"; `remat.frontier(prof)` (auto → ilp) stops at {i['frontier_auto_last']:,} B where "
        f"`frontier(prof, solver='dp')` reaches {i['frontier_dp_last']:,} B. "
        + cause
        + "The harness still guards against it: its frontier is the Pareto union of frontier(auto) and "
        "frontier(dp), and where plan(auto) contradicts itself it takes dp's plan and says so in the verdict."
    ]


def _selective_last(b: dict) -> list[str]:
    keys = ("selective_last_gpt2", "selective_last_bert")
    rows = []
    for key in keys:
        r = b.get(key, {})
        for x in r.get("rows", []):
            rows.append(
                [
                    r["model"],
                    ", ".join(x["selective"]),
                    x["predicted"],
                    x["measured"],
                    f"{x['measured'] - x['predicted']:+,}",
                ]
            )
    if not rows:
        return []
    st = {b.get(k, {}).get("status") for k in keys}
    L = [
        f"3. **Selective on the last layer is predicted above what it measures** — {', '.join(sorted(s for s in st if s))}. "
        "Hand-built plans (remat's own `make_plan`), predicted vs measured tracker peak in bytes:"
    ]
    L += ["", table(["model", "selective on", "predicted B", "measured B", "measured − predicted"], rows), ""]
    if "present" in st:
        L.append(
            "   Every layer but the last is exact; with the last one the prediction is too high, so selective "
            "on every layer is predicted worse than on all but the last and the planner never chooses it, "
            "although it measures lower — what SAC on every layer measures. Cause: "
            "`src/remat/planner/problem.py` `_make_selective_unit` (Rule 4)."
        )
    else:
        L.append(
            "   At 1b9603e the plans with the last layer selective were predicted 160 KiB too high at these "
            "sizes (Rule 4 of the memory model, `_make_selective_unit` in `src/remat/planner/problem.py`, held "
            "the cached matmul outputs until the end of the block's backward, across the peak at the start "
            "of backward), so selective on every layer was predicted worse than on all but the last and never "
            "planned. Since 8a19a06 the cache is released at the block's backward start: the rows above are "
            "exact, or over-predicted by 128 B. The per-model tables keep the _diagnostic_ row (selective on "
            "every layer, predicted vs measured at the benchmark's size)."
        )
    return L
