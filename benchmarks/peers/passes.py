"""The peers benchmark's workers started from the parent (`run_worker`), and the passes over an earlier run's
results: remat + torch.compile at the eager peers' peaks (`--at-peers-of`), and the doubtful time verdicts measured
again (`--recheck`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import report
from _common import git_state, run_fresh
from report.time_verdicts import doubtful, reaches, time_verdicts
from report.verdicts import PEERS_FAMILIES

# On top of `_common.fresh_env` (remat.verifier.process.PROCESS_ENV).  OMP_WAIT_POLICY=PASSIVE: on a
# shared 2-core machine, OpenMP threads that spin-wait for a descheduled sibling made 2-thread steps
# 5-50x slower (measured: 0.73 s vs 0.016 s for the quick chain under load 10); passive waiting
# removes that without changing idle-machine speed.
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def run_worker(worker: str, spec: dict, timeout: int, verbose: bool = True) -> dict:
    """`peers/WORKER.py:run` on SPEC in a fresh interpreter (`run_fresh`), its progress printed as it goes; a
    worker that fails is a result (`worker_error`, the end of its output)."""
    t0, lines = time.perf_counter(), []

    def progress(line: str) -> None:
        lines.append(line)
        if verbose:
            print(f"    [{spec['model']} {worker[7:]} {time.perf_counter() - t0:5.0f}s] {line}", flush=True)

    try:
        res = run_fresh(f"peers/{worker}.py:run", spec, env_extra=WORKER_ENV, timeout=timeout, progress=progress)
    except RuntimeError as e:
        log = "\n".join(lines)
        return {"worker_error": str(e).splitlines()[0], "log_tail": log[-3000:], "wall_s": time.perf_counter() - t0}
    res["wall_s"] = time.perf_counter() - t0
    res["log"] = "\n".join(lines)[-6000:]
    return res


def compile_spec(m: str, prof: dict, args: argparse.Namespace) -> dict:
    return {
        "model": m,
        "size": prof["size"],
        "threads": args.threads,
        "rounds": prof["rounds"],
        "budgets": prof["compile_budgets"],
        "remat_points": "remat_compiled" in prof,
        "remat_fractions": prof.get("remat_compiled", []),
    }


def unreached_peers(eager: dict, comp: dict) -> list[dict]:
    """The eager peer points (process peaks) that no remat + compile point of `comp` reached: at each, remat +
    compile has no measured point to be judged by (report.time_verdicts)."""
    reached = [r["rss_peak"] for r in comp.get("remat_compiled", []) if r.get("rss_peak")]
    return [
        {"label": c["label"], "rss_peak": c["rss_peak"]}
        for c in eager.get("configs", [])
        if c["family"] in PEERS_FAMILIES and c.get("rss_peak") and not any(reaches(r, c["rss_peak"]) for r in reached)
    ]


def compiled_at_peers(m: str, prof: dict, args: argparse.Namespace, eager: dict, comp: dict) -> None:
    """remat + torch.compile at the eager peers' process peaks that the compile worker's points did not reach, in
    a second compile worker (its own unplanned compiled step for the offset, its own interleaved rounds against
    eager); its points join `comp["remat_compiled"]`, marked `pass: "at eager peers"`."""
    peers = unreached_peers(eager, comp)
    if not peers:
        return
    more = run_worker(
        "worker_compile",
        {
            **compile_spec(m, prof, args),
            "budgets": [1.0],
            "remat_points": True,
            "remat_fractions": [],
            "remat_at_peers": peers,
        },
        args.timeout,
    )
    if "worker_error" in more:
        comp["at_peers_error"] = more["worker_error"]
        return
    comp["remat_compiled"] += [dict(r, **{"pass": "at eager peers"}) for r in more.get("remat_compiled", [])]
    comp["at_peers_pass"] = {k: more.get(k) for k in ("elapsed_s", "eager_step_s", "eager_rss_peak")}


def at_peers_of(args: argparse.Namespace, profiles: dict) -> int:
    """Only the second compile pass (`compiled_at_peers`) on an earlier run's results, spliced into them and
    written back (results/<name>.md and .json; docs only with --docs): for a run made before the pass existed.
    With --recompile, the compile worker is run again first, with remat + torch.compile where this version's
    profile of the run's size (`profiles`: run.py's) measures it, and its results replace the earlier run's (the
    eager worker's figures stay, and with them its remat plans matched to the earlier compile points' peaks)."""
    data = json.loads(Path(args.at_peers_of).read_text())
    models = args.models.split(",") if args.models else list(data["models"])
    if args.recompile:
        now = next((p for p in profiles.values() if p["size"] == data["profile"]["size"]), {})
        data["profile"].update({k: now[k] for k in ("remat_compiled", "remat_compiled_at_peers") if k in now})
    for m in models:
        R = data["models"][m]
        if args.recompile:
            R["compile"] = run_worker("worker_compile", compile_spec(m, data["profile"], args), args.timeout)
        if R.get("compile") and "remat_compiled" in R["compile"]:
            compiled_at_peers(m, data["profile"], args, R["eager"], R["compile"])
    again = " --recompile" if args.recompile else ""
    when = f"{time.strftime('%Y-%m-%d')}, commit {git_state().get('commit', '?')}"
    data["command"] += (
        f"; python benchmarks/peers/run.py --at-peers-of {args.at_peers_of} --models {','.join(models)}{again} ({when})"
    )
    name = args.out or Path(args.at_peers_of).stem
    print(f"spliced into {report.write_all(data, name=name, docs=bool(args.docs))} (docs: --from-json, merged)")
    return 0


RECHECK_ROUNDS = 9
"""Rounds of a recheck of compiled points: in a probe of 9 rounds (2026-11-26), U-Net's per-round ratios of one
compiled step spread over 0.54-0.77."""
EAGER_RECHECK_ROUNDS = 30
"""Rounds of a recheck of eager points: an eager step of the default sizes takes 0.03-0.5 s, and over 9 rounds
mlp000's per-round ratios of one plan spread over 0.96-1.61 (2026-11-29, benchmarks/results/peers_eager_recheck)."""


def _recheckable(m: str, R: dict) -> tuple[list[dict], list[dict]]:
    """Model `m`'s doubtful verdicts (compiled: a torch.compile budget against a remat + compile plan; eager: an
    eager peer against an eager remat plan); the others, one side eager and the other compiled, are listed as
    not rechecked."""
    lost = [v for v in time_verdicts(R["eager"], R.get("compile")) if doubtful(v)]
    compiled = [v for v in lost if v.get("peer_budget") is not None and v.get("remat_key")]
    eager = [v for v in lost if v.get("peer_ekey") and v.get("remat_ekeys")]
    for v in lost:
        if v not in compiled and v not in eager:
            print(
                f"{m}: {v['peer']} against {v.get('remat') or 'nothing'}: not rechecked (one point eager, the "
                "other compiled: run that model again)"
            )
    return compiled, eager


def _recheck_spec(m: str, data: dict, args: argparse.Namespace, points: list[dict], compiled: bool) -> dict:
    """The worker's SPEC for model `m`'s doubtful points: worker_recheck.py's for compiled points,
    worker_recheck_eager.py's (the strategies' specs, as the eager worker recorded them) for eager ones."""
    spec = {"model": m, "size": data["profile"]["size"], "threads": args.threads}
    if compiled:
        return dict(
            spec,
            rounds=args.rounds or RECHECK_ROUNDS,
            budgets=sorted({v["peer_budget"] for v in points}),
            plans=sorted({k for v in points for k in v["remat_keys"]}),
        )
    keys = {k for v in points for k in [v["peer_ekey"], *v["remat_ekeys"]]}
    configs = [{"key": c["key"], "spec": c["spec"]} for c in data["models"][m]["eager"]["configs"] if c["key"] in keys]
    return dict(spec, rounds=args.rounds or EAGER_RECHECK_ROUNDS, configs=configs)


def recheck(args: argparse.Namespace) -> int:
    """The doubtful verdicts of an earlier run (`report.time_verdicts.doubtful`: losses within noise and ties remat
    was slower in) measured again in one fresh process each, more rounds, judged by the same rule (docs:
    --from-json): a torch.compile budget against remat + compile by worker_recheck.py (the same budgets, the same
    plans rebuilt from their keys), added to the run as `compile.recheck`; an eager peer against an eager remat
    plan by worker_recheck_eager.py (the peer, the remat plan it was judged against and remat's plan at the peer's
    own peak, with the unplanned step, nothing else interleaved), added as `eager.recheck`."""
    data = json.loads(Path(args.recheck).read_text())
    models = args.models.split(",") if args.models else list(data["models"])
    done = []
    for m in models:
        R = data["models"][m]
        for part, points in zip(("compile", "eager"), _recheckable(m, R)):
            if not points:
                continue
            spec = _recheck_spec(m, data, args, points, compiled=part == "compile")
            res = run_worker("worker_recheck" if part == "compile" else "worker_recheck_eager", spec, args.timeout)
            if "worker_error" in res:
                print(f"{m}: {res['worker_error']}\n{res.get('log_tail', '')}")
                return 1
            when = {"date": time.strftime("%Y-%m-%d"), "commit": git_state().get("commit", "?")}
            R[part]["recheck"] = dict(res, **when, peers=[v["peer"] for v in points])
            done.append(m)
    if not done:
        print("nothing to recheck: no loss within noise nor tie remat was slower in")
        return 0
    data["command"] += (
        f"; python benchmarks/peers/run.py --recheck {args.recheck} --models {','.join(dict.fromkeys(done))}"
        + (f" --rounds {args.rounds}" if args.rounds else "")
        + f" ({time.strftime('%Y-%m-%d')}, commit {git_state().get('commit', '?')})"
    )
    name = args.out or Path(args.recheck).stem
    print(f"added to {report.write_all(data, name=name, docs=bool(args.docs))} (docs: --from-json, merged)")
    return 0
