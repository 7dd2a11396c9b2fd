"""Task: do real mode (measured) and fake mode (predicted, nothing allocated) agree?

For each model, one training step with Adam is profiled twice in this process,
`remat.profile(mode="real")` and `remat.profile(mode="fake")`, and the peaks and the
breakdowns at the peak and at the end of forward are compared.

    python benchmarks/real_vs_fake.py           # 7 models, ~1 min on 2 cores
    python benchmarks/real_vs_fake.py --quick   # smaller sizes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, write_results  # noqa: E402
from _models import build, make_optimizer  # noqa: E402

import remat  # noqa: E402
from remat.types import CATEGORIES  # noqa: E402

CASES = [
    ("MLP: report-001 chain 32×Linear(1024)+ReLU, batch 1024", "chain", {"batch": 1024}, {"batch": 256}),
    ("MLP: report-000 FeedForward 512/2048 ×8, seq 512, batch 8", "ff000", {}, {"seq": 128}),
    ("CNN + BatchNorm (zoo.cnn_bn), batch 64, 64×64", "cnn_bn", {}, {"batch": 16, "size": 32}),
    ("HF GPT-2 4×512, seq 512, batch 2", "gpt2", {}, {"seq": 128}),
    ("HF BERT 4×512, seq 256, batch 4", "bert", {}, {"seq": 64}),
    ("SkipNet 1024 wide, depth 4, batch 4096", "skipnet", {}, {"batch": 512}),
    ("report-002 CNN, batch 100, mse_loss", "cnn002", {}, {}),
]


def abbrev(b) -> str:
    d = b.as_dict()
    short = {
        "params": "P",
        "buffers": "B",
        "inputs": "I",
        "grads": "G",
        "optimizer": "O",
        "activations": "A",
        "temporaries": "T",
    }
    return " ".join(f"{short[k]} {d[k] / MiB:.1f}" for k in CATEGORIES if d[k])


def pct(a, b):
    return 100.0 * (a - b) / b if b else 0.0


def profile_both(name: str, kw: dict) -> tuple[dict, dict]:
    """Real and fake mode profiles of one step with Adam, each on a freshly built model, and their seconds."""
    profs, secs = {}, {}
    for mode in ("real", "fake"):
        model, inputs, loss_fn = build(name, kw)
        opt = make_optimizer("adam", model)
        t0 = time.perf_counter()
        profs[mode] = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode=mode)
        secs[mode] = time.perf_counter() - t0
        del model, inputs, opt
    return profs, secs


def _signed(d: dict) -> str:
    return " ".join(f"{k[0].upper()} {v:+,}" for k, v in d.items() if v) or "0"


def breakdown_rows(label: str, r, f) -> list[list]:
    """The breakdowns of both modes at the peak and at the end of forward, and fake − real in bytes."""
    dif = {k: f.at_peak.as_dict()[k] - r.at_peak.as_dict()[k] for k in CATEGORIES}
    dif_fwd = {k: f.end_of_forward.as_dict()[k] - r.end_of_forward.as_dict()[k] for k in CATEGORIES}
    return [
        [label, "real", abbrev(r.at_peak), abbrev(r.end_of_forward)],
        ["", "fake", abbrev(f.at_peak), abbrev(f.end_of_forward)],
        ["", "fake − real (bytes)", _signed(dif), _signed(dif_fwd)],
    ]


def mode_data(p, seconds: float) -> dict:
    return {
        "peak": p.peak_bytes,
        "phase": p.peak_phase,
        "op": p.peak_op,
        "at_peak": p.at_peak.as_dict(),
        "end_of_forward": p.end_of_forward.as_dict(),
        "activation_bytes": p.activation_bytes,
        "seconds": seconds,
    }


def compare_case(label: str, name: str, kw: dict) -> tuple[list, list[list], dict]:
    profs, secs = profile_both(name, kw)
    r, f = profs["real"], profs["fake"]
    row = [
        label,
        r.peak_bytes / MiB,
        f.peak_bytes / MiB,
        f"{pct(f.peak_bytes, r.peak_bytes):+.3f}%",
        f"{r.peak_phase}/{r.peak_op}",
        f"{f.peak_phase}/{f.peak_op}",
        r.activation_bytes / MiB,
        f.activation_bytes / MiB,
        f"{secs['real']:.1f} / {secs['fake']:.1f}",
    ]
    print(f"  {label:<60} real {r.peak_bytes / MiB:9.2f}  fake {f.peak_bytes / MiB:9.2f} MiB", flush=True)
    return (
        row,
        breakdown_rows(label, r, f),
        {
            "label": label,
            "model": name,
            "kwargs": kw,
            "real": mode_data(r, secs["real"]),
            "fake": mode_data(f, secs["fake"]),
        },
    )


HEADERS = [
    "model",
    "real peak MiB",
    "fake peak MiB",
    "fake vs real",
    "real peak at",
    "fake peak at",
    "real saved act. MiB",
    "fake saved act. MiB",
    "profile s real / fake",
]
LEGEND = (
    "P params, B buffers, I inputs, G grads, O optimizer state, A activations (saved for backward), "
    "T temporaries. One step with Adam; loss = out.sum(), out.loss (HF), or the zoo's loss."
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    t_start = time.perf_counter()
    rows, diff_rows, data = [], [], []
    for label, name, kw, quick_kw in CASES:
        row, diffs, case = compare_case(label, name, {**kw, **(quick_kw if args.quick else {})})
        rows.append(row)
        diff_rows += diffs
        data.append(case)
    elapsed = time.perf_counter() - t_start
    table = md_table(HEADERS, rows)
    dtable = md_table(["model", "mode", "breakdown at peak (MiB)", "breakdown at end of forward (MiB)"], diff_rows)
    print(f"\n{table}\n\n{dtable}\n\n{elapsed:.0f} s, threads {args.threads}")
    write_results(
        "real_vs_fake_quick" if args.quick else "real_vs_fake",
        "remat real mode vs fake mode",
        info,
        "python benchmarks/real_vs_fake.py" + (" --quick" if args.quick else ""),
        [("Peaks", table), ("Breakdowns", LEGEND + "\n\n" + dtable), ("", f"Elapsed {elapsed:.0f} s.")],
        {"cases": data, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
