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
    short = {"params": "P", "buffers": "B", "inputs": "I", "grads": "G", "optimizer": "O", "activations": "A", "temporaries": "T"}
    return " ".join(f"{short[k]} {d[k] / MiB:.1f}" for k in CATEGORIES if d[k])


def pct(a, b):
    return 100.0 * (a - b) / b if b else 0.0


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
        kw = {**kw, **(quick_kw if args.quick else {})}
        profs, secs = {}, {}
        for mode in ("real", "fake"):
            model, inputs, loss_fn = build(name, kw)
            opt = make_optimizer("adam", model)
            t0 = time.perf_counter()
            profs[mode] = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode=mode)
            secs[mode] = time.perf_counter() - t0
            del model, inputs, opt
        r, f = profs["real"], profs["fake"]
        rows.append(
            [
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
        )
        diff_rows.append([label, "real", abbrev(r.at_peak), abbrev(r.end_of_forward)])
        diff_rows.append(["", "fake", abbrev(f.at_peak), abbrev(f.end_of_forward)])
        dif = {k: f.at_peak.as_dict()[k] - r.at_peak.as_dict()[k] for k in CATEGORIES}
        dif_fwd = {k: f.end_of_forward.as_dict()[k] - r.end_of_forward.as_dict()[k] for k in CATEGORIES}
        diff_rows.append(
            ["", "fake − real (bytes)", " ".join(f"{k[0].upper()} {v:+,}" for k, v in dif.items() if v) or "0",
             " ".join(f"{k[0].upper()} {v:+,}" for k, v in dif_fwd.items() if v) or "0"]
        )
        data.append(
            {
                "label": label,
                "model": name,
                "kwargs": kw,
                "real": {"peak": r.peak_bytes, "phase": r.peak_phase, "op": r.peak_op, "at_peak": r.at_peak.as_dict(),
                         "end_of_forward": r.end_of_forward.as_dict(), "activation_bytes": r.activation_bytes, "seconds": secs["real"]},
                "fake": {"peak": f.peak_bytes, "phase": f.peak_phase, "op": f.peak_op, "at_peak": f.at_peak.as_dict(),
                         "end_of_forward": f.end_of_forward.as_dict(), "activation_bytes": f.activation_bytes, "seconds": secs["fake"]},
            }
        )
        print(f"  {label:<60} real {r.peak_bytes / MiB:9.2f}  fake {f.peak_bytes / MiB:9.2f} MiB", flush=True)
    elapsed = time.perf_counter() - t_start
    headers = ["model", "real peak MiB", "fake peak MiB", "fake vs real", "real peak at", "fake peak at",
               "real saved act. MiB", "fake saved act. MiB", "profile s real / fake"]
    table = md_table(headers, rows)
    dtable = md_table(["model", "mode", "breakdown at peak (MiB)", "breakdown at end of forward (MiB)"], diff_rows)
    print()
    print(table)
    print()
    print(dtable)
    print(f"\n{elapsed:.0f} s, threads {args.threads}")
    legend = ("P params, B buffers, I inputs, G grads, O optimizer state, A activations (saved for backward), "
              "T temporaries. One step with Adam; loss = out.sum(), out.loss (HF), or the zoo's loss.")
    write_results(
        "real_vs_fake_quick" if args.quick else "real_vs_fake",
        "remat real mode vs fake mode",
        info,
        "python benchmarks/real_vs_fake.py" + (" --quick" if args.quick else ""),
        [("Peaks", table), ("Breakdowns", legend + "\n\n" + dtable), ("", f"Elapsed {elapsed:.0f} s.")],
        {"cases": data, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
