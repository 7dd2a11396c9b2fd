"""Who wins at each peer point, and report 004's two questions on BERT: pure functions of the
workers' data (worker_eager.py's and worker_compile.py's JSON)."""

from __future__ import annotations

from .fmt import MiB, gflop, grads_differ, mib

ONEFLOW_TIME, ONEFLOW_MEM = 1.33, 0.65  # user report 004: +33% time, -35% memory (9141 -> 5978 MB)
PEERS_FAMILIES = ("every_block", "checkpoint_sequential", "chen", "sac")
TOL_TRACKER = 64 * 1024  # as worker_eager.TOL_TRACKER

# why remat loses, by cause (docs/peers.md "Where remat loses in FLOPs, and why")
WHY = {
    "fusion": "op level: Inductor's fused kernels never store the pointwise intermediates that eager keeps, "
    "a saving at 0 counted FLOPs that no choice of eager modules reproduces",
    "free_ops": "op level: the peer recomputes only ops FlopCounterMode counts as free (pointwise, norms, softmax, "
    "dropout); remat's smallest unit that frees this much recomputes a matmul",
    "finer": "op level: the partitioner picks single ops anywhere in the graph; remat's units are whole modules",
    "below": "below remat's least-memory plan",
    "peak": "measured peak above the peer's",
}


def tol_process(peak: float) -> float:
    return max(MiB, 0.01 * peak)  # as worker_eager.tol_process


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


# -- remat at each peer point ------------------------------------------------------------------


def verdicts(E: dict, C: dict | None) -> list[dict]:
    """For each peer point: remat's plan at a budget equal to the peer's measured peak (plus the
    measurement tolerance), and who wins."""
    peers = {
        "tracker": {c["label"]: c for c in E.get("configs", []) if c["family"] in PEERS_FAMILIES},
        "rss": {f"torch.compile budget {r['budget']:g}": r for r in (C or {}).get("budgets", []) if "rss_peak" in r},
    }
    rows = []
    for m in E.get("matched", []):
        peer = peers["tracker" if m["method"] == "tracker" else "rss"].get(m["peer"])
        if peer is not None:
            rows.append(_verdict(m, peer, E))
    return rows


def _verdict(m: dict, peer: dict, E: dict) -> dict:
    method = m["method"]
    pk = "tracker_peak" if method == "tracker" else "rss_peak"
    tol = m.get("tol_bytes", TOL_TRACKER if method == "tracker" else tol_process(peer.get(pk) or 0))
    g = peer.get("grads") if method == "tracker" else peer.get("grads_vs_eager")
    v = {
        "peer": m["peer"],
        "method": method,
        "peer_peak": peer.get(pk),
        "peer_flops": peer.get("extra_flops"),
        "peer_time": peer.get("time_ratio"),
        "peer_family": "compile" if method == "rss" else peer["family"],
        "budget": m["budget_bytes"],
        "tol": tol,
        "solver_note": m.get("solver_note"),
        "peer_grads_differ": grads_differ(g),
    }
    if m["status"] == "infeasible":
        return _infeasible(v, m)
    if m["status"] != "ok":
        v.update(verdict="error", remat=None, cause="error", why=m.get("error", ""))
        return v
    cfg = configs_by_key(E)
    r = cfg[m["key"]]
    v.update(
        remat=r["label"],
        remat_peak=r.get(pk),
        remat_flops=r.get("extra_flops"),
        remat_time=r.get("time_ratio"),
        predicted=r.get("predicted_peak"),
    )
    if r.get(pk) is None or v["peer_peak"] is None or v["peer_flops"] is None:
        v.update(verdict="error", cause="error", why=r.get("error", "not measured"))
        return v
    _judge(v, r, pk, E)
    if v["peer_grads_differ"]:
        v["why"] = (v["why"] + "; " if v["why"] else "") + "the peer's gradients differ from the unplanned model's"
    if v.get("solver_note"):
        v["why"] = (v["why"] + "; " if v["why"] else "") + "remat's ILP failed here, dp's plan shown (bug 2)"
    return v


def _infeasible(v: dict, m: dict) -> dict:
    """remat has no plan at the peer's peak."""
    cause = "fusion" if v["peer_family"] == "compile" and not v["peer_flops"] else "below"
    why = (
        f"{WHY['below']} ({mib(m['min_bytes'])} MiB tracker, the peer {mib(m.get('peer_budget_bytes', m['budget_bytes']))}"
        f"{' process − offset' if m['method'] == 'rss' else ''})"
    )
    if cause == "fusion":
        why += "; " + WHY["fusion"]
    elif v["peer_family"] in ("sac", "compile"):
        why += "; " + WHY["finer"]
    else:
        why += ": the peer's checkpoints cut where remat has no unit"
    v.update(verdict="loses", remat=None, cause=cause, why=why)
    return v


def _judge(v: dict, r: dict, pk: str, E: dict) -> None:
    """wins / ties / loses of remat's measured plan `r` against the peer point `v`, and why."""
    tol, none = v["tol"], configs_by_key(E)["none"]
    peak_ok = r[pk] <= v["peer_peak"] + tol
    flops_ok = r["extra_flops"] <= v["peer_flops"]
    if peak_ok and flops_ok:
        same = r["extra_flops"] == v["peer_flops"] and abs(r[pk] - v["peer_peak"]) <= tol
        v.update(verdict="ties" if same else "wins", cause="")
        v["why"] = "the peer saves no memory here" if v["peer_peak"] >= none[pk] - tol else ""
        return
    whys, cause = [], "peak"
    if not peak_ok:
        whys.append(
            f"measured peak {mib(r[pk])} MiB above the peer's {mib(v['peer_peak'])} MiB + tolerance "
            f"(predicted {mib(r.get('predicted_peak'))} MiB tracker)"
        )
    if not flops_ok:
        cause, why = _flops_cause(v, r, pk, E)
        whys.append(why)
    v.update(verdict="loses", cause=cause, why="; ".join(whys))


def _flops_cause(v: dict, r: dict, pk: str, E: dict) -> tuple[str, str]:
    """Why remat's plan at the peer's peak recomputes more than the peer."""
    diag = next((c for c in E.get("configs", []) if c["family"] == "diagnostic" and c.get(pk) is not None), None)
    if (
        diag
        and diag[pk] <= v["peer_peak"] + v["tol"]
        and diag.get("extra_flops", 1) <= v["peer_flops"]
        and diag.get("tracker_peak", 0) < diag.get("predicted_peak", 0)
    ):
        return "bug3", (
            f"remat bug 3: selective on every layer measures {mib(diag[pk])} MiB at "
            f"{gflop(diag['extra_flops'])} GFLOP (diagnostic row) but is predicted at "
            f"{mib(diag['predicted_peak'])} MiB tracker, so the planner does not choose it"
        )
    step_flops = configs_by_key(E)["none"].get("flops") or 1
    op_level = v["peer_family"] in ("sac", "compile")
    if v["peer_family"] == "compile" and not v["peer_flops"]:
        cause = "fusion"
    elif op_level and v["peer_flops"] <= 0.02 * step_flops:
        cause = "free_ops"
    else:
        cause = "finer" if op_level else "flops"
    return cause, WHY.get(cause, f"remat needs {gflop(r['extra_flops'] - v['peer_flops'])} GFLOP more")


# -- report 004 on BERT ----------------------------------------------------------------------------


def oneflow_headline(E: dict) -> dict:
    """remat's best measured plans against OneFlow's figures (+33% time, −35% memory), in time and in FLOPs."""
    cfg = E.get("configs", [])
    none = next(c for c in cfg if c["key"] == "none")
    base, step_flops = none["tracker_peak"], none["flops"]
    rem = [c for c in cfg if c["family"] in ("remat", "none") and c.get("time_ratio") and c.get("tracker_peak")]
    fl = [c for c in rem if c.get("extra_flops") is not None]
    # the same two questions in FLOPs (exact on any machine): OneFlow's +33% time is about one extra forward,
    # which is about +33% of a step's FLOPs (forward ~ 1/3 of forward + backward)
    questions = {  # name: (the plans that qualify, the best first)
        "at_time": ([c for c in rem if c["time_ratio"] <= ONEFLOW_TIME], ("tracker_peak", "time_ratio")),
        "at_mem": ([c for c in rem if c["tracker_peak"] <= ONEFLOW_MEM * base], ("time_ratio", "tracker_peak")),
        "at_flops": ([c for c in fl if c["extra_flops"] <= 0.33 * step_flops], ("tracker_peak", "extra_flops")),
        "at_mem_flops": ([c for c in fl if c["tracker_peak"] <= ONEFLOW_MEM * base], ("extra_flops", "tracker_peak")),
    }
    out: dict = {"base": base, "base_rss": none["rss_peak"]}
    for name, (found, order) in questions.items():
        if found:
            best = min(found, key=lambda c: (c[order[0]], c[order[1]]))
            out[name] = {"label": best["label"], **_against_none(best, none)}
            out[name]["reduction_rss"] = 1 - best["rss_peak"] / none["rss_peak"]
    spreads = [max(c["time_ratios"]) - min(c["time_ratios"]) for c in cfg if len(c.get("time_ratios") or []) > 1]
    out["max_spread"] = max(spreads, default=0.0)
    for family in ("sac", "every_block"):
        first = next((c for c in cfg if c["family"] == family and c.get("time_ratio")), None)
        if first:
            out[family] = _against_none(first, none)
    least = min((c for c in rem), key=lambda c: c["tracker_peak"])
    out["least"] = {"label": least["label"], "reduction": 1 - least["tracker_peak"] / base, "time": least["time_ratio"]}
    return out


def _against_none(c: dict, none: dict) -> dict:
    """One strategy's figures against no checkpointing."""
    return {
        "reduction": 1 - c["tracker_peak"] / none["tracker_peak"],
        "time": c["time_ratio"],
        "flops_frac": c["extra_flops"] / none["flops"],
    }
