"""What checkpointing itself costs per op on this machine's CPU, beyond the ops it re-runs: the figures behind
`remat.measure.device.roofline.HOST_CHECKPOINT_OP_S` and `HOST_SELECTIVE_OP_S` (NOTE [The seconds of a step], Rule 5).

A chain of small ops (linear, silu, mul, add on 4x64 tensors, whose kernels take next to nothing) runs forward
and backward plain, under a non-reentrant checkpoint, and under a selective checkpoint that saves nothing;
best of 15 each.  Per op re-run, a checkpoint costs (checkpoint - plain - forward) / ops; per op and pass, the
selective policy costs (selective - checkpoint) / (2 ops).  Each process measures once, as a profile used to
(its figures moved 2-3x from one process to the next, which is why profiles no longer measure them).

    python benchmarks/checkpoint_overheads.py [--processes N]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

from _common import machine_info, md_table, run_fresh, write_results  # noqa: E402
from remat.measure.device.roofline import HOST_CHECKPOINT_OP_S, HOST_SELECTIVE_OP_S  # noqa: E402
from remat.measure.timing import best_of  # noqa: E402

CHAIN = 50
REPEATS = 15
US = 1e-6


def worker(spec: dict) -> dict:
    """One process's measurement, in microseconds."""
    torch.set_num_threads(spec["threads"])
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(4, 64, requires_grad=True)

    def f(h):
        for _ in range(CHAIN // 5):
            a = nn.functional.linear(h, w)
            h = nn.functional.silu(a) * a + h
        return h

    nothing_saved = functools.partial(
        create_selective_checkpoint_contexts, lambda *a, **k: CheckpointPolicy.PREFER_RECOMPUTE
    )
    runs = {
        "forward": lambda: f(x),
        "plain": lambda: f(x).sum().backward(),
        "checkpoint": lambda: checkpoint(f, x, use_reentrant=False).sum().backward(),
        "selective": lambda: checkpoint(f, x, use_reentrant=False, context_fn=nothing_saved).sum().backward(),
    }
    best = {name: best_of(run, REPEATS) for name, run in runs.items()}
    return {
        "checkpoint_op_us": (best["checkpoint"] - best["plain"] - best["forward"]) / CHAIN / US,
        "selective_op_us": (best["selective"] - best["checkpoint"]) / (2 * CHAIN) / US,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    info = machine_info(threads=2)
    runs = [run_fresh("checkpoint_overheads.py:worker", {"threads": 2}) for _ in range(args.processes)]
    rows = []
    for key, constant in (("checkpoint_op_us", HOST_CHECKPOINT_OP_S), ("selective_op_us", HOST_SELECTIVE_OP_S)):
        values = sorted(r[key] for r in runs)
        rows.append(
            [key, f"{values[0]:.1f}", f"{statistics.median(values):.1f}", f"{values[-1]:.1f}", f"{constant / US:g}"]
        )
    table = md_table(["per op", "min us", "median us", "max us", "remat's constant us"], rows)
    print(table)
    command = f"python benchmarks/checkpoint_overheads.py --processes {args.processes}"
    path = write_results(
        "checkpoint_overheads",
        "Checkpointing's own cost per op, one measurement per process",
        info,
        command,
        [(f"{args.processes} fresh processes, best of {REPEATS} each", table)],
        {"runs": runs},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
