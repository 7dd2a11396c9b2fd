"""The prepared GPU check's report: a run's results as a table (a row per model and plan, what ran under the
cap, what did not finish), the docs section between its markers, and the raw results written."""

from __future__ import annotations

import json
import time
from pathlib import Path

from _common import ROOT, MiB
from gpu_check_run import KINDS, NOISE_FACTOR, RunOptions

RESULTS = ROOT / "benchmarks" / "results" / "gpu_check"
START, END = "<!-- gpu_check:start -->", "<!-- gpu_check:end -->"
SECTION_TITLE = "## 6. The prepared GPU check (`benchmarks/gpu_check.py`)"


def _mib(n) -> str:
    return "—" if n is None else f"{n / MiB:,.1f}"


def _err(predicted, measured) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if predicted and measured else "n/a"


def _mib_or_na(n) -> str:
    return "n/a" if n is None else _mib(n)


def _status(r: dict) -> str:
    if r.get("status") == "ok":
        return "yes" if "cap_fraction" in r else "no cap"
    return f"**{r.get('status', '?')}**"


def _grad_cell(r: dict, noise) -> str:
    g = r.get("grads")
    if not g or noise is None:
        return "n/a"
    if "error" in g:
        return f"**fail**: {g['error'][:80]}"
    verdict = r["grad_verdict"] if r["grad_verdict"] == "pass" else f"**{r['grad_verdict']}**"
    return f"{g['max_abs_diff']:.1e} vs {NOISE_FACTOR * noise:.1e}: {verdict}"


def _unplanned_row(name: str, m: dict) -> str:
    r, pred = m["runs"]["unplanned"], m["predicted"]["unplanned_peak_bytes"]
    real, replayed = r.get("real_profile_peak_bytes"), r.get("real_profile_allocated_bytes")
    real_cell = (
        f"{_mib(real)} ({_err(real, r.get('peak_allocated_bytes'))})"
        if real is not None
        else r.get("real_profile_error", "n/a")[:80]
    )
    if replayed is not None:
        real_cell += f"; replayed {_mib(replayed)} ({_err(replayed, r.get('peak_allocated_bytes'))})"
    noise = "n/a" if m["grad_noise"] is None else f"noise {m['grad_noise']:.1e}"
    return (
        f"| {name} | unplanned | {_mib(pred)} | "
        f"{_allocated_cells(m['predicted'].get('unplanned_allocated_bytes'), pred, r)} | "
        f"{_reserved_cell(m['predicted'].get('unplanned_reserved_bytes'), r)} | — | "
        f"{_status(r)} | {noise} | {real_cell} | {_seconds(r)} |"
    )


def _plan_row(name: str, kind: str, m: dict) -> str:
    p = m["predicted"]["plans"][kind]
    if kind not in m["runs"]:
        return f"| {name} | {kind}: no plan | {' '.join(p.get('error', '?').split())[:200]} |" + " |" * 9
    r = m["runs"][kind]
    what = (
        f"{kind}: {p['segments']} ckpt + {p['selective']} selective"
        + (f" + {p['offload']} offload" if p.get("offload") else "")
        + (f", {p['allocator']}" if p.get("allocator") else "")
    )
    return (
        f"| {name} | {what} | {_mib(p['peak_bytes'])} | "
        f"{_allocated_cells(_planned(p, r, 'allocated_bytes'), p['peak_bytes'], r)} | "
        f"{_reserved_cell(_planned(p, r, 'reserved_bytes'), r)} | "
        f"{_mib(r.get('budget_bytes') or p['budget_bytes'] or p['peak_bytes'])} | {_status(r)} | "
        f"{_grad_cell(r, m['grad_noise'])} | — | {_seconds(r)} |"
    )


def _allocated_cells(replayed, tensors: int, r: dict) -> str:
    """max_memory_allocated replayed on the laptop / measured, and the error (of the tensors without a replay)."""
    measured = r.get("peak_allocated_bytes")
    if replayed is None:
        return f"{_mib_or_na(measured)} | {_err(tensors, measured)}"
    return f"{_mib(replayed)} / {_mib_or_na(measured)} | {_err(replayed, measured)}"


def _planned(p: dict, r: dict, figure: str) -> int | None:
    """The replay's `figure` under the allocator the plan's step ran with (None in plans made before it was kept)."""
    expandable = "expandable_segments:True" in (r.get("alloc_conf") or "")
    return p.get("expandable_" + figure) if expandable else p.get(figure)


def _reserved_cell(predicted, r: dict) -> str:
    """max_memory_reserved measured, after the replayed reserve predicted on the laptop when there is one."""
    measured = r.get("peak_reserved_bytes")
    if predicted is None:
        return _mib_or_na(measured)
    return f"{_mib(predicted)} / {_mib_or_na(measured)} ({_err(predicted, measured)})"


def _seconds(r: dict) -> str:
    return f"{r['step_s']:.3f}" if r.get("step_s") is not None else "—"


def _failures(res: dict) -> list[str]:
    """One line per measurement that did not run to the end: OOM, error, timeout or skipped."""
    lines = []
    for name, m in res["models"].items():
        for label, r in m["runs"].items():
            if r.get("status") != "ok":
                msg = " ".join(str(r.get("message", "")).split())[:300]
                lines.append(f"- {name} / {label}: {r.get('status')}: {msg}")
    return lines


def render(res: dict) -> str:
    """The dated section: what ran where, the table, and every measurement that did not finish."""
    made, capped = res["made"], res.get("cap", True)
    cap_note = "; a plan's step under `torch.cuda.set_per_process_memory_fraction(budget / total memory)`"
    allocator = f"`PYTORCH_CUDA_ALLOC_CONF={res['alloc_conf']}`" if res.get("alloc_conf") else "the default allocator"
    lines = [
        f"Run {res['date']} on **{res['device']}**, torch {res['torch']}, transformers {res['transformers']}: "
        f"`{res['command']}` ({res['elapsed_s']:.0f} s of a {res['budget_s']:.0f} s budget), {allocator}, "
        f"{'planned steps capped at their budget' if capped else 'planned steps not capped (--no-cap)'}.  Plans made "
        f"{made['date']} by `{made['command']}` on {made['machine'].get('cpu', '?')} (torch {made['torch']}, "
        f"transformers {made['transformers']}, remat {made['remat_commit'][:10]}"
        f"{' + uncommitted src/ changes' if made.get('src_dirty') else ''}): fake mode, `device="
        f'"{made["profile"]["device"]}", hardware="{made["profile"]["hardware"]}"`, Adam, the output kept '
        "through backward.",
        "",
        "| model | plan | tensors MiB (laptop, fake) | max_memory_allocated MiB: replayed on the laptop / measured | error | "
        "reserved MiB: replayed on the laptop / measured | budget (cap) MiB | ran under the cap | grad max \\|diff\\| vs 10x noise | "
        "real-mode profile MiB: tensors (error); replayed (error) | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        lines.append(_unplanned_row(name, m))
        lines += [_plan_row(name, kind, m) for kind in KINDS if kind in m["predicted"]["plans"]]
    failures = _failures(res)
    lines += [
        "",
        "Every measurement ran to the end." if not failures else "Measurements that did not finish:",
        *failures,
        "",
        "Error: (replayed - measured) / measured of max_memory_allocated, the replay being the "
        "laptop's fake step run through a model of the caching allocator (of its tensors where a run has no "
        "replay).  Each row a fresh process, the third step of the loop with Adam"
        + (cap_note if capped else "; no step capped")
        + ".  Gradients: the first step's, max |difference| from the unplanned run's, against "
        f"{NOISE_FACTOR}x that of a second unplanned run (the noise).  Raw results: `{res['results_file']}`.",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, body: str) -> None:
    """`body` between the markers of `path`, replacing what was there; the section added at the end if absent."""
    text = path.read_text() if path.exists() else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + START + "\n" + body + END + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION_TITLE}\n\n{START}\n{body}{END}\n"
    path.write_text(text)


def _in_tree(path: Path, device: str) -> str:
    """Where the raw results are in this tree, or belong once copied back from a GPU (the device tool's $OUT)."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(RESULTS.relative_to(ROOT) / path.name) if device != "CPU" else str(path)


def write_results(res: dict, opts: RunOptions) -> None:
    slug = "".join(c if c.isalnum() else "_" for c in res["device"]).strip("_")
    out = opts.out_dir / f"gpu_{slug}_{time.strftime('%Y-%m-%dT%H%M', time.gmtime())}.json"
    res["results_file"] = _in_tree(out, res["device"])
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    publish(res, docs=opts.docs)
    print(f"wrote {out} and the section of {opts.docs}", flush=True)


def publish(*runs: dict, docs: Path) -> None:
    """The tables of one run or more (--from-json A,B,...), printed and written to the section of `docs`."""
    body = "\n".join(render(res) for res in runs)
    write_section(docs, body)
    print(body, flush=True)
