"""Issue 36: the seconds a fake step predicts for a GPU, against what a GPU measures.

usage:
  python benchmarks/gpu_seconds.py                  on the CPU: predictions against the H100's figures
  python benchmarks/gpu_seconds.py --make-plans     on the CPU: plans for the two models, fake mode for an H100
  python benchmarks/gpu_seconds.py --gpu [--compile] [--out-dir D] [--budget-s S] [--auto-trials N]
                                                    on a GPU: the plans run, timed; `--smoke`: tiny, on the CPU

The default run needs no GPU: fake-mode profiles for hardware="H100" against the repository's copy of the H100's
figures (tests/gpu_facts/h100/op_times.json, step_times.json, zoo_truth.json); tests/test_gpu_seconds.py holds the
same cases to 25% per op and 5 points per step.  Writes benchmarks/results/gpu_seconds.md/.json.

`--gpu` is issue 36's two tables measured again (gpu_seconds_run.py): for a bf16 Llama-style decoder and BERT-base
(random weights, nothing downloaded), the eager step, Hugging Face's every-layer checkpointing, remat's every-block,
its plans at 65% of the peak and at the least memory (made by `--make-plans`, committed in
results/gpu_seconds/plans/), `remat.auto` on the model for 35% under the eager step's measured peak (`auto -35%`),
and with `--compile` torch.compile alone, at its activation memory budgets 0.7, 0.5 and 0.3, remat's two plans
compiled, and `remat.auto` on the compiled model for the peak each of those budgets measured in the same run, and
for `auto -35%`'s (`auto 0.5+compile`: the search as a user runs it on a GPU, in this process, at most
`--auto-trials` compilations of each kind; the point it aims at, `compile 0.5` or `eager`, must run first, in the
same call).  Each variant in a model built afresh, AdamW, the output
held through backward, the third step's max_memory_allocated, the median of TIMED synchronised steps and of the
host's time to issue them (before the synchronisation: near the step's own when the host, not the GPU, sets the
pace), and what was allocated before the variant began (an earlier variant's leftovers count in its peak:
gpu_seconds_report.py checks it).  Variants run in TIERS, both models a tier, so that `--budget-s` skips the
least telling ones; `--models` and `--variants` run a part (a second call finishing a run).
Prints predicted against measured overhead and the issue's checks on the figures (gpu_seconds_report.py); writes
results/gpu_seconds/gpu_<device>_<date>.json (or into --out-dir).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
if (ROOT / "src").is_dir():
    sys.path.insert(0, str(ROOT / "src"))

import remat  # noqa: E402
from _catalog import ISSUE36, SIZES  # noqa: E402
from _models import build_sized  # noqa: E402
from gpu_seconds_report import render  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from h100_ops import CASES, FACTS, OFF, op_table, predicted  # noqa: E402  (the cases test_gpu_seconds.py holds)

PLANS = HERE / "results" / "gpu_seconds" / "plans"
WARM, TIMED = 2, 6


# -- issue 36's two models ----------------------------------------------------------------------------------


MODELS = ISSUE36
LAYERS = {name: SIZES["issue"][name]["n_layer"] for name in MODELS}


def build(name: str, size: str = "issue", device: str = "meta", autocast: str = "cuda") -> tuple:
    """`(model, batch)` built on `device` (its forward's autocast naming `autocast`); on "meta" (for a fake-mode
    profile) the batch is CPU tensors of the same shapes."""
    model, batch, _ = build_sized(name, size, device, autocast)
    if device == "meta":
        batch = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in batch.items()}
    return model, batch


def fake_profile(name: str, size: str = "issue", device: str | None = None, plan=None):
    """The model's step predicted for an H100 (for the CPU at the smoke size, where the smoke run runs it, or where
    `device` is "cpu"), with `plan` applied."""
    device = device or ("cpu" if size == "smoke" else "cuda")
    model, batch = build(name, size, autocast=device)
    if plan is not None:
        remat.apply(model, plan)
    hardware = "H100" if device == "cuda" else "cpu"
    return remat.profile(
        model, batch, mode="fake", device=device, hardware=hardware, optimizer=torch.optim.AdamW(model.parameters())
    )


# -- the default run: predictions against the H100's figures --------------------------------------------------


def op_rows() -> list[list]:
    big, floor = op_table()
    rows = []
    for case in CASES:
        for direction, key, harness, seconds in zip(
            ("forward", "backward"), ("forward_s", "backward_s"), floor, predicted(case)
        ):
            kernel = big[case[0]][key] - harness
            compared = big[case[0]][key] >= 3 * harness
            verdict = ("not modelled" if case[0] in OFF else "compared") if compared else "harness-bound"
            rows.append(
                [
                    case[0],
                    direction,
                    round(kernel * 1e6, 1),
                    round(seconds * 1e6, 1),
                    f"{seconds / kernel:.2f}" if kernel > 0 else "-",
                    verdict,
                ]
            )
    return rows


def step_rows() -> list[list]:
    from remat.planner.recipes import baseline_plans

    truth = json.loads((FACTS / "step_times.json").read_text())["models"]
    rows = []
    for name in MODELS:
        prof = fake_profile(name)
        every = baseline_plans(prof)["every-block"]
        m = truth[name]
        rows.append(
            [
                name,
                round(m["eager_step_s"] * 1e3, 1),
                round(prof.step_time_s * 1e3, 1),
                f"+{m['every_layer_checkpointing']['step_ratio'] - 1:.1%}",
                f"+{every.extra_fraction:.1%}",
            ]
        )
    return rows


def zoo_rows() -> list[list]:
    """remat.zoo's small models, whose steps on the H100 take a few milliseconds (zoo_truth.json)."""
    from remat import zoo

    truth = json.loads((FACTS / "zoo_truth.json").read_text())["models"]
    rows = []
    for name, measured in truth.items():
        model, inputs, *loss_fn = getattr(zoo, name)()
        prof = remat.profile(
            model,
            inputs,
            loss_fn=loss_fn[0] if loss_fn else None,
            mode="fake",
            device="cuda",
            hardware="H100",
            optimizer=torch.optim.Adam(model.parameters()),
        )
        step = measured["held"]["step_s"]
        rows.append([name, round(step * 1e3, 2), round(prof.step_time_s * 1e3, 2), f"{prof.step_time_s / step:.2f}"])
    return rows


def against_the_h100() -> None:
    import _common

    ops, steps, small = op_rows(), step_rows(), zoo_rows()
    tables = [
        _common.md_table(["case", "pass", "H100 kernel us", "predicted us", "ratio", "verdict"], ops),
        _common.md_table(["model", "H100 step ms", "predicted ms", "every layer, H100", "predicted"], steps),
        _common.md_table(["remat.zoo model", "H100 step ms", "predicted ms", "ratio"], small),
    ]
    print(*tables, sep="\n\n")
    path = _common.write_results(
        "gpu_seconds",
        "Predicted GPU seconds against an H100's",
        _common.machine_info(),
        "python benchmarks/gpu_seconds.py",
        list(
            zip(
                (
                    "Per op (H100 kernel: the table's time less the harness's least op)",
                    "Per step (issue 36's runs)",
                    "Small steps: the host's (zoo_truth.json, the output held through backward)",
                ),
                tables,
            )
        ),
        {"ops": ops, "steps": steps, "zoo": small},
    )
    print(f"wrote {path}")


# -- plans made here, run on a GPU ----------------------------------------------------------------------------


def made_plans(prof) -> dict:
    """The plans the GPU runs, of a fake profile: at 65% of its peak (no lower than the least) and the least."""
    least = remat.frontier(prof, max_points=2)[-1]
    return {"plan65": remat.plan(prof, max(int(0.65 * prof.peak_bytes), least.peak_bytes)), "least": least}


def make_plans(size: str, plans: Path) -> dict:
    """Plans at 65% of each model's fake peak and at the least memory, with what they predict."""
    plans.mkdir(parents=True, exist_ok=True)
    import transformers

    made = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "size": size,
        "made": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "models": {},
    }
    for name in MODELS:
        prof = fake_profile(name, size)
        entry = {"peak_bytes": prof.peak_bytes, "step_s": prof.step_time_s}
        for kind, plan in made_plans(prof).items():
            plan.save(plans / f"{name}.{kind}.json")
            entry[kind] = {
                "peak_bytes": plan.peak_bytes,
                "extra_fraction": plan.extra_fraction,
                "recompute": sorted(n for n, a in plan.decisions.items() if str(a) != "keep"),
            }
        made["models"][name] = entry
    (plans / "made.json").write_text(json.dumps(made, indent=1))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-plans", action="store_true", help="plans for the GPU run, made here (fake, H100)")
    parser.add_argument("--gpu", action="store_true", help="run the plans on this machine's GPU, timed")
    parser.add_argument("--smoke", action="store_true", help="with --gpu: tiny models on the CPU (the test)")
    parser.add_argument("--compile", action="store_true", help="with --gpu: torch.compile's variants too")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results" / "gpu_seconds")
    parser.add_argument("--budget-s", type=float, default=300.0, help="with --gpu: skip variants after this")
    parser.add_argument("--models", default="", help="with --gpu: these models only (comma-separated)")
    parser.add_argument("--variants", default="", help="with --gpu: these variants only (comma-separated)")
    parser.add_argument("--auto-trials", type=int, default=2, help="with --gpu: remat.auto's trials (each kind)")
    args = parser.parse_args()
    if args.make_plans:
        print(json.dumps(make_plans("issue", PLANS), indent=1))
    elif args.gpu:
        if not args.smoke and not torch.cuda.is_available():
            sys.exit(
                "remat: --gpu runs the plans on a CUDA GPU, and this machine has none. Fix: run it where one is, "
                "or add --smoke for the tiny run on the CPU."
            )
        from gpu_seconds_run import on_the_gpu

        res, path = on_the_gpu(args)  # written after each variant
        print(render(res), f"wrote {path}", sep="\n")
    else:
        against_the_h100()


if __name__ == "__main__":
    main()
