"""`gpu_seconds.py --gpu`: issue 36's two tables measured on a GPU (or at a tiny size on the CPU, `--smoke`), each
variant of each model built afresh, in TIERS.

The variants: the eager step, Hugging Face's every-layer checkpointing, remat's every-block and the plans made on
the laptop (`plan65`, `least`), `remat.auto` on the eager model at 35% under the eager step's measured peak
(`auto -35%`: a real-mode profile on the GPU, its op times measured, and a plan for the budget: the issue's BERT
point, and `plan.extra_fraction` from the GPU's own seconds), and with `--compile` torch.compile alone and at its
activation memory budgets, remat's plans compiled, and `remat.auto` on the compiled model (`auto X+compile`: for the
peak `compile X` measured in the same run; `auto -35%+compile`: for the budget of `auto -35%`).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpu_seconds import MODELS, PLANS, TIMED, WARM, build, make_plans  # first: it finds this tree's remat (src/)

import remat  # noqa: E402
from _common import describe_plan  # noqa: E402
from _models import Autocast  # noqa: E402
from gpu_seconds_report import AT_35  # noqa: E402
from remat._torch_compat.compiler import activation_memory_budget  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_variant(name: str, variant: str, size: str, device: str, plans: Path, *, aim: float = 0, trials=2) -> dict:
    """One variant of one model, built afresh: the third step's peak, the median of TIMED steps.  An `auto`
    variant first runs `remat.auto` on the model, compiled for `...+compile`, for `aim` (bytes, or SMOKE_AIM on
    the CPU), in at most `trials` compilations of each kind.  `wall_s`: the whole variant, building, compiling and searching included
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
    """`remat.auto` on the model (compiled or not) for `aim`, as a user on a GPU calls it: the plan it applied and
    what its search measured (a compiled model's: on CUDA in this process; NOTE [Plans for a compiled step], Rule
    7), or, for an eager model, what the plan predicted from the real profile remat.auto made (`said_extra`,
    `said_peak_bytes`: the report holds them against the step measured)."""
    t0 = time.perf_counter()
    if isinstance(aim, float):  # the smoke run's: a share of the step's peak as remat.profile measures it
        prof = remat.profile(runner, batch, optimizer=opt)
        aim = int(aim * (prof.compiled_peak_bytes or prof.peak_bytes))
    phases: list = []  # [phase, seconds into the search]: how long each candidate's compiling and measuring took

    def told(phase: str, _done: int) -> None:
        if not phases or phases[-1][0] != phase:
            phases.append([phase, round(time.perf_counter() - t0, 1)])

    plan = remat.auto(runner, batch, budget=aim, optimizer=opt, trials=trials, progress=told)
    out = {"budget": aim, "plan": describe_plan(plan), "search_s": time.perf_counter() - t0, "phases": phases}
    if plan.measured_step_s:  # chosen by compiling and measuring candidates
        out.update(search_peak_bytes=plan.measured_peak_bytes, search_step_s=plan.measured_step_s)
        out["search"] = plan.notes[1]
    else:  # an eager plan (or the compiled step, which fitted), priced on the profile's measured op times
        out.update(said_extra=plan.extra_fraction, said_peak_bytes=plan.peak_bytes, search=" ".join(plan.notes))
    return out


AT35 = "-35%"
"""The point of `auto -35%` and `auto -35%+compile`: AT_35 of the eager step's peak measured in the same run."""
VARIANTS = ["eager", "hf", "every-block", "plan65", "least", f"auto {AT35}"]
COMPILED = ["compile", "least+compile", "compile 0.5", "plan65+compile", "compile 0.3", "compile 0.7"]
AUTO = ["auto 0.5+compile", f"auto {AT35}+compile", "auto 0.3+compile", "auto 0.7+compile"]
"""`remat.auto` on the compiled model, for the peak torch.compile's budget measured in the same run (or AT35)."""
SMOKE_AIM = 0.95
"""The smoke run's budget for remat.auto on the CPU, where the loop reads no peak: this share of the step's peak
by remat.profile (the compiled step's, compiled), so that the search compiles candidates, and can meet it."""
TIERS = [
    ["eager", "plan65", "least", f"auto {AT35}"],
    ["compile", "compile 0.5"],
    ["auto 0.5+compile"],
    [f"auto {AT35}+compile"],
    ["hf", "every-block", "least+compile", "plan65+compile"],
    ["compile 0.3", "compile 0.7"],
    ["auto 0.3+compile", "auto 0.7+compile"],
]
"""The order of a run, each tier for both models, so that `--budget-s` leaves the least telling: first what the
issue's checks on remat's own seconds and its BERT point need (the eager step, the laptop's plans, remat.auto at
-35% with the GPU's own op times), then torch.compile alone and at 0.5 and remat.auto at that point and at -35%,
then the peers and plans measured on the H200 on 2026-12-04, then the rest of torch.compile's budgets and
remat.auto at them."""
assert sorted(v for tier in TIERS for v in tier) == sorted(VARIANTS + COMPILED + AUTO)


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


SKIP_AUTO = "the point it aims at (`eager` for -35%, else `compile X`) was not measured in this run (name both)"


def aimed(variant: str, measured: dict, device: str) -> int | float | None:
    """What an `auto` variant's search aims at: the peak of torch.compile at the same budget in this run, or AT_35
    of the eager step's (on the CPU, where the loop reads no peak, SMOKE_AIM); None if that was not measured; 0 for
    the other variants."""
    if not variant.startswith("auto "):
        return 0
    at = variant.split()[1].removesuffix("+compile")
    point = measured.get("eager" if at == AT35 else f"compile {at}", {})
    if "step_s" not in point:
        return None
    if device != "cuda":
        return SMOKE_AIM
    return int(AT_35 * point["peak_bytes"]) if at == AT35 else point["peak_bytes"]


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
