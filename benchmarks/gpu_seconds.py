"""Issue 36: the seconds a fake step predicts for a GPU, against what a GPU measures.

usage:
  python benchmarks/gpu_seconds.py                  on the CPU: predictions against the H100's figures
  python benchmarks/gpu_seconds.py --make-plans     on the CPU: plans for the two models, fake mode for an H100
  python benchmarks/gpu_seconds.py --gpu [--compile] [--out-dir D] [--budget-s S] [--auto-trials N]
                                                    on a GPU: the plans run, timed; `--smoke`: tiny, on the CPU

The default run needs no GPU: fake-mode profiles for hardware="H100" against the repository's copy of the H100's
figures (tests/gpu_facts/h100/op_times.json, step_times.json, zoo_truth.json); tests/test_gpu_seconds.py holds the
same cases to 25% per op and 5 points per step.  Writes benchmarks/results/gpu_seconds.md/.json.

`--gpu` is issue 36's two tables measured again: for a bf16 Llama-style decoder and BERT-base (random weights,
nothing downloaded), the eager step, Hugging Face's every-layer checkpointing, remat's every-block, its plans at
65% of the peak and at the least memory (made by `--make-plans`, committed in results/gpu_seconds/plans/), and with
`--compile` torch.compile alone, at its activation memory budgets 0.7, 0.5 and 0.3, remat's two plans compiled, and
`remat.auto` on the compiled model for the peak each of those budgets measured in the same run (`auto 0.5+compile`:
the search as a user runs it on a GPU, in this process, at most `--auto-trials` compilations of each kind; its
budget's `compile 0.5` must run first, in the same call).  Each variant in a model built afresh, AdamW, the output
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
import gc
import json
import statistics
import sys
import time
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
from _common import describe_plan  # noqa: E402
from _models import Autocast, build_sized  # noqa: E402
from gpu_seconds_report import render  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from h100_ops import CASES, FACTS, OFF, op_table, predicted  # noqa: E402  (the cases test_gpu_seconds.py holds)
from remat._torch_compat.compiler import activation_memory_budget  # noqa: E402

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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_variant(name: str, variant: str, size: str, device: str, plans: Path, *, aim: float = 0, trials=2) -> dict:
    """One variant of one model, built afresh: the third step's peak, the median of TIMED steps.  An `auto`
    variant first runs `remat.auto` on the compiled model for `aim` (bytes, or SMOKE_AIM on the CPU), in at most
    `trials` compilations of each kind.  `wall_s`: the whole variant, building, compiling and searching included
    (what the next run on a lent GPU, minutes counted, is sized by)."""
    began = time.perf_counter()
    before = torch.cuda.memory_allocated() if device == "cuda" else None  # what earlier variants left
    model, batch = build(name, size, device, autocast=device)
    inner = model.inner if isinstance(model, Autocast) else model
    if variant == "hf":
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif variant == "every-block":
        remat.apply(model, "every-block")
    elif variant.split("+")[0] in ("plan65", "least"):
        remat.apply(model, remat.load_plan(plans / f"{name}.{variant.split('+')[0]}.json"))
    budget = float(variant.split()[1]) if variant.startswith("compile ") else 1.0
    runner = torch.compile(model) if "compile" in variant else model
    opt = torch.optim.AdamW(model.parameters())
    seconds, issued, out = [], [], searched(runner, batch, opt, aim, trials) if variant.startswith("auto ") else {}
    out["before_bytes"] = before
    with activation_memory_budget(budget):
        for i in range(WARM + 1 + TIMED):
            if i == WARM and device == "cuda":
                _sync(device)
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            result = runner(**batch)
            result.loss.backward()  # the output held through backward, as the issue's loop
            opt.step()
            opt.zero_grad(set_to_none=True)
            issue_s = time.perf_counter() - t0  # the host's time to issue the step (report's HOST_BOUND)
            _sync(device)
            if i == WARM and device == "cuda":
                out["peak_bytes"] = torch.cuda.max_memory_allocated()
            elif i > WARM:
                seconds.append(time.perf_counter() - t0)
                issued.append(issue_s)
            del result
    out["step_s"], out["issue_s"] = statistics.median(seconds), statistics.median(issued)
    out["steps_s"], out["wall_s"] = seconds, time.perf_counter() - began  # each timed step: its spread
    return out


def searched(runner, batch: dict, opt, aim: int | float, trials: int) -> dict:
    """`remat.auto` on the compiled model for `aim`, as a user on a GPU calls it: the plan it applied and what its
    search measured (on CUDA in this process; NOTE [Plans for a compiled step], Rule 7)."""
    t0 = time.perf_counter()
    if isinstance(aim, float):  # the smoke run's: a share of the compiled step's peak, as remat.profile measures it
        aim = int(aim * remat.profile(runner, batch, optimizer=opt).compiled_peak_bytes)
    plan = remat.auto(runner, batch, budget=aim, optimizer=opt, trials=trials)
    return {
        "budget": aim,
        "plan": describe_plan(plan),
        "search_s": time.perf_counter() - t0,
        "search_peak_bytes": plan.measured_peak_bytes,
        "search_step_s": plan.measured_step_s,
        "search": plan.notes[1] if plan.measured_peak_bytes else plan.notes[0],
    }


VARIANTS = ["eager", "hf", "every-block", "plan65", "least"]
COMPILED = ["compile", "least+compile", "compile 0.5", "plan65+compile", "compile 0.3", "compile 0.7"]
AUTO = ["auto 0.5+compile", "auto 0.3+compile", "auto 0.7+compile"]
"""`remat.auto` on the compiled model, for the peak torch.compile's budget measured in the same run."""
SMOKE_AIM = 0.95
"""The smoke run's budget for remat.auto on the CPU, where the loop reads no peak: this share of the compiled
step's peak by remat.profile, so that the search compiles candidates, and can meet it."""
TIERS = [VARIANTS, COMPILED[:2], COMPILED[2:4], AUTO[:1], COMPILED[4:], AUTO[1:]]
"""The order of a run, each tier for both models: without compile, then the points the issue's table had, then
remat.auto at compile 0.5's point, then the rest of torch.compile's budgets and remat.auto at them."""


def chosen(args) -> list[tuple[str, str]]:
    """(model, variant) in the order they run."""
    wanted = args.variants.split(",") if args.variants else VARIANTS + (COMPILED + AUTO if args.compile else [])
    models = args.models.split(",") if args.models else list(MODELS)
    unknown = sorted(set(wanted) - set(VARIANTS + COMPILED + AUTO)) + sorted(set(models) - set(MODELS))
    if unknown:
        sys.exit(
            f"remat: --variants takes {VARIANTS + COMPILED + AUTO} and --models {list(MODELS)}; got {unknown}. "
            "Fix: name them from those lists, comma-separated."
        )
    return [(m, v) for tier in TIERS for m in models for v in tier if v in wanted]


SKIP_AUTO = "its torch.compile point was not measured in this run (name both in --variants)"


def aimed(variant: str, measured: dict, device: str) -> int | float | None:
    """What an `auto` variant's search aims at: the peak of torch.compile at the same budget in this run (on the
    CPU, where the loop reads no peak, SMOKE_AIM); None if that was not measured; 0 for the other variants."""
    if not variant.startswith("auto "):
        return 0
    point = measured.get(f"compile {variant.split()[1].removesuffix('+compile')}", {})
    if "step_s" not in point:
        return None
    return point["peak_bytes"] if device == "cuda" else SMOKE_AIM


def on_the_gpu(args) -> tuple[dict, Path]:
    """Every variant chosen, run; the results, written again after each variant (a run stopped by the device's
    time limit keeps what it measured), and where."""
    runs = chosen(args)  # before anything is written
    device = "cpu" if args.smoke else "cuda"
    size = "smoke" if args.smoke else "issue"
    plans = args.out_dir / "smoke_plans" if args.smoke else PLANS  # never the committed plans
    made = make_plans(size, plans) if args.smoke else json.loads((plans / "made.json").read_text())
    deadline = time.monotonic() + args.budget_s
    res = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "made": made,
        "models": {m: {} for m in dict.fromkeys(m for m, _ in runs)},
    }
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M")
    path = args.out_dir / f"gpu_{res['device'].replace(' ', '_')}_{stamp}.json"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, variant in runs:
        aim = aimed(variant, res["models"][name], device)
        try:
            if time.monotonic() > deadline:
                r = {"skipped": "over --budget-s"}
            elif aim is None:
                r = {"skipped": SKIP_AUTO}
            else:
                r = run_variant(name, variant, size, device, plans, aim=aim, trials=args.auto_trials)
        except Exception as e:  # noqa: BLE001 -- a variant that fails is a result, the others still run
            r = {"error": f"{type(e).__name__}: {e}"[:300]}
        res["models"][name][variant] = r
        path.write_text(json.dumps(res, indent=1))
        if "skipped" in r:
            continue
        print(name, variant, r, flush=True)
        if "compile" in variant:
            torch.compiler.reset()  # the compiled graphs hold the variant's model
        gc.collect()  # what other libraries' cycles hold; remat's plans make none since 2026-12-04 (Rule 8)
        if device == "cuda":
            torch.cuda.empty_cache()
    return res, path


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
        res, path = on_the_gpu(args)  # written after each variant
        print(render(res), f"wrote {path}", sep="\n")
    else:
        against_the_h100()


if __name__ == "__main__":
    main()
