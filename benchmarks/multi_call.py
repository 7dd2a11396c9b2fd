"""Modules called more than once per step (NOTE [A module called more than once]): the least-memory plan's predicted
peak against the step's, measured by `remat.verify` (its tracker and the process's high-water mark), on ALBERT
(6 shared layers, hidden 128, batch 8 x 128: `tests/test_multi_call.py`'s model) and on one MLP and LayerNorm
applied 4 times (width 512, batch 8192), both with Adam, real mode.

    python benchmarks/multi_call.py                     # ~2 min
    git worktree add /tmp/before 0fba430 && PYTHONPATH=/tmp/before/src python benchmarks/multi_call.py --no-write
                                                        # the same with the planner before it planned call by call
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat import zoo  # noqa: E402


class FourCalls(nn.Module):
    def __init__(self, width: int = 512):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        for _ in range(4):
            x = x + self.block(self.norm(x))
        return x


def least_plan_row(label: str, model: nn.Module, inputs) -> list:
    adam = lambda ps: torch.optim.Adam(ps)  # noqa: E731
    prof = remat.profile(model, inputs, optimizer=adam, timed=False)
    try:
        least = remat.plan(prof, 1)
    except remat.InfeasibleBudget as e:
        least = remat.plan(prof, e.min_bytes)
    remat.apply(model, least)
    report = remat.verify(model, inputs, least, optimizer=adam, time_rounds=0)
    remat.remove(model)
    measured, process = report.measured_peak_bytes, report.independent_peak_bytes or 0
    return [label, prof.peak_bytes / MiB, least.peak_bytes / MiB, measured / MiB, process / MiB, report.ok]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only (a run of another checkout)")
    args = parser.parse_args()
    rows = [least_plan_row("ALBERT, 6 calls of one layer", *zoo.albert(n_layer=6, hidden=128, seq=128, batch=8))]
    torch.manual_seed(0)
    rows.append(least_plan_row("MLP + LayerNorm, 4 calls", FourCalls(), torch.randn(8192, 512)))
    headers = ["model", "unplanned MiB", "least plan predicted", "measured (tracker)", "process", "verify ok"]
    table = md_table(headers, [[r[0], *(f"{v:.2f}" for v in r[1:5]), r[5]] for r in rows])
    print(remat.__file__)
    print(table)
    if not args.no_write:
        data = [dict(zip(headers, r)) for r in rows]
        path = write_results(
            "multi_call", "Modules called more than once", machine_info(), "python benchmarks/multi_call.py",
            [("least-memory plans", table)], data,
        )  # fmt: skip
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
