"""The "Planning time" section of the peers report: what each planner costs before the first step.  A table
per model of remat's profile and plan seconds per solver beside torch.compile's compile and partitioner
seconds per budget, then Rockmate's recorded status (with the probe that found it not runnable on CPU) and
how the compile seconds are measured."""

from __future__ import annotations

import statistics

from . import texts
from .fmt import secs, table

HEADERS = [
    "model",
    "remat profile s (once)",
    "remat plan s: dp",
    "ilp (median, max)",
    "chen",
    "remat total (profile + slowest plan)",
    "torch.compile s per budget: median (min–max)",
    "of which partitioner s",
    "Rockmate",
]


def planning_section(data: dict, models: list[str]) -> list[str]:
    """The planning-time table and a blank line (the docs/benchmarks.md span keeps only these two), then
    Rockmate's status and how the compile seconds are measured."""
    rows = [
        _planning_row(m, data["models"][m]["eager"], data["models"][m].get("compile"))
        for m in models
        if not data["models"][m]["eager"].get("worker_error")
    ]
    return [table(HEADERS, rows), "", _rockmate_line(data), "", _compile_note(data), ""]


def _rockmate_line(data: dict) -> str:
    """Rockmate's recorded status, with what its probe downloaded and why `import rockmate` failed."""
    rk = data.get("rockmate", {})
    probe = rk.get("probe") or {}
    return (
        f"Rockmate: **not runnable on CPU: CUDA-only as shipped, rkgb 2.0.0 on PyPI incomplete** (recorded status: "
        f"{rk.get('status', 'not probed')}). "
        + (
            f"Probe of {probe.get('date')}: `pip download --no-deps rockmate rkgb` gave {', '.join(probe.get('downloaded', []))}; "
            f"the rkgb sdist holds only {', '.join(probe.get('rkgb_sdist_contents', []))} (missing "
            f"{', '.join(p + '/' for p in probe.get('rkgb_missing_packages', []))}); installed into a throwaway "
            f"directory, `import rockmate` fails: `{(probe.get('probe') or {}).get('error', '?')}`. "
            if probe
            else ""
        )
        + texts.ROCKMATE_SCALE
    )


def _compile_note(data: dict) -> str:
    """How the compile seconds are measured, with the kernels in Inductor's cache at the start of the run."""
    return (
        "Compile seconds are the first compiled call (forward + backward) minus a steady compiled step, with the "
        "FX-graph and AOTAutograd caches off (so each budget is really partitioned) and Inductor's on-disk kernel "
        "cache as found (warm for kernels an earlier budget or run already built"
        + (
            f"; {data['machine']['inductor_cache']['compiled_kernels_at_start']:,} compiled kernels in it at the start of this run"
            if data.get("machine", {}).get("inductor_cache")
            else ""
        )
        + "); the partitioner column is the time inside `min_cut_rematerialization_partition`, torch.compile's own "
        "planning."
    )


def _planning_row(m: str, E: dict, C: dict | None) -> list:
    ok = [r["plan_s"] for r in E["plans"] if r["status"] == "ok"]
    by = {s: [r["plan_s"] for r in E["plans"] if r["solver"] == s] for s in ("dp", "ilp", "chen")}
    comp = [r for r in (C or {}).get("budgets", []) if "compile_s" in r]
    return [
        m,
        secs(E["profile_s"]),
        *(
            (secs(statistics.median(by[s])) + (f" (max {secs(max(by[s]))})" if s == "ilp" else "")) if by[s] else "—"
            for s in ("dp", "ilp", "chen")
        ),
        secs(E["profile_s"] + (max(ok) if ok else 0)),
        (
            f"{secs(statistics.median(r['compile_s'] for r in comp))} ({secs(min(r['compile_s'] for r in comp))}–"
            f"{secs(max(r['compile_s'] for r in comp))})"
        )
        if comp
        else "—",
        secs(statistics.median(r["partition_s"] for r in comp)) if comp else "—",
        "not runnable on CPU",
    ]
