"""The H100's op table as fake-mode cases: each op of gpu_facts/h100/op_times.json (the shapes of
gpu_facts/op_facts.py) in a module of its own, its forward and backward seconds predicted for an H100 (`predicted`)
beside the H100's own figures (`op_table`).  test_gpu_seconds.py holds each to 25%; benchmarks/gpu_seconds.py
renders the same cases."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import remat

FACTS = Path(__file__).resolve().parent / "gpu_facts" / "h100"
B, L, D, H, V = 8, 1024, 1024, 16, 32000
BF = torch.bfloat16


def t(*shape, dtype=torch.float32, grad=True):
    return shape, dtype, grad


def _sdpa(**kw):
    return lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, **kw)


CASES = [
    ("linear fp32", [t(B * L, D), t(4 * D, D)], F.linear),
    ("linear autocast bf16", [t(B * L, D), t(4 * D, D)], F.linear, BF),
    ("dropout 0.1 fp32", [t(B * L, D)], lambda x: F.dropout(x, 0.1, True)),
    ("layer_norm fp32", [t(B * L, D), t(D), t(D)], lambda x, w, b: F.layer_norm(x, (D,), w, b)),
    ("rms_norm fp32", [t(B * L, D), t(D)], lambda x, w: F.rms_norm(x, (D,), w)),
    ("gelu fp32", [t(B * L, D)], F.gelu),
    ("gelu tanh fp32", [t(B * L, D)], lambda x: F.gelu(x, approximate="tanh")),
    ("silu bf16", [t(B * L, D, dtype=BF)], F.silu),
    ("softmax fp32", [t(B * H, L, L // 4)], lambda x: F.softmax(x, -1)),
    ("cross_entropy fp32 V32000", [t(B * 512, V)], lambda x: F.cross_entropy(x, torch.arange(B * 512) % V)),
    ("cross_entropy bf16 V32000", [t(B * 512, V, dtype=BF)], lambda x: F.cross_entropy(x, torch.arange(B * 512) % V)),
    ("embedding", [t(V, D)], lambda w: F.embedding(torch.arange(B * L) % V, w)),
    ("sdpa fp32", [t(B, H, L, 64)] * 3, _sdpa()),
    ("sdpa fp32 dropout 0.1", [t(B, H, L, 64)] * 3, _sdpa(dropout_p=0.1)),
    ("sdpa bf16 causal", [t(B, H, L, 64, dtype=BF)] * 3, _sdpa(is_causal=True)),
    ("sdpa bf16 causal dropout 0.1", [t(B, H, L, 64, dtype=BF)] * 3, _sdpa(is_causal=True, dropout_p=0.1)),
    ("sdpa bf16 float mask", [t(B, H, L, 64, dtype=BF)] * 3 + [t(B, 1, L, L, dtype=BF, grad=False)], _sdpa()),
    (
        "sdpa fp32 bool mask",
        [t(B, H, L, 64)] * 3,
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(B, 1, L, L, dtype=torch.bool).tril()
        ),
    ),
    ("sdpa bf16 bias requires grad (T5)", [t(B, H, L, 64, dtype=BF)] * 3 + [t(1, H, L, L, dtype=BF)], _sdpa()),
    (
        "sdpa bf16 gqa 16q/4kv causal",
        [t(B, H, L, 64, dtype=BF), t(B, 4, L, 64, dtype=BF), t(B, 4, L, 64, dtype=BF)],
        _sdpa(is_causal=True, enable_gqa=True),
    ),
    ("conv2d fp32 64->64 3x3", [t(32, 64, 128, 128), t(64, 64, 3, 3)], lambda x, w: F.conv2d(x, w, padding=1)),
    ("conv2d fp32 3->64 3x3", [t(32, 3, 128, 128, grad=False), t(64, 3, 3, 3)], lambda x, w: F.conv2d(x, w, padding=1)),
    (
        "conv2d bf16 64->64 3x3",
        [t(32, 64, 128, 128, dtype=BF), t(64, 64, 3, 3, dtype=BF)],
        lambda x, w: F.conv2d(x, w, padding=1),
    ),
    (
        "batch_norm fp32 train",
        [t(32, 64, 128, 128), t(64), t(64)],
        lambda x, w, b: F.batch_norm(x, torch.zeros(64), torch.ones(64), w, b, True),
    ),
    ("max_pool2d fp32", [t(32, 64, 128, 128)], lambda x: F.max_pool2d(x, 2)),
    ("interpolate x2 fp32", [t(32, 64, 64, 64)], lambda x: F.interpolate(x, scale_factor=2.0)),
    ("cat fp32", [t(32, 64, 128, 128), t(32, 64, 128, 128)], lambda a, b: torch.cat([a, b], 1)),
]
OFF = {
    "gelu fp32": "the erf GELU measured 4x (forward) and 19x (backward) a one-pass kernel, 50x its compute bound: "
    "not modelled until measured again",
    "rms_norm fp32": "torch 2.13 on a CPU runs F.rms_norm as two multiplications and one fused backward, torch 2.11 on "
    "CUDA as six ops: the simulated step does not see the GPU's ops",
}
"""Cases the model does not hold, and why."""


class _Op(nn.Module):
    def __init__(self, fn, specs):
        super().__init__()
        self.fn = fn
        self.args = nn.ParameterList([nn.Parameter(torch.empty(s, dtype=d), requires_grad=g) for s, d, g in specs])

    def forward(self):
        return self.fn(*self.args)


class _Case(nn.Module):
    """The op in a block of its own ("op"); the loss (a float sum of what needs a gradient) outside it."""

    def __init__(self, fn, specs, autocast):
        super().__init__()
        self.op, self.autocast = _Op(fn, specs), autocast

    def forward(self, _):
        with torch.autocast("cuda", dtype=self.autocast or BF, enabled=self.autocast is not None):
            out = self.op()
        outs = out if isinstance(out, tuple) else (out,)
        return sum(o.float().sum() for o in outs if o.requires_grad)


def predicted(case) -> tuple[float, float]:
    """The case's op, forward and backward seconds, by a fake step for an H100."""
    name, specs, fn, *autocast = case
    with torch.device("meta"):
        model = _Case(fn, specs, autocast[0] if autocast else None)
    prof = remat.profile(model, torch.zeros(1), loss_fn=lambda o: o, mode="fake", device="cuda", hardware="H100")
    op = prof.block("op")
    return op.forward_s, op.backward_s


def op_table() -> tuple[dict, tuple[float, float]]:
    """The H100's rows at their big size, by case, and the harness's least op (forward, backward)."""
    rows = json.loads((FACTS / "op_times.json").read_text())["rows"]
    small = [r for r in rows if r["scale"] == "small" and "forward_s" in r]
    floor = (min(r["forward_s"] for r in small), min(r["backward_s"] for r in small))
    return {r["case"]: r for r in rows if r["scale"] == "big"}, floor
