"""User report 001 ("more checkpoints, higher memory"): `checkpoint_sequential` over a chain of
32 × [Linear(1024), ReLU] + Sigmoid (65 modules), predicted peak for each number of segments.

Fake mode at batch 8192 (the size of MEASURING.md's process figures), optimizer=None (the
report is about activations), loss out.sum(), use_reentrant=False.  Then real mode at
batch 4096 for a subset, to check that the prediction is the measurement.

For each segment count the script also reads which of the 65 modules re-ran in backward
(`BlockProfile.checkpointed` / `recompute_flops`) and compares with what
torch/utils/checkpoint.py's checkpoint_sequential does: segment_size = 65 // segments; the
first segments - 1 chunks of segment_size modules are checkpointed, and *everything after them*
(the last chunk plus the remainder) runs without checkpointing.

    python benchmarks/report001.py           # ~1 min
    python benchmarks/report001.py --quick   # fewer segment counts, no real-mode check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402
from _models import build  # noqa: E402

import remat  # noqa: E402

N_MODULES = 65
SEGMENTS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 24, 32, 40, 48, 64, 65]
QUICK_SEGMENTS = [0, 1, 2, 4, 8, 10, 16, 32, 64]
REAL_SEGMENTS = [0, 4, 8, 32]
REAL_BATCH = 4096
MEASURING = {0: 1272, 2: 925, 4: 701, 8: 685, 16: 869, 32: 1345}  # MiB, process RSS, batch 8192 (MEASURING.md)


def expected_plain(segments: int) -> int:
    """Modules run without checkpointing by checkpoint_sequential (torch/utils/checkpoint.py)."""
    if segments == 0:
        return N_MODULES
    size = N_MODULES // segments
    return N_MODULES - size * (segments - 1)


def profile(segments: int, batch: int, mode: str):
    model, x, _ = build("chain", {"batch": batch}, segments=segments)
    t0 = time.perf_counter()
    prof = remat.profile(model, x, mode=mode)
    return prof, time.perf_counter() - t0


def rerun_in_backward(segments: int) -> list[int]:
    """Indices of the chain modules whose forward ran again during backward, seen by plain
    forward-pre-hooks on an untracked step (batch 16): torch's behaviour, independent of remat."""
    model, x, _ = build("chain", {"batch": 16}, segments=segments)
    seq = model.seq if segments else model
    seen: set[int] = set()
    handles = [
        m.register_forward_pre_hook(
            lambda mod, args, i=i: seen.add(i) if torch._C._current_graph_task_id() != -1 else None
        )
        for i, m in enumerate(seq)
    ]
    model(x).sum().backward()
    for h in handles:
        h.remove()
    return sorted(seen)


def remat_flags(prof) -> list[int]:
    """Chain modules remat marks as checkpointed (BlockProfile.checkpointed)."""
    return sorted(int(b.name.split(".")[-1]) for b in prof.blocks if b.checkpointed and b.name.split(".")[-1].isdigit())


def span(ix: list[int]) -> str:
    if not ix:
        return "none"
    return f"{ix[0]}–{ix[-1]} ({len(ix)})" if ix == list(range(ix[0], ix[-1] + 1)) else f"{len(ix)} modules"


def torch_rule(s: int, rerun: list[int], batch: int, recompute_flops: int) -> dict:
    """What checkpoint.py's remainder rule says for s segments, against the modules that re-ran."""
    exp = expected_plain(s)
    size = N_MODULES // s if s else 0
    inside = list(range(N_MODULES - exp))  # modules inside checkpointed chunks, per checkpoint.py
    # every re-run module is inside a checkpointed chunk, none of the trailing `exp` modules re-runs
    ok = set(rerun) <= set(inside) and not any(i >= N_MODULES - exp for i in rerun)
    # a Linear that ends its chunk saves only its input, packed before its matmul runs: the
    # non-reentrant early stop ends the recomputation there, so that matmul is never re-run
    ends = {size * (c + 1) - 1 for c in range(s - 1)} if s else set()
    linears = sum(1 for i in rerun if i % 2 == 0 and i < 64 and i not in ends)
    return {
        "segment_size": size,
        "inside_checkpoints": inside,
        "expected_plain": exp,
        "matches_torch_source": ok,
        "recompute_flops_as_expected": recompute_flops == linears * 2 * batch * 1024 * 1024,
    }


def sweep_point(s: int, batch: int) -> tuple[list, dict]:
    """One segment count: fake-mode peak, the modules that re-ran against torch's rule, the reentrant variant."""
    prof, dt = profile(s, batch, "fake")
    rerun = rerun_in_backward(s)
    rule = torch_rule(s, rerun, batch, prof.recompute_flops)
    re_model, re_x, _ = build("chain", {"batch": batch}, segments=s, use_reentrant=True)
    re_x.requires_grad_(True)
    re_peak = remat.profile(re_model, re_x, mode="fake").peak_bytes
    flags = remat_flags(prof)
    ref = MEASURING.get(s) if batch == 8192 else None
    exp = rule["expected_plain"]
    row = [
        "no checkpoint" if s == 0 else s,
        rule["segment_size"] or "",
        span(rule["inside_checkpoints"]),
        span(rerun),
        f"{exp} (modules {N_MODULES - exp}–64)",
        "yes" if rule["matches_torch_source"] else "NO",
        prof.peak_bytes / MiB,
        f"{prof.peak_bytes / (batch * 1024 * 4):.1f}",
        f"{prof.peak_phase}/{prof.peak_op}",
        f"{prof.recompute_flops / 1e9:,.0f}" + ("" if rule["recompute_flops_as_expected"] else " (≠ expected!)"),
        "yes" if flags == rerun else f"NO: {len(flags)} flagged, {len(set(flags) ^ set(rerun))} wrong",
        re_peak / MiB,
        "" if ref is None else ref,
    ]
    print(
        f"  segments {s:3d}: peak {prof.peak_bytes / MiB:8.1f} MiB, re-run {len(rerun):2d}, trailing plain "
        f"{exp:2d}, recompute {prof.recompute_flops / 1e9:,.0f} GFLOP, remat flags "
        f"{'ok' if flags == rerun else 'WRONG'}  [{dt:.1f} s]",
        flush=True,
    )
    return row, {
        "segments": s,
        **rule,
        "rerun_in_backward": rerun,
        "not_rerun": [i for i in range(N_MODULES) if i not in rerun],
        "remat_checkpointed_flags": flags,
        "remat_flags_match": flags == rerun,
        "reentrant_input_grad_peak": re_peak,
        "peak_bytes": prof.peak_bytes,
        "peak_phase": prof.peak_phase,
        "peak_op": prof.peak_op,
        "recompute_flops": prof.recompute_flops,
        "activation_bytes": prof.activation_bytes,
        "measuring_md_mib": ref,
        "profile_s": dt,
    }


def real_check() -> tuple[str, list]:
    """Real mode against fake mode at REAL_BATCH for REAL_SEGMENTS."""
    rows, data = [], []
    for s in REAL_SEGMENTS:
        r, dr = profile(s, REAL_BATCH, "real")
        f, _ = profile(s, REAL_BATCH, "fake")
        rows.append(
            [
                "no checkpoint" if s == 0 else s,
                r.peak_bytes / MiB,
                f.peak_bytes / MiB,
                f"{100 * (f.peak_bytes - r.peak_bytes) / r.peak_bytes:+.2f}%",
                f"{r.recompute_flops / 1e9:,.0f} / {f.recompute_flops / 1e9:,.0f}",
                f"{dr:.1f}",
            ]
        )
        data.append(
            {
                "segments": s,
                "real_peak": r.peak_bytes,
                "fake_peak": f.peak_bytes,
                "real_recompute_flops": r.recompute_flops,
                "fake_recompute_flops": f.recompute_flops,
            }
        )
        print(
            f"  real check, segments {s}: real {r.peak_bytes / MiB:.1f}  fake {f.peak_bytes / MiB:.1f} MiB", flush=True
        )
    return md_table(
        ["segments", "real peak MiB", "fake peak MiB", "fake vs real", "recompute GFLOP real / fake", "real profile s"],
        rows,
    ), data


HEADERS = [
    "segments",
    "segment size",
    "inside checkpointed chunks (checkpoint.py)",
    "re-run in backward (hooks)",
    "run plain (remainder)",
    "hooks agree",
    "predicted peak MiB",
    "peak / activation",
    "peak at",
    "recompute GFLOP",
    "remat BlockProfile.checkpointed = re-run?",
    "predicted, use_reentrant=True + input requires grad",
    "MEASURING.md process MiB",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    t_start = time.perf_counter()
    rows, data = zip(*(sweep_point(s, args.batch) for s in (QUICK_SEGMENTS if args.quick else SEGMENTS)))
    table = md_table(HEADERS, list(rows))
    best = min(data, key=lambda d: d["peak_bytes"])
    print(f"\n{table}\n\nlowest predicted peak: segments={best['segments']} ({best['peak_bytes'] / MiB:.1f} MiB)")
    real_table, real_data = ("", []) if args.quick else real_check()
    if real_table:
        print(f"\n{real_table}")
    elapsed = time.perf_counter() - t_start
    print(f"\n{elapsed:.0f} s, threads {args.threads}")
    notes = (
        f"Fake mode, batch {args.batch}, optimizer=None, loss out.sum(), checkpoint_sequential(use_reentrant=False). "
        f"One activation (batch × 1024 float32) = {args.batch * 1024 * 4 / MiB:.0f} MiB. 'modules not checkpointed' lists the chain "
        "modules whose forward re-ran during backward, seen by forward-pre-hooks on a plain untracked step; "
        "'run plain' is 65 − (65 // segments) × (segments − 1), the trailing modules checkpoint.py runs "
        "without checkpoint; 'hooks agree' checks that none of them re-ran. Recompute GFLOP is remat's "
        "recompute_flops, checked against 2·batch·1024² per re-run Linear that does not end its chunk. "
        f"Elapsed {elapsed:.0f} s."
    )
    sections = [("", notes), (f"Predicted peak per segment count (batch {args.batch})", table)]
    if real_table:
        sections.append((f"Real mode vs fake mode (batch {REAL_BATCH})", real_table))
    write_results(
        "report001_quick" if args.quick else "report001",
        "User report 001: checkpoint_sequential segments",
        info,
        "python benchmarks/report001.py" + (" --quick" if args.quick else ""),
        sections,
        {"sweep": list(data), "real_check": real_data, "elapsed_s": elapsed, "batch": args.batch},
    )


if __name__ == "__main__":
    main()
