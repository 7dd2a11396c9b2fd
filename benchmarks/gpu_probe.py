"""What single CUDA ops allocate beyond the tensors they return: the op-level facts a GPU run pointed at.

    python benchmarks/gpu_probe.py --out F.json

The GPU check of 2026-11-27 (docs/validation.md section 6.3) found, in remat's real-mode profile of the dropout
MLP on an H200, 128 MiB of kernel scratch at the `sum` that makes each `nn.Linear`'s bias gradient, which the fake
step did not have.  Each case here runs one forward and backward on the GPU under a dispatch mode that, around every
aten op, resets the caching allocator's peak and reports what the op took beyond the storages it returned (as
`remat.measure.scratch.CudaAllocatorPeak` does in real mode).  On a machine without CUDA it runs on the CPU and
reports zeros (the test that it runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


class OpPeaks(TorchDispatchMode):
    """Each aten op's allocator peak beyond what was allocated before it and the new storages it returned."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = _allocated()
        _reset()
        out = func(*args, **kwargs)
        ins = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        made = sum(
            t.untyped_storage().nbytes()
            for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ins
        )
        shapes = [
            list(t.shape) + ([f"stride {list(t.stride())}"] if not t.is_contiguous() else [])
            for t in tree_flatten(args)[0]
            if isinstance(t, torch.Tensor)
        ]
        self.rows.append(
            {"op": func.__name__, "args": shapes, "made": made, "scratch": max(0, _peak() - before - made)}
        )
        return out


def _allocated() -> int:
    return torch.cuda.memory_allocated() if CUDA else 0


def _reset() -> None:
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> int:
    if CUDA:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return 0


def t(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, device=DEV, dtype=dtype).requires_grad_(grad)


CASES = {
    # (inputs, forward, how the output's gradient arrives: "dense" or "sum" (expanded, as from .sum()))
    "sum dim0 16384x1024 fp32": (lambda: (t(16384, 1024),), lambda x: x.sum(0), "dense"),
    "sum dim0 8192x4096 fp32": (lambda: (t(8192, 4096),), lambda x: x.sum(0), "dense"),
    "sum dim0 16384x1024 bf16": (lambda: (t(16384, 1024, dtype=torch.bfloat16),), lambda x: x.sum(0), "dense"),
    "sum all 16384x1024 fp32": (lambda: (t(16384, 1024),), lambda x: x.sum(), "dense"),
    "linear+bias 16384x1024->1024 fp32": (lambda: (t(16384, 1024), t(1024, 1024), t(1024)), F.linear, "dense"),
    "linear 16384x1024->1024 fp32": (lambda: (t(16384, 1024), t(1024, 1024)), F.linear, "dense"),
    "linear+bias 8192x1024->4096 fp32": (lambda: (t(8192, 1024), t(4096, 1024), t(4096)), F.linear, "dense"),
    "linear+bias 16384x1024->1024 fp32, grad of sum": (
        lambda: (t(16384, 1024), t(1024, 1024), t(1024)),
        F.linear,
        "sum",
    ),
    "linear+bias 4096x1024->1024 fp32": (lambda: (t(4096, 1024), t(1024, 1024), t(1024)), F.linear, "dense"),
    # F.linear of a frozen weight (LoRA's base) on a transposed input (nn.MultiheadAttention's projections) runs
    # as bmm with the weight at batch stride 0: remat predicts no copy of it (NOTE [CUDA memory that is no
    # tensor], Rule 2; 441 MiB if copied).  A weight that needs its gradient folds the input into an mm instead.
    "linear of a frozen weight on a transposed 16x196x768 input ->1536 bf16": (
        lambda: (t(16, 196, 768, dtype=torch.bfloat16), t(1536, 768, dtype=torch.bfloat16, grad=False)),
        lambda x, w: F.linear(x.transpose(0, 1), w),
        "dense",
    ),
}


def _conv(cin, cout, k, size, batch=16, *, dtype=torch.float32, transposed=False, stride=1):
    """A convolution case of the U-Net of the GPU check (batch 16) or beside it: (inputs, forward, "dense")."""
    pad = 0 if transposed or k == 1 else k // 2

    def make():
        w = (cin, cout, k, k) if transposed else (cout, cin, k, k)
        return t(batch, cin, size, size, dtype=dtype), t(*w, dtype=dtype), t(cout, dtype=dtype)

    def fwd(x, w, b):
        if transposed:
            return F.conv_transpose2d(x, w, b, stride=stride)
        return F.conv2d(x, w, b, stride=stride, padding=pad)

    return make, fwd, "dense"


def conv_cases(batch: int = 16) -> dict:
    """The convolution cases at `batch` (the U-Net of the GPU check runs 16)."""
    return {
        f"conv{'T' if tr else ''} {cin}->{cout} {k}x{k} at {size}{' bf16' if dt == torch.bfloat16 else ''}": _conv(
            cin, cout, k, size, batch, dtype=dt, transposed=tr, stride=2 if tr else 1
        )
        for cin, cout, k, size, dt, tr in [
            (3, 32, 3, 128, torch.float32, False),
            (32, 32, 3, 128, torch.float32, False),
            (32, 64, 3, 64, torch.float32, False),
            (64, 64, 3, 64, torch.float32, False),
            (64, 128, 3, 32, torch.float32, False),
            (128, 128, 3, 32, torch.float32, False),
            (128, 256, 3, 16, torch.float32, False),
            (256, 256, 3, 16, torch.float32, False),
            (256, 128, 2, 16, torch.float32, True),
            (128, 64, 2, 32, torch.float32, True),
            (64, 32, 2, 64, torch.float32, True),
            (256, 128, 3, 32, torch.float32, False),
            (128, 64, 3, 64, torch.float32, False),
            (64, 32, 3, 128, torch.float32, False),
            (32, 3, 1, 128, torch.float32, False),
            (64, 64, 1, 64, torch.float32, False),
            (64, 256, 1, 64, torch.float32, False),
            (256, 64, 1, 64, torch.float32, False),
            (64, 64, 3, 64, torch.bfloat16, False),
            (32, 3, 1, 128, torch.bfloat16, False),
            (64, 64, 3, 128, torch.float32, False),
            (128, 128, 3, 64, torch.float32, False),
        ]
    }


CASES |= conv_cases()


def run(name: str) -> dict:
    make, fn, grad = CASES[name]
    torch.manual_seed(0)
    args = make()
    out = fn(*args)
    g = torch.randn_like(out) if grad == "dense" else torch.ones((), device=DEV).expand_as(out)
    with OpPeaks() as fwd:
        out = fn(*args)
    with OpPeaks() as bwd:
        out.backward(g)
    big = [r for r in fwd.rows + bwd.rows if r["scratch"] or r["made"] >= 1 << 20]
    return {
        "case": name,
        "forward": fwd.rows,
        "backward": bwd.rows,
        "scratch_max": max((r["scratch"] for r in fwd.rows + bwd.rows), default=0),
        "large": big,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=16, help="the convolution cases' batch")
    ap.add_argument("--only", default="", help="cases whose name starts with this (e.g. conv)")
    args = ap.parse_args()
    CASES.update(conv_cases(args.batch))
    found = {
        "device": torch.cuda.get_device_name() if CUDA else "CPU",
        "torch": torch.__version__,
        "conv_batch": args.batch,
        "cases": [],
    }
    for name in [n for n in CASES if n.startswith(args.only)]:
        row = run(name)
        found["cases"].append(row)
        print(name, "| scratch max", row["scratch_max"], flush=True)
        for r in row["large"] if not name.startswith("conv") else [r for r in row["large"] if "conv" in r["op"]]:
            print(f"   {r['op']:32s} made {r['made']:>11,d} scratch {r['scratch']:>11,d} {r['args']}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
