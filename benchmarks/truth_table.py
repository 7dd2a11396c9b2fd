"""Issue 12: predicted vs trained.  Is remat's figure the peak of the step the user actually runs?

For each model of the zoo, `remat.profile` (real mode, the steady step: Adam's state
resident) predicts the peak; then the user's own loop (one Adam kept across steps,
`zero_grad()` between them) runs in a fresh interpreter and its third step is measured by
the process itself (NOTE [Measuring a step by the process] in remat/verifier/process.py:
VmHWM over the step minus the resident set before it, plus the tensors resident before
it).  Unplanned, then planned at two budgets: half-way between the least-memory plan and
the unplanned peak, and the least-memory plan itself.

    python benchmarks/truth_table.py            # ~10 min on 2 cores
    python benchmarks/truth_table.py --quick    # three models

The sizes are the zoo's, enlarged where the zoo's default step is under 64 MiB: below that
the process counter does not resolve a step (remat.types.verification.COUNTER_RESOLVES_BYTES).
One intra-op thread in both processes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat import zoo  # noqa: E402
from remat.verifier.process import step_peak_bytes  # noqa: E402

TOLERANCE = 0.03
BUDGET_SLACK = 0.01


# -- the models (TARGETs of this file, so that the measuring process builds the same) ---------------


def gpt2():
    return zoo.gpt2()  # = `remat demo`'s model


def bert():
    return zoo.bert()


def mlp000():
    return zoo.mlp_report000(seq=512, batch=16)


def chain001():
    return zoo.chain_report001(width=256, blocks=16, batch=8192)


def cnn002():
    return zoo.cnn_report002(batch=400)


def cnn_bn():
    return zoo.cnn_bn(batch=64, size=64)


def skipnet():
    return zoo.skipnet(width=1024, depth=4, batch=4096)


CASES = {
    "gpt2": "HF GPT-2 4×256, seq 256, batch 8 (zoo.gpt2 = remat demo)",
    "bert": "HF BERT 4×256, seq 128, batch 8 (zoo.bert)",
    "mlp000": "report-000 FeedForward 256/1024 ×8, seq 512, batch 16",
    "chain001": "report-001 chain 16×Linear(256)+ReLU, batch 8192",
    "cnn002": "report-002 CNN, batch 400",
    "cnn_bn": "CNN + BatchNorm + skips (zoo.cnn_bn), batch 64, 64×64",
    "skipnet": "SkipNet 4×1024, batch 4096",
}
QUICK = ("gpt2", "chain001", "cnn_bn")


def _built(name: str):
    built = globals()[name]()
    return built[0], built[1], (built[2] if len(built) > 2 else None)


def _row(name: str, case: str, budget: int | None, predicted: int, measured: int) -> dict:
    return {
        "model": name,
        "case": case,
        "budget_bytes": budget,
        "predicted_bytes": predicted,
        "process_bytes": measured,
        "difference": (predicted - measured) / measured,
        "within_budget": None if budget is None else measured <= (1 + BUDGET_SLACK) * budget,
    }


def measure(name: str, workdir: Path) -> list[dict]:
    target = f"{__file__}:{name}"
    model, inputs, loss_fn = _built(name)
    prof = remat.profile(model, inputs, loss_fn, optimizer=torch.optim.Adam)
    rows = [_row(name, "unplanned", None, prof.peak_bytes, step_peak_bytes(target).peak_bytes)]
    least = remat.frontier(prof)[-1].peak_bytes
    if least >= 0.99 * prof.peak_bytes:
        rows.append({"model": name, "case": f"no plan lowers the peak (least plan {least / prof.peak_bytes:.0%})"})
        return rows
    for case, budget in (("half-way", (least + prof.peak_bytes) // 2), ("least", least)):
        plan = remat.plan(prof, budget)
        path = workdir / f"{name}_{case}.json"
        plan.save(path)
        rows.append(_row(name, case, plan.budget_bytes, plan.peak_bytes, step_peak_bytes(target, path).peak_bytes))
    return rows


def _table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if "predicted_bytes" not in r:
            out.append([CASES[r["model"]], r["case"], "", "", "", "", ""])
            continue
        budget = "" if r["budget_bytes"] is None else f"{r['budget_bytes'] / MiB:,.1f}"
        fits = "" if r["within_budget"] is None else ("yes" if r["within_budget"] else "**no**")
        close = abs(r["difference"]) <= TOLERANCE
        out.append(
            [
                CASES[r["model"]],
                r["case"],
                budget,
                f"{r['predicted_bytes'] / MiB:,.1f}",
                f"{r['process_bytes'] / MiB:,.1f}",
                f"{r['difference']:+.2%}" + ("" if close else " **over 3%**"),
                fits,
            ]
        )
    headers = [
        "model",
        "plan",
        "budget MiB",
        "remat predicted MiB",
        "process, 3rd step MiB",
        "difference",
        "within budget +1%",
    ]
    return md_table(headers, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ["REMAT_THREADS"] = "1"
    info = machine_info(threads=1)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in QUICK if args.quick else CASES:
            rows += measure(name, Path(tmp))
            print(_table(rows[-3:]), flush=True)
    table = _table(rows)
    print(table)
    measured = [r for r in rows if "difference" in r]
    worst = max(measured, key=lambda r: abs(r["difference"]))
    summary = (
        f"{len(measured)} steps; worst difference {worst['difference']:+.2%} ({worst['model']}, {worst['case']}); "
        f"over 3%: {sum(abs(r['difference']) > TOLERANCE for r in measured)}; over budget + 1%: "
        f"{sum(r['within_budget'] is False for r in measured)}."
    )
    print(summary)
    name = "truth_table_quick" if args.quick else "truth_table"
    command = "python benchmarks/truth_table.py" + (" --quick" if args.quick else "")
    write_results(
        name,
        "Predicted vs trained: the third step of the user's loop, measured by the process",
        info,
        command,
        [("", table), ("Summary", summary)],
        rows,
    )


if __name__ == "__main__":
    main()
