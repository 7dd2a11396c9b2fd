"""What a compiler-budget plan costs the host per step, beyond torch.compile's own budget.

A = `torch.compile(model)` compiled under torch's own activation memory budget (set only while it compiles);
B = a copy, `torch.compile(copy)` following remat's plan of the same budget (`Plan.compiler_budget`).  Both are
partitioned under the same budget, so the difference is remat's call around the compiled model (NOTE [The
compiler's budget as a plan]).  Timed as `apply_overhead.py`'s pairs: interleaved rounds, one forward + backward
each, the median of the per-round ratios B / A.  On tiny Llama-style decoders, where a step's host work shows.

    python benchmarks/budget_overhead.py [--rounds N] [--layers 2,8] [--budget 0.7]

Writes benchmarks/results/budget_overhead.md and .json (dated, machine, torch, threads).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn as nn

import remat
from remat import zoo
from remat._torch_compat.compiler import activation_memory_budget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402
from _models import Switch  # noqa: E402
from apply_overhead import nothing, pair, step  # noqa: E402


class Either(nn.Module):
    """Two compiled models behind one, the one in use switched between rounds (`pair` steps one model)."""

    def __init__(self, a: nn.Module, b: nn.Module) -> None:
        super().__init__()
        self.both, self.using = nn.ModuleList([a, b]), 0

    def forward(self, **inputs):
        return self.both[self.using](**inputs)


def measure(layers: int, budget: float, rounds: int) -> dict:
    """The pair on a Llama-style decoder of `layers` layers (hidden 64, seq 32, batch 2)."""
    torch.manual_seed(0)
    model, inputs = zoo.llama(n_layer=layers, hidden=64, heads=4, seq=32, batch=2, vocab=256)
    theirs, ours = torch.compile(model), torch.compile(copy.deepcopy(model))
    with activation_memory_budget(budget):  # as a script sets it, here only while this one compiles
        step(theirs, inputs)
    keep = remat.plan(remat.profile(ours, inputs), 1.0)
    remat.apply(ours, dataclasses.replace(keep, compiler_budget=budget))
    either = Either(theirs, ours)

    def use(i: int):
        return lambda: setattr(either, "using", i)

    a = Switch(f"torch.compile under torch's own budget {budget:g}", use(0), nothing)
    b = Switch(f"torch.compile following remat's plan of budget {budget:g}", use(1), nothing)
    return pair(either, inputs, a, b, rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--layers", default="2,8", help="comma-separated decoder depths")
    ap.add_argument("--budget", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows, data = [], {}
    for layers in [int(n) for n in args.layers.split(",")]:
        res = measure(layers, args.budget, args.rounds)
        extra_ms = (res["b_median_s"] - res["a_median_s"]) * 1e3
        rows.append(
            [
                f"zoo.llama({layers} x 64, seq 32, batch 2)",
                f"{res['a_median_s'] * 1e3:.3f}",
                f"{res['b_median_s'] * 1e3:.3f}",
                f"{extra_ms:+.3f}",
                f"{res['ratio_median']:.3f}",
                f"{res['ratio_min']:.3f}–{res['ratio_max']:.3f}",
            ]
        )
        data[str(layers)] = res
        print(f"{layers} layers: {res['a_median_s'] * 1e3:.3f} vs {res['b_median_s'] * 1e3:.3f} ms", flush=True)
    headers = ["model", "A median ms", "B median ms", "B - A ms", "median ratio B / A", "range"]
    text = (
        f"A: torch.compile under torch's own budget {args.budget:g}; B: a copy following remat's plan of that "
        f"budget.  {args.rounds} interleaved rounds after one warm-up round (A first in even rounds), one forward + "
        "backward each; ratio = B / A within the round, median over rounds.\n\n" + md_table(headers, rows)
    )
    command = (
        f"python benchmarks/budget_overhead.py --rounds {args.rounds} --layers {args.layers} --budget {args.budget:g}"
    )
    path = write_results(
        "budget_overhead",
        "What a compiler-budget plan costs the host per step",
        machine_info(args.threads),
        command,
        [("Results", text)],
        {"budget": args.budget, "rounds": args.rounds, "results": data},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
