"""How much slower is a training step under `remat.profile(mode="real")` than the same step
untracked?  And how long does a fake-mode profile of a GPT-2-medium-sized model take?

Real mode: after one warm-up of each, A = the untracked step (forward, loss, backward, Adam
step; fresh Adam and no grads each time, as remat's step sees them) and B = remat.profile of
the same step are run interleaved A B A B ... in this process; the figure is the median of the
per-pair ratios B/A (MEASURING.md).  Both the whole `remat.profile` call (snapshot, tracking,
restore) and its tracked step alone (`StepProfile.step_s`) are reported.  Target: ≤ 3x.

Fake mode: GPT-2 medium's shape (24 layers, 1024 wide, 16 heads, 50257 tokens, seq 1024,
batch 8), built under FakeTensorMode (nothing allocated), profiled with Adam, device "cuda"
simulated.  Target: < 30 s.

    python benchmarks/overhead.py            # 7 pairs per model, ~4 min
    python benchmarks/overhead.py --quick    # 3 pairs per model
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402
from _models import build, plain_step  # noqa: E402

import remat  # noqa: E402

CASES = [
    ("report-001 chain 32×Linear(1024), batch 512", "chain", {"batch": 512}),
    ("report-000 FeedForward 512/2048 ×8, seq 256, batch 8", "ff000", {"seq": 256}),
    (
        "HF GPT-2 (zoo default: 4×256, seq 256, batch 8)",
        "gpt2",
        {"n_layer": 4, "n_embd": 256, "n_head": 4, "seq": 256, "batch": 8},
    ),
]


def adam(params):
    return torch.optim.Adam(params)


def time_plain(model, inputs, loss_fn) -> float:
    for p in model.parameters():
        p.grad = None
    opt = adam(model.parameters())
    t0 = time.perf_counter()
    plain_step(model, inputs, loss_fn, opt)
    dt = time.perf_counter() - t0
    for p in model.parameters():
        p.grad = None
    return dt


def time_remat(model, inputs, loss_fn) -> tuple[float, float]:
    opt = adam(model.parameters())
    t0 = time.perf_counter()
    prof = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode="real")
    return time.perf_counter() - t0, prof.step_s


def fake_gpt2_medium(seq: int, batch: int):
    t0 = time.perf_counter()
    model, inputs, _ = build("gpt2_medium", {"seq": seq, "batch": batch}, fake=True)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    prof = remat.profile(model, inputs, optimizer=adam, mode="fake", device="cuda")
    t_prof = time.perf_counter() - t0
    nparams = sum(p.numel() for p in model.parameters())
    return prof, t_build, t_prof, nparams


def real_mode(label: str, name: str, kw: dict, pairs: int) -> tuple[list, dict]:
    """Interleaved pairs (untracked step, remat.profile) on one model after one warm-up of each."""
    model, inputs, loss_fn = build(name, kw)
    time_plain(model, inputs, loss_fn)  # warm-up
    time_remat(model, inputs, loss_fn)
    a, b, s = [], [], []
    for _ in range(pairs):
        a.append(time_plain(model, inputs, loss_fn))
        tb, ts = time_remat(model, inputs, loss_fn)
        b.append(tb)
        s.append(ts)
    ratios = [y / x for x, y in zip(a, b)]
    step_ratios = [y / x for x, y in zip(a, s)]
    med, med_step = statistics.median(ratios), statistics.median(step_ratios)
    print(
        f"  {label:<55} plain {statistics.median(a):6.2f} s  profile {statistics.median(b):6.2f} s  "
        f"ratio {med:.2f}x (tracked step alone {med_step:.2f}x)",
        flush=True,
    )
    row = [
        label,
        f"{statistics.median(a):.2f}",
        f"{statistics.median(b):.2f}",
        f"{med:.2f}x",
        f"{min(ratios):.2f}–{max(ratios):.2f}",
        f"{med_step:.2f}x",
        "met" if med <= 3 else "MISSED",
    ]
    return row, {
        "label": label,
        "model": name,
        "kwargs": kw,
        "plain_s": a,
        "profile_s": b,
        "tracked_step_s": s,
        "ratios": ratios,
        "median_ratio": med,
        "median_tracked_step_ratio": med_step,
    }


def fake_mode(seq: int = 1024, batch: int = 8) -> tuple[str, dict]:
    """The fake-mode profile of GPT-2 medium's shape: its table and its data."""
    prof, t_build, t_prof, nparams = fake_gpt2_medium(seq, batch)
    row = [
        f"GPT-2 medium shape ({nparams / 1e6:.0f}M params), seq {seq}, batch {batch}, Adam, device cuda",
        f"{t_build:.1f}",
        f"{t_prof:.1f}",
        f"{prof.peak_bytes / 2**30:.2f} GiB",
        f"{prof.peak_phase}/{prof.peak_op}",
        len(prof.timeline),
        "met" if t_prof < 30 else "MISSED",
    ]
    table = md_table(
        [
            "model",
            "build under FakeTensorMode s",
            "remat.profile(mode='fake') s",
            "predicted peak",
            "peak at",
            "ops tracked",
            "< 30 s",
        ],
        [row],
    )
    return table, {
        "build_s": t_build,
        "profile_s": t_prof,
        "peak_bytes": prof.peak_bytes,
        "peak_phase": prof.peak_phase,
        "params": nparams,
        "ops": len(prof.timeline),
        "at_peak": prof.at_peak.as_dict(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pairs = args.pairs or (3 if args.quick else 7)
    info = machine_info(args.threads)
    t_start = time.perf_counter()
    rows, data = zip(*(real_mode(label, name, kw, pairs) for label, name, kw in CASES))
    table = md_table(
        [
            "model",
            "untracked step s (median)",
            "remat.profile s (median)",
            "median ratio",
            "ratio range",
            "tracked step alone / untracked",
            "≤ 3x",
        ],
        list(rows),
    )
    fake_table, fake_data = fake_mode()
    elapsed = time.perf_counter() - t_start
    print(f"\n{table}\n\n{fake_table}\n\n{elapsed:.0f} s; torch threads {args.threads}; {pairs} pairs per model")
    notes = (
        f"torch.set_num_threads({args.threads}); {pairs} interleaved pairs per model after one warm-up each; "
        "ratio = remat.profile wall time / untracked step wall time, per pair, median. Times on this shared "
        f"machine drift by up to 2x between runs; the ratios are the figure to quote. Elapsed {elapsed:.0f} s."
    )
    write_results(
        "overhead_quick" if args.quick else "overhead",
        "Profiling overhead",
        info,
        "python benchmarks/overhead.py" + (" --quick" if args.quick else ""),
        [
            ("", notes),
            ("Real mode: remat.profile vs the untracked step", table),
            ("Fake mode: GPT-2 medium", fake_table),
        ],
        {"real": list(data), "fake_gpt2_medium": fake_data, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
