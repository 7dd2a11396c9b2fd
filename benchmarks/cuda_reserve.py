"""The caching allocator replayed on the CPU, against what an H200 reserved (NOTE [The caching allocator's reserve]).

    python benchmarks/cuda_reserve.py [--models bert,llama_gqa,t5,unet_bn,resmlp]

For each model of benchmarks/gpu_check.py, unplanned and under the two plans the H200 ran (tests/gpu_facts/h200/plans): the step profiled here in
fake mode for an H100 (`remat.profile(..., mode="fake", device="cuda")`, the planned model with the plan applied),
its `gpu_reserve` (the third step replayed through the default allocator and with expandable segments), and the
H200's own `max_memory_allocated` / `max_memory_reserved` of the same step (tests/gpu_facts/h200/gpu_check_steps.json,
2026-11-26).  Prints a markdown table for docs/validation.md section 6.2.

    python benchmarks/cuda_reserve.py --fit [--models bert,llama_gqa]

For the budgets of the plans the H200 ran out of memory under (tests/gpu_facts/h200/plans), the plan `remat.gpu_fit.fit_gpu`
makes instead (NOTE [A plan fits the GPU's reserve]): its tensors, its replayed reserve and the allocator setting
it needs, or why none fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402  (its builders, the committed plans and the import paths)

import remat  # noqa: E402
import torch  # noqa: E402

TRUTH = HERE.parent / "tests" / "gpu_facts" / "h200" / "gpu_check_steps.json"
PLANS = TRUTH.parent / "plans"
"""The plans the H200 ran (made at 8c15f99, as committed then in benchmarks/results/gpu_check/), with made.json."""
MiB = 2**20


def predicted(name: str, kind: str) -> remat.StepProfile:
    """The fake-mode profile of `name`'s step, unplanned or under its committed plan `kind`."""
    model, inputs, loss_fn = gpu_check.build(name, "full", "cpu", autocast_device="cuda")
    if kind != "unplanned":
        made = json.loads((PLANS / "made.json").read_text())
        model = remat.apply(model, remat.load_plan(PLANS / made["models"][name]["plans"][kind]["file"]))
    return remat.profile(
        model, inputs, loss_fn, gpu_check.adam, mode="fake", device="cuda", hardware="H100", keep_output=True
    )


def _cell(pred: int, truth: int | None) -> str:
    if truth is None:
        return f"{pred / MiB:,.1f} / n/a"
    return f"{pred / MiB:,.1f} / {truth / MiB:,.1f} ({(pred - truth) / truth:+.1%})"


def row(name: str, kind: str, truth: dict) -> str:
    prof = predicted(name, kind)
    r = prof.gpu_reserve
    return (
        f"| {name} | {kind} | {prof.peak_bytes / MiB:,.1f} | {_cell(r.allocated_bytes, truth['allocated'])} | "
        f"{_cell(r.reserved_bytes, truth['reserved'])} | "
        f"{_cell(r.expandable_reserved_bytes, truth.get('expandable_reserved'))} |"
    )


def fit_row(name: str, kind: str) -> str:
    """The plan fitted to the GPU reserve for the budget of `name`'s committed plan `kind`."""
    from remat.gpu_fit import fit_gpu

    made = json.loads((PLANS / "made.json").read_text())["models"][name]["plans"][kind]
    budget = made["budget_bytes"] or made["peak_bytes"]
    model, inputs, loss_fn = gpu_check.build(name, "full", "cpu", autocast_device="cuda")
    options = {"hardware": "H100", "keep_output": True}
    prof = remat.profile(model, inputs, loss_fn, gpu_check.adam, mode="fake", device="cuda", **options)
    try:
        plan = fit_gpu(model, (inputs, loss_fn, gpu_check.adam), prof, remat.plan(prof, budget), None, options)
    except remat.InfeasibleBudget as e:
        return f"| {name} | {budget / MiB:,.1f} | {made['peak_bytes'] / MiB:,.1f} | none fits: least {e.min_bytes / MiB:,.1f} | | |"
    r = plan.gpu_reserve
    return (
        f"| {name} | {budget / MiB:,.1f} | {made['peak_bytes'] / MiB:,.1f} | {plan.peak_bytes / MiB:,.1f} | "
        f"{r.reserved_bytes / MiB:,.1f} / {r.expandable_reserved_bytes / MiB:,.1f} | {plan.allocator or 'default'} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert,llama_gqa,t5,unet_bn,resmlp")
    ap.add_argument("--fit", action="store_true", help="the plans fitted to the GPU reserve for the same budgets")
    args = ap.parse_args()
    if args.fit:
        print(
            "| model | budget MiB | committed plan's tensors MiB | fitted plan's tensors MiB | its reserve: default / "
            "expandable MiB | allocator it needs |"
        )
        print("|---|---|---|---|---|---|")
        for name in args.models.split(","):
            for kind in ("plan65", "least"):
                print(fit_row(name, kind), flush=True)
        return 0
    truth = json.loads(TRUTH.read_text())
    print(
        f"Measured: {truth['device']}, torch {truth['torch']}, {truth['date']}; predicted here, torch "
        f"{torch.__version__}.\n"
    )
    print(
        "| model | step | tensors MiB (fake) | allocated: replay / H200 MiB | reserved: replay / H200 MiB | "
        "reserved with expandable segments: replay / H200 MiB |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for kind, measured in truth["steps"].get(name, {}).items():
            print(row(name, kind, measured), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
