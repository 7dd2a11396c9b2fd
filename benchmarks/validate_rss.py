"""Task: is remat's real-mode peak the process's own peak?  (MEASURING.md, "Memory")

For each model, three fresh interpreters (MALLOC_MMAP_THRESHOLD_=65536, MKL_DISABLE_FAST_MM=1):
  process        plain untracked step: peak RSS (VmHWM) after it minus statm RSS before the model is built
  remat          remat.profile(mode="real").peak_bytes
  MemTracker     torch.distributed._tools.mem_tracker.MemTracker peak over the same plain step
Also, per model kind, the same at a tiny size: process − remat there is the fixed overhead of the
procedure (interpreter, autograd engine, library code paged in), not tensor memory.

    python benchmarks/validate_rss.py            # full: chain at batch 8192 (20-40 min on 2 shared cores)
    python benchmarks/validate_rss.py --quick    # chain at batch 4096, segments 0, 8, 32 (~5 min)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import STEP, MiB, machine_info, md_table, run_fresh, write_results  # noqa: E402

MEASURING = {0: 1272, 2: 925, 4: 701, 8: 685, 16: 869, 32: 1345}  # MiB, MEASURING.md, batch 8192
METHODS = ("process", "remat", "memtracker")
TINY = {"chain": {"batch": 8}, "gpt2": {"batch": 1, "seq": 16}, "ff000": {"batch": 1, "seq": 8}}


def cases(quick: bool):
    batch = 4096 if quick else 8192
    segs = (0, 8, 32) if quick else (0, 2, 4, 8, 16, 32)
    out = []
    for s in segs:
        label = f"chain 32×[Linear(1024),ReLU]+Sigmoid, batch {batch}, " + (
            "no checkpoint" if s == 0 else f"checkpoint_sequential({s})"
        )
        out.append({"label": label, "model": "chain", "kwargs": {"batch": batch}, "segments": s})
    out.append(
        {"label": "HF GPT-2 4 layers × 512, seq 512, batch 2, vocab 8192", "model": "gpt2", "kwargs": {}, "segments": 0}
    )
    out.append(
        {"label": "report-000 FeedForward 512/2048 ×8, seq 512, batch 8", "model": "ff000", "kwargs": {}, "segments": 0}
    )
    return out


def pct(a, b):
    return 100.0 * (a - b) / b


def measure_case(c: dict, args) -> tuple[list, dict]:
    """One model, each method in its own fresh interpreter: a table row and its data."""
    res = {}
    for m in METHODS:
        spec = {**c, "method": m, "optimizer": args.optimizer, "threads": args.threads}
        spec.pop("label")
        res[m] = run_fresh(STEP, spec)
        print(f"  {c['label']:<70} {m:<14} {res[m].get('peak', res[m]['proc_peak']) / MiB:9.1f} MiB", flush=True)
    proc = res["process"]["proc_peak"]
    r, mt = res["remat"], res["memtracker"]
    ref = MEASURING.get(c["segments"]) if (c["model"] == "chain" and c["kwargs"]["batch"] == 8192) else None
    row = [
        c["label"],
        proc / MiB,
        r["peak"] / MiB,
        f"{pct(r['peak'], proc):+.1f}%",
        f"{r['peak_phase']}/{r['peak_op']}",
        mt["peak"] / MiB,
        f"{pct(mt['peak'], proc):+.1f}%",
        r["proc_peak"] / MiB,
        "" if ref is None else ref,
    ]
    return row, {"case": c, "results": res, "measuring_md_mib": ref}


def tiny_overhead(args) -> tuple[str, list]:
    """The fixed overhead of the procedure, from tiny runs: process − remat."""
    rows, data = [], []
    for model, kw in TINY.items():
        res = {
            m: run_fresh(
                STEP,
                {"model": model, "kwargs": kw, "method": m, "optimizer": args.optimizer, "threads": args.threads},
            )
            for m in ("process", "remat")
        }
        proc, rem = res["process"]["proc_peak"], res["remat"]["peak"]
        rows.append([f"{model} {kw}", proc / MiB, rem / MiB, (proc - rem) / MiB])
        data.append({"model": model, "kwargs": kw, "results": res})
    return md_table(["tiny model", "process MiB", "remat MiB", "fixed overhead MiB"], rows), data


HEADERS = [
    "model",
    "process MiB",
    "remat MiB",
    "remat vs proc",
    "remat peak at",
    "MemTracker MiB",
    "MT vs proc",
    "RSS of the remat process",
    "MEASURING.md MiB",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--optimizer", default="adam")
    args = ap.parse_args()
    t_start = time.perf_counter()
    info = machine_info(args.threads)
    rows, data = zip(*(measure_case(c, args) for c in cases(args.quick)))
    table = md_table(HEADERS, list(rows))
    tiny_table, tiny_data = tiny_overhead(args)
    elapsed = time.perf_counter() - t_start
    print(f"\n{table}\n\n{tiny_table}\n\n{elapsed:.0f} s; threads {args.threads}; optimizer {args.optimizer}")
    notes = (
        "process = peak RSS (VmHWM) after one plain step − statm RSS before the model is built, fresh interpreter, "
        "MALLOC_MMAP_THRESHOLD_=65536 MKL_DISABLE_FAST_MM=1. remat = `remat.profile(mode='real').peak_bytes` in "
        "its own fresh interpreter. MemTracker = peak Total of "
        "`torch.distributed._tools.mem_tracker.MemTracker` around the plain step. 'RSS of the remat process' = "
        "that process's own peak (the cost of profiling: parameter snapshot, records). "
        f"Optimizer: {args.optimizer}. checkpoint_sequential with use_reentrant=False. Elapsed {elapsed:.0f} s."
    )
    write_results(
        "validate_rss_quick" if args.quick else "validate_rss",
        "remat real-mode peak vs the process's own peak",
        info,
        "python benchmarks/validate_rss.py" + (" --quick" if args.quick else ""),
        [("", notes), ("Peaks", table), ("Fixed overhead of the procedure (tiny models)", tiny_table)],
        {"cases": list(data), "tiny": tiny_data, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
