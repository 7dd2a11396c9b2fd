"""Issue 15's criterion, a pure function of the workers' data: at each peer point, does remat (eager,
or remat + torch.compile) reach the same or a lower measured peak with no more measured time?

Measured peak = the process counter (`rss_peak`) for every strategy, eager or compiled, so remat +
compile and torch.compile's budgets are judged like the eager peers.  Time = the median per-round
ratio to the eager step without checkpointing, interleaved within one worker (eager strategies in
worker_eager.py, compiled ones in worker_compile.py).  A time within TIME_TOL of the peer's is a tie
on time; a peak within tol_process of the peer's is a tie on memory.  A loss on time whose per-round
ratios overlap the peer's (`noise`) is marked so: on a shared 2-core machine, three rounds cannot
tell such times apart."""

from __future__ import annotations

from .fmt import grads_differ, mib
from .verdicts import PEERS_FAMILIES, tol_process

TIME_TOL = 0.05
ONEFLOW_MEM = 0.65  # user report 004: -35% memory
SAME_STEP_AS_KEEP_ALL = "torch.compile budget 1"
"""The peer whose step is remat + compile's when remat's plan checkpoints nothing: a tie, whatever the rounds say."""
WRONG_GRADS = (
    "; the peer's gradients are not its own loss's (they differ from the step compiled at budget 1.0 from the same "
    "seed: dropout re-drawn in backward, pytorch/pytorch#190758)"
)
"""Said of a loss to a torch.compile budget whose gradients differ from its budget 1.0's (remat's are checked so)."""


def reaches(rss: float, peer_rss: float) -> bool:
    """A point measured at `rss` is at the peer's peak: no higher than it, within the process tolerance."""
    return rss <= peer_rss + tol_process(peer_rss)


def remat_candidates(E: dict, C: dict | None) -> list[dict]:
    """Every measured remat point: eager plans, and remat + torch.compile."""
    out = [
        {
            "label": c["label"],
            "rss": c["rss_peak"],
            "time": c["time_ratio"],
            "compiled": False,
            "rounds": c.get("time_ratios") or [c["time_ratio"]],
            "ekey": c["key"],
        }
        for c in E.get("configs", [])
        if c["family"] == "remat" and c.get("rss_peak") and c.get("time_ratio")
    ]
    seen = set()
    for r in (C or {}).get("remat_compiled", []):
        if r.get("rss_peak") and r.get("time_ratio") and r["key"] not in seen:
            seen.add(r["key"])
            out.append(
                {
                    "label": f"remat + compile ({r['plan']})",
                    "rss": r["rss_peak"],
                    "time": r["time_ratio"],
                    "compiled": True,
                    "rounds": r.get("time_ratios") or [r["time_ratio"]],
                    "keeps_all": r["plan"] == "0 ckpt",
                    "key": r["key"],
                    "at": r.get("at") or "",
                }
            )
    return out


def peer_points(E: dict, C: dict | None) -> list[dict]:
    matched = {r["peer"]: r["key"] for r in E.get("matched", []) if r.get("key")}
    pts = [
        {
            "peer": c["label"],
            "family": c["family"],
            "rss": c["rss_peak"],
            "time": c["time_ratio"],
            "rounds": c.get("time_ratios") or [c["time_ratio"]],
            "peer_ekey": c["key"],
            "matched_ekey": matched.get(c["label"]),
        }
        for c in E.get("configs", [])
        if c["family"] in PEERS_FAMILIES and c.get("rss_peak") and c.get("time_ratio")
    ]
    return pts + [
        {
            "peer": f"torch.compile budget {r['budget']:g}",
            "family": "compile",
            "rss": r["rss_peak"],
            "time": r["time_ratio"],
            "rounds": r.get("time_ratios") or [r["time_ratio"]],
            "budget": r["budget"],
            "wrong_grads": grads_differ(r.get("grads_vs_compiled_1")),
        }
        for r in (C or {}).get("budgets", [])
        if r.get("rss_peak") and r.get("time_ratio")
    ]


def time_verdicts(E: dict, C: dict | None) -> list[dict]:
    """Per peer point: remat's fastest measured point at no more than the peer's process peak (+ tolerance)."""
    cands = remat_candidates(E, C)
    rows = []
    for p in peer_points(E, C):
        tol = tol_process(p["rss"])
        v = dict(p, tol=tol)
        fits = [c for c in cands if reaches(c["rss"], p["rss"])]
        if not fits:
            least = min(cands, key=lambda c: c["rss"], default=None)
            v.update(
                verdict="loses",
                remat=None,
                why=f"no remat point measured at this peak (least {mib(least['rss']) if least else '—'} MiB)",
            )
            rows.append(v)
            continue
        best = min(fits, key=lambda c: (c["time"], c["rss"]))
        v.update(
            remat=best["label"],
            remat_rss=best["rss"],
            remat_time=best["time"],
            remat_compiled=best["compiled"],
            peer_budget=p.get("budget"),
            **_recheck_keys(p, best, fits),
        )
        v["noise"] = min(best["rounds"]) <= max(p["rounds"]) and min(p["rounds"]) <= max(best["rounds"])
        if best.get("keeps_all") and p["peer"] == SAME_STEP_AS_KEEP_ALL:
            v.update(
                verdict="ties",
                why="the same step: remat's plan for the compiled step checkpoints nothing",
                same_step=True,
            )
        else:
            verdict, why = judge(best["rss"], best["time"], p["rss"], p["time"])
            v.update(
                verdict=verdict,
                why=why
                + (
                    " (the per-round ratios overlap: within the rounds' noise)"
                    if verdict == "loses" and v["noise"]
                    else ""
                )
                + (WRONG_GRADS if verdict == "loses" and p.get("wrong_grads") else ""),
            )
        rows.append(v)
    return rows


def judge(rss: float, ratio: float, peer_rss: float, peer_ratio: float) -> tuple[str, str]:
    """(verdict, why) of a remat point measured at process peak `rss` and step-time `ratio` against a peer's."""
    if not reaches(rss, peer_rss):
        return "loses", f"measured peak {mib(rss)} MiB above the peer's {mib(peer_rss)} MiB + tolerance"
    if ratio > peer_ratio * (1 + TIME_TOL):
        return "loses", f"slower: {ratio:.2f}× against {peer_ratio:.2f}×"
    if ratio >= peer_ratio * (1 - TIME_TOL) and abs(rss - peer_rss) <= tol_process(peer_rss):
        return "ties", ""
    return "wins", ""


def doubtful(v: dict) -> bool:
    """A verdict worth measuring again (`run.py --recheck`): a loss within the rounds' noise, or a tie in which
    remat's median was the slower (three rounds cannot tell whether it is within TIME_TOL), unless both points
    are the same step."""
    return (
        v["verdict"] == "loses"
        and bool(v.get("noise"))
        or v["verdict"] == "ties"
        and not v.get("same_step")
        and v.get("remat_time", 0.0) > v["time"]
    )


def rechecked(v: dict, R: dict) -> dict | None:
    """Verdict `v` of model run `R` judged again on `run.py --recheck`'s figures of the same points (one fresh
    process, more rounds), by the same rule: a torch.compile budget against remat + compile from
    `R["compile"]["recheck"]`, the fastest at the peer's peak of the point `v` chose and the points remat's search
    chose aimed at that peer (`remat_keys`; runs rechecked before 2026-12-07 measured the first only); an eager
    peer against remat's fastest eager plan from `R["eager"]["recheck"]`, of the one `v` chose and the one remat
    planned at the peer's own peak (`R["eager"]["matched"]`).  None where the recheck did not measure both sides.
    {verdict, why, rss, time, remat, remat_rss, remat_time, rounds, date}."""
    if v.get("peer_budget") is not None and v.get("remat_key"):
        recheck = (R.get("compile") or {}).get("recheck") or {}
        peer = _measured(recheck.get("budgets"), "budget", v["peer_budget"])
        mine = _fastest_at(peer, [_measured(recheck.get("remat_compiled"), "key", k) for k in v["remat_keys"]])
    elif v.get("peer_ekey") and v.get("remat_ekeys"):
        recheck = (R.get("eager") or {}).get("recheck") or {}
        peer = _measured(recheck.get("configs"), "key", v["peer_ekey"])
        mine = _fastest_at(peer, [_measured(recheck.get("configs"), "key", k) for k in v["remat_ekeys"]])
    else:
        return None
    if peer is None or mine is None:
        return None
    verdict, why = judge(mine["rss_peak"], mine["time_ratio"], peer["rss_peak"], peer["time_ratio"])
    return {
        "verdict": verdict,
        "why": why,
        "rss": peer["rss_peak"],
        "time": peer["time_ratio"],
        "remat": mine.get("label") or f"remat + compile ({mine.get('plan', '?')})",
        "remat_rss": mine["rss_peak"],
        "remat_time": mine["time_ratio"],
        "rounds": recheck.get("rounds"),
        "date": recheck.get("date", ""),
    }


def _recheck_keys(p: dict, best: dict, fits: list[dict]) -> dict:
    """What `run.py --recheck` measures again at peer point `p` besides the peer: remat + compile's `best` and the
    points aimed at `p` (`remat_keys`), or eager remat's `best` and its plan at the peer's own peak (`remat_ekeys`)."""
    return {
        "remat_key": best.get("key"),
        "remat_keys": _led_by(best.get("key"), _aimed_at(p, fits)),
        "remat_ekeys": _led_by(best.get("ekey"), [p.get("matched_ekey")]),
    }


def _led_by(first: str | None, others: list) -> list[str]:
    """`first`, then those of `others` set and not already listed; none without `first`."""
    return [k for k in dict.fromkeys([first, *others]) if k] if first else []


def _aimed_at(p: dict, fits: list[dict]) -> list[str]:
    """The keys of the remat + compile points aimed at peer point `p` (its search's own choice, re-aimed or not)
    that reach its peak: measured again beside the fastest, since three rounds may have ranked them wrongly."""
    return [c["key"] for c in fits if c.get("compiled") and c.get("at", "").split(" (")[0] == p["peer"]]


def _fastest_at(peer: dict | None, mine: list[dict | None]) -> dict | None:
    """Of remat's points measured again, the fastest at the peer's peak measured again (the first if none is)."""
    got = [r for r in mine if r]
    fits = [r for r in got if peer and reaches(r["rss_peak"], peer["rss_peak"])]
    return min(fits, key=lambda r: r["time_ratio"]) if fits else (got[0] if got else None)


def _measured(records: list[dict] | None, field: str, value) -> dict | None:
    """The record of `records` whose `field` is `value`, if it was measured (a process peak and a time)."""
    return next((r for r in records or [] if r.get(field) == value and r.get("time_ratio") and r.get("rss_peak")), None)


def at_oneflow_memory(E: dict, C: dict | None) -> dict | None:
    """remat's fastest measured point at <= 65% of the unplanned process peak (report 004's -35%)."""
    none = next((c for c in E.get("configs", []) if c["key"] == "none"), None)
    if none is None or not none.get("rss_peak"):
        return None
    fits = [c for c in remat_candidates(E, C) if c["rss"] <= ONEFLOW_MEM * none["rss_peak"]]
    if not fits:
        return None
    best = min(fits, key=lambda c: c["time"])
    return dict(best, reduction=1 - best["rss"] / none["rss_peak"])
