"""What pointwise and normalisation ops cost on this machine's CPU against one pass over their bytes: the figures
behind `remat.measure.device.roofline.CPU_PASSES` (NOTE [An op's seconds, predicted], Rule 4).

Each op runs on float32 tensors of 8 x 512 x 1024 (16 MiB, past the caches), every op once per round in a
fixed order, over ROUNDS rounds after a warm-up round, 2 threads; an op's figure is the least over the rounds
of its seconds over the nominal CPU's roofline (`remat.measure.device.roofline.op_seconds` with no CPU_PASSES: its
bytes at the nominal bandwidth).  Ops at about 1 stream their bytes; a transcendental function computes more
per element than the memory can feed (tanh, erf, exp, log): those above PASSES_AT go into CPU_PASSES.  The least,
not the median: a shared machine only ever adds (the medians moved 15-30% between runs, the least 1-5%).

    python benchmarks/cpu_passes.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _common import machine_info, md_table, write_results  # noqa: E402
from remat.measure.device import roofline  # noqa: E402

ROUNDS = 15
SHAPE = (8, 512, 1024)
PASSES_AT = 1.5
"""An op measured above this many passes over its bytes is charged what it measured (CPU_PASSES)."""


def cases() -> dict:
    """op name -> (aten op, args, kwargs) on SHAPE: the pointwise, activation and normalisation ops of the zoo."""
    a, x, y, g = torch.ops.aten, torch.randn(SHAPE), torch.randn(SHAPE), torch.randn(SHAPE)
    w, mask = torch.randn(SHAPE[-1]), torch.rand(SHAPE) > 0.5
    ln = a.native_layer_norm.default(x, [SHAPE[-1]], w, w, 1e-5)
    soft = torch.softmax(x, -1)
    return {
        "mul": (a.mul.Tensor, (x, y), {}),
        "add": (a.add.Tensor, (x, y), {}),
        "clone": (a.clone.default, (x,), {}),
        "tanh": (a.tanh.default, (x,), {}),
        "tanh_backward": (a.tanh_backward.default, (g, x), {}),
        "exp": (a.exp.default, (x,), {}),
        "log": (a.log.default, (x.abs(),), {}),
        "erf": (a.erf.default, (x,), {}),
        "rsqrt": (a.rsqrt.default, (x.abs(),), {}),
        "pow": (a.pow.Tensor_Scalar, (x, 3.0), {}),
        "sigmoid": (a.sigmoid.default, (x,), {}),
        "silu": (a.silu.default, (x,), {}),
        "silu_backward": (a.silu_backward.default, (g, x), {}),
        "gelu": (a.gelu.default, (x,), {}),
        "gelu_backward": (a.gelu_backward.default, (g, x), {}),
        "relu": (a.relu.default, (x,), {}),
        "where": (a.where.self, (mask, x, y), {}),
        "_softmax": (a._softmax.default, (x, -1, False), {}),
        "_softmax_backward_data": (a._softmax_backward_data.default, (g, soft, -1, torch.float32), {}),
        "native_layer_norm": (a.native_layer_norm.default, (x, [SHAPE[-1]], w, w, 1e-5), {}),
        "native_layer_norm_backward": (
            a.native_layer_norm_backward.default,
            (g, x, [SHAPE[-1]], ln[1], ln[2], w, w, [True, True, True]),
            {},
        ),
    }


def one_pass(func, args, kwargs, out) -> float:
    """The nominal CPU's roofline of the op with no CPU_PASSES: its bytes at the nominal bandwidth."""
    saved = dict(roofline.CPU_PASSES)
    roofline.CPU_PASSES.clear()
    try:
        return roofline.op_seconds(roofline.HARDWARE["cpu"], func, args, kwargs, out)
    finally:
        roofline.CPU_PASSES.update(saved)


def measure() -> dict[str, list[float]]:
    """Per op, its seconds over one pass, in each round."""
    ops = cases()
    base = {name: one_pass(f, args, kw, f(*args, **kw)) for name, (f, args, kw) in ops.items()}
    ratios: dict[str, list[float]] = {name: [] for name in ops}
    for r in range(ROUNDS + 1):
        for name, (f, args, kw) in ops.items():
            t = time.perf_counter()
            f(*args, **kw)
            if r:  # round 0 warms up
                ratios[name].append((time.perf_counter() - t) / base[name])
    return ratios


def main() -> None:
    torch.set_num_threads(2)
    info = machine_info(threads=2)
    ratios = measure()
    rows = []
    for name, rs in ratios.items():
        rows.append(
            [
                name,
                f"{min(rs):.2f}",
                f"{statistics.median(rs):.2f}",
                f"{max(rs):.2f}",
                f"{roofline.CPU_PASSES.get(name, 1.0):g}",
                "yes" if min(rs) > PASSES_AT else "",
            ]
        )
    table = md_table(["op", "least", "median", "most", "CPU_PASSES", f"least over {PASSES_AT}"], rows)
    print(table)
    path = write_results(
        "cpu_passes",
        "CPU ops against one pass over their bytes (the nominal CPU's roofline)",
        info,
        "python benchmarks/cpu_passes.py",
        [(f"seconds over one pass, {ROUNDS} rounds, float32 {SHAPE}", table)],
        {"ratios": ratios, "passes_at": PASSES_AT},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
