"""Task (issue 15): is a plan's predicted time true?  `plan.extra_fraction` (the plan's extra seconds over the
unplanned step's, from a real profile's warm-step op times) against the overhead `remat.verify` measures
(median of interleaved rounds of the step without and with the plan).  Target: within 10 percentage points.

For each model: one real profile with Adam, then the plans of its frontier at three points (a quarter, half
and all the way down from keep-everything to the least memory), each verified with 7 timing rounds.

    python benchmarks/seconds.py            # 3 models x 3 plans, ~6 min on 2 cores
    python benchmarks/seconds.py --quick    # smaller sizes, 1 model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat import zoo  # noqa: E402
from remat.types.verification import TIME_AGREES  # noqa: E402

CASES = {  # name: (builder, default size, quick size)
    "Llama 4x256, seq 256, batch 4": (
        lambda kw: zoo.llama(**kw),
        dict(n_layer=4, hidden=256, heads=4, seq=256, batch=4, vocab=4096),
        dict(n_layer=2, hidden=128, heads=4, seq=64, batch=2, vocab=512),
    ),
    "GPT-2 4x256, seq 256, batch 8": (
        lambda kw: zoo.gpt2(**kw),
        dict(n_layer=4, n_embd=256, n_head=4, seq=256, batch=8, vocab=8192),
        None,
    ),
    "report-001 chain 16xLinear(512), batch 2048": (
        lambda kw: zoo.chain_report001(**kw),
        dict(width=512, blocks=16, batch=2048),
        None,
    ),
}
ROUNDS = 7


def run_case(name: str, build, kw: dict) -> list[dict]:
    torch.manual_seed(0)
    model, inputs = build(kw)
    opt = torch.optim.Adam(model.parameters())
    prof = remat.profile(model, inputs, optimizer=opt)
    frontier = remat.frontier(prof)
    picks = sorted({len(frontier) // 4, len(frontier) // 2, len(frontier) - 1} - {0})
    rows = []
    for i in picks:
        plan = frontier[i]
        report = remat.verify(model, inputs, plan, optimizer=opt, time_rounds=ROUNDS)
        rows.append(
            {
                "model": name,
                "point": i,
                "points": len(frontier),
                "peak_mib": plan.peak_bytes / MiB,
                "unplanned_mib": prof.peak_bytes / MiB,
                "checkpoints": len(plan.segments),
                "selective": len(plan.selective),
                "predicted": plan.extra_fraction,
                "measured": report.measured_overhead,
                "gap_pp": 100 * (report.measured_overhead - plan.extra_fraction),
                "agrees": report.time_agrees,
                "step_time_s": prof.step_time_s,
                "verify_step_s": report.unplanned_step_s,
                "ok": report.ok,
            }
        )
        print(
            f"{name} point {i}: predicted {plan.extra_fraction:+.1%}, measured {report.measured_overhead:+.1%}",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    rows = []
    for name, (build, default, quick) in CASES.items():
        if args.quick and quick is None:
            continue
        rows += run_case(name, build, quick if args.quick else default)
    agree = sum(r["agrees"] for r in rows)
    body = (
        f"{agree} of {len(rows)} plans predicted within {TIME_AGREES * 100:.0f} percentage points of the measured overhead.\n\n{_table(rows)}\n\n"
        f"predicted = plan.extra_fraction (the plan's extra seconds / the profile's step_time_s); measured = "
        f"remat.verify's median over {ROUNDS} interleaved rounds of (step with the plan / without) - 1. "
        f"Elapsed {time.time() - t0:.0f} s."
    )
    command = "python benchmarks/seconds.py" + (" --quick" if args.quick else "")
    write_results(
        "seconds" + ("_quick" if args.quick else ""),
        "Predicted vs measured step-time overhead",
        machine_info(),
        command,
        [("Results", body)],
        rows,
    )


def _table(rows: list[dict]) -> str:
    return md_table(
        [
            "model",
            "frontier point",
            "peak (unplanned)",
            "ckpt + selective",
            "predicted",
            "measured",
            "gap",
            f"within {TIME_AGREES * 100:.0f} pp",
            "verify ok",
        ],
        [
            [
                r["model"],
                f"{r['point']} of {r['points']}",
                f"{r['peak_mib']:.1f} MiB ({r['unplanned_mib']:.1f})",
                f"{r['checkpoints']} + {r['selective']}",
                f"{r['predicted']:+.1%}",
                f"{r['measured']:+.1%}",
                f"{r['gap_pp']:+.0f} pp",
                "yes" if r["agrees"] else "no",
                "yes" if r["ok"] else "no",
            ]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
