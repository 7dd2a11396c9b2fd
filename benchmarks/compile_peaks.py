"""Task (issue 15): does a plan hold under torch.compile?  A plan made from a profile of `torch.compile(model)`
(remat profiles the eager model inside), applied, and the compiled step (Inductor, torch.compile's default)
measured by `remat.verify(compiled, ...)`: the process's high-water mark of a forked copy running the training
loop (Adam kept across steps, third step), beside the same plan's eager step.  Target: the compiled planned step
within the plan's budget (+1%), with the same gradients as the eager plan (verify compares them on the eager model
inside: see docs/compile.md).

    python benchmarks/compile_peaks.py            # 5 models x 4 budgets, ~25 min on 2 cores (compiling)
    python benchmarks/compile_peaks.py --quick    # one small model
    python benchmarks/compile_peaks.py --models "GPT-2 6x128" --least --out compile_peaks_gpt2_least
                                                  # the peers' GPT-2 at batch 4 and 1, the least plan only

The last: at the peers' default GPT-2 the compiled step with remat's least-memory plan keeps more than the eager one,
so `remat.auto` on the compiled model says where the eager step fits instead (NOTE [Plans for a compiled step],
Rule 8).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat import zoo  # noqa: E402

PEERS_GPT2 = dict(n_layer=6, n_embd=128, n_head=4, seq=128, vocab=2048)
CASES = {  # name: (builder, default size, quick size)
    "Llama 12x256, seq 256, batch 8": (
        lambda kw: zoo.llama(**kw),
        dict(n_layer=12, hidden=256, heads=8, seq=256, batch=8, vocab=4096),
        dict(n_layer=3, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
    ),
    "GPT-2 12x256, seq 256, batch 8": (
        lambda kw: zoo.gpt2(**kw),
        dict(n_layer=12, n_embd=256, n_head=8, seq=256, batch=8, vocab=4096),
        None,
    ),
    "GPT-2 6x128, seq 128, batch 4 (the peers' default)": (lambda kw: zoo.gpt2(**kw), {**PEERS_GPT2, "batch": 4}, None),
    "GPT-2 6x128, seq 128, batch 1": (lambda kw: zoo.gpt2(**kw), {**PEERS_GPT2, "batch": 1}, None),
    "report-001 chain 16xLinear(256), batch 8192": (
        lambda kw: zoo.chain_report001(**kw),
        dict(width=256, blocks=16, batch=8192),
        None,
    ),
}
BUDGETS = (1.0, 0.7, 0.5, None)  # fractions of the unplanned peak; None: the least-memory plan


def run_case(name: str, build, kw: dict, budgets=BUDGETS) -> list[dict]:
    torch.manual_seed(0)
    model, inputs, *rest = build(kw)
    loss_fn = rest[0] if rest else None
    opt = torch.optim.Adam(model.parameters())
    torch._dynamo.reset()
    compiled = torch.compile(model)
    prof = remat.profile(compiled, inputs, loss_fn=loss_fn, optimizer=opt)
    least = remat.frontier(prof)[-1]
    rows = []
    for frac in budgets:
        if frac is not None and frac * prof.peak_bytes < least.peak_bytes:  # no plan fits (small --quick models)
            print(f"{name} {frac}: below the least plan's {least.peak_bytes / MiB:.0f} MiB, not measured", flush=True)
            continue
        plan = least if frac is None else remat.plan(prof, frac)
        eager = remat.verify(model, inputs, plan, loss_fn=loss_fn, optimizer=opt, time_rounds=0)
        report = remat.verify(compiled, inputs, plan, loss_fn=loss_fn, optimizer=opt, time_rounds=0)
        budget = plan.budget_bytes if plan.budget_bytes is not None else plan.peak_bytes
        rows.append(
            {
                "model": name,
                "budget_fraction": frac,
                "budget_mib": budget / MiB,
                "plan_mib": plan.peak_bytes / MiB,
                "unplanned_mib": prof.peak_bytes / MiB,
                "units": _units(plan),
                "eager_mib": eager.independent_peak_bytes / MiB,
                "compiled_mib": report.independent_peak_bytes / MiB,
                "fits": report.independent_peak_bytes <= budget * 1.01,
                "grads_equal": report.grads_equal,
            }
        )
        print(
            f"{name} {frac}: plan {plan.peak_bytes / MiB:.1f} MiB, eager {rows[-1]['eager_mib']:.1f}, "
            f"compiled {rows[-1]['compiled_mib']:.1f}",
            flush=True,
        )
    return rows


def _units(plan) -> str:
    runs = sum(len(s) > 1 for s in plan.segments)
    return f"{len(plan.segments)} ckpt ({runs} runs) + {len(plan.selective)} sel"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="", help="comma-separated parts of case names: only those cases")
    ap.add_argument("--least", action="store_true", help="only the least-memory plan of each case")
    ap.add_argument("--out", default="", help="results/<out>.{md,json} (default compile_peaks[_quick])")
    args = ap.parse_args()
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    t0 = time.time()
    rows = []
    for name, (build, default, quick) in CASES.items():
        if (args.quick and quick is None) or (wanted and not any(w in name for w in wanted)):
            continue
        rows += run_case(name, build, quick if args.quick else default, (None,) if args.least else BUDGETS)
    table = md_table(
        ["model", "budget", "plan's peak", "plan", "eager step", "compiled step", "compiled fits", "grads equal"],
        [
            [
                r["model"],
                "least plan"
                if r["budget_fraction"] is None
                else f"{r['budget_fraction']:.0%} = {r['budget_mib']:.0f} MiB",
                f"{r['plan_mib']:.1f} MiB (unplanned {r['unplanned_mib']:.1f})",
                r["units"],
                f"{r['eager_mib']:.1f} MiB",
                f"{r['compiled_mib']:.1f} MiB",
                "yes" if r["fits"] else "NO",
                "yes" if r["grads_equal"] else "NO",
            ]
            for r in rows
        ],
    )
    fits = sum(r["fits"] for r in rows)
    body = (
        f"{fits} of {len(rows)} compiled planned steps within the plan's budget (+1%).\n\n{table}\n\n"
        "eager step / compiled step = remat.verify(model or torch.compile(model), ...).independent_peak_bytes: the "
        "process's high-water mark of a forked copy running the loop (Adam kept across steps, third step). "
        f"The budget of the least plan is its own peak. Elapsed {time.time() - t0:.0f} s."
    )
    command = shlex.join(["python", "benchmarks/compile_peaks.py", *sys.argv[1:]])
    write_results(
        args.out or "compile_peaks" + ("_quick" if args.quick else ""),
        "Plans under torch.compile: the compiled step's peak by the process",
        machine_info(),
        command,
        [("Results", body)],
        rows,
    )


if __name__ == "__main__":
    main()
