"""Fit the kernel-scratch models remat ships for fake mode (NOTE [Kernel scratch], Rule 3).

Runs conv nets and transformers (with dropout) of the zoo at a few sizes, measures each op's scratch in a copy of this process
(as `remat.profile` does in real mode), and fits, per op with scratch, bytes of scratch per byte
of the op's inputs or outputs (whichever explains it: the median ratio over the ops seen).
Writes src/remat/measure/scratch_models.json with the date, machine, torch version and threads.

    python benchmarks/scratch_models.py
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
from pathlib import Path

import torch

from remat import procmem, zoo
from remat._torch_compat import tree_flatten
from remat.measure import scratch
from remat.measure.loop import Loop, lead_in, micro_batch, storage_bytes
from remat.measure.step import normalize_inputs

OUT = Path(__file__).resolve().parents[1] / "src" / "remat" / "measure" / "scratch_models.json"
OPS = {"convolution": "output", "convolution_backward": "input", "_safe_softmax": "output"}
"""The ops with scratch on this machine's CPU (seen: nothing else over 1 MiB in the zoo's conv nets, GPT-2, BERT,
SkipNet and chain), and what it follows: oneDNN writes a convolution's output in a blocked layout and reorders
it, and its backward reorders its inputs; attention's `_safe_softmax` keeps a one-byte-per-element mask of the rows
that are all -inf.  Dropout's `bernoulli_` seemed to draw into a temporary the size of its mask until the copy
committed the mask's pages where `empty_like` made them (NOTE [Kernel scratch], Rule 6): it has none."""
STEPS = [
    *(
        (f"cnn_bn(batch={b}, size={s})", lambda b=b, s=s: zoo.cnn_bn(batch=b, size=s))
        for b, s in ((64, 64), (32, 96), (128, 32))
    ),
    ("gpt2()", zoo.gpt2),
    ("gpt2(batch=4, seq=512)", lambda: zoo.gpt2(batch=4, seq=512)),
    ("bert(batch=16)", lambda: zoo.bert(batch=16)),
]
"""The steps measured: (name, factory of (model, inputs[, loss_fn]))."""


class _Sizes(scratch.ScratchMeter):
    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.sizes.append((storage_bytes(tree_flatten((args, kwargs or {}))[0]), storage_bytes(tree_flatten(out)[0])))
        return out


def _measure(build) -> list[dict]:
    model, x, *rest = build()
    loss_fn = rest[0] if rest else None
    step, opt = normalize_inputs(x), torch.optim.Adam(model.parameters())

    def run() -> dict:
        meter = _Sizes()
        held = lead_in(model, step, loss_fn, opt, Loop()).held
        with meter:
            micro_batch(model, step, loss_fn, held)
        return {
            "rows": [
                {"op": sig[0], "scratch": s, "input": i, "output": out}  # a signature starts with the op's name
                for sig, s, (i, out) in zip(meter.ops, meter.scratch, meter.sizes)
                if sig[0] in OPS
            ]
        }

    return procmem.in_forked_copy(run)["rows"]


def main() -> None:
    torch.set_num_threads(1)  # as the copy remat forks measures (NOTE [Kernel scratch], Rule 4)
    rows = []
    for name, build in STEPS:
        rows += _measure(build)
        print(f"measured {name}")
    models = []
    for op, follows in OPS.items():
        ratios = [r["scratch"] / r[follows] for r in rows if r["op"] == op and r["scratch"] > 0]
        ratio = round(statistics.median(ratios), 3) if ratios else 0.0
        models.append(
            {
                "device": "cpu",
                "op": op,
                "per_input_byte": ratio if follows == "input" else 0.0,
                "per_output_byte": ratio if follows == "output" else 0.0,
                "seen": len(ratios),
                "min_ratio": round(min(ratios, default=0), 3),
                "max_ratio": round(max(ratios, default=0), 3),
            }
        )
        print(
            f"{op:24s} scratch = {ratio:.3f} x {follows} bytes  ({len(ratios)} ops, ratios {min(ratios, default=0):.3f}-{max(ratios, default=0):.3f})"
        )
    OUT.write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "machine": platform.machine(),
                "cpu_threads_in_copy": 1,
                "torch": torch.__version__,
                "models": models,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
