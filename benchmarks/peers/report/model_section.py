"""One model's section of the peers report: every strategy, remat at every budget and solver,
remat at every peer point."""

from __future__ import annotations

from _catalog import TITLES

from .fmt import gflop, grads_text, mib, pct, ratio, secs, table
from .verdicts import configs_by_key, remat_sources

HF_MODELS = ("gpt2", "bert", "llama", "vit")


def model_section(m: str, E: dict, C: dict | None, img: str | None, vs: list[dict]) -> list[str]:
    """The section of model `m` (`vs`: its verdicts), with the plot `img` when given."""
    lines = [f"### {m}: {TITLES.get(m, m)}", ""]
    if E.get("worker_error"):
        return lines + [f"Worker failed: {E['worker_error']}", "", "```", E.get("log_tail", "")[-1500:], "```", ""]
    lines += [_summary(m, E, C), ""]
    if img:
        lines += [f"![{m}]({img})", ""]
    rows, rng = _strategy_rows(E)
    lines += _strategies_table(rows + _compile_rows(E, C) + _remat_rows(E))
    if E.get("skipped"):
        lines += [
            "Not applicable as users apply them: "
            + "; ".join(f"{s['label']} — {s['why']}" for s in E["skipped"])
            + ".",
            "",
        ]
    lines += _plans_table(E)
    lines += _verdict_table(E, vs)
    if rng:
        lines += [
            "¹ torchtitan's wrapper uses `preserve_rng_state=False`; this model has dropout, so the recomputed "
            "dropout masks differ from the forward's and the gradients change (remat preserves the RNG state).",
            "",
        ]
    return lines


def _strategies_table(rows: list[list]) -> list[str]:
    """Every strategy's row (the peers', torch.compile's, remat's) under one table."""
    return [
        "All strategies (tracker = `remat.profile(...).peak_bytes` on the modified model; process = RSS method; "
        "Δ against no checkpointing):",
        "",
        table(
            [
                "strategy",
                "applied with",
                "tracker peak MiB",
                "process peak MiB",
                "extra GFLOP (of step)",
                "step time vs none",
                "planning / compile s",
                "gradients vs none",
            ],
            rows,
        ),
        "",
    ]


def _plans_table(E: dict) -> list[str]:
    """remat at every budget and solver: the plan, its predictions and its measurements."""
    return [
        f"remat at each budget (fraction of the tracker's unplanned peak {mib(configs_by_key(E)['none']['tracker_peak'])} "
        f"MiB) and solver (profile {E['profile_s']:.2f} s once, then plan s below):",
        "",
        table(
            [
                "budget",
                "solver",
                "plan",
                "predicted MiB",
                "tracker MiB",
                "process MiB",
                "extra GFLOP predicted / measured",
                "time vs none",
                "plan s",
            ],
            [_plan_row(r, configs_by_key(E).get(r.get("key"), {})) for r in E.get("plans", [])],
        ),
        "",
    ]


def _summary(m: str, E: dict, C: dict | None) -> str:
    none = configs_by_key(E)["none"]
    return (
        f"{E['describe']}; {E['params']:,} parameters; Adam; loss {'out.loss' if m in HF_MODELS else 'see benchmarks/_models.py'}. "
        f"Unplanned step: tracker {mib(none['tracker_peak'])} MiB (peak in {E['peak_phase']}), process {mib(none['rss_peak'])} MiB "
        f"(fresh-process MEASURING.md figure {mib(E['fresh_none_rss'])} MiB), {gflop(none['flops'])} GFLOP forward+backward, "
        f"{E['n_blocks']} candidate modules for remat. Worker wall time {E.get('wall_s', 0):.0f} s"
        + (f" + compile worker {C.get('wall_s', 0):.0f} s" if C and "wall_s" in C else "")
        + "."
    )


def _strategy_rows(E: dict) -> tuple[list[list], bool]:
    """The peers' rows, and whether a footnote on SAC's random numbers is needed."""
    none = configs_by_key(E)["none"]
    base_t, base_r, step_flops = none["tracker_peak"], none["rss_peak"], none["flops"]
    rows, rng = [], False
    for c in E["configs"]:
        if c["family"] in ("remat", "diagnostic"):
            continue
        note = c.get("error", "")
        is_rng = c["family"] == "sac" and not (c.get("grads") or {}).get("equal", True)
        rng = rng or is_rng
        rows.append(
            [
                c["label"],
                c["how"] or "—",
                mib(c.get("tracker_peak")) + f" ({pct(c.get('tracker_peak'), base_t)})",
                mib(c.get("rss_peak")) + f" ({pct(c.get('rss_peak'), base_r)})",
                gflop(c.get("extra_flops"))
                + (f" ({c['extra_flops'] / step_flops:.0%})" if c.get("extra_flops") is not None else ""),
                ratio(c.get("time_ratio")),
                "0",
                grads_text(c.get("grads"), is_rng) + (f" {note}" if note else ""),
            ]
        )
    return rows, rng


def _compile_rows(E: dict, C: dict | None) -> list[list]:
    none = configs_by_key(E)["none"]
    rows = []
    for r in (C or {}).get("budgets", []):
        if "error" in r:
            rows.append([f"torch.compile budget {r['budget']:g}", "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        g = r.get("grads_vs_compiled_1")
        rows.append(
            [
                f"torch.compile budget {r['budget']:g}",
                "torch.compile(step) + activation_memory_budget",
                "n/a ²",
                mib(r["rss_peak"]) + f" ({pct(r['rss_peak'], none['rss_peak'])})",
                gflop(r["extra_flops"]) + f" ({r['extra_flops'] / none['flops']:.0%})",
                ratio(r.get("time_ratio")),
                f"{secs(r['compile_s'])} (partitioner {secs(r['partition_s'])})",
                f"vs eager {grads_text(r['grads_vs_eager'])}; vs budget 1.0 {grads_text(g)}",
            ]
        )
    seen = set()
    for r in (C or {}).get("remat_compiled", []):
        if r["status"] != "ok" or r["key"] in seen:
            continue
        seen.add(r["key"])
        where = ", ".join(x["at"] for x in C["remat_compiled"] if x.get("key") == r["key"])
        if "error" in r:
            rows.append([f"**remat + compile ({r['plan']})** ← {where}", "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        rows.append(
            [
                f"**remat + compile ({r['plan']})** ← {where}",
                "remat.apply(model, plan); torch.compile(step)",
                f"n/a ² (predicted eager {mib(r['predicted_peak'])})",
                mib(r["rss_peak"]) + f" ({pct(r['rss_peak'], none['rss_peak'])})",
                gflop(r["extra_flops"]) + f" ({r['extra_flops'] / none['flops']:.0%})",
                ratio(r.get("time_ratio")),
                secs(r["compile_s"]) + (f" (remat.auto's search {secs(r['search_s'])})" if r.get("search_s") else ""),
                f"vs eager {grads_text(r['grads_vs_eager'])}"
                + (f"; vs budget 1.0 {grads_text(r['grads_vs_compiled_1'])}" if "grads_vs_compiled_1" in r else ""),
            ]
        )
    return rows


def _remat_rows(E: dict) -> list[list]:
    none, src = configs_by_key(E)["none"], remat_sources(E)
    rows = []
    for c in E["configs"]:
        if c["family"] not in ("remat", "diagnostic"):
            continue
        where = (
            ""
            if c["family"] == "diagnostic"
            else f" ← {', '.join(src.get(c['key'], [])[:4])}{' …' if len(src.get(c['key'], [])) > 4 else ''}"
        )
        rows.append(
            [
                (f"_{c['label']}_" if c["family"] == "diagnostic" else f"**{c['label']}**") + where,
                "remat.apply(model, plan)",
                mib(c.get("tracker_peak"))
                + f" ({pct(c.get('tracker_peak'), none['tracker_peak'])}; predicted {mib(c.get('predicted_peak'))})",
                mib(c.get("rss_peak")) + f" ({pct(c.get('rss_peak'), none['rss_peak'])})",
                gflop(c.get("extra_flops"))
                + (
                    f" ({c['extra_flops'] / none['flops']:.0%}; predicted {gflop(c.get('predicted_flops'))})"
                    if c.get("extra_flops") is not None
                    else ""
                ),
                ratio(c.get("time_ratio")),
                f"{secs(E['profile_s'])} + plan",
                grads_text(c.get("grads")) + (f" {c.get('error', '')}"),
            ]
        )
    return rows


def _plan_row(r: dict, c: dict) -> list:
    """One (budget, solver) row; `c` is the measured config of its plan."""
    head = [f"{r['budget_frac']:.0%}", r["solver"]]
    if r["status"] == "ok":
        return [
            head[0],
            r["solver"] + (f" → {r['solver_used']}" if r["solver_used"] != r["solver"] else ""),
            f"{r['n_segments']} ckpt"
            + (f" + {r['n_selective']} sel" if r.get("n_selective") else "")
            + (" — apply fails: " + c["error"][:120] if c.get("error") else ""),
            mib(r["predicted_peak"]),
            mib(c.get("tracker_peak")),
            mib(c.get("rss_peak")),
            f"{gflop(r['predicted_flops'])} / {gflop(c.get('extra_flops'))}",
            ratio(c.get("time_ratio")),
            f"{r['plan_s']:.3f}",
        ]
    if r["status"] == "infeasible" and r["min_bytes"] <= r["budget_bytes"]:
        what = f"no plan: InfeasibleBudget although its least is {mib(r['min_bytes'])} MiB (solver error, bug 2)"
    elif r["status"] == "infeasible":
        what = f"infeasible (least {mib(r['min_bytes'])} MiB)"
    else:
        what = r.get("error", "error")[:90]
    return head + [what, "", "", "", "", "", f"{r.get('plan_s', 0):.3f}"]


def _verdict_table(E: dict, vs: list[dict]) -> list[str]:
    vrows = []
    for v in vs:
        unit = "tracker" if v["method"] == "tracker" else "process"
        vrows.append(
            [
                v["peer"],
                f"{mib(v['peer_peak'])} ({unit})",
                gflop(v["peer_flops"]),
                ratio(v.get("peer_time")),
                v.get("remat") or "—",
                mib(v.get("remat_peak")),
                gflop(v.get("remat_flops")),
                ratio(v.get("remat_time")),
                f"**{v['verdict']}**" + (f": {v['why']}" if v.get("why") else ""),
            ]
        )
    if not vrows:
        return []
    return [
        "remat at each peer's measured peak (budget = the peer's tracker peak + 64 KiB; for torch.compile its "
        "process peak minus the unplanned process−tracker offset "
        f"{mib(E.get('rss_offset'))} MiB, + max(1 MiB, 1%), compared on process peaks with that tolerance):",
        "",
        table(
            [
                "peer point",
                "peer peak MiB",
                "peer extra GFLOP",
                "peer time",
                "remat plan",
                "remat peak MiB",
                "remat extra GFLOP",
                "remat time",
                "verdict",
            ],
            vrows,
        ),
        "",
    ]
