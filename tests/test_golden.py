"""What the command line prints and writes, pinned: text reports and JSON documents.

Each case runs `remat` in this process and compares stdout (and any JSON it writes)
with a file under tests/golden/cli/.  A change to any of them is a change to the
public output: review it, say so in docs/changelog.md, and regenerate with
REMAT_REGEN_GOLDEN=1.  Real-mode cases run under a fixed clock (each
`time.perf_counter()` call advances 1 ms) and fixed step times (every op of the timed steps
takes 1 ms, checkpointing costs nothing more, and verify measures the overhead the plan
predicts) so that seconds print the same on every machine; test_seconds.py checks timing.  `verify`'s independent counter (the process's high-water mark) reads a little
differently on each run; its figures are held against the truth in test_truth.py, and here it is
pinned to the tracker's figure of the same step so that the layout of the report can be compared.
"""

from __future__ import annotations

import importlib
import itertools
import os
import time
from pathlib import Path

import pytest

import remat
from remat.cli import main
from remat.measure import profiling, scratch, timing

GOLDEN = Path(__file__).parent / "golden" / "cli"
REGEN = os.environ.get("REMAT_REGEN_GOLDEN") == "1"
verify = importlib.import_module("remat.verifier.verify")  # the module (the package exports the function)

CASES = {
    "profile_mlp_fake": ["profile", "remat.zoo:mlp_report000", "--mode", "fake", "--json", "{json}"],
    "profile_cnn_fake_cuda": ["profile", "remat.zoo:cnn_bn", "--mode", "fake", "--device", "cuda", "--top", "4"],
    "plan_gpt2_fake_frontier": [
        "plan",
        "remat.zoo:gpt2",
        "--mode",
        "fake",
        "--budget",
        "0.6",
        "--frontier",
        "--out",
        "{json}",
    ],
    "plan_skipnet_ilp": [
        "plan",
        "remat.zoo:skipnet",
        "--mode",
        "fake",
        "--budget",
        "97%",
        "--solver",
        "ilp",
        "--optimizer",
        "sgd",
    ],
    "plan_skipnet_infeasible": ["plan", "remat.zoo:skipnet", "--mode", "fake", "--budget", "60%"],
    "plan_gpt2_offload": [
        "plan",
        "remat.zoo:gpt2",
        "--mode",
        "fake",
        "--device",
        "cuda",
        "--budget",
        "0.7",
        "--offload-bandwidth",
        "1TB/s",
        "--device-flops",
        "1TFLOPs/s",
    ],
    "plan_cnn_verify": ["plan", "remat.zoo:cnn_bn", "--budget", "0.7", "--verify"],
    "explain_report002": ["explain", "remat.explainer.examples:report002"],
    "explain_report001": ["explain", "remat.explainer.examples:report001"],
    "demo": ["demo", "--json", "{json}"],
}


@pytest.fixture
def fixed_clock(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-3)
    real_time_loop = timing.time_loop

    def one_ms_per_op(*args, **kwargs) -> timing.StepTimes:
        timed = real_time_loop(*args, **{**kwargs, "repeats": 1})  # for the names of the ops
        n, b = len(timed.op_names), timed.bounds
        phases = [(b[i + 1] - b[i]) * 1e-3 for i in range(3)]
        return timing.StepTimes(n * 1e-3, timed.op_names, [1e-3] * n, phases, b)

    def as_predicted(model, step_args, plan, loop, rounds):
        return (1.0, 1.0 + plan.extra_fraction, plan.extra_fraction) if rounds else (0.0, 0.0, 0.0)

    monkeypatch.setattr(profiling, "time_loop", one_ms_per_op)
    # kernel scratch estimated, not measured: measured in a forked copy, one op of the demo read 1 MiB more or less
    # from one process to the next (the text rounds it away, the JSON's timeline did not)
    monkeypatch.setattr(profiling._Run, "_measures_scratch", lambda self, prof: False)
    monkeypatch.setattr(scratch, "MEASURED", {})  # nor taken from an earlier test's measurement (Rule 5)
    monkeypatch.setattr(verify, "interleaved_times", as_predicted)


def _compare(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path.name}; generate it with REMAT_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} changed; review the difference, note it in docs/changelog.md, and regenerate with "
        "REMAT_REGEN_GOLDEN=1"
    )


@pytest.fixture
def pinned_counter(monkeypatch):
    def tracked(model, inputs, loss_fn, optimizer, loop):
        prof = remat.profile(model, inputs, loss_fn, optimizer, step=loop.step, accumulate=loop.accumulate)
        return prof.peak_bytes, verify.PROCESS_COUNTER

    monkeypatch.setattr(verify, "independent_peak", tracked)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_output_is_unchanged(case, capsys, tmp_path, fixed_clock, pinned_counter):
    json_path = tmp_path / "out.json"
    argv = [a.replace("{json}", str(json_path)) for a in CASES[case]]
    code = main(argv)
    captured = capsys.readouterr()
    out, err = (text.replace(str(json_path), "OUT.json") for text in (captured.out, captured.err))
    _compare(GOLDEN / f"{case}.txt", f"exit {code}\n{out}--- stderr\n{err}")
    if json_path.exists():
        _compare(GOLDEN / f"{case}.json", json_path.read_text(encoding="utf-8"))
