"""Issue 36's tables from a `gpu_seconds.py --gpu` run: every variant as measured, then the issue's "Done when"
judged on those figures alone.

A point is a variant's third-step `max_memory_allocated` and its median step time.  remat's points are its plans
(`plan65`, `least`), `remat.auto`'s on the eager model (`auto -35%`), those plans compiled and `remat.auto`'s on the
compiled model (`...+compile`); the peers' are
the eager step, Hugging Face's and every-layer checkpointing and torch.compile at its activation memory budgets
(`compile`, `compile 0.7`, ...).
"""

from __future__ import annotations

from _common import MiB, md_table

TIE = 0.02
"""Step times within 2% count as no more time: medians of 6 synchronised steps (the issue's own runs)."""
AT_35 = 0.65  # the BERT point: 35% under the eager step's peak ...
AT_35_COST = 0.05  # ... at most 5% over the eager step's time
SAID = 0.05  # `plan.extra_fraction` within 5 points of the overhead measured
PEAK_SAID = 0.05
"""A step's measured peak within 5% of the peak remat predicted for it (the made plan's, or the unplanned step's)."""
HOST_BOUND = 0.9
"""A step whose host took at least this share of its time to issue it ran at the host's pace, not the GPU's: its
seconds are the host's Python and dispatch (a recomputation issues its ops again), which a GPU's roofline does not
see."""
COMPILE_POINTS = ("compile", "compile 0.7", "compile 0.5", "compile 0.3")
MADE = ("plan65", "least")
"""remat's plans made on the laptop, whose predictions are in the run's `made`."""
REMAT_EAGER = (*MADE, "auto -35%")
"""remat's eager points: the plans made on the laptop and remat.auto's on the eager model, whose predictions (from
its real profile on the GPU) are its result's own (`said_extra`, `said_peak_bytes`)."""


def ours(variant: str) -> bool:
    """remat + compile: one of remat's plans, compiled."""
    return variant.endswith("+compile")


def _points(variants: dict) -> dict:
    return {v: r for v, r in variants.items() if "step_s" in r and "peak_bytes" in r}


def _at(r: dict, eager_s: float) -> str:
    return f"{r['peak_bytes'] / MiB:,.0f} MiB at {r['step_s'] / eager_s:.2f}x"


def _against_compile(pts: dict, eager_s: float) -> list[list[str]]:
    """At each of torch.compile's points: remat + compile's fastest point at the same or a lower peak."""
    rows = []
    for c in (c for c in COMPILE_POINTS if c in pts):
        under = [(r["step_s"], v) for v, r in pts.items() if ours(v) and r["peak_bytes"] <= pts[c]["peak_bytes"]]
        check = f"at `{c}`'s point ({_at(pts[c], eager_s)}): remat + compile as low, no slower"
        if not under:
            rows.append([check, "no remat + compile point at or under that peak", "no"])
            continue
        best = pts[min(under)[1]]
        held = best["step_s"] <= pts[c]["step_s"] * (1 + TIE)
        rows.append([check, f"`{min(under)[1]}`: {_at(best, eager_s)}", "yes" if held else "no: slower"])
    return rows


def _least_memory(pts: dict, eager_s: float) -> list[list[str]]:
    peers = {v: r for v, r in pts.items() if not ours(v) and v not in REMAT_EAGER}
    mine = {v: r for v, r in pts.items() if ours(v)}
    if not peers or not mine:
        return []
    peer = min(peers, key=lambda v: (peers[v]["peak_bytes"], peers[v]["step_s"]))
    least = min(mine, key=lambda v: (mine[v]["peak_bytes"], mine[v]["step_s"]))
    held = mine[least]["peak_bytes"] <= peers[peer]["peak_bytes"]
    return [
        [
            f"least memory: remat + compile at or under every peer (least: `{peer}`, {_at(peers[peer], eager_s)})",
            f"`{least}`: {_at(mine[least], eager_s)}",
            "yes" if held else "no",
        ]
    ]


def _at_35(pts: dict, eager: dict) -> list[list[str]]:
    cut = AT_35 * eager["peak_bytes"]
    mine = [(r["step_s"], v) for v, r in pts.items() if (ours(v) or v in REMAT_EAGER) and r["peak_bytes"] <= cut]
    check = f"at -35% of the eager peak ({cut / MiB:,.0f} MiB): remat's fastest within +{AT_35_COST:.0%}"
    if not mine:
        return [[check, "no remat point at or under it", "no"]]
    best = min(mine)[1]
    held = pts[best]["step_s"] <= eager["step_s"] * (1 + AT_35_COST)
    return [[check, f"`{best}`: {_at(pts[best], eager['step_s'])}", "yes" if held else "no"]]


def _predicted(kind: str, r: dict, made: dict, key: str) -> float | None:
    """What remat predicted of a point (`key`: "extra_fraction" or "peak_bytes"): a made plan's, or remat.auto's."""
    if kind in MADE:
        return made.get(kind, {}).get(key)
    return r.get({"extra_fraction": "said_extra", "peak_bytes": "said_peak_bytes"}[key])


def _said(pts: dict, made: dict, eager_s: float) -> list[list[str]]:
    rows = []
    for kind in (k for k in REMAT_EAGER if k in pts and _predicted(k, pts[k], made, "extra_fraction") is not None):
        said, measured = _predicted(kind, pts[kind], made, "extra_fraction"), pts[kind]["step_s"] / eager_s - 1
        held = abs(said - measured) <= SAID + 1e-9
        check = f"`{kind}`: plan.extra_fraction within {SAID * 100:.0f} points of the overhead"
        rows.append([check, f"said {said:+.0%}, measured {measured:+.0%}", "yes" if held else "no"])
    return rows


def _peak_said(pts: dict, made: dict) -> list[list[str]]:
    """The eager step's and remat's plans' peaks against the fake step's, made for the GPU on the laptop (remat.auto's
    against the one it planned from its real profile on the GPU)."""
    rows = []
    for kind in ("eager", *REMAT_EAGER):
        if kind not in pts:
            continue
        said = made.get("peak_bytes") if kind == "eager" else _predicted(kind, pts[kind], made, "peak_bytes")
        if said:
            off = pts[kind]["peak_bytes"] / said - 1
            check = f"`{kind}`: peak within {PEAK_SAID:.0%} of the predicted"
            measured = f"said {said / MiB:,.0f} MiB, measured {pts[kind]['peak_bytes'] / MiB:,.0f} ({off:+.1%})"
            rows.append([check, measured, "yes" if abs(off) <= PEAK_SAID else "no"])
    return rows


LEFT_BEFORE = 80 << 20
"""What may be allocated when a variant begins: cuBLAS's two 32 MiB workspaces, taken at the process's first matmul
and never freed (NOTE [CUDA memory that is no tensor], Rule 1), and a little more."""


def _left_before(pts: dict) -> list[list[str]]:
    """Nothing an earlier variant left counts in a variant's peak (runs since 2026-12-04 record it): on the H200
    that day, earlier plans' modules did (remat's reference cycles, fixed; `leak_account.py`)."""
    left = {v: r["before_bytes"] for v, r in pts.items() if r.get("before_bytes") is not None}
    if not left:
        return []
    worst = max(left, key=left.get)
    check = f"nothing of earlier variants allocated when each began (at most {LEFT_BEFORE / MiB:.0f} MiB)"
    return [[check, f"most: `{worst}`, {left[worst] / MiB:,.1f} MiB", "yes" if left[worst] <= LEFT_BEFORE else "no"]]


def _within_budget(pts: dict, eager_s: float) -> list[list[str]]:
    """remat.auto's plans on the compiled model: each within the budget it was given (a peak in bytes)."""
    rows = []
    for variant, r in pts.items():
        if isinstance(r.get("budget"), int):
            check = f"`{variant}`: within its budget ({r['budget'] / MiB:,.0f} MiB)"
            rows.append([check, _at(r, eager_s), "yes" if r["peak_bytes"] <= r["budget"] else "no: over"])
    return rows


def done_when(res: dict) -> list[list[str]]:
    """The issue's checks, a row each: [model, check, what was measured, verdict]."""
    rows = []
    for name, variants in res["models"].items():
        pts = _points(variants)
        if "eager" not in pts:
            rows.append([name, "every check", "the eager step was not measured", "n/a"])
            continue
        eager = pts["eager"]
        made = res["made"]["models"].get(name, {})
        checks = _against_compile(pts, eager["step_s"]) + _least_memory(pts, eager["step_s"])
        checks += _at_35(pts, eager) + _said(pts, made, eager["step_s"]) + _peak_said(pts, made)
        checks += _within_budget(pts, eager["step_s"]) + _left_before(pts)
        rows += [[name, *c] for c in checks]
    return rows


def _issued(r: dict) -> str:
    """The host's time to issue the step, its share of the step, and whether the host set the pace (HOST_BOUND);
    empty for a run from before it was recorded (2026-12-04)."""
    if "issue_s" not in r:
        return ""
    share = r["issue_s"] / r["step_s"]
    return f"{r['issue_s'] * 1e3:.1f} ms ({share:.0%}{', host-bound' if share >= HOST_BOUND else ''})"


def render(res: dict) -> str:
    """Every variant measured, then the issue's checks."""
    rows = []
    for name, variants in res["models"].items():
        eager = variants.get("eager", {}).get("step_s")
        for variant, r in variants.items():
            if "step_s" not in r:
                rows.append([name, variant, r.get("error") or r.get("skipped"), "", "", "", ""])
                continue
            extra = None if ours(variant) else _predicted(variant, r, res["made"]["models"][name], "extra_fraction")
            said = f"{extra:+.1%}" if extra is not None else ""
            overhead = f"{r['step_s'] / eager - 1:+.1%}" if eager else ""
            peak = f"{r['peak_bytes'] / MiB:,.0f}" if "peak_bytes" in r else "-"
            if "plan" in r:  # remat.auto's: what it chose, and what its search cost (its compilations, where kept)
                compiled = sum(phase.startswith("candidate ") for phase, _ in r.get("phases", []))
                each = f", {compiled} candidate{'s' * (compiled != 1)} compiled" if compiled else ""
                variant = f"{variant} ({r['plan']}; searched {r['search_s']:.0f} s{each})"
            rows.append([name, variant, peak, f"{r['step_s'] * 1e3:.1f}", _issued(r), overhead, said])
    return "\n\n".join(
        [
            f"{res['device']}, torch {res['torch']}, {res['date']}",
            md_table(
                ["model", "variant", "peak MiB", "step ms", "host issued", "measured overhead", "predicted"],
                rows,
                pad=False,
            ),
            "Issue 36's checks, on these figures:",
            md_table(["model", "check", "measured", "holds"], done_when(res), pad=False),
        ]
    )


def merge(runs: list[dict]) -> dict:
    """Runs on one device joined (a run the device's time limit cut short, and the calls that finished it): each
    variant as the first run that measured it; a variant skipped or failed in one run and measured in a later one
    takes the later one's figures.  The runs must be of the same device, torch and plans."""
    first = runs[0]
    for run in runs[1:]:
        if (run["device"], run["torch"], run["made"]) != (first["device"], first["torch"], first["made"]):
            raise SystemExit(
                f"remat: the results to merge must be of one device, torch and plans; saw {run['device']}, torch "
                f"{run['torch']} (plans of {run['made']['made']}) beside {first['device']}, torch {first['torch']} "
                f"(plans of {first['made']['made']}). Fix: merge the runs of one device and one set of plans."
            )
    merged = {**first, "models": {}, "dates": [r["date"] for r in runs]}
    for run in runs:
        for name, variants in run["models"].items():
            into = merged["models"].setdefault(name, {})
            for variant, r in variants.items():
                if "step_s" not in into.get(variant, {}):
                    into[variant] = r
    return merged


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Issue 36's tables from gpu_seconds.py --gpu runs, merged.")
    parser.add_argument("results", nargs="+", help="results JSON of `gpu_seconds.py --gpu`, the first run first")
    args = parser.parse_args()
    print(render(merge([json.loads(open(f).read()) for f in args.results])))


if __name__ == "__main__":
    main()
