"""Tables, verdicts and plots of the peers benchmark (from run.py's collected data)."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from models import ORDER, TITLES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE.parent / "results"
DOCS = ROOT / "docs"
MiB = 2**20
ONEFLOW_TIME, ONEFLOW_MEM = 1.33, 0.65  # user report 004: +33% time, -35% memory (9141 -> 5978 MB)
PEERS_FAMILIES = ("every_block", "checkpoint_sequential", "chen", "sac")


# -- formatting -------------------------------------------------------------------------------


def mib(b) -> str:
    return "—" if b is None else f"{b / MiB:,.1f}"


def pct(a, base) -> str:
    if a is None or not base:
        return ""
    return f"{(a - base) / base:+.0%}"


def gflop(f) -> str:
    return "—" if f is None else f"{f / 1e9:,.2f}"


def ratio(r) -> str:
    return "—" if r is None else f"{r:.2f}×"


def secs(s) -> str:
    if s is None:
        return "—"
    return f"{s:.2f}" if s < 10 else f"{s:.0f}"


def grads_text(g: dict | None, rng_note: bool = False) -> str:
    if not g:
        return "—"
    if g.get("equal"):
        return "exact"
    if g.get("rel", 1) < 1e-4:
        return f"≈ (rel {g['rel']:.0e})"
    return f"DIFFER (rel {g['rel']:.0e})" + (" ¹" if rng_note else "")


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# -- analysis ---------------------------------------------------------------------------------


def configs_by_key(E: dict) -> dict:
    return {c["key"]: c for c in E.get("configs", [])}


def remat_sources(E: dict) -> dict[str, list[str]]:
    """config key -> the (budget, solver) rows and matched peers that produced it."""
    src: dict[str, list[str]] = {}
    for r in E.get("plans", []):
        if r.get("key"):
            src.setdefault(r["key"], []).append(f"{r['budget_frac']:.0%}/{r['solver']}")
    for r in E.get("matched", []):
        if r.get("key"):
            src.setdefault(r["key"], []).append(f"at {r['peer']}")
    return src


TOL_TRACKER = 64 * 1024  # as worker_eager.TOL_TRACKER


def tol_process(peak: float) -> float:
    return max(MiB, 0.01 * peak)  # as worker_eager.tol_process


# why remat loses, by cause (docs/peers.md "Where remat loses, and why")
WHY = {
    "fusion": "op level: Inductor's fused kernels never store the pointwise intermediates that eager keeps, "
              "a saving at 0 counted FLOPs that no choice of eager modules reproduces",
    "free_ops": "op level: the peer recomputes only ops FlopCounterMode counts as free (pointwise, norms, softmax, "
                "dropout); remat's smallest unit that frees this much recomputes a matmul",
    "finer": "op level: the partitioner picks single ops anywhere in the graph; remat's units are whole modules",
    "below": "below remat's least-memory plan",
    "peak": "measured peak above the peer's",
}


def verdicts(E: dict, C: dict | None) -> list[dict]:
    """For each peer point: remat's plan at a budget equal to the peer's measured peak (plus the
    measurement tolerance), and who wins."""
    cfg = configs_by_key(E)
    none = cfg["none"]
    by_label = {c["label"]: c for c in E.get("configs", []) if c["family"] in PEERS_FAMILIES}
    comp = {f"torch.compile budget {r['budget']:g}": r for r in (C or {}).get("budgets", []) if "rss_peak" in r}
    step_flops = none.get("flops") or 1
    rows = []
    for m in E.get("matched", []):
        method = m["method"]
        peer = by_label.get(m["peer"]) if method == "tracker" else comp.get(m["peer"])
        if peer is None:
            continue
        pk = "tracker_peak" if method == "tracker" else "rss_peak"
        tol = m.get("tol_bytes", TOL_TRACKER if method == "tracker" else tol_process(peer.get(pk) or 0))
        saves_nothing = peer.get(pk, 0) >= none[pk] - tol
        g = peer.get("grads") if method == "tracker" else peer.get("grads_vs_eager")
        v = {"peer": m["peer"], "method": method, "peer_peak": peer.get(pk), "peer_flops": peer.get("extra_flops"),
             "peer_time": peer.get("time_ratio"), "peer_family": "compile" if method == "rss" else peer["family"],
             "budget": m["budget_bytes"], "tol": tol, "solver_note": m.get("solver_note"),
             "peer_grads_differ": bool(g) and not g.get("equal") and g.get("rel", 1) >= 1e-4}
        if m["status"] == "infeasible":
            cause = "fusion" if v["peer_family"] == "compile" and not v["peer_flops"] else "below"
            why = (f"{WHY['below']} ({mib(m['min_bytes'])} MiB tracker, the peer {mib(m.get('peer_budget_bytes', m['budget_bytes']))}"
                   f"{' process − offset' if method == 'rss' else ''})")
            if cause == "fusion":
                why += "; " + WHY["fusion"]
            elif v["peer_family"] in ("sac", "compile"):
                why += "; " + WHY["finer"]
            else:
                why += ": the peer's checkpoints cut where remat has no unit"
            v.update(verdict="loses", remat=None, cause=cause, why=why)
            rows.append(v)
            continue
        if m["status"] != "ok":
            v.update(verdict="error", remat=None, cause="error", why=m.get("error", ""))
            rows.append(v)
            continue
        r = cfg[m["key"]]
        v.update(remat=r["label"], remat_peak=r.get(pk), remat_flops=r.get("extra_flops"), remat_time=r.get("time_ratio"),
                 predicted=r.get("predicted_peak"))
        if r.get(pk) is None or v["peer_peak"] is None or v["peer_flops"] is None:
            v.update(verdict="error", cause="error", why=r.get("error", "not measured"))
            rows.append(v)
            continue
        peak_ok = r[pk] <= v["peer_peak"] + tol
        flops_ok = r["extra_flops"] <= v["peer_flops"]
        if peak_ok and flops_ok:
            same = r["extra_flops"] == v["peer_flops"] and abs(r[pk] - v["peer_peak"]) <= tol
            v["verdict"] = "ties" if same else "wins"
            v["cause"] = ""
            v["why"] = "the peer saves no memory here" if saves_nothing else ""
        else:
            v["verdict"] = "loses"
            whys, cause = [], "peak"
            if not peak_ok:
                whys.append(f"measured peak {mib(r[pk])} MiB above the peer's {mib(v['peer_peak'])} MiB + tolerance "
                            f"(predicted {mib(r.get('predicted_peak'))} MiB tracker)")
            diag = next((c for c in E.get("configs", []) if c["family"] == "diagnostic" and c.get(pk) is not None), None)
            if not flops_ok:
                if (diag and diag[pk] <= v["peer_peak"] + tol and diag.get("extra_flops", 1) <= v["peer_flops"]
                        and diag.get("tracker_peak", 0) < diag.get("predicted_peak", 0)):
                    cause = "bug3"
                    whys.append(f"remat bug 3: selective on every layer measures {mib(diag[pk])} MiB at "
                                f"{gflop(diag['extra_flops'])} GFLOP (diagnostic row) but is predicted at "
                                f"{mib(diag['predicted_peak'])} MiB tracker, so the planner does not choose it")
                elif v["peer_family"] == "compile" and not v["peer_flops"]:
                    cause = "fusion"
                elif v["peer_family"] in ("sac", "compile") and v["peer_flops"] <= 0.02 * step_flops:
                    cause = "free_ops"
                elif v["peer_family"] in ("sac", "compile"):
                    cause = "finer"
                else:
                    cause = "flops"
                if cause != "bug3":
                    whys.append(WHY.get(cause, f"remat needs {gflop(r['extra_flops'] - v['peer_flops'])} GFLOP more"))
            v["cause"] = cause
            v["why"] = "; ".join(whys)
        if v["peer_grads_differ"]:
            v["why"] = (v["why"] + "; " if v["why"] else "") + "the peer's gradients differ from the unplanned model's"
        if v.get("solver_note"):
            v["why"] = (v["why"] + "; " if v["why"] else "") + "remat's ILP failed here, dp's plan shown (bug 2)"
        rows.append(v)
    return rows


def oneflow_headline(E: dict) -> dict:
    cfg = E.get("configs", [])
    none = next(c for c in cfg if c["key"] == "none")
    base, base_rss = none["tracker_peak"], none["rss_peak"]
    rem = [c for c in cfg if c["family"] in ("remat", "none") and c.get("time_ratio") and c.get("tracker_peak")]
    out: dict = {"base": base, "base_rss": base_rss}

    def point(c: dict) -> dict:
        """One remat plan's figures against no checkpointing."""
        return {"label": c["label"], "reduction": 1 - c["tracker_peak"] / base,
                "reduction_rss": 1 - c["rss_peak"] / base_rss, "time": c["time_ratio"],
                "flops_frac": c["extra_flops"] / none["flops"]}

    within = [c for c in rem if c["time_ratio"] <= ONEFLOW_TIME]
    if within:
        best = min(within, key=lambda c: (c["tracker_peak"], c["time_ratio"]))
        out["at_time"] = point(best)
    reach = [c for c in rem if c["tracker_peak"] <= ONEFLOW_MEM * base]
    if reach:
        best = min(reach, key=lambda c: (c["time_ratio"], c["tracker_peak"]))
        out["at_mem"] = point(best)
    # the same two questions in FLOPs (exact on any machine): OneFlow's +33% time is about one extra forward,
    # which is about +33% of a step's FLOPs (forward ~ 1/3 of forward + backward)
    fl = [c for c in rem if c.get("extra_flops") is not None]
    within_f = [c for c in fl if c["extra_flops"] <= 0.33 * none["flops"]]
    if within_f:
        best = min(within_f, key=lambda c: (c["tracker_peak"], c["extra_flops"]))
        out["at_flops"] = point(best)
    reach_f = [c for c in fl if c["tracker_peak"] <= ONEFLOW_MEM * base]
    if reach_f:
        best = min(reach_f, key=lambda c: (c["extra_flops"], c["tracker_peak"]))
        out["at_mem_flops"] = point(best)
    spreads = [max(c["time_ratios"]) - min(c["time_ratios"]) for c in cfg if len(c.get("time_ratios") or []) > 1]
    out["max_spread"] = max(spreads, default=0.0)
    sac = next((c for c in cfg if c["family"] == "sac" and c.get("time_ratio")), None)
    if sac:
        out["sac"] = {"reduction": 1 - sac["tracker_peak"] / base, "time": sac["time_ratio"],
                      "flops_frac": sac["extra_flops"] / none["flops"]}
    least = min((c for c in rem), key=lambda c: c["tracker_peak"])
    out["least"] = {"label": least["label"], "reduction": 1 - least["tracker_peak"] / base, "time": least["time_ratio"]}
    eb = next((c for c in cfg if c["family"] == "every_block" and c.get("time_ratio")), None)
    if eb:
        out["every_block"] = {"reduction": 1 - eb["tracker_peak"] / base, "time": eb["time_ratio"],
                              "flops_frac": eb["extra_flops"] / none["flops"]}
    return out


# -- plots ------------------------------------------------------------------------------------

STYLE = {
    "none": ("black", "o", "no checkpointing"),
    "every_block": ("tab:blue", "s", "every block"),
    "checkpoint_sequential": ("tab:cyan", "v", "checkpoint_sequential(k)"),
    "chen": ("tab:purple", "D", "Chen sqrt(n)"),
    "sac": ("tab:green", "P", "selective (SAC)"),
    "compile": ("tab:orange", "X", "torch.compile budget"),
    "remat": ("tab:red", "*", "remat (measured)"),
    "diagnostic": ("lightgray", "*", "diagnostic: hand-built selective"),
}


def plot_model(m: str, E: dict, C: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = E["configs"]
    none = configs_by_key(E)["none"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    pts: dict[str, list] = {}
    for c in cfg:
        if c.get("rss_peak") is None:
            continue
        pts.setdefault(c["family"], []).append((c.get("extra_flops", 0) / 1e9, c.get("time_ratio"), c["rss_peak"] / MiB, c["label"]))
    for r in (C or {}).get("budgets", []):
        if "rss_peak" in r:
            pts.setdefault("compile", []).append((r["extra_flops"] / 1e9, r.get("time_ratio"), r["rss_peak"] / MiB,
                                                  f"{r['budget']:g}"))
    offset = E.get("rss_offset", 0)
    front = E.get("frontier", [])
    if front:
        xs = [f["flops"] / 1e9 for f in front]
        ys = [(f["peak"] + offset) / MiB for f in front]
        axes[0].step(xs, ys, where="post", color="tab:red", alpha=0.45, lw=1.2,
                     label="remat frontier (predicted, + process offset)")
    for fam, items in pts.items():
        color, marker, lab = STYLE.get(fam, ("gray", "o", fam))
        size = 140 if fam == "remat" else 55
        axes[0].scatter([i[0] for i in items], [i[2] for i in items], c=color, marker=marker, s=size, label=lab,
                        edgecolors="k", linewidths=0.4, zorder=3)
        tt = [(i[1], i[2]) for i in items if i[1] is not None]
        axes[1].scatter([t[0] for t in tt], [t[1] for t in tt], c=color, marker=marker, s=size, edgecolors="k",
                        linewidths=0.4, zorder=3)
        if fam == "compile":
            for i in items:
                axes[0].annotate(i[3], (i[0], i[2]), fontsize=7, xytext=(3, 3), textcoords="offset points")
                if i[1] is not None:
                    axes[1].annotate(i[3], (i[1], i[2]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[0].axhline(none["rss_peak"] / MiB, color="gray", lw=0.6, ls=":")
    axes[1].axhline(none["rss_peak"] / MiB, color="gray", lw=0.6, ls=":")
    axes[1].axvline(1.0, color="gray", lw=0.6, ls=":")
    axes[0].set_xlabel("extra GFLOP per step (FlopCounterMode; compile: its graphs)")
    axes[1].set_xlabel("step time / no checkpointing (median of interleaved rounds)")
    axes[0].set_ylabel("measured peak, MiB (process RSS method)")
    axes[0].set_title(f"{m}: peak vs recomputation", fontsize=10)
    axes[1].set_title(f"{m}: peak vs step time", fontsize=10)
    axes[0].legend(fontsize=7, loc="best", framealpha=0.8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{TITLES.get(m, m)} — {E.get('describe', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the document -----------------------------------------------------------------------------


def model_section(m: str, E: dict, C: dict | None, img: str | None) -> tuple[list[str], list[dict]]:
    lines = [f"### {m}: {TITLES.get(m, m)}", ""]
    if E.get("worker_error"):
        return lines + [f"Worker failed: {E['worker_error']}", "", "```", E.get("log_tail", "")[-1500:], "```", ""], []
    cfg = configs_by_key(E)
    none = cfg["none"]
    base_t, base_r, step_flops = none["tracker_peak"], none["rss_peak"], none["flops"]
    lines += [
        f"{E['describe']}; {E['params']:,} parameters; Adam; loss {'out.loss' if m in ('gpt2', 'bert', 'llama', 'vit') else 'see models.py'}. "
        f"Unplanned step: tracker {mib(base_t)} MiB (peak in {E['peak_phase']}), process {mib(base_r)} MiB "
        f"(fresh-process MEASURING.md figure {mib(E['fresh_none_rss'])} MiB), {gflop(step_flops)} GFLOP forward+backward, "
        f"{E['n_blocks']} candidate modules for remat. Worker wall time {E.get('wall_s', 0):.0f} s"
        + (f" + compile worker {C.get('wall_s', 0):.0f} s" if C and "wall_s" in C else "") + ".",
        "",
    ]
    if img:
        lines += [f"![{m}]({img})", ""]
    src = remat_sources(E)
    rows = []
    rng = False
    for c in E["configs"]:
        if c["family"] in ("remat", "diagnostic"):
            continue
        note = c.get("error", "")
        is_rng = c["family"] == "sac" and not (c.get("grads") or {}).get("equal", True)
        rng = rng or is_rng
        rows.append([c["label"], c["how"] or "—", mib(c.get("tracker_peak")) + f" ({pct(c.get('tracker_peak'), base_t)})",
                     mib(c.get("rss_peak")) + f" ({pct(c.get('rss_peak'), base_r)})",
                     gflop(c.get("extra_flops")) + (f" ({c['extra_flops'] / step_flops:.0%})" if c.get("extra_flops") is not None else ""),
                     ratio(c.get("time_ratio")), "0", grads_text(c.get("grads"), is_rng) + (f" {note}" if note else "")])
    for r in (C or {}).get("budgets", []):
        if "error" in r:
            rows.append([f"torch.compile budget {r['budget']:g}", "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        g = r.get("grads_vs_compiled_1")
        rows.append([f"torch.compile budget {r['budget']:g}", "torch.compile(step) + activation_memory_budget",
                     "n/a ²", mib(r["rss_peak"]) + f" ({pct(r['rss_peak'], base_r)})",
                     gflop(r["extra_flops"]) + f" ({r['extra_flops'] / step_flops:.0%})", ratio(r.get("time_ratio")),
                     f"{secs(r['compile_s'])} (partitioner {secs(r['partition_s'])})",
                     f"vs eager {grads_text(r['grads_vs_eager'])}; vs budget 1.0 {grads_text(g)}"])
    for c in E["configs"]:
        if c["family"] not in ("remat", "diagnostic"):
            continue
        where = "" if c["family"] == "diagnostic" else f" ← {', '.join(src.get(c['key'], [])[:4])}{' …' if len(src.get(c['key'], [])) > 4 else ''}"
        rows.append([(f"_{c['label']}_" if c["family"] == "diagnostic" else f"**{c['label']}**") + where,
                     "remat.apply(model, plan)",
                     mib(c.get("tracker_peak")) + f" ({pct(c.get('tracker_peak'), base_t)}; predicted {mib(c.get('predicted_peak'))})",
                     mib(c.get("rss_peak")) + f" ({pct(c.get('rss_peak'), base_r)})",
                     gflop(c.get("extra_flops")) + (f" ({c['extra_flops'] / step_flops:.0%}; predicted {gflop(c.get('predicted_flops'))})" if c.get("extra_flops") is not None else ""),
                     ratio(c.get("time_ratio")), f"{secs(E['profile_s'])} + plan", grads_text(c.get("grads")) + (f" {c.get('error', '')}")])
    lines += ["All strategies (tracker = `remat.profile(...).peak_bytes` on the modified model; process = RSS method; "
              "Δ against no checkpointing):", ""]
    lines += [table(["strategy", "applied with", "tracker peak MiB", "process peak MiB", "extra GFLOP (of step)",
                     "step time vs none", "planning / compile s", "gradients vs none"], rows), ""]
    if E.get("skipped"):
        lines += ["Not applicable as users apply them: " + "; ".join(f"{s['label']} — {s['why']}" for s in E["skipped"]) + ".", ""]
    # remat budgets x solvers
    prow = []
    for r in E.get("plans", []):
        c = cfg.get(r.get("key"), {})
        if r["status"] == "ok":
            prow.append([f"{r['budget_frac']:.0%}", r["solver"] + (f" → {r['solver_used']}" if r["solver_used"] != r["solver"] else ""),
                         f"{r['n_segments']} ckpt" + (f" + {r['n_selective']} sel" if r.get("n_selective") else "") + (" — apply fails: " + c["error"][:120] if c.get("error") else ""), mib(r["predicted_peak"]), mib(c.get("tracker_peak")), mib(c.get("rss_peak")),
                         f"{gflop(r['predicted_flops'])} / {gflop(c.get('extra_flops'))}", ratio(c.get("time_ratio")), f"{r['plan_s']:.3f}"])
        elif r["status"] == "infeasible" and r["min_bytes"] <= r["budget_bytes"]:
            prow.append([f"{r['budget_frac']:.0%}", r["solver"], f"no plan: InfeasibleBudget although its least is {mib(r['min_bytes'])} MiB (solver error, bug 2)",
                         "", "", "", "", "", f"{r['plan_s']:.3f}"])
        elif r["status"] == "infeasible":
            prow.append([f"{r['budget_frac']:.0%}", r["solver"], f"infeasible (least {mib(r['min_bytes'])} MiB)", "", "", "", "", "", f"{r['plan_s']:.3f}"])
        else:
            prow.append([f"{r['budget_frac']:.0%}", r["solver"], r.get("error", "error")[:90], "", "", "", "", "", f"{r.get('plan_s', 0):.3f}"])
    lines += [f"remat at each budget (fraction of the tracker's unplanned peak {mib(base_t)} MiB) and solver "
              f"(profile {E['profile_s']:.2f} s once, then plan s below):", ""]
    lines += [table(["budget", "solver", "plan", "predicted MiB", "tracker MiB", "process MiB", "extra GFLOP predicted / measured",
                     "time vs none", "plan s"], prow), ""]
    vs = verdicts(E, C)
    vrows = []
    for v in vs:
        unit = "tracker" if v["method"] == "tracker" else "process"
        vrows.append([v["peer"], f"{mib(v['peer_peak'])} ({unit})", gflop(v["peer_flops"]), ratio(v.get("peer_time")),
                      v.get("remat") or "—", mib(v.get("remat_peak")), gflop(v.get("remat_flops")), ratio(v.get("remat_time")),
                      f"**{v['verdict']}**" + (f": {v['why']}" if v.get("why") else "")])
    if vrows:
        lines += ["remat at each peer's measured peak (budget = the peer's tracker peak + 64 KiB; for torch.compile its "
                  "process peak minus the unplanned process−tracker offset "
                  f"{mib(E.get('rss_offset'))} MiB, + max(1 MiB, 1%), compared on process peaks with that tolerance):", ""]
        lines += [table(["peer point", "peer peak MiB", "peer extra GFLOP", "peer time", "remat plan", "remat peak MiB",
                         "remat extra GFLOP", "remat time", "verdict"], vrows), ""]
    if rng:
        lines += ["¹ torchtitan's wrapper uses `preserve_rng_state=False`; this model has dropout, so the recomputed "
                  "dropout masks differ from the forward's and the gradients change (remat preserves the RNG state).", ""]
    return lines, vs


def _run_line(data: dict) -> list[str]:
    info, prof = data["machine"], data["profile"]
    return [
        f"Run {info['date']} on {info['cpu']}, {info['cores']} cores (shared machine), torch {info['torch']}, transformers "
        f"{info['transformers']}, python {info['python']}; torch threads {info['threads']} in every worker, "
        f"OMP_WAIT_POLICY={info.get('OMP_WAIT_POLICY')}; load average (1, 5, 15 min) at start "
        f"{' '.join(info.get('loadavg_at_start', []))}, at end {' '.join(info.get('loadavg_at_end', []))}. "
        f"Whole run {info['elapsed_s'] / 60:.1f} min."
        + (f" remat at commit {info['git']['commit']}" + (" with uncommitted changes in src/" if info['git'].get('src_dirty') else "")
           + "." if info.get("git", {}).get("commit") else ""),
        "",
        f"Command: `{data['command']}`. Sizes `{prof['size']}`; {prof['rounds']} interleaved timing rounds after one "
        f"warm-up round; remat budgets {', '.join(f'{b:.0%}' for b in prof['budgets'])} of the unplanned peak × solvers "
        f"{', '.join(prof['solvers'])}; torch.compile budgets {', '.join(f'{b:g}' for b in prof['compile_budgets']) or 'none'}.",
        "",
    ]


def _counts(vs: list[dict]) -> dict:
    return {k: sum(1 for v in vs if v["verdict"] == k) for k in ("wins", "ties", "loses", "error")}


def _headline(all_v: list[dict], per_model: dict) -> list[str]:
    c = _counts(all_v)
    L = [f"Every peer point (one strategy at one setting on one model) was matched by `remat.plan(profile, budget=that "
         f"point's measured peak)`, and the plan was applied and measured the same way: remat **wins {c['wins']}**, "
         f"**ties {c['ties']}**, **loses {c['loses']}**" + (f", errors {c['error']}" if c["error"] else "")
         + " of {} points. wins: measured peak no higher (within the tolerance) and fewer extra FLOPs, or the same FLOPs "
           "at a lower peak; ties: the same peak and FLOPs (often both keep everything).".format(len(all_v)), ""]
    rows = []
    for fam in ("every_block", "checkpoint_sequential", "chen", "sac", "compile"):
        vs = [v for v in all_v if v["peer_family"] == fam]
        if vs:
            k = _counts(vs)
            rows.append([FAMILY_NAMES[fam], len(vs), k["wins"], k["ties"], k["loses"]])
    L += [table(["peer", "points", "remat wins", "ties", "remat loses"], rows), ""]
    rows = []
    for m, vs in per_model.items():
        if vs:
            k = _counts(vs)
            rows.append([m, len(vs), k["wins"], k["ties"], k["loses"],
                         ", ".join(sorted({v["peer"] for v in vs if v["verdict"] == "loses"})) or "—"])
    L += [table(["model", "points", "remat wins", "ties", "remat loses", "lost to"], rows), ""]
    return L


FAMILY_NAMES = {"every_block": "every block (HF / apply_activation_checkpointing)",
                "checkpoint_sequential": "checkpoint_sequential(k)", "chen": "Chen sqrt(n)",
                "sac": "selective op checkpointing (SAC, torchtitan-style)",
                "compile": "torch.compile activation_memory_budget"}

CAUSE_TEXT = {
    "fusion": ("**Fusion (op level, a genuine limit of module-level planning).** torch.compile at a budget where its "
               "graphs count no extra FLOPs still has a lower peak than eager: Inductor's fused kernels never store "
               "the pointwise intermediates (activations, dropout masks, residual sums) that eager PyTorch keeps, and "
               "the partitioner recomputes such ops in backward for free as FlopCounterMode counts. remat plans "
               "checkpoints around eager modules; its cheapest unit that frees as much recomputes a matmul."),
    "free_ops": ("**Free ops (op level, a genuine limit).** The peer recomputes only ops that FlopCounterMode counts "
                 "as 0 FLOPs (pointwise, norms, softmax, dropout) on every block and keeps every matmul. remat's "
                 "selective unit is the same policy per module, but its whole-module and selective units do not "
                 "cover every mix the peer reaches; where they do not, remat's plan that fits recomputes a matmul."),
    "finer": ("**Finer choices (op level, a genuine limit).** The compile partitioner chooses single ops to save or "
              "recompute anywhere in the joint graph; remat chooses whole modules (or a module's selective policy), so "
              "between two of its frontier points it pays for the next whole module."),
    "below": ("**Below remat's least-memory plan.** The peer's peak is lower than any plan remat can build from its "
              "units: it checkpoints runs that are not one module or one run of nn.Sequential children, or it saves "
              "memory inside modules."),
    "bug3": ("**remat bug 3 (a remat bug, see Bugs found).** Selective checkpointing on every layer would match the "
             "peer (the _diagnostic_ row measures it), but remat predicts it too high and plans something costlier."),
    "peak": ("**Measured above the prediction.** remat's plan fitted the budget as predicted but measured higher."),
    "flops": ("**More FLOPs at the same peak.** remat's plan fits but recomputes more."),
}


def _losses(all_v: list[dict]) -> list[str]:
    losses = [v for v in all_v if v["verdict"] == "loses"]
    if not losses:
        return ["remat lost no point in this run.", ""]
    fams = sorted({FAMILY_NAMES.get(v["peer_family"], v["peer_family"]) for v in losses})
    eager_losses = [v for v in losses if v["peer_family"] != "compile"]
    L = [f"remat loses {len(losses)} of {len(all_v)} points, all to: {'; '.join(fams)}. "
         + ("Against the eager peers (every block, checkpoint_sequential, Chen, SAC) it loses none: at each of their "
            "measured peaks it has a plan with no more extra FLOPs. " if not eager_losses else "")
         + "The short answer for practitioners: remat plans checkpoints around eager modules, and its unit is a whole "
           "module (or one module's selective policy); torch.compile works on single ops of a fused graph, so at some "
           "budgets it saves memory that no choice of modules can, and sometimes for no counted FLOPs. In time, "
           "compiled steps were mostly faster than eager ones here (see the per-model tables); remat does not compile.",
         "",
         "Compared with the development run (benchmarks/results/peers_dev.md, other sizes: remat won 18, tied 15, lost "
         "32): 12 losses there came from report 001's chain being an nn.Sequential subclass, which remat did not "
         "segment (fixed in 1b9603e); 7 from matching strictly at a peer's peak although the peer was within a few "
         "hundred bytes (tracker) or within noise (process) of remat's plan — a harness bug, fixed by the tolerances "
         "above; 1 (GPT-2 SAC) from remat bug 3, which did not decide any point in this run; the rest are the op-level "
         "causes below.",
         "",
         table(["model", "peer point", "peer peak MiB / extra GFLOP", "remat peak MiB / extra GFLOP", "why"],
               [[v["model"], v["peer"], f"{mib(v['peer_peak'])} ({'tracker' if v['method'] == 'tracker' else 'process'}) / "
                 f"{gflop(v['peer_flops'])}",
                 f"{mib(v.get('remat_peak'))} / {gflop(v.get('remat_flops'))}" if v.get("remat") else "no plan",
                 v["why"]] for v in losses]), ""]
    causes = sorted({v["cause"] for v in losses}, key=lambda c: list(CAUSE_TEXT).index(c) if c in CAUSE_TEXT else 99)
    L += ["The causes, in plain words:", ""]
    for cz in causes:
        n = sum(1 for v in losses if v["cause"] == cz)
        L.append(f"- {CAUSE_TEXT.get(cz, cz)} ({n} point{'s' if n != 1 else ''}.)")
    L.append("")
    return L


def _bugs(data: dict) -> list[str]:
    b = data.get("bugs")
    if not b:
        return []
    L = ["## Bugs found by this benchmark", "",
         "Reproduced in this run by `python benchmarks/peers/repro_bugs.py` (small models, seconds; `present` = still "
         "there, `fixed` / `not reproduced` = no longer reproduces)"
         + (f"; {data['bugs_note']}" if data.get("bugs_note") else "") + ".", ""]
    c = b.get("chen_apply", {})
    if c.get("plan_refuses"):
        L.append(f"1. **solver='chen' planned segments that remat.apply rejects** — {c.get('status')}: on {c.get('model')} "
                 f"`remat.plan(prof, 0.8, solver='chen')` now raises `{c['plan_refuses'][:160]}…`.")
    elif c:
        L.append(f"1. **solver='chen' plans segments that remat.apply rejects** — {c.get('status')}. On {c.get('model')} "
                 f"(layers in an `{c.get('container')}`), `remat.plan(prof, 0.8, solver='chen')` returns segments "
                 f"{c.get('segments')}; `remat.apply` raises `{c.get('error', '')}`. Cause: "
                 "`src/remat/planner/chen.py` `units_for` takes every unit of the span, also those with "
                 "`Unit.appliable == False` (a run of several children of anything but an nn.Sequential). Every "
                 "`remat chen` row below that says \"apply fails\" is this bug.")
    i = b.get("ilp_solve", {})
    if i and "budgets_tried" in i:
        L.append(f"2. **The ILP reports feasible budgets as infeasible** — {i.get('status')}. On {i.get('model')}, over "
                 f"{i['budgets_tried']} budgets evenly spread from remat's least peak ({i['least']:,} B) to the unplanned "
                 f"peak ({i['unplanned']:,} B), `ilp.solve` returned no plan at {i['ilp_none_where_dp_plans']} where "
                 f"`dp.solve` finds one" + (f" (first: {i['first_failing_budget']:,} B; there `remat.plan(..., solver='ilp')` "
                 f"raises InfeasibleBudget whose own least is {i.get('plan_error_min_bytes', 0):,} B)" if i.get("first_failing_budget") else "")
                 + f"; `remat.frontier(prof)` (auto → ilp) stops at {i['frontier_auto_last']:,} B where "
                 f"`frontier(prof, solver='dp')` reaches {i['frontier_dp_last']:,} B. "
                 + ("Cause: `src/remat/planner/ilp.py` `_solve` gives HiGHS byte-sized coefficients (seen: \"HiGHS "
                    "Status 4: Solve error\") and reads any result without a solution as infeasible. "
                    if i.get("status") == "present" else
                    "The cause was `src/remat/planner/ilp.py` `_solve` (seen at 1b9603e: HiGHS \"Status 4: Solve error\" "
                    "on byte-sized rows, read as infeasible); since 24a57a6 it tries the program's other forms (scaled "
                    "rows, byte rows, presolve off) and a stop without an answer is a `remat:` error, never "
                    "\"infeasible\" (`tests/test_plan.py::test_ilp_never_contradicts_itself_across_budgets`). ")
                 + "The harness still guards against it: its frontier is the Pareto union of frontier(auto) and "
                 "frontier(dp), and where plan(auto) contradicts itself it takes dp's plan and says so in the verdict.")
    rows = []
    for key in ("selective_last_gpt2", "selective_last_bert"):
        r = b.get(key, {})
        for x in r.get("rows", []):
            rows.append([r["model"], ", ".join(x["selective"]), x["predicted"], x["measured"], f"{x['measured'] - x['predicted']:+,}"])
    if rows:
        st = {b.get(k, {}).get("status") for k in ("selective_last_gpt2", "selective_last_bert")}
        L.append(f"3. **Selective on the last layer is predicted above what it measures** — {', '.join(sorted(s for s in st if s))}. "
                 "Hand-built plans (remat's own `make_plan`), predicted vs measured tracker peak in bytes:")
        L += ["", table(["model", "selective on", "predicted B", "measured B", "measured − predicted"], rows), ""]
        if "present" in st:
            L.append("   Every layer but the last is exact; with the last one the prediction is too high, so selective "
                     "on every layer is predicted worse than on all but the last and the planner never chooses it, "
                     "although it measures lower — what SAC on every layer measures. Cause: "
                     "`src/remat/planner/problem.py` `_make_selective_unit` (Rule 4).")
        else:
            L.append("   At 1b9603e the plans with the last layer selective were predicted 160 KiB too high at these "
                     "sizes (Rule 4 of the memory model, `_make_selective_unit` in `src/remat/planner/problem.py`, held "
                     "the cached matmul outputs until the end of the block's backward, across the peak at the start "
                     "of backward), so selective on every layer was predicted worse than on all but the last and never "
                     "planned. Since 8a19a06 the cache is released at the block's backward start: the rows above are "
                     "exact, or over-predicted by 128 B. The per-model tables keep the _diagnostic_ row (selective on "
                     "every layer, predicted vs measured at the benchmark's size).")
    L.append("")
    L.append("Fixed before this run (commit 1b9603e): remat planned no segments for an nn.Sequential *subclass*; the "
             "development run's report-001 chain was one, which made remat lose every checkpoint_sequential point there.")
    return L + [""]


def _oneflow(data: dict) -> list[str]:
    if "bert" not in data["models"] or data["models"]["bert"]["eager"].get("worker_error"):
        return []
    h = oneflow_headline(data["models"]["bert"]["eager"])
    L = []
    if "at_time" in h:
        a = h["at_time"]
        L.append(f"- **At OneFlow's extra time (≤ +33% step time)** remat's best measured plan ({a['label']}) cuts the "
                 f"peak by **{a['reduction']:.0%}** (tracker; process {a['reduction_rss']:.0%}) at {a['time']:.2f}× step "
                 f"time (+{a['flops_frac']:.0%} FLOPs).")
    if "at_mem" in h:
        a = h["at_mem"]
        L.append(f"- **For OneFlow's reduction (−35%)** remat needs **{a['time'] - 1:+.0%} step time** ({a['label']}: "
                 f"−{a['reduction']:.0%} tracker, −{a['reduction_rss']:.0%} process, +{a['flops_frac']:.0%} FLOPs).")
    else:
        L.append(f"- OneFlow's −35% is out of reach on this BERT: remat's least measured peak is −{h['least']['reduction']:.0%}.")
    if "at_flops" in h:
        a = h["at_flops"]
        L.append(f"- The same in FLOPs, exact on any machine (OneFlow's +33% time is about one extra forward, about "
                 f"+33% of a step's FLOPs): within +33% extra FLOPs remat reaches **−{a['reduction']:.0%}** "
                 f"({a['label']}: +{a['flops_frac']:.0%} FLOPs, −{a['reduction_rss']:.0%} process, {a['time']:.2f}×)")
    if "at_mem_flops" in h:
        a = h["at_mem_flops"]
        L[-1] += (f"; for −35% it needs **+{a['flops_frac']:.0%} FLOPs** ({a['label']}: −{a['reduction']:.0%} tracker, "
                  f"{a['time']:.2f}×).")
    elif "at_flops" in h:
        L[-1] += "."
    if "sac" in h:
        e = h["sac"]
        L.append(f"- Why time and FLOPs disagree here: on CPU eager, recomputing pointwise ops is not free in time "
                 f"though FlopCounterMode counts it 0 — selective op checkpointing (SAC) is +{e['flops_frac']:.0%} FLOPs "
                 f"but {e['time']:.2f}× step time for −{e['reduction']:.0%}; remat's selective plans pay the same. Step "
                 f"times are medians of interleaved rounds on a shared machine: the per-round ratios of one strategy "
                 f"on this model span up to {h.get('max_spread', 0):.2f} (`time_ratios` in benchmarks/results/peers.json), "
                 "so step-time differences of that order are noise; FLOPs are exact.")
    if "every_block" in h:
        e = h["every_block"]
        L.append(f"- OneFlow's recipe (every layer checkpointed) here: −{e['reduction']:.0%} at {e['time']:.2f}× "
                 f"(+{e['flops_frac']:.0%} FLOPs).")
    L += ["- Caveat: OneFlow's figures are a full-size BERT on an RTX 3090 (whole training run time); ours are a "
          "6-layer, 128-wide BERT on 2 shared CPU cores, where parameters and Adam state are a larger share of the "
          "peak, and step times are medians of interleaved steps. Only remat plans measured in this run are "
          "considered (no interpolation).", ""]
    return L


def _planning(data: dict, models: list[str]) -> list[str]:
    rows = []
    for m in models:
        E, C = data["models"][m]["eager"], data["models"][m].get("compile")
        if E.get("worker_error"):
            continue
        ok = [r["plan_s"] for r in E["plans"] if r["status"] == "ok"]
        by = {s: [r["plan_s"] for r in E["plans"] if r["solver"] == s] for s in ("dp", "ilp", "chen")}
        comp = [r for r in (C or {}).get("budgets", []) if "compile_s" in r]
        rows.append([
            m, secs(E["profile_s"]),
            *((secs(statistics.median(by[s])) + (f" (max {secs(max(by[s]))})" if s == "ilp" else "")) if by[s] else "—"
              for s in ("dp", "ilp", "chen")),
            secs(E["profile_s"] + (max(ok) if ok else 0)),
            (f"{secs(statistics.median(r['compile_s'] for r in comp))} ({secs(min(r['compile_s'] for r in comp))}–"
             f"{secs(max(r['compile_s'] for r in comp))})") if comp else "—",
            secs(statistics.median(r["partition_s"] for r in comp)) if comp else "—",
            "not runnable on CPU",
        ])
    L = [table(["model", "remat profile s (once)", "remat plan s: dp", "ilp (median, max)", "chen",
                "remat total (profile + slowest plan)", "torch.compile s per budget: median (min–max)",
                "of which partitioner s", "Rockmate"], rows), ""]
    rk = data.get("rockmate", {})
    probe = rk.get("probe") or {}
    L += [f"Rockmate: **not runnable on CPU: CUDA-only as shipped, rkgb 2.0.0 on PyPI incomplete** (recorded status: "
          f"{rk.get('status', 'not probed')}). "
          + (f"Probe of {probe.get('date')}: `pip download --no-deps rockmate rkgb` gave {', '.join(probe.get('downloaded', []))}; "
             f"the rkgb sdist holds only {', '.join(probe.get('rkgb_sdist_contents', []))} (missing "
             f"{', '.join(p + '/' for p in probe.get('rkgb_missing_packages', []))}); installed into a throwaway "
             f"directory, `import rockmate` fails: `{(probe.get('probe') or {}).get('error', '?')}`. " if probe else "")
          + "Not patched here. For scale only (PEERS.md, a hand-patched Rockmate, not measured in this run): rotor "
          "planned an 8-block MLP in 55–68 s, its ILP 1,282 s (it hit its 20-minute limit).", "",
          "Compile seconds are the first compiled call (forward + backward) minus a steady compiled step, with the "
          "FX-graph and AOTAutograd caches off (so each budget is really partitioned) and Inductor's on-disk kernel "
          "cache as found (warm for kernels an earlier budget or run already built"
          + (f"; {data['machine']['inductor_cache']['compiled_kernels_at_start']:,} compiled kernels in it at the start of this run"
             if data.get("machine", {}).get("inductor_cache") else "")
          + "); the partitioner column is the time inside `min_cut_rematerialization_partition`, torch.compile's own "
          "planning.", ""]
    return L


def _method() -> list[str]:
    return [
        "- **tracker peak**: `remat.profile(model, inputs, optimizer=Adam).peak_bytes` (real mode) on the model as the "
        "strategy modified it: live tensor storages over forward, loss, backward and the Adam step.",
        "- **process peak**: MEASURING.md's process method, in a fresh worker per model with "
        "MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1: for each strategy the kernel's peak-RSS mark is reset "
        "(`/proc/self/clear_refs` ← 5) and VmHWM after one step (fresh Adam, state made in the step) minus RSS just "
        "before it, plus the parameters, buffers and inputs that existed before. The fresh-process figure itself "
        "(RSS before the model is built, ru_maxrss after the first step) is given per model as a check. "
        "torch.compile peaks use only this method: Inductor's kernels run outside any dispatch mode, so the tracker "
        "cannot see them (n/a ²).",
        "- **extra GFLOP**: `FlopCounterMode` total (forward + backward, seed 0) minus the unplanned step's; for "
        "torch.compile the same formulas summed over the forward and backward graphs Inductor compiles. Only matmuls, "
        "convolutions and attention count: recomputed pointwise ops, norms and softmax count 0.",
        "- **step time**: forward + loss + backward + Adam step; all strategies of a model interleaved in one process "
        "(A B C … per round), the median over rounds of each round's ratio to no checkpointing. The machine is "
        "shared: ratios near 1 (±10%) are noise.",
        "- **planning**: remat = `remat.profile` + `remat.plan`; torch.compile = compile seconds and the time inside "
        "its partitioner.",
        "- **gradients**: after forward + backward from `torch.manual_seed(0)`, against the unplanned model's "
        "(`exact` = bit-identical).",
        "- **remat at a peer's point**: `remat.plan(profile, budget=peer's measured peak + tolerance, solver='auto')`, "
        "applied with `remat.apply` and measured like the peer. Tolerance: 64 KiB on tracker peaks (byte-exact; "
        "strategies differ by a few hundred bytes of bookkeeping), max(1 MiB, 1%) on process peaks (torch.compile; "
        "the budget is its process peak minus the unplanned process−tracker offset). wins = measured peak no higher "
        "than the peer's + tolerance and extra FLOPs no more (strictly better in one); ties = same; loses = "
        "otherwise, with the reason.",
        "",
    ]


def render(data: dict, img_prefix: str | None) -> tuple[str, dict]:
    models = [m for m in ORDER if m in data["models"]]
    all_v, per_model, sections = [], {}, []
    for m in models:
        R = data["models"][m]
        img = f"{img_prefix}peers_{m}.png" if img_prefix is not None else None
        sec, vs = model_section(m, R["eager"], R.get("compile"), img)
        sections += sec
        per_model[m] = vs
        all_v += [dict(v, model=m) for v in vs]
    L = [
        "# remat and its peers, side by side",
        "",
        "One run, one machine, the same models and inputs for every strategy: the measured peak (remat's tracker and "
        "the process itself), the extra FLOPs, the step time against no checkpointing, the planning or compile time, "
        "and whether the gradients are the unplanned model's. Reproduce with `python benchmarks/peers/run.py` "
        "(default zoo, < 30 min on 2 cores; `--quick` is the CI smoke test, `--models gpt2,bert` a subset, "
        "`--compile-budgets 1,0.9,0.7,0.5,0.3,0.1` a finer compile sweep); the code is in `benchmarks/peers/`, the raw "
        "figures in `benchmarks/results/peers.json`.",
        "",
        *_run_line(data),
        "Peers: no checkpointing; every block (Hugging Face's own `activation_checkpointing_enable` on HF models, "
        "`apply_activation_checkpointing` with `checkpoint_wrapper` elsewhere); `checkpoint_sequential(k)` for k = 2..N "
        "and Chen's sqrt(n) segments where the forward is a loop over one list; torchtitan-style selective op "
        "checkpointing (`create_selective_checkpoint_contexts`, matmul outputs saved) per block; torch.compile with "
        "`torch._functorch.config.activation_memory_budget`; Rockmate (not runnable here, see Planning time). remat: "
        "`remat.plan` at each budget with each solver (dp, ilp, chen), and at each peer point's measured peak.",
        "",
        "## Headline",
        "",
    ]
    L += _headline(all_v, per_model)
    if _oneflow(data):
        L += ["## User report 004 restated on our BERT", "",
              "OneFlow's documentation (user-reports/004) measured BERT with activation checkpointing at −35% memory "
              "(9141 → 5978 MB) for +33% time.", ""]
        L += _oneflow(data)
    L += ["## Planning time", ""]
    L += _planning(data, models)
    L += ["## Where remat loses, and why", ""]
    L += _losses(all_v)
    # prediction quality and correctness
    errs, bad = [], []
    for m in models:
        E, C = data["models"][m]["eager"], data["models"][m].get("compile")
        for c in E.get("configs", []):
            if c["family"] == "remat" and c.get("tracker_peak") and c.get("predicted_peak"):
                errs.append((m, c["label"], (c["tracker_peak"] - c["predicted_peak"]) / c["predicted_peak"],
                             c.get("extra_flops") == c.get("predicted_flops")))
            if c.get("error"):
                bad.append([m, c["label"], c["error"][:160] + (" (bug 1)" if "chen" in c["label"] else "")])
            elif c.get("grads") and not c["grads"].get("equal") and c["grads"].get("rel", 1) >= 1e-4:
                why = ("`preserve_rng_state=False` (torchtitan's setting) and dropout in the model"
                       if c["family"] == "sac" else "")
                bad.append([m, c["label"], f"gradients {grads_text(c['grads'])} vs none {why}"])
        for r in (C or {}).get("budgets", []):
            g = r.get("grads_vs_compiled_1")
            if g and not g.get("equal") and g.get("rel", 1) >= 1e-4:
                bad.append([m, f"torch.compile budget {r['budget']:g}",
                            f"gradients {grads_text(g)} vs the same model compiled at budget 1.0 (same seed): "
                            "the partitioner recomputes dropout in backward with fresh random numbers"])
    if errs:
        over = [e for e in errs if e[2] > 0.005]
        L += [f"remat's predictions: {len(errs)} distinct plans applied and measured; measured tracker peak − predicted "
              f"from {min(e[2] for e in errs):+.1%} to {max(e[2] for e in errs):+.1%} (above the prediction by more "
              f"than 0.5%: {len(over)} plans{': ' + ', '.join(f'{e[0]} {e[1]} {e[2]:+.1%}' for e in over[:6]) if over else ''}); "
              f"extra FLOPs exactly as predicted for {sum(e[3] for e in errs)} of {len(errs)}.", ""]
    if bad:
        L += ["Strategies that failed or changed the gradients:", "", table(["model", "strategy", "what"], bad), ""]
    L += _bugs(data)
    L += ["## How each figure is measured", ""] + _method()
    L += ["## Per model", "",
          "Each plot: left, measured process peak against extra FLOPs (remat's predicted frontier as a line, shifted "
          "by the unplanned process−tracker offset); right, the same peaks against step time. Tables: every strategy, "
          "remat at every budget and solver, and remat at every peer point.", ""]
    L += sections
    return "\n".join(L) + "\n", {"per_model": per_model, "all": all_v}


BENCH_BEGIN, BENCH_END = "<!-- peers:begin -->", "<!-- peers:end -->"


def benchmarks_span(data: dict, verdicts_all: list[dict], per_model: dict) -> str:
    models = [m for m in ORDER if m in data["models"]]
    info = data["machine"]
    L = [BENCH_BEGIN, "",
         f"## remat and its peers (generated by `python benchmarks/peers/run.py`, {info['date']})", "",
         f"{info['cpu']}, {info['cores']} cores (shared), torch {info['torch']}, {info['threads']} torch threads, load "
         f"average {' '.join(info.get('loadavg_at_start', []))} at start; whole run {info['elapsed_s'] / 60:.1f} min. "
         "Full write-up, per-model tables and frontier plots: [docs/peers.md](peers.md).", ""]
    L += _headline(verdicts_all, per_model)
    if _oneflow(data):
        L += ["Report 004 (OneFlow on BERT: −35% memory, +33% time) restated on our BERT:", ""]
        L += _oneflow(data)
    L += ["Planning time:", ""]
    L += _planning(data, models)[:2]
    L += ["Rockmate: not runnable on CPU (CUDA-only as shipped, rkgb 2.0.0 on PyPI incomplete). Where remat loses "
          "and why, and the remat bugs this benchmark found: [docs/peers.md](peers.md).", "", "---", "", BENCH_END]
    return "\n".join(L)


def write_benchmarks_span(span: str, path: Path | None = None) -> None:
    """Replace the span between the markers in docs/benchmarks.md (insert it after the title if missing)."""
    path = path or DOCS / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BENCH_BEGIN in text and BENCH_END in text:
        a, b = text.index(BENCH_BEGIN), text.index(BENCH_END) + len(BENCH_END)
        text = text[:a] + span + text[b:]
    else:
        lines = text.split("\n")
        i = next((k for k, ln in enumerate(lines) if ln.startswith("# ")), -1)
        lines[i + 1:i + 1] = ["", span, ""]
        text = "\n".join(lines)
    path.write_text(text)


def write_all(data: dict, name: str, docs: bool, quick: bool) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    models = [m for m in ORDER if m in data["models"]]
    plot_dir = DOCS if docs else Path(tempfile.mkdtemp(prefix="peers-plots-"))
    for m in models:
        R = data["models"][m]
        if not R["eager"].get("worker_error"):
            try:
                plot_model(m, R["eager"], R.get("compile"), plot_dir / f"peers_{m}.png")
            except Exception as e:  # a plot must not lose the tables
                print(f"plot {m} failed: {e}")
    md, v = render(data, "../../docs/" if docs else None)
    path = RESULTS / f"{name}.md"
    path.write_text(md)
    slim = json.loads(json.dumps(data))
    for R in slim["models"].values():
        for c in R["eager"].get("configs", []):
            c["spec"].pop("plan", None)
    (RESULTS / f"{name}.json").write_text(json.dumps(slim, indent=1))
    if docs:
        DOCS.mkdir(exist_ok=True)
        md_docs, _ = render(data, "")
        (DOCS / "peers.md").write_text(md_docs)
        write_benchmarks_span(benchmarks_span(data, v["all"], v["per_model"]))
    else:
        print(f"plots in {plot_dir}")
    return path
