"""On a CUDA GPU: remat's figures against `torch.cuda.max_memory_allocated` (docs/validation.md, "On a GPU").

For each model, on the GPU, with Adam (the steady step: its state resident):
  - remat.profile in real mode (the tracker, ops synchronised) and in fake mode for `device="cuda"` with
    the roofline of this GPU (`hardware`), both against the unplanned step as `remat.verify` measures it
    with CUDA's own counter (`torch.cuda.max_memory_allocated` over the step, `independent_peak_bytes`);
  - plans at half-way between the least-memory plan and the unplanned peak, and the least-memory plan:
    applied and verified (gradients, FlopCounterMode's extra FLOPs against the plan's, the measured peak
    by CUDA's counter against the budget, and the measured step-time overhead against `plan.extra_s`);
  - with --compiled, `remat.auto` on `torch.compile(model)` at 80% of the compiled step's measured peak,
    verified by the same counter.

    python benchmarks/cuda_truth.py [--models gpt2_medium,bert_base,llama] [--compiled llama] [--out-dir D]

Needs a CUDA device; writes cuda_truth.{md,json} to --out-dir (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import remat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _models import build_sized  # noqa: E402

MiB = 2**20


MODELS = {  # name: what (its size is _catalog.SIZES["truth"][name])
    "gpt2_medium": "GPT-2 medium's shape (24 x 1024, 355M parameters), seq 1024, batch 4",
    "bert_base": "BERT-base's shape (12 x 768), seq 512, batch 16",
    "llama": "Llama-like decoder (8 x 1024, 16 heads, MLP 2816), seq 1024, batch 4",
}


def _cuda(x):
    if isinstance(x, dict):
        return {k: _cuda(v) for k, v in x.items()}
    return x.cuda() if isinstance(x, torch.Tensor) else x


def _plan_row(name: str, plan, report) -> dict:
    return {
        "model": name,
        "plan": f"{len(plan.segments)} ckpt + {len(plan.selective)} selective",
        "budget": plan.budget_bytes,
        "predicted": plan.peak_bytes,
        "tracked": report.measured_peak_bytes,
        "cuda_counter": report.independent_peak_bytes,
        "counter": report.independent_counter,
        "fits": report.independent_peak_bytes is not None
        and plan.budget_bytes is not None
        and report.independent_peak_bytes <= plan.budget_bytes,
        "ok": report.ok,
        "grads_equal": report.grads_equal,
        "fits_budget": report.fits_budget,
        "grad_max_abs_diff": max(report.grad_max_abs_diff.values(), default=0.0),
        "flops_predicted": report.predicted_recompute_flops,
        "flops_measured": report.measured_recompute_flops,
        "overhead_predicted": report.predicted_overhead,
        "overhead_measured": report.measured_overhead,
    }


def one(name: str, compiled: bool) -> dict:
    what = MODELS[name]
    built = build_sized(name, "truth")
    model, inputs = built[0].cuda(), _cuda(built[1])
    params = sum(p.numel() for p in model.parameters())
    out = {"model": name, "what": what, "params": params}
    t0 = time.perf_counter()
    prof = remat.profile(model, inputs, optimizer=torch.optim.Adam)
    out["profile_s"] = time.perf_counter() - t0
    out["predicted_real"] = prof.peak_bytes
    try:
        hardware = "H200" if "H200" in torch.cuda.get_device_name() else None
        fake = remat.profile(model, inputs, optimizer=torch.optim.Adam, mode="fake", device="cuda", hardware=hardware)
        out["predicted_fake"] = fake.peak_bytes
    except remat.RematError as e:
        out["fake_error"] = str(e)[:300]
    keep = remat.plan(prof, prof.peak_bytes)
    unplanned = remat.verify(model, inputs, keep, optimizer=torch.optim.Adam)
    out["grad_run_to_run"] = max(unplanned.grad_max_abs_diff.values(), default=0.0)  # nothing applied: the noise
    out["cuda_counter_unplanned"] = unplanned.independent_peak_bytes
    out["counter"] = unplanned.independent_counter
    out["tracked_unplanned"] = unplanned.unplanned_peak_bytes
    out["step_s"] = unplanned.unplanned_step_s
    least = remat.frontier(prof, max_points=2)[-1]
    rows = []
    for budget in ((least.peak_bytes + prof.peak_bytes) // 2, least.peak_bytes):
        plan = remat.plan(prof, budget)
        rows.append(_plan_row(name, plan, remat.verify(model, inputs, plan, optimizer=torch.optim.Adam)))
    out["plans"] = rows
    if compiled:
        try:
            cm = torch.compile(model)
            cprof = remat.profile(cm, inputs, optimizer=torch.optim.Adam)
            out["compiled_peak"] = cprof.compiled_peak_bytes
            budget = int(0.8 * cprof.compiled_peak_bytes)
            plan = remat.auto(cm, inputs, budget, optimizer=torch.optim.Adam, trials=2)
            report = remat.verify(cm, inputs, plan, optimizer=torch.optim.Adam)
            out["compiled_plan"] = dict(
                _plan_row(name, plan, report), search=plan.notes[:2], search_measured=plan.measured_peak_bytes
            )
            remat.remove(cm)
        except Exception as e:  # remat.InfeasibleBudget, or the compiler's own failure: a result either way
            out["compiled_plan"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    return out


def _over(measured: int, budget: int) -> str:
    """The CUDA counter's excess over the budget, or "no"."""
    if measured <= budget:
        return "no"
    return f"+{(measured - budget) / MiB:,.2f} MiB ({(measured - budget) / budget:.3%})"


def _pct(a, b) -> str:
    return f"{(a - b) / b:+.2%}" if a and b else "—"


def markdown(results: dict) -> str:
    lines = [
        "# remat on a CUDA GPU against torch.cuda.max_memory_allocated",
        "",
        f"Run {results['date']} on {results['device']}, torch {results['torch']}, remat at {results['commit']}.",
        "Command: `" + results["command"] + "`.",
        "",
        "| model | parameters | unplanned, CUDA counter MiB | remat real-mode prediction | fake-mode prediction "
        "| step s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:200]} | | | | |")
            continue
        c = r["cuda_counter_unplanned"]
        lines.append(
            f"| {r['model']}: {r['what']} | {r['params'] / 1e6:,.0f}M | {c / MiB:,.1f} | "
            f"{r['predicted_real'] / MiB:,.1f} ({_pct(r['predicted_real'], c)}) | "
            + (
                f"{r['predicted_fake'] / MiB:,.1f} ({_pct(r['predicted_fake'], c)})"
                if "predicted_fake" in r
                else r.get("fake_error", "—")[:120]
            )
            + f" | {r['step_s']:.3f} |"
        )
    lines += [
        "",
        "Gradients: the largest |difference| of any gradient element between two runs of the unplanned step "
        "from the same RNG state (keep-everything plan, nothing applied): "
        + ", ".join(f"{r['model']} {r['grad_run_to_run']:.1e}" for r in results["models"] if "grad_run_to_run" in r)
        + ".  On CUDA `remat.verify` accepts GRAD_NOISE_FACTOR (10) times its own measure of that difference.",
        "",
        "| model | plan | budget MiB | predicted MiB | CUDA counter MiB | over the budget | "
        "max \\|grad diff\\| | extra FLOPs predicted = measured | overhead predicted / measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        for p in r.get("plans", []) + ([r["compiled_plan"]] if "predicted" in r.get("compiled_plan", {}) else []):
            lines.append(
                f"| {p['model']} | {p['plan']}{' (compiled, remat.auto)' if 'search' in p else ''} | "
                f"{p['budget'] / MiB:,.1f} | {p['predicted'] / MiB:,.1f} | {p['cuda_counter'] / MiB:,.1f} | "
                f"{_over(p['cuda_counter'], p['budget'])} | {p['grad_max_abs_diff']:.1e} | "
                f"{'yes' if p['flops_predicted'] == p['flops_measured'] else '**no**'} | "
                f"{p['overhead_predicted']:+.1%} / {p['overhead_measured']:+.1%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--compiled", default="", help="models also planned compiled with remat.auto (comma-separated)")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "remat: cuda_truth.py measures on a CUDA GPU, and this machine has none. Fix: run it where "
            "torch.cuda.is_available() is True.",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import git_state

    try:
        commit = git_state().get("commit", "?")
    except Exception:  # a copy of the tree without its .git (the device tool sends files, not the repository)
        commit = "?"
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "commit": commit,
        "command": "python benchmarks/cuda_truth.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "models": [],
    }
    out_dir = Path(args.out_dir)
    for name in args.models.split(","):
        try:
            results["models"].append(one(name, name in args.compiled.split(",")))
        except Exception as e:  # a failure is a result
            results["models"].append({"model": name, "error": f"{type(e).__name__}: {e}"[:2000]})
        torch.cuda.empty_cache()
        (out_dir / "cuda_truth.json").write_text(json.dumps(results, indent=1))
        (out_dir / "cuda_truth.md").write_text(markdown(results))
        print(markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
