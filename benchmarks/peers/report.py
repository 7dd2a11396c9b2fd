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


def verdicts(E: dict, C: dict | None) -> list[dict]:
    """For each peer point: remat's plan at a budget equal to the peer's measured peak, and who wins."""
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
        saves_nothing = method == "tracker" and peer.get("tracker_peak", 0) >= none["tracker_peak"]
        pk = "tracker_peak" if method == "tracker" else "rss_peak"
        v = {"peer": m["peer"], "method": method, "peer_peak": peer.get(pk), "peer_flops": peer.get("extra_flops"),
             "peer_time": peer.get("time_ratio"), "peer_family": "compile" if method == "rss" else peer["family"],
             "budget": m["budget_bytes"]}
        if m["status"] == "infeasible":
            v.update(verdict="loses", remat=None,
                     why=f"below remat's least-memory plan ({mib(m['min_bytes'])} MiB tracker): the peer recomputes "
                         "inside modules (op level); remat's unit is a whole module")
            rows.append(v)
            continue
        if m["status"] != "ok":
            v.update(verdict="error", remat=None, why=m.get("error", ""))
            rows.append(v)
            continue
        r = cfg[m["key"]]
        v.update(remat=r["label"], remat_peak=r.get(pk), remat_flops=r.get("extra_flops"), remat_time=r.get("time_ratio"),
                 predicted=r.get("predicted_peak"))
        if r.get(pk) is None or v["peer_peak"] is None or v["peer_flops"] is None:
            v.update(verdict="error", why=r.get("error", "not measured"))
            rows.append(v)
            continue
        tol = 0 if method == "tracker" else max(2 * MiB, 0.02 * v["peer_peak"])  # process RSS: page/heap noise
        peak_ok = r[pk] <= v["peer_peak"] + tol
        flops_ok = r["extra_flops"] <= v["peer_flops"]
        if peak_ok and flops_ok:
            same = r["extra_flops"] == v["peer_flops"] and abs(r[pk] - v["peer_peak"]) <= max(tol, 0.005 * v["peer_peak"])
            v["verdict"] = "ties" if same else "wins"
            v["why"] = "the peer saves no memory here" if saves_nothing else ""
        else:
            v["verdict"] = "loses"
            whys = []
            if not peak_ok:
                if r.get("predicted_peak") is not None and method == "tracker" and r["predicted_peak"] <= m["budget_bytes"]:
                    whys.append(f"measured peak {mib(r[pk])} MiB above the prediction {mib(r['predicted_peak'])} MiB")
                else:
                    whys.append(f"peak {mib(r[pk])} MiB above the peer's {mib(v['peer_peak'])} MiB")
            if not flops_ok:
                if v["peer_family"] in ("sac", "compile") and v["peer_flops"] <= 0.02 * step_flops:
                    whys.append("the peer recomputes only ops FlopCounterMode counts as free (pointwise, norms, "
                                "softmax, dropout); remat recomputes whole modules, matmuls included")
                elif v["peer_family"] in ("sac", "compile"):
                    whys.append("the peer chooses single ops to recompute (finer than remat's module units)")
                else:
                    whys.append(f"remat needs {gflop(r['extra_flops'] - v['peer_flops'])} GFLOP more")
            v["why"] = "; ".join(whys)
        rows.append(v)
    return rows


def oneflow_headline(E: dict) -> dict:
    cfg = E.get("configs", [])
    none = next(c for c in cfg if c["key"] == "none")
    base, base_rss = none["tracker_peak"], none["rss_peak"]
    rem = [c for c in cfg if c["family"] in ("remat", "none") and c.get("time_ratio") and c.get("tracker_peak")]
    out: dict = {"base": base, "base_rss": base_rss}
    within = [c for c in rem if c["time_ratio"] <= ONEFLOW_TIME]
    if within:
        best = min(within, key=lambda c: (c["tracker_peak"], c["time_ratio"]))
        out["at_time"] = {"label": best["label"], "reduction": 1 - best["tracker_peak"] / base,
                          "reduction_rss": 1 - best["rss_peak"] / base_rss, "time": best["time_ratio"],
                          "flops_frac": best["extra_flops"] / none["flops"]}
    reach = [c for c in rem if c["tracker_peak"] <= ONEFLOW_MEM * base]
    if reach:
        best = min(reach, key=lambda c: (c["time_ratio"], c["tracker_peak"]))
        out["at_mem"] = {"label": best["label"], "reduction": 1 - best["tracker_peak"] / base,
                         "reduction_rss": 1 - best["rss_peak"] / base_rss, "time": best["time_ratio"],
                         "flops_frac": best["extra_flops"] / none["flops"]}
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
    axes[0].legend(fontsize=7, loc="upper right")
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
        if c["family"] == "remat":
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
        if c["family"] != "remat":
            continue
        rows.append([f"**{c['label']}** ← {', '.join(src.get(c['key'], [])[:4])}{' …' if len(src.get(c['key'], [])) > 4 else ''}",
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
        lines += ["remat at each peer's measured peak (budget = the peer's tracker peak; for torch.compile its process peak "
                  "minus the unplanned process−tracker offset "
                  f"{mib(E.get('rss_offset'))} MiB, compared on process peaks within max(2 MiB, 2%)):", ""]
        lines += [table(["peer point", "peer peak MiB", "peer extra GFLOP", "peer time", "remat plan", "remat peak MiB",
                         "remat extra GFLOP", "remat time", "verdict"], vrows), ""]
    if rng:
        lines += ["¹ torchtitan's wrapper uses `preserve_rng_state=False`; this model has dropout, so the recomputed "
                  "dropout masks differ from the forward's and the gradients change (remat preserves the RNG state).", ""]
    return lines, vs


def render(data: dict, img_prefix: str | None) -> tuple[str, dict]:
    info, prof = data["machine"], data["profile"]
    models = [m for m in ORDER if m in data["models"]]
    L = [
        "# remat and its peers, side by side",
        "",
        "One run, one machine, the same models and inputs for every strategy: the measured peak (remat's tracker and "
        "the process itself), the extra FLOPs, the step time against no checkpointing, the planning or compile time, "
        "and whether the gradients are the unplanned model's. Reproduce with `python benchmarks/peers/run.py` "
        "(default zoo; `--quick` is the CI smoke test, `--models gpt2,bert` a subset, `--compile-budgets 1,0.9,0.7,0.5,0.3,0.1` "
        "the full compile sweep); the code is in `benchmarks/peers/` and the raw figures in "
        "`benchmarks/results/peers.json`.",
        "",
        f"Run {info['date']} on {info['cpu']}, {info['cores']} cores, torch {info['torch']}, transformers "
        f"{info['transformers']}, python {info['python']}; torch threads {info['threads']} in every worker, "
        f"OMP_WAIT_POLICY={info.get('OMP_WAIT_POLICY')}; load average at start {' '.join(info.get('loadavg_at_start', []))}, "
        f"at end {' '.join(info.get('loadavg_at_end', []))}. Whole run {info['elapsed_s'] / 60:.1f} min.",
        "",
        f"Command: `{data['command']}`. Sizes `{prof['size']}`; {prof['rounds']} interleaved timing rounds after one warm-up "
        f"round; remat budgets {', '.join(f'{b:.0%}' for b in prof['budgets'])} × solvers {', '.join(prof['solvers'])}; "
        f"torch.compile budgets {', '.join(f'{b:g}' for b in prof['compile_budgets']) or 'none'}.",
        "",
    ]
    all_v, per_model = [], {}
    sections = []
    for m in models:
        R = data["models"][m]
        img = f"{img_prefix}peers_{m}.png" if img_prefix is not None else None
        sec, vs = model_section(m, R["eager"], R.get("compile"), img)
        sections += sec
        per_model[m] = vs
        all_v += [dict(v, model=m) for v in vs]
    # headline
    L += ["## Headline", ""]
    counts = {k: sum(1 for v in all_v if v["verdict"] == k) for k in ("wins", "ties", "loses", "error")}
    L += [f"Every peer point (a strategy at one setting on one model) was matched by `remat.plan(profile, budget=that "
          f"point's measured peak)` and the plan was applied and measured the same way: remat **wins {counts['wins']}**, "
          f"**ties {counts['ties']}**, **loses {counts['loses']}**" + (f", errors {counts['error']}" if counts["error"] else "")
          + " (wins: peak no higher and fewer extra FLOPs; ties: the same plan, e.g. both keep everything).", ""]
    fam_rows = []
    for fam in ("every_block", "checkpoint_sequential", "chen", "sac", "compile"):
        vs = [v for v in all_v if v["peer_family"] == fam]
        if vs:
            fam_rows.append([fam.replace("_", " "), len(vs), sum(v["verdict"] == "wins" for v in vs),
                             sum(v["verdict"] == "ties" for v in vs), sum(v["verdict"] == "loses" for v in vs)])
    L += [table(["peer", "points", "remat wins", "ties", "remat loses"], fam_rows), ""]
    losses = [v for v in all_v if v["verdict"] == "loses"]
    if losses:
        L += ["Where remat loses:", ""]
        L += [table(["model", "peer point", "peer peak MiB / extra GFLOP", "remat peak MiB / extra GFLOP", "why"],
                    [[v["model"], v["peer"], f"{mib(v['peer_peak'])} / {gflop(v['peer_flops'])}",
                      f"{mib(v.get('remat_peak'))} / {gflop(v.get('remat_flops'))}" if v.get("remat") else "no plan",
                      v["why"]] for v in losses]), ""]
    # prediction quality and correctness
    errs, bad = [], []
    for m in models:
        E, C = data["models"][m]["eager"], data["models"][m].get("compile")
        for c in E.get("configs", []):
            if c["family"] == "remat" and c.get("tracker_peak") and c.get("predicted_peak"):
                errs.append((m, c["label"], (c["tracker_peak"] - c["predicted_peak"]) / c["predicted_peak"],
                             c.get("extra_flops") == c.get("predicted_flops")))
            if c.get("error"):
                bad.append([m, c["label"], c["error"][:160]])
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
              f"from {min(e[2] for e in errs):+.1%} to {max(e[2] for e in errs):+.1%} (positive = above the prediction: "
              f"{len(over)} plans{': ' + ', '.join(f'{e[0]} {e[1]} {e[2]:+.1%}' for e in over[:6]) if over else ''}); "
              f"extra FLOPs exactly as predicted for {sum(e[3] for e in errs)} of {len(errs)}.", ""]
    if bad:
        L += ["Strategies that failed or changed the gradients:", "",
              table(["model", "strategy", "what"], bad), ""]
    # OneFlow on BERT
    if "bert" in data["models"] and not data["models"]["bert"]["eager"].get("worker_error"):
        h = oneflow_headline(data["models"]["bert"]["eager"])
        L += ["### User report 004 (OneFlow on BERT: −35% memory at +33% time) restated on our BERT", ""]
        if "at_time" in h:
            a = h["at_time"]
            L.append(f"- At OneFlow's extra time (≤ +33%): remat's best measured plan ({a['label']}) cuts the peak by "
                     f"**{a['reduction']:.0%}** (tracker; process {a['reduction_rss']:.0%}) at {a['time']:.2f}× step time "
                     f"(+{a['flops_frac']:.0%} FLOPs).")
        if "at_mem" in h:
            a = h["at_mem"]
            L.append(f"- For OneFlow's reduction (−35%): remat needs **{a['time'] - 1:+.0%} time** ({a['label']}: −{a['reduction']:.0%} "
                     f"tracker, −{a['reduction_rss']:.0%} process, +{a['flops_frac']:.0%} FLOPs).")
        else:
            L.append(f"- OneFlow's −35% is out of reach on this BERT: remat's least measured peak is −{h['least']['reduction']:.0%} "
                     "(parameters, gradients and Adam state are the rest of the peak).")
        if "every_block" in h:
            e = h["every_block"]
            L.append(f"- For scale: Hugging Face's every-layer checkpointing (OneFlow's recipe) gives −{e['reduction']:.0%} at "
                     f"{e['time']:.2f}× (+{e['flops_frac']:.0%} FLOPs).")
        L += ["- OneFlow's figures are a 3090's memory for a full-size BERT (activations dominate); ours are a 6-layer, "
              "256-wide BERT on a CPU, where parameters + Adam state are a larger share of the peak; time ratios are "
              "medians of interleaved CPU steps.", ""]
    # planning time
    L += ["### Planning time", ""]
    prow = []
    for m in models:
        E, C = data["models"][m]["eager"], data["models"][m].get("compile")
        if E.get("worker_error"):
            continue
        ok = [r["plan_s"] for r in E["plans"] if r["status"] == "ok"]
        by = {s: [r["plan_s"] for r in E["plans"] if r["solver"] == s] for s in ("dp", "ilp")}
        comp = [r for r in (C or {}).get("budgets", []) if "compile_s" in r]
        prow.append([
            m, secs(E["profile_s"]),
            secs(statistics.median(by["dp"])) if by["dp"] else "—",
            secs(statistics.median(by["ilp"])) + f" (max {secs(max(by['ilp']))})" if by["ilp"] else "—",
            secs(E["profile_s"] + (max(ok) if ok else 0)),
            secs(C.get("inductor_startup_s")) if C and "inductor_startup_s" in C else "—",
            (f"{secs(statistics.median(r['compile_s'] for r in comp))} ({secs(min(r['compile_s'] for r in comp))}–"
             f"{secs(max(r['compile_s'] for r in comp))})") if comp else "—",
            secs(statistics.median(r["partition_s"] for r in comp)) if comp else "—",
            "not runnable",
        ])
    L += [table(["model", "remat profile s", "plan s dp (median)", "plan s ilp (median)", "remat total (profile + slowest plan)",
                 "inductor start-up s (once)", "compile s per budget: median (min–max)", "of which partitioner s", "Rockmate"],
                prow), ""]
    rk = data.get("rockmate", {})
    probe = rk.get("probe") or {}
    L += [f"Rockmate: **{rk.get('status', 'not probed')}**. "
          + (f"Probe of {probe.get('date')}: `pip download --no-deps rockmate rkgb` gave {', '.join(probe.get('downloaded', []))}; "
             f"the rkgb sdist holds only {', '.join(probe.get('rkgb_sdist_contents', []))} (missing "
             f"{', '.join(p + '/' for p in probe.get('rkgb_missing_packages', []))}); installed with `pip install --target` "
             f"into a throwaway directory, `import rockmate` fails: `{(probe.get('probe') or {}).get('error', '?')}`. "
             if probe else "")
          + "Not patched here. For scale, PEERS.md's hand-patched run (not measured in this run): rotor planned an "
          "8-block MLP in 55–68 s, its ILP 1,282 s (hit its 20-minute limit). `python benchmarks/peers/rockmate_probe.py` "
          "re-tries it; with a GPU and a complete rkgb it would run there.", ""]
    L += ["Compile seconds are the first compiled call (forward + backward) minus a steady compiled step, with the "
          "FX-graph and AOTAutograd caches off (so each budget is really partitioned) and Inductor's on-disk kernel "
          "cache as found (warm after the first budget or an earlier run); Inductor's one-time start-up is measured "
          "once per model on a toy function.", ""]
    # method
    L += ["## How each figure is measured", "",
          "- **tracker peak**: `remat.profile(model, inputs, optimizer=Adam).peak_bytes` (real mode) on the model as the "
          "strategy modified it: live tensor storages over forward, loss, backward and the Adam step.",
          "- **process peak**: MEASURING.md's process method, in a fresh worker per model with "
          "MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1: for each strategy the kernel's peak-RSS mark is reset "
          "(`/proc/self/clear_refs` ← 5) and VmHWM after one step (fresh Adam, state made in the step) minus RSS just "
          "before it, plus the parameters, buffers and inputs that existed before (what the fresh-process figure "
          "counts). The fresh-process figure itself (RSS before the model is built, ru_maxrss after the first step) is "
          "given for the unplanned step of each model as a check. torch.compile peaks use only this method: Inductor's "
          "kernels run outside any dispatch mode, so the tracker cannot see them (marked n/a ²).",
          "- **extra GFLOP**: `FlopCounterMode` total (forward + backward, seed 0) minus the unplanned step's; for "
          "torch.compile the same formulas summed over the forward and backward graphs Inductor compiles. FLOPs are "
          "counted for matmuls, convolutions and attention only: recomputed pointwise ops, norms and softmax count 0.",
          "- **step time**: forward + loss + backward + Adam step; all strategies of a model interleaved in one process "
          "(A B C … per round), the median over rounds of each round's ratio to no checkpointing.",
          "- **planning**: remat = `remat.profile` + `remat.plan`; torch.compile = compile seconds, and the time inside "
          "`min_cut_rematerialization_partition` (its knapsack over the joint graph).",
          "- **gradients**: after forward + backward from `torch.manual_seed(0)`, against the unplanned model's "
          "(`exact` = bit-identical).",
          "- **remat at a peer's point**: `remat.plan(profile, budget=peer's measured tracker peak, solver='auto')`, "
          "applied with `remat.apply` and measured like the peer. wins = measured peak no higher and extra FLOPs no "
          "more (strictly better in one); ties = same peak and FLOPs; loses = otherwise, with the reason.",
          "", "## Per model", ""]
    L += sections
    return "\n".join(L) + "\n", per_model


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
    md, _ = render(data, "../../docs/" if docs else None)
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
    else:
        print(f"plots in {plot_dir}")
    return path
