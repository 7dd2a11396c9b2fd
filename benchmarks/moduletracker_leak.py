"""Regression check for the recomputation leak of `torch.utils.module_tracker.ModuleTracker`
(docs/validation.md, "ModuleTracker and non-reentrant checkpoints").

torch's ModuleTracker registers multi-grad hooks on the inputs and outputs of every module
call, also for forwards re-run by a non-reentrant checkpoint inside backward, and keeps them
until it exits: the recomputed tensors then stay alive to the end of backward.  remat's own
`remat._torch_compat.ModuleTracker` registers none during recomputation.  This script runs one
plain step (no remat tracking) under no tracker / torch's / remat's, each in a fresh process
with MALLOC_MMAP_THRESHOLD_=65536, and reads RSS (above the RSS before the model was built)
at the end of backward, after the tracker exits, and the peak (ru_maxrss).

    python benchmarks/moduletracker_leak.py      # 6 fresh processes, 2-8 min on 2 shared cores
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = {
    "chain": "report-001 chain, batch 4096, checkpoint_sequential(8), non-reentrant",
    "ff_layers": "8 × checkpoint_wrapper(Linear(1024,4096), ReLU, Linear(4096,1024)), 2048 rows",
}
TRACKERS = ("none", "torch", "remat")


def worker(spec: dict) -> dict:
    import torch
    import torch.nn as nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.module_tracker import ModuleTracker as TorchTracker

    from remat._torch_compat import ModuleTracker as RematTracker
    from _models import build

    torch.set_num_threads(2)
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    base = rss()
    if spec["case"] == "chain":
        model, x, _ = build("chain", {"batch": 4096}, segments=8)
    else:
        torch.manual_seed(0)
        model = nn.Sequential(
            *[checkpoint_wrapper(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))) for _ in range(8)]
        )
        x = torch.randn(2048, 1024)
    tracker = {"none": contextlib.nullcontext, "torch": TorchTracker, "remat": RematTracker}[spec["tracker"]]()
    out = {}
    with tracker:
        y = model(x)
        y.sum().backward()
        out["end_of_backward"] = rss() - base
    out["after_exit"] = rss() - base
    out["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return out


def main():
    from _common import MiB, RSS_ENV, machine_info, md_table, write_results

    t0 = time.perf_counter()
    info = machine_info(2)
    rows, data = [], []
    for case, label in CASES.items():
        res = {}
        for tr in TRACKERS:
            env = {**os.environ, **RSS_ENV, "PYTHONWARNINGS": "ignore"}
            p = subprocess.run([sys.executable, __file__, "--worker", json.dumps({"case": case, "tracker": tr})],
                               env=env, capture_output=True, text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                raise RuntimeError(p.stderr[-2000:])
            res[tr] = json.loads(line[0][7:])
            r = res[tr]
            rows.append([label if tr == "none" else "", {"none": "no tracker", "torch": "torch.utils.module_tracker.ModuleTracker",
                                                          "remat": "remat._torch_compat.ModuleTracker"}[tr],
                         r["end_of_backward"] / MiB, r["after_exit"] / MiB, r["peak"] / MiB,
                         f"{(r['end_of_backward'] - res['none']['end_of_backward']) / MiB:+.0f}" if tr != "none" else ""])
            print(f"  {case:<10} {tr:<6} end of backward {r['end_of_backward'] / MiB:7.1f}  after exit "
                  f"{r['after_exit'] / MiB:7.1f}  peak {r['peak'] / MiB:7.1f} MiB", flush=True)
        data.append({"case": case, "label": label, "results": res})
    table = md_table(["step", "tracker", "RSS at end of backward MiB", "after tracker exit MiB", "peak MiB",
                      "held at end of backward vs none"], rows)
    elapsed = time.perf_counter() - t0
    print()
    print(table)
    write_results("moduletracker_leak", "ModuleTracker recomputation leak (regression check)", info,
                  "python benchmarks/moduletracker_leak.py",
                  [("", "RSS above the RSS before the model was built, fresh process per row, one plain step with "
                        f"loss out.sum(), no optimizer. Elapsed {elapsed:.0f} s."), ("RSS", table)],
                  {"cases": data, "elapsed_s": elapsed})


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        main()
