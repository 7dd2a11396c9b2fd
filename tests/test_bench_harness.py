"""The benchmarks' harness: one model registry (`benchmarks/_catalog.py`, `_models.py`, built on remat.zoo) and one
fresh-process worker (`_common.run_fresh` running `benchmarks/_worker.py`)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def harness():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import _catalog
        import _common
        import _models

        yield _catalog, _models, _common
    finally:
        sys.path[:] = saved


def peers_module(name: str):
    """A module of benchmarks/peers, imported with the harness's path on sys.path for the import only."""
    saved = list(sys.path)
    sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def test_every_size_names_models_the_registry_builds(harness):
    catalog, models, _ = harness
    named = {m for size in catalog.SIZES.values() for m in size}
    assert named <= set(models.MODELS), named - set(models.MODELS)
    for lineup, size in [(catalog.ORDER, "quick"), (catalog.LARGE_ORDER, "large"), (catalog.GPU_CHECK, "smoke")]:
        assert set(lineup) <= set(catalog.SIZES[size]), (size, set(lineup) - set(catalog.SIZES[size]))
    assert set(catalog.ISSUE36) <= set(catalog.SIZES["issue"]) and set(catalog.TITLES) >= set(catalog.ORDER)


def test_each_peers_model_names_blocks_it_has(harness):
    """What "every block" and selective checkpointing wrap, and the list checkpoint_sequential runs, exist in the
    model the registry builds."""
    catalog, models, _ = harness
    for name in catalog.ORDER:
        bench = models.make_bench(name, "quick")
        assert bench.blocks, name
        for block in bench.blocks:
            bench.model.get_submodule(block)
        assert bench.sequence is not None or bench.no_sequence_why, name
        if bench.sequence is not None:
            assert all(isinstance(m, models.nn.Module) for m in bench.sequence(bench.model))
    with pytest.raises(ValueError, match="names no blocks"):  # a worker model, no Hugging Face layers either
        models.make_bench("chain", "worker")


def test_the_worker_returns_the_tasks_result_or_raises_with_its_output(harness):
    _, _, common = harness
    spec = {"model": "chain", "method": "fake", "kwargs": {"width": 64, "blocks": 4, "batch": 32}}
    res = common.run_fresh(common.STEP, spec, timeout=300)
    assert res["spec"] == spec and res["peak"] > 64 * 64 * 4 * 4  # the weights alone, in float32
    lines = []
    with pytest.raises(RuntimeError, match="exited 1") as failed:
        common.run_fresh(common.STEP, {"model": "no such model", "method": "fake"}, timeout=300, progress=lines.append)
    assert "KeyError: 'no such model'" in str(failed.value) and lines


MiB = 2**20


def _config(key: str, label: str, family: str, mib: float, ratio: float, rounds: list[float]) -> dict:
    return {
        "key": key,
        "label": label,
        "family": family,
        "spec": {"kind": family, "label": label},
        "rss_peak": int(mib * MiB),
        "time_ratio": ratio,
        "time_ratios": rounds,
    }


@pytest.fixture
def peers_passes():
    saved = list(sys.path)
    sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]
    try:
        import passes
        from report import time_verdicts

        yield passes, time_verdicts
    finally:
        sys.path[:] = saved


def _recheck_of(passes, model: str, R: dict, compiled: bool) -> tuple[list[dict], dict]:
    """`run.py --recheck`'s doubtful compiled points of `model`'s run `R`, and its worker's SPEC for the compiled
    (or the eager) ones, at the default rounds."""
    compiled_points, eager_points = passes._recheckable(model, R)
    args = passes.argparse.Namespace(threads=2, rounds=None)
    data = {"profile": {"size": "default"}, "models": {model: R}}
    points = compiled_points if compiled else eager_points
    return compiled_points, passes._recheck_spec(model, data, args, points, compiled)


def test_an_eager_loss_within_noise_is_measured_again_with_remats_plan_at_the_peers_own_peak(peers_passes):
    """mlp000 on 2026-11-29: remat's fastest point at checkpoint_sequential(6)'s peak was a 6-checkpoint plan
    (1.22x against 1.16x, within the rounds' noise); its plan at the peer's own peak, 5 checkpoints, had the peer's
    FLOPs.  `--recheck` measures the peer and both plans again, and the verdict takes the faster plan that reaches
    the peer's peak measured again."""
    passes, tv = peers_passes
    eager = {
        "configs": [
            _config("none", "no checkpointing", "none", 27.5, 1.0, [1.0] * 3),
            _config("p", "checkpoint_sequential(6)", "checkpoint_sequential", 17.5, 1.16, [0.94, 1.16, 1.52]),
            _config("r6", "remat ilp (6 ckpt)", "remat", 17.1, 1.22, [0.96, 1.22, 1.61]),
            _config("r5", "remat ilp (5 ckpt)", "remat", 17.5, 1.24, [1.0, 1.24, 1.5]),
        ],
        "matched": [{"peer": "checkpoint_sequential(6)", "key": "r5"}],
    }
    (v,) = tv.time_verdicts(eager, None)
    assert (v["verdict"], v["remat"], v["remat_ekeys"]) == ("loses", "remat ilp (6 ckpt)", ["r6", "r5"])
    assert v["noise"] and tv.doubtful(v)

    R = {"eager": eager, "compile": None}
    compiled, spec = _recheck_of(passes, "mlp000", R, compiled=False)
    assert compiled == [] and spec["rounds"] == passes.EAGER_RECHECK_ROUNDS
    assert sorted(c["key"] for c in spec["configs"]) == ["p", "r5", "r6"]

    again = [
        _config("p", "checkpoint_sequential(6)", "checkpoint_sequential", 17.3, 1.16, []),
        _config("r6", "remat ilp (6 ckpt)", "remat", 17.1, 1.27, []),
        _config("r5", "remat ilp (5 ckpt)", "remat", 17.3, 1.18, []),
    ]
    eager["recheck"] = {"configs": again, "rounds": 30, "date": "2026-11-29"}
    r = tv.rechecked(v, R)
    assert (r["verdict"], r["remat"], r["remat_time"], r["time"]) == ("ties", "remat ilp (5 ckpt)", 1.18, 1.16)

    again[2]["rss_peak"] = int(18.5 * MiB)  # above the peer's peak + max(1 MiB, 1%): not at the peer's point
    r = tv.rechecked(v, R)
    assert (r["verdict"], r["remat"]) == ("loses", "remat ilp (6 ckpt)")
    assert r["why"] == "slower: 1.27× against 1.16×"


def _compiled(key: str, plan: str, at: str, mib: float, ratio: float, rounds: list[float]) -> dict:
    return {"key": key, "plan": plan, "at": at, "rss_peak": int(mib * MiB), "time_ratio": ratio, "time_ratios": rounds}


def test_a_compiled_loss_within_noise_is_measured_again_with_the_plan_remats_search_aimed_at_the_peer(peers_passes):
    """BERT on 2026-12-07: at torch.compile's budget 0.5 (35.9 MiB, 0.74x) remat's fastest point in three rounds was
    the plan aimed at 65% of the eager peak (1 checkpoint + 1 selective, 0.78x), while its search aimed at that
    budget had chosen remat's own budget 0.5 (35.3 MiB, 0.80x).  `--recheck` measures the peer and both plans
    again, and the verdict takes the faster that reaches the peer's peak measured again."""
    passes, tv = peers_passes
    eager = {"configs": [_config("none", "no checkpointing", "none", 65.0, 1.0, [1.0] * 3)]}
    compiled = {
        "budgets": [{"budget": 0.5, "rss_peak": int(35.9 * MiB), "time_ratio": 0.74, "time_ratios": [0.7, 0.74, 0.8]}],
        "remat_compiled": [
            _compiled("b05", "compile budget 0.5", "torch.compile budget 0.5", 35.3, 0.80, [0.76, 0.8, 0.85]),
            _compiled("c1s1", "1 ckpt + 1 selective", "65% of the eager peak", 32.7, 0.78, [0.72, 0.78, 0.8]),
            _compiled("b09", "compile budget 0.9", "torch.compile budget 0.9", 37.6, 0.68, [0.6, 0.68, 0.7]),
        ],
    }
    (v,) = tv.time_verdicts(eager, compiled)
    assert (v["verdict"], v["remat_key"], v["remat_keys"]) == ("loses", "c1s1", ["c1s1", "b05"])
    assert v["noise"] and tv.doubtful(v)

    R = {"eager": eager, "compile": compiled}
    _, spec = _recheck_of(passes, "bert", R, compiled=True)
    assert (spec["budgets"], spec["plans"], spec["rounds"]) == ([0.5], ["b05", "c1s1"], passes.RECHECK_ROUNDS)

    peer = {"budget": 0.5, "rss_peak": int(36.0 * MiB), "time_ratio": 0.80, "time_ratios": []}
    again = [
        _compiled("b05", "compile budget 0.5", "", 35.5, 0.77, []),
        _compiled("c1s1", "1 ckpt + 1 selective", "", 32.6, 0.825, []),
    ]
    compiled["recheck"] = {"budgets": [peer], "remat_compiled": again, "rounds": 15, "date": "2026-12-07"}
    r = tv.rechecked(v, R)
    assert (r["verdict"], r["remat"], r["remat_time"]) == ("ties", "remat + compile (compile budget 0.5)", 0.77)

    again[0]["rss_peak"] = int(37.5 * MiB)  # above the peer's peak + max(1 MiB, 1%): not at the peer's point
    r = tv.rechecked(v, R)  # the other: within 5% of the peer's time at 3.4 MiB less
    assert (r["verdict"], r["remat"], r["remat_time"]) == ("wins", "remat + compile (1 ckpt + 1 selective)", 0.825)


def test_the_eager_recheck_worker_rebuilds_a_plan_from_the_modules_the_results_keep(harness):
    """The worker `--recheck` runs for eager points, on report 001's chain (8 blocks): the plan rebuilt from its
    segments alone (the results JSON keeps no plan) checkpoints the blocks `checkpoint_sequential(2)` does, so both
    recompute the same FLOPs, and both leave the gradients exact."""
    _, _, common = harness
    segment = {"kind": "remat", "label": "remat (1 ckpt)", "segments": [["0", "1", "2", "3"]], "selective": []}
    spec = {
        "model": "chain001",
        "size": "quick",
        "threads": 1,
        "rounds": 2,
        "configs": [{"key": "cs2", "spec": {"kind": "ckpt_seq", "k": 2}}, {"key": "r1", "spec": segment}],
    }
    res = common.run_fresh("peers/worker_recheck_eager.py:run", spec, timeout=600)
    got = {c["key"]: c for c in res["configs"]}
    assert list(got) == ["none", "cs2", "r1"] and res["rounds"] == 2
    assert got["none"]["extra_flops"] == 0 < got["cs2"]["extra_flops"] == got["r1"]["extra_flops"]
    assert all(c["grads"]["equal"] and len(c["time_ratios"]) == 2 and c["rss_peak"] > 0 for c in got.values())
    assert got["r1"]["tracker_peak"] < got["none"]["tracker_peak"]


def test_a_compiled_point_over_the_peers_peak_is_searched_again_under_the_plans_own_peak():
    """The Llama at torch.compile's budget 0.1 on 2026-12-05: remat.auto's search put `compile budget 0.5` at 46.0 MB
    on its counter, under the 48.8 MB it was given, and the harness measured it at 26.4 MB, over the peer's 24.6 MB +
    tolerance.  Searched again, the budget is the peer's peak by that plan's own offset, under the 46.0 MB the plan
    measured in the search, so the search cannot choose it again (lowering the budget by the overshoot alone gave
    48.1 MB, and the same plan)."""
    remat_compiled = peers_module("remat_compiled")
    row = {"rss_peak": 26_421_888, "search_measured_peak": 46_014_312, "key": "[[], [], {}, 0.5]"}
    allowed = int(24_636_032 + remat_compiled.tol_process(24_636_032))
    assert remat_compiled._reaim(row, allowed)
    again = remat_compiled.reaimed_budget(row, allowed, 48_828_264)
    assert again == allowed + 46_014_312 - 26_421_888 < row["search_measured_peak"]
    # a plan well under the peer's peak is searched again with the room it left, on the same conversion
    under = {"rss_peak": 20_000_000, "search_measured_peak": 40_000_000, "key": '[[["a"]], [], {}, 1.0]'}
    assert remat_compiled._reaim(under, allowed) and remat_compiled.reaimed_budget(under, allowed, 1) > 40_000_000


def test_runs_made_model_by_model_merge_into_one_with_the_bugs_one_of_them_checked(tmp_path):
    """`run.py --from-json a.json,b.json`: the models of every run (a later run's replace an earlier one's), the
    first run's machine, the minutes summed, and the bugs section from the run that checked it, not dropped because
    the first run was made with --no-bugs; runs of different profiles are refused."""
    run = peers_module("run")
    profile = {"size": "default", "rounds": 3, "remat_compiled_at_peers": True}

    def made(name, models, bugs, elapsed, **prof):
        machine = {"elapsed_s": elapsed, "loadavg_at_end": [elapsed], "git": {"commit": name}}
        doc = {"machine": machine, "command": name, "profile": {**profile, **prof}, "models": models, "bugs": bugs}
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
        return str(tmp_path / f"{name}.json")

    a = made("a", {"gpt2": "first", "bert": "first"}, None, 60.0)
    b = made("b", {"gpt2": "again"}, {"chen_apply": {"status": "fixed"}}, 30.0, remat_compiled_at_peers=False)
    data = run.merged([a, b])
    assert data["models"] == {"gpt2": "again", "bert": "first"} and data["bugs"] == {"chen_apply": {"status": "fixed"}}
    assert data["machine"]["elapsed_s"] == 90.0 and data["machine"]["git"] == {"commit": "a"}
    assert data["command"] == "a; b" and [g["commit"] for g in data["machine"]["git_per_run"]] == ["a", "b"]
    assert run.merged([a])["bugs"] is None
    with pytest.raises(SystemExit, match="different profiles"):
        run.merged([a, made("c", {}, None, 1.0, rounds=9)])


def test_a_compiled_point_is_searched_again_by_each_plans_own_offset_until_one_lands():
    """BERT at every block's peak on 2026-12-05: the first plan measured 28,590,592 B here (44,050,348 by remat's
    search), the one re-aimed by its offset 29,229,568 (42,215,340), both over the peer's 27,116,032 allowed; it was
    searched once only.  Now the third search is aimed by the second plan's own offset, and a plan that lands ends
    the searching; the same plan chosen again ends it too."""
    remat_compiled = peers_module("remat_compiled")
    allowed, asked = 27_116_032, []
    rows = [
        {"rss_peak": 28_590_592, "search_measured_peak": 44_050_348, "key": '[[["a"]], ["b"], {}, 1.0]'},
        {"rss_peak": 29_229_568, "search_measured_peak": 42_215_340, "key": '[[["a"], ["c"]], [], {}, 1.0]'},
        {"rss_peak": 26_800_000, "search_measured_peak": 39_800_000, "key": '[[["a"], ["c"], ["d"]], [], {}, 1.0]'},
        {"rss_peak": 1, "key": "never asked"},
    ]

    def point(where, budget):
        asked.append((where, budget))
        return dict(rows[len(asked) - 1], budget_bytes=budget, status="ok")

    remat_compiled.aimed(point, "every block", 45_135_788, allowed)
    assert asked == [
        ("every block", 45_135_788),
        ("every block (re-aimed)", allowed + 44_050_348 - 28_590_592),
        ("every block (re-aimed 2x)", allowed + 42_215_340 - 29_229_568),
    ]
    asked.clear()
    rows[1] = dict(rows[0])  # the search chose the same plan again: nothing more to learn
    remat_compiled.aimed(point, "every block", 45_135_788, allowed)
    assert [w for w, _ in asked] == ["every block", "every block (re-aimed)"]


def test_a_peers_peak_remats_counter_finds_infeasible_is_measured_at_the_least_the_search_reached():
    """GPT-2 at every block's peak on 2026-12-05: remat's search reached 40.8 MiB on its counter, not the 38.3 MiB aimed
    at, and nothing was measured.  The least reached (+ tolerance) is searched for and measured; over the peer's peak
    it is re-aimed by its own offset, and a search infeasible again ends it."""
    remat_compiled = peers_module("remat_compiled")
    allowed, least, asked = 26_800_000, 42_770_000, []
    rows = [
        {"status": "infeasible", "min_bytes": least},
        {"status": "ok", "rss_peak": 28_000_000, "search_measured_peak": 42_500_000, "key": '[[["a"]], [], {}, 1.0]'},
        {"status": "infeasible", "min_bytes": least},
        {"status": "ok", "rss_peak": 1, "key": "never asked"},
    ]

    def point(where, budget):
        asked.append((where, budget))
        return dict(rows[len(asked) - 1], budget_bytes=budget)

    remat_compiled.aimed(point, "every block", 40_165_000, allowed)
    assert asked == [
        ("every block", 40_165_000),
        ("every block (least reached)", int(least + remat_compiled.tol_process(least))),
        ("every block (re-aimed)", allowed + 42_500_000 - 28_000_000),
    ]
    asked.clear()
    remat_compiled.aimed(point, "65% of the eager peak", 40_165_000, 0)  # no peer's peak to land on: searched once
    assert asked == [("65% of the eager peak", 40_165_000)]


def test_a_remat_compile_point_is_held_to_the_gradients_of_the_step_compiled_at_budget_one(monkeypatch):
    """Each remat + compile point's gradients are compared with the step compiled at budget 1.0 from the same seed
    (`grads_vs_compiled_1`), as torch.compile's budgets are, and one that differs is listed with the strategies that
    changed the gradients; a loss in time to a budget whose gradients differ says so (pytorch/pytorch#190758).  On
    the GPT-2 run of 2026-12-06: torch.compile's budget 0.5 beat remat + compile within noise with such gradients."""
    worker_compile = peers_module("worker_compile")
    document, time_verdicts = peers_module("report.document"), peers_module("report.time_verdicts")
    ref = {"w": torch.ones(2)}
    monkeypatch.setattr(worker_compile, "grads_of", lambda model, call: {"w": call()})
    rows = [{"key": "a"}, {"key": "b"}, {"key": "a", "at": "again"}, {"key": "c", "error": "failed"}]
    calls = {"a": (None, lambda: torch.ones(2)), "b": (None, lambda: torch.tensor([1.0, 3.0]))}
    worker_compile.against_compiled_remat(rows, calls, ref)
    assert [r.get("grads_vs_compiled_1", {}).get("equal") for r in rows] == [True, False, True, None]
    data = json.loads((BENCH / "results" / "peers_gpt2_rng_2026-12-06.json").read_text())
    E, C = data["models"]["gpt2"]["eager"], data["models"]["gpt2"]["compile"]
    assert all(r["grads_vs_compiled_1"]["equal"] for r in C["remat_compiled"] if r["status"] == "ok")
    why = {v["peer"]: v.get("why", "") for v in time_verdicts.time_verdicts(E, C)}
    assert why["torch.compile budget 0.5"].endswith(time_verdicts.WRONG_GRADS)
    assert time_verdicts.WRONG_GRADS not in why["torch.compile budget 0.9"]
    C["remat_compiled"][0]["grads_vs_compiled_1"] = rows[1]["grads_vs_compiled_1"]
    listed = "\n".join(document._checks({"models": {"gpt2": {"eager": E, "compile": C}}}, ["gpt2"]))
    assert f"| gpt2 | remat + compile ({C['remat_compiled'][0]['plan']}) | gradients DIFFER" in listed, listed
