"""Regression check for the recomputation leak of `torch.utils.module_tracker.ModuleTracker`
(docs/validation.md, "ModuleTracker and non-reentrant checkpoints").

torch's ModuleTracker registers multi-grad hooks on the inputs and outputs of every module
call, also for forwards re-run by a non-reentrant checkpoint inside backward, and keeps them
until it exits: the recomputed tensors then stay alive to the end of backward.  remat's own
`remat._torch_compat.ModuleTracker` registers none during recomputation.  This script runs one
plain step (no remat tracking) under no tracker / torch's / remat's, each in a fresh process
with MALLOC_MMAP_THRESHOLD_=65536, and reads RSS (above the RSS before the model was built)
at the end of backward, after the tracker exits, and the peak (VmHWM; `remat.verifier.process`).

    python benchmarks/moduletracker_leak.py      # 6 fresh processes, 2-8 min on 2 shared cores
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.module_tracker import ModuleTracker as TorchTracker

from remat._torch_compat import ModuleTracker as RematTracker
from remat.verifier.process import high_water_mark_bytes, resident_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, run_fresh, write_results  # noqa: E402
from _models import build  # noqa: E402

CASES = {
    "chain": "report-001 chain, batch 4096, checkpoint_sequential(8), non-reentrant",
    "ff_layers": "8 × checkpoint_wrapper(Linear(1024,4096), ReLU, Linear(4096,1024)), 2048 rows",
}
TRACKERS = {"none": contextlib.nullcontext, "torch": TorchTracker, "remat": RematTracker}
TRACKER_NAMES = {
    "none": "no tracker",
    "torch": "torch.utils.module_tracker.ModuleTracker",
    "remat": "remat._torch_compat.ModuleTracker",
}


def _case(name: str):
    if name == "chain":
        model, x, _ = build("chain", {"batch": 4096}, segments=8)
        return model, x
    torch.manual_seed(0)
    model = nn.Sequential(
        *[checkpoint_wrapper(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))) for _ in range(8)]
    )
    return model, torch.randn(2048, 1024)


def worker(spec: dict) -> dict:
    torch.set_num_threads(2)
    base = resident_bytes()
    model, x = _case(spec["case"])
    out = {}
    with TRACKERS[spec["tracker"]]():
        y = model(x)
        y.sum().backward()
        out["end_of_backward"] = resident_bytes() - base
    out["after_exit"] = resident_bytes() - base
    out["peak"] = high_water_mark_bytes() - base
    return out


def measure_case(case: str, label: str) -> tuple[list, dict]:
    """Every tracker on one case, each in a fresh process: table rows and the results."""
    rows, res = [], {}
    for tr in TRACKERS:
        r = res[tr] = run_fresh("moduletracker_leak.py:worker", {"case": case, "tracker": tr})
        held = r["end_of_backward"] - res["none"]["end_of_backward"]
        rows.append(
            [
                label if tr == "none" else "",
                TRACKER_NAMES[tr],
                r["end_of_backward"] / MiB,
                r["after_exit"] / MiB,
                r["peak"] / MiB,
                f"{held / MiB:+.0f}" if tr != "none" else "",
            ]
        )
        print(
            f"  {case:<10} {tr:<6} end of backward {r['end_of_backward'] / MiB:7.1f}  after exit "
            f"{r['after_exit'] / MiB:7.1f}  peak {r['peak'] / MiB:7.1f} MiB",
            flush=True,
        )
    return rows, {"case": case, "label": label, "results": res}


def main():
    t0 = time.perf_counter()
    info = machine_info(2)
    rows, data = [], []
    for case, label in CASES.items():
        case_rows, case_data = measure_case(case, label)
        rows += case_rows
        data.append(case_data)
    table = md_table(
        [
            "step",
            "tracker",
            "RSS at end of backward MiB",
            "after tracker exit MiB",
            "peak MiB",
            "held at end of backward vs none",
        ],
        rows,
    )
    elapsed = time.perf_counter() - t0
    print(f"\n{table}")
    write_results(
        "moduletracker_leak",
        "ModuleTracker recomputation leak (regression check)",
        info,
        "python benchmarks/moduletracker_leak.py",
        [
            (
                "",
                "RSS above the RSS before the model was built, fresh process per row, one plain step with "
                f"loss out.sum(), no optimizer. Elapsed {elapsed:.0f} s.",
            ),
            ("RSS", table),
        ],
        {"cases": data, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
