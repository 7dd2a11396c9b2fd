"""What a compiled step holds for the outputs its loss does not read (issue 36: BERT-base compiled peaked 6.2 GiB
over its eager step on the H200, docs/peers_gpu.md).

Hugging Face's masked-LM model computes its loss inside `forward` and returns the logits beside it.  Compiled, the
model is one autograd node with two differentiable outputs; `out.loss.backward()` gives the logits no gradient,
and autograd hands the compiled backward a gradient of zeros of the logits' size instead (AOTAutograd's function
lets autograd materialise undefined gradients: pytorch/pytorch#131794).  The eager step has no such tensor.  Each
variant runs in a fresh process: BERT for masked LM (hidden 768, 12 heads, vocabulary 30,522, sequence 512, SDPA),
AdamW, three steps; the third step's peak by the process's high-water mark (`remat.procmem`, what `remat.verify`
reads) over what was resident before it, and in the second step's backward the ops that made a tensor of the
logits' shape (a dispatch mode that counts them).

    python benchmarks/compiled_outputs.py [--layers 2] [--batch 2]

Variants: the model as written, its output held through backward (the loop of docs/peers_gpu.md); the logits
returned detached (held, but no gradient asked of them); the loss alone (nothing else returned or held); each
eager and under `torch.compile`.  Writes benchmarks/results/compiled_outputs.md and .json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, machine_info, md_table, run_fresh, write_results  # noqa: E402

RETURNS = {
    "as written": "the model's output (loss and logits), held through backward",
    "logits detached": "(loss, logits.detach()), held through backward",
    "loss only": "the loss alone",
}
VOCAB, SEQ = 30522, 512


class Returning(nn.Module):
    """The model, returning what `returns` names (a key of RETURNS); `loss_of` its loss."""

    def __init__(self, model: nn.Module, returns: str) -> None:
        super().__init__()
        self.model, self.returns = model, returns

    def forward(self, **batch):
        out = self.model(**batch)
        if self.returns == "loss only":
            return out.loss
        return (out.loss, out.logits.detach()) if self.returns == "logits detached" else out

    def loss_of(self, out) -> torch.Tensor:
        if self.returns == "as written":
            return out.loss
        return out if self.returns == "loss only" else out[0]


def _logits_made(step, shape: tuple) -> list[str]:
    """The aten ops that made a tensor of `shape` (not a view) while `step()` ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Made(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == shape and not func.is_view:
                self.ops.append(str(func))
            return out

    with Made() as made:
        step()
    return made.ops


def one(spec: dict) -> dict:
    """One variant in this (fresh) process: `spec` has layers, batch, returns, compiled."""
    from remat import procmem, zoo

    procmem.map_large_allocations()
    model, batch = zoo.bert(n_layer=spec["layers"], hidden=768, heads=12, seq=SEQ, batch=spec["batch"], vocab=VOCAB)
    net = Returning(model, spec["returns"])
    run = torch.compile(net) if spec["compiled"] else net
    opt = torch.optim.AdamW(model.parameters())
    held = []

    def forward():
        held.append(run(**batch))
        return net.loss_of(held[-1])

    def finish():
        opt.step()
        opt.zero_grad(set_to_none=True)
        held.clear()

    loss = forward()
    loss.backward()
    finish()
    loss = forward()
    made = _logits_made(loss.backward, (spec["batch"], SEQ, VOCAB))
    finish()
    del loss
    procmem.release_free_heap()
    before = procmem.resident_bytes()
    procmem.reset_high_water_mark()
    forward().backward()
    finish()
    return {"peak_over_resident": procmem.high_water_mark_bytes() - before, "logits_made_in_backward": made}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    logits = args.batch * SEQ * VOCAB * 4
    rows, data = [], []
    for compiled in (False, True):
        for returns in RETURNS:
            spec = {"layers": args.layers, "batch": args.batch, "returns": returns, "compiled": compiled}
            res = {**spec, **run_fresh("compiled_outputs.py:one", spec, timeout=1200)}
            data.append(res)
            peak = res["peak_over_resident"]
            made = ", ".join(sorted(set(res["logits_made_in_backward"]))) or "none"
            rows.append(["torch.compile" if compiled else "eager", returns, f"{peak / MiB:,.1f}", made])
            print(rows[-1], flush=True)
    made_in_backward = f"tensors of the logits' shape ({args.batch} x {SEQ} x {VOCAB}) made in backward"
    text = (
        f"BERT for masked LM, {args.layers} layers of 768, batch {args.batch} x {SEQ}, vocabulary {VOCAB:,} "
        f"(logits: {logits / MiB:,.1f} MiB float32).  Returned: "
        + "; ".join(f"*{k}*, {v}" for k, v in RETURNS.items())
        + f".  The loss's own gradients in backward are of ({args.batch} * {SEQ}) x {VOCAB}: not counted.\n\n"
        + md_table(["step", "returned", "third step's peak over resident, MiB", made_in_backward], rows)
    )
    path = write_results(
        "compiled_outputs",
        "What a compiled step holds for outputs its loss does not read",
        machine_info(torch.get_num_threads()),
        f"python benchmarks/compiled_outputs.py --layers {args.layers} --batch {args.batch}",
        [("Results", text)],
        {"logits_bytes": logits, "variants": data},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
