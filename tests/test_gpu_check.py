"""benchmarks/gpu_check.py, the prepared GPU check, tested on the CPU.

`--smoke` runs its whole pipeline at tiny sizes (plans made in fake mode, every measurement in its own process,
gradients compared, the docs section rendered into a copy of docs/validation.md); the committed plans of
`--make-plans` load and apply to the models the GPU run builds.  Nothing here asserts a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import remat

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    """The script as a module (its models, sizes, markers and pure report), sys.path as it was after the import."""
    saved = list(sys.path)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path[:] = saved
    return gpu_check


def test_smoke_runs_the_whole_pipeline_on_the_cpu(tmp_path, gpu_check):
    """One run of `--smoke` (one test, so that pytest-xdist's workers do not each run it), then its outputs."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu_*.json")
    res = json.loads(path.read_text())
    _every_model_and_plan_has_a_row(proc.stdout, res, gpu_check)
    _gradients_of_every_plan_are_compared(res, gpu_check)
    _the_docs_section_is_rendered_between_the_markers_of_a_copy(tmp_path / "validation.md", gpu_check)
    _the_plans_load_and_match_the_predictions(tmp_path, gpu_check)


def _every_model_and_plan_has_a_row(stdout: str, res: dict, gpu_check) -> None:
    for name in gpu_check.MODELS:
        assert f"| {name} | unplanned |" in stdout
        for kind in gpu_check.KINDS:
            assert f"| {name} | {kind}: " in stdout, (name, kind)
    assert "Every measurement ran to the end." in stdout
    runs = {(m, label): r for m, v in res["models"].items() for label, r in v["runs"].items()}
    assert len(runs) == len(gpu_check.MODELS) * (2 + len(gpu_check.KINDS))
    assert all(r["status"] == "ok" for r in runs.values()), runs


def _gradients_of_every_plan_are_compared(res: dict, gpu_check) -> None:
    for name, m in res["models"].items():
        assert m["grad_noise"] == 0.0  # two CPU runs from one seed: bit-equal, so a plan's must be too
        for kind in gpu_check.KINDS:
            assert m["runs"][kind]["grads"]["max_abs_diff"] == 0.0, (name, kind)
            assert m["runs"][kind]["grad_verdict"] == "pass"
        assert m["runs"]["unplanned"]["real_profile_peak_bytes"] > 0


def _the_docs_section_is_rendered_between_the_markers_of_a_copy(docs: Path, gpu_check) -> None:
    text = docs.read_text()
    assert text.count(gpu_check.START) == 1 and text.count(gpu_check.END) == 1
    section = text.split(gpu_check.START)[1].split(gpu_check.END)[0]
    assert "on **CPU**" in section and "| bert | plan65: " in section and "| resmlp | least: " in section
    assert "on **CPU**" not in (ROOT / "docs" / "validation.md").read_text()  # the smoke run left the docs alone


def _the_plans_load_and_match_the_predictions(plans_dir: Path, gpu_check) -> None:
    made = json.loads((plans_dir / "made.json").read_text())
    for name, row in made["models"].items():
        for kind in gpu_check.KINDS:
            plan = remat.load_plan(plans_dir / row["plans"][kind]["file"])
            assert plan.peak_bytes == row["plans"][kind]["peak_bytes"]
            assert plan.unplanned_peak_bytes == row["unplanned_peak_bytes"]


def test_the_committed_plans_apply_to_the_models_the_gpu_builds(gpu_check):
    """The GPU run loads benchmarks/results/gpu_check/ and never plans: each plan must name the modules of the
    model as built today (built on the meta device here: nothing allocated)."""
    made = json.loads((gpu_check.RESULTS / "made.json").read_text())
    assert made["size"] == "full" and made["profile"]["device"] == "cuda"
    assert set(made["models"]) == set(gpu_check.MODELS)
    for name, row in made["models"].items():
        assert row["size"] == gpu_check.SIZES["full"][name], f"{name}: sizes changed; run --make-plans"
        for kind in gpu_check.KINDS:
            plan = remat.load_plan(gpu_check.RESULTS / row["plans"][kind]["file"])
            assert plan.peak_bytes <= row["unplanned_peak_bytes"]
            model, _, _ = gpu_check.build(name, "full", "meta", autocast_device="cuda")
            remat.apply(model, plan)  # raises if the plan names modules this model does not have


def test_a_section_is_replaced_not_added_twice(tmp_path, gpu_check):
    docs = tmp_path / "validation.md"
    docs.write_text("# Validation\n\nbefore\n")
    gpu_check.write_section(docs, "first\n")
    gpu_check.write_section(docs, "second\n")
    text = docs.read_text()
    assert text.startswith("# Validation\n\nbefore\n") and text.count(gpu_check.SECTION_TITLE) == 1
    assert f"{gpu_check.START}\nsecond\n{gpu_check.END}" in text and "first" not in text


def test_the_report_states_errors_caps_and_failures(gpu_check):
    """The GPU's columns, from made-up figures: error against max_memory_allocated, the cap, an OOM, noise."""
    MiB = 2**20
    plan = {"peak_bytes": 90 * MiB, "budget_bytes": 100 * MiB, "segments": 2, "selective": 1}
    runs = {
        "unplanned": {
            "status": "ok",
            "peak_allocated_bytes": 200 * MiB,
            "peak_reserved_bytes": 210 * MiB,
            "step_s": 0.1,
            "real_profile_peak_bytes": 202 * MiB,
            "device_name": "GPU",
            "torch": "t",
        },
        "plan65": {
            "status": "ok",
            "budget_bytes": 100 * MiB,
            "cap_fraction": 0.1,
            "peak_allocated_bytes": 100 * MiB,
            "peak_reserved_bytes": 100 * MiB,
            "step_s": 0.1,
            "grads": {"max_abs_diff": 3e-7, "param": "w"},
            "grad_verdict": "fail",
        },
        "least": {
            "status": "OOM",
            "budget_bytes": 90 * MiB,
            "message": "CUDA out of memory.",
            "grads": None,
            "grad_verdict": "n/a",
        },
        "noise": {"status": "ok"},
    }
    made = {
        "date": "d",
        "command": "c",
        "machine": {"cpu": "x"},
        "torch": "t",
        "transformers": "v",
        "remat_commit": "abc",
        "profile": {"device": "cuda", "hardware": "H100"},
        "models": {"m": {"unplanned_peak_bytes": 190 * MiB, "plans": {"plan65": plan, "least": plan}}},
    }
    res = {
        "date": "d",
        "device": "GPU",
        "torch": "t",
        "transformers": "v",
        "command": "c",
        "elapsed_s": 1,
        "budget_s": 330,
        "results_file": "r.json",
        "made": made,
        "models": {"m": {"predicted": made["models"]["m"], "runs": runs, "grad_noise": 1e-8}},
    }
    text = gpu_check.render(res)
    assert "| m | unplanned | 190.0 | 200.0 | -5.0% | 210.0 | — | no cap | noise 1.0e-08 | 202.0 (+1.0%) |" in text
    assert (
        "| m | plan65: 2 ckpt + 1 selective | 90.0 | 100.0 | -10.0% | 100.0 | 100.0 | yes | 3.0e-07 vs 1.0e-07: **fail** |"
        in text
    )
    assert "| m | least: 2 ckpt + 1 selective | 90.0 | n/a | n/a | n/a | 90.0 | **OOM** |" in text
    assert "- m / least: OOM: CUDA out of memory." in text
