"""Check the peers benchmark's process-peak method (one worker per model, peak RSS reset before
each step with /proc/self/clear_refs) against MEASURING.md's fresh-process method (one
interpreter per measurement, RSS before the model is built, VmHWM after the step).

Report 001's chain (32 x [Linear(1024), ReLU] + Sigmoid, the flat nn.Sequential of
benchmarks/_models.py) under checkpoint_sequential(0, 2, 4, 8, 16, 32), Adam:
  fresh     benchmarks/_worker.py method "process", one interpreter per segment count
  reset     benchmarks/peers/measure.rss_step_peak, all segment counts in one interpreter

    python benchmarks/peers/validate_reset.py [--batch 2048]     # ~2 min at batch 2048 on 2 cores

Writes benchmarks/results/peers_validate.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import WORKER, MiB, machine_info, main_or_worker, md_table, results_markdown, run_fresh  # noqa: E402
from _models import build  # noqa: E402
from measure import adam, rss_step_peak, step  # noqa: E402

SEGMENTS = (0, 2, 4, 8, 16, 32)
ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


class _Bench:
    def __init__(self, model, x):
        self.model, self.inputs = model, x


def in_process(spec: dict) -> dict:
    """Runs inside a fresh interpreter started by main(): every segment count, peak reset between."""
    torch.set_num_threads(spec["threads"])
    out = {}
    warm, x0, _ = build("chain", {"batch": 64})
    step(_Bench(warm, x0), lambda: warm(x0).sum(), adam(warm))  # noqa: F821  first-call costs out of the way
    del warm
    for s in SEGMENTS:
        model, x, _ = build("chain", {"batch": spec["batch"]}, segments=s)
        b = _Bench(model, x)
        out[s] = rss_step_peak(b, lambda: model(x).sum())  # noqa: F821  (called before the del below)
        del model, x, b
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    reset = {
        int(k): v for k, v in run_fresh(__file__, {"batch": args.batch, "threads": args.threads}, env_extra=ENV).items()
    }
    rows = []
    for s in SEGMENTS:
        fresh = run_fresh(
            WORKER,
            {
                "model": "chain",
                "kwargs": {"batch": args.batch},
                "segments": s,
                "method": "process",
                "optimizer": "adam",
                "threads": args.threads,
            },
            env_extra=ENV,
        )
        f = fresh["proc_peak"]
        rows.append(
            [
                f"checkpoint_sequential({s})" if s else "no checkpointing",
                f / MiB,
                reset[s] / MiB,
                f"{(reset[s] - f) / MiB:+.1f}",
                f"{(reset[s] - f) / f:+.1%}",
            ]
        )
        print(rows[-1], flush=True)
    text = results_markdown(
        "The peers benchmark's process-peak method against MEASURING.md's fresh-process method",
        machine_info(args.threads),
        f"python benchmarks/peers/validate_reset.py --batch {args.batch}",
        [
            (
                "",
                f"Report 001's chain, 32 × [Linear(1024), ReLU] + Sigmoid, batch {args.batch}, Adam, "
                "MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1 OMP_WAIT_POLICY=PASSIVE. fresh = one interpreter per row "
                "(RSS before the model is built, VmHWM after the step; benchmarks/_worker.py). reset = all rows in one "
                "interpreter, VmHWM reset before each step, VmHWM − RSS before the step + parameters and inputs "
                "(benchmarks/peers/measure.py). The difference is the first step's one-time costs in the fresh figure "
                "(libraries paged in, thread pools, allocator arenas), which the reset figure does not carry.",
            ),
            ("", md_table(["strategy", "fresh MiB", "reset MiB", "reset − fresh MiB", "relative"], rows)),
        ],
    )
    out = HERE.parent / "results" / "peers_validate.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main_or_worker(main, in_process)
