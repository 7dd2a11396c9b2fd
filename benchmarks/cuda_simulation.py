"""remat's simulated CUDA step, on this CPU, against what an H100 measured (tests/gpu_facts/h100, 2026-11-26).

usage: python benchmarks/cuda_simulation.py [--json OUT]
Prints two markdown tables: each op of tests/gpu_facts/h100/op_facts.json (saved bytes, held after forward,
forward and backward peaks over what was allocated before them), and each `remat.zoo` model's steady step
(Adam, third step, `max_memory_allocated`) in the loop that keeps the output and in the one that keeps only the
loss, against `remat.profile(mode="fake", device="cuda", hardware="H100")`.  The same comparisons are the tests
of tests/test_cuda_simulation.py; this script shows the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_cuda_simulation as sim  # noqa: E402  (the harness the tests hold the model with)


MIB = 2**20


def op_rows() -> list[dict]:
    rows = []
    for name in sorted(sim.CASES):
        truth, simulated = sim.OP_FACTS[name], sim._simulate(sim.CASES[name])
        footprint = max(truth[f] for f in sim.FIGURES)
        worst = max(abs(simulated[f] - truth[f]) for f in sim.FIGURES) / footprint
        rows.append(
            {
                "case": name,
                "simulated": simulated,
                "h100": {f: truth[f] for f in sim.FIGURES},
                "worst_of_footprint": worst,
            }
        )
    return rows


def zoo_rows() -> list[dict]:
    rows = []
    for name in sorted(sim.ZOO_TRUTH):
        for loop in ("held", "loss"):
            prof = sim.simulated_step(name, loop)  # as the H100 measured it
            truth = sim.ZOO_TRUTH[name][loop]["peak"]
            rows.append(
                {
                    "model": name,
                    "loop": loop,
                    "predicted_bytes": prof.peak_bytes,
                    "h100_bytes": truth,
                    "error": prof.peak_bytes / truth - 1,
                }
            )
    return rows


def _mib(n: int) -> str:
    return f"{n / MIB:,.2f}"


def print_tables(ops: list[dict], models: list[dict]) -> None:
    print("| op | saved | held after forward | forward peak | backward peak | worst, of the op's footprint |")
    print("|---|---|---|---|---|---|")
    for r in ops:
        cells = [f"{_mib(r['simulated'][f])} / {_mib(r['h100'][f])}" for f in sim.FIGURES]
        print(f"| {r['case']} | {' | '.join(cells)} | {100 * r['worst_of_footprint']:.2f}% |")
    print("\n(MiB, simulated / H100)\n")
    print("| model | loop | predicted MiB | H100 MiB | error |")
    print("|---|---|---|---|---|")
    for r in models:
        loop = "output held" if r["loop"] == "held" else "loss only"
        print(
            f"| {r['model']} | {loop} | {_mib(r['predicted_bytes'])} | {_mib(r['h100_bytes'])} | "
            f"{100 * r['error']:+.2f}% |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    ops, models = op_rows(), zoo_rows()
    print_tables(ops, models)
    if args.json:
        meta = {
            "date": datetime.date.today().isoformat(),
            "machine": platform.machine(),
            "torch": torch.__version__,
            "truth": "tests/gpu_facts/h100 (H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-26)",
        }
        Path(args.json).write_text(json.dumps({**meta, "ops": ops, "models": models}, indent=1))


if __name__ == "__main__":
    main()
