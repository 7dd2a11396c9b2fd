"""Grouped-query attention's FLOPs (issue 34): remat counts them on every torch it supports.

torch before 2.12 asserts in its attention FLOP formulas that key and value have the query's head count, so
real-mode `remat.profile` of a GQA model on CUDA crashed.  `remat._torch_compat.flops` counts those ops
itself, with the numbers of torch 2.12+'s formulas.  Held to: the same counts as torch's own formulas (this
torch) on each attention op, forward and backward, GQA and plain; and, with torch 2.11's formulas put back,
`remat.profile` and `remat.verify` of a small Llama-like decoder work and count what they count without them.

CPU has no kernel for the CUDA attention ops, and its own (`_scaled_dot_product_flash_attention_for_cpu`,
what `F.scaled_dot_product_attention` runs here, GQA included) has no formula in torch up to 2.13 (0 FLOPs).
So the `flash_on_cpu` fixture gives `aten::_scaled_dot_product_flash_attention` and its backward a CPU
kernel (torch's CPU flash kernel underneath), and the decoder's "flash" variant calls that op, as
`F.scaled_dot_product_attention` does on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.flop_counter as flop_counter
from torch.utils.flop_counter import FlopCounterMode

import remat
from remat._torch_compat import TorchDispatchMode, flop_formulas, flops_of

aten = torch.ops.aten
TORCH_COUNTS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 12)
SHAPES = {"gqa": ((2, 16, 128, 64), (2, 4, 128, 64)), "mha": ((2, 16, 128, 64), (2, 16, 128, 64))}


class Calls(TorchDispatchMode):
    """Records each op with its arguments and output, and what `flops_of` counts for it."""

    def __init__(self):
        super().__init__()
        self.flops: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flops_of(func, args, kwargs, out)
        if count:
            self.flops[func._overloadpacket] = self.flops.get(func._overloadpacket, 0) + count
        return out


def _attention_ops(kernel: str, q, k, v):
    """One forward and one backward of `kernel`'s attention op, called directly (meta tensors)."""
    grad = torch.empty_like(q)
    if kernel == "flash":
        o = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        aten._scaled_dot_product_flash_attention_backward(grad, q, k, v, *o[:6], 0.0, True, *o[6:8])
    elif kernel == "efficient":
        o = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)
        aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, torch.empty(0, device=q.device), *o, 0.0, [True, True, True, False], True
        )
    else:
        o = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)
        aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, o[0], o[1], o[6], o[7], torch.empty(0, device=q.device), *o[2:6], 0.0, True
        )


@pytest.mark.parametrize("shapes", ["gqa", "mha"])
@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
def test_each_attention_op_counts_as_torchs_own_formula(kernel, shapes):
    if shapes == "gqa" and not TORCH_COUNTS_GQA:
        pytest.skip("torch's own formulas count grouped-query attention from 2.12 on")
    q_shape, kv_shape = SHAPES[shapes]
    q, k, v = (torch.empty(s, device="meta") for s in (q_shape, kv_shape, kv_shape))
    with FlopCounterMode(display=False) as torchs:
        _attention_ops(kernel, q, k, v)
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as remats:
        _attention_ops(kernel, q, k, v)
    with Calls() as calls:
        _attention_ops(kernel, q, k, v)
    expected = dict(torchs.get_flop_counts()["Global"])
    forward, backward = (getattr(aten, f"_scaled_dot_product_{kernel}_attention{s}") for s in ("", "_backward"))
    assert set(expected) == {forward, backward} and all(expected.values())
    assert dict(remats.get_flop_counts()["Global"]) == expected
    assert calls.flops == expected
    b, h, s, d = q_shape  # 2 products forward, 5 backward, each 2*b*h*s*s*d: key/value heads broadcast
    assert expected == {forward: 2 * 2 * b * h * s * s * d, backward: 5 * 2 * b * h * s * s * d}


# -- torch's CPU flash kernel under the CUDA op's name (the fixture) ----------------------------------


def _flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, scale=scale)
    empty = query.new_empty(0)
    rng = torch.zeros(2, dtype=torch.int64)
    return out, lse, empty, empty.clone(), query.size(2), key.size(2), rng, empty.clone(), empty.clone()


def _flash_backward(
    grad_out, query, key, value, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset, *, scale=None
):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, lse, dropout_p, is_causal, scale=scale
    )


@pytest.fixture
def flash_on_cpu():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_flash_attention", _flash_forward, "CPU")
    lib.impl("_scaled_dot_product_flash_attention_backward", _flash_backward, "CPU")
    yield
    lib._destroy()  # the registrations undone now, not when the object is collected


@pytest.mark.parametrize("shapes", ["gqa", "mha"])
def test_real_cpu_tensors_through_autograd_count_as_torch(flash_on_cpu, shapes):
    if shapes == "gqa" and not TORCH_COUNTS_GQA:
        pytest.skip("torch's own formulas count grouped-query attention from 2.12 on")
    q_shape, kv_shape = (s[:2] + (16, 8) for s in SHAPES[shapes])
    q, k, v = (torch.randn(s, requires_grad=True) for s in (q_shape, kv_shape, kv_shape))

    def step():
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=0.3)[0].sum().backward()

    with FlopCounterMode(display=False) as torchs:
        step()
    with Calls() as calls:
        step()
    expected = dict(torchs.get_flop_counts()["Global"])
    assert set(expected) == {
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_flash_attention_backward,
    }
    assert calls.flops == expected
    assert k.grad.shape == kv_shape


# -- a Llama-like decoder, with torch 2.11's formulas put back -------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, kernel: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.kernel = heads, kv_heads, dim // heads, kernel
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, dim = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kernel == "flash":  # what F.scaled_dot_product_attention runs on a GPU
            out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, dim))


class Layer(nn.Module):
    def __init__(self, dim: int, kernel: str):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads=8, kv_heads=2, kernel=kernel)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.SiLU(), nn.Linear(4 * dim, dim, bias=False))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, kernel: str, dim: int = 64, layers: int = 3, vocab: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, kernel) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).float().pow(2).mean()


def _strict_forward(query_shape, key_shape, value_shape):
    """torch 2.11's `sdpa_flop_count`: key and value must have the query's heads."""
    if not query_shape[:2] == key_shape[:2] == value_shape[:2]:
        raise AssertionError(
            f"sdpa_flop_count: query/key/value shapes are incompatible: q={query_shape}, k={key_shape}, v={value_shape}"
        )
    return STRICT[0](query_shape, key_shape, value_shape)


def _strict_backward(grad_out_shape, query_shape, key_shape, value_shape):
    """torch 2.11's `sdpa_backward_flop_count`: the same assertion."""
    if not grad_out_shape[:2] == query_shape[:2] == key_shape[:2] == value_shape[:2]:
        raise AssertionError("sdpa_backward_flop_count: batch/heads mismatch among tensors")
    return STRICT[1](grad_out_shape, query_shape, key_shape, value_shape)


STRICT = (flop_counter.sdpa_flop_count, flop_counter.sdpa_backward_flop_count)


def _measure(kernel: str):
    """(forward FLOPs, backward FLOPs) of the profile, and the verified plan's measured and predicted extra FLOPs."""
    torch.manual_seed(0)
    model, ids = Decoder(kernel), torch.randint(0, 128, (2, 32))
    prof = remat.profile(model, ids)
    plan = remat.plan(prof, prof.peak_bytes - 1, solver="chen")  # layers checkpointed: attention recomputed
    report = remat.verify(model, ids, plan)
    assert report.grads_equal, str(report)
    return prof.forward_flops, prof.backward_flops, report.measured_recompute_flops, report.predicted_recompute_flops


def test_profile_and_verify_of_a_gqa_decoder_with_torch_2_11s_formulas(flash_on_cpu, monkeypatch):
    plain_cpu, plain_flash = _measure("sdpa"), _measure("flash")
    monkeypatch.setattr(flop_counter, "sdpa_flop_count", _strict_forward)
    monkeypatch.setattr(flop_counter, "sdpa_backward_flop_count", _strict_backward)
    model, ids = Decoder("flash"), torch.randint(0, 128, (2, 32))
    with pytest.raises(AssertionError, match="shapes are incompatible"), FlopCounterMode(display=False):
        model(ids)  # the patch is what the flash op's registered formula runs: torch alone fails (issue 34)

    strict_cpu, strict_flash = _measure("sdpa"), _measure("flash")
    assert strict_flash == plain_flash and strict_cpu == plain_cpu
    forward, backward, measured, predicted = strict_flash
    assert measured == predicted > 0
    # the attention's FLOPs: what the flash op counts over torch's CPU kernel (no formula, 0); 3 layers
    b, h, s, d = 2, 8, 32, 8
    assert forward - strict_cpu[0] == 3 * 2 * (2 * b * h * s * s * d) > 0
    assert backward - strict_cpu[1] == 3 * 5 * (2 * b * h * s * s * d)
    assert measured - strict_cpu[2] == 3 * 2 * (2 * b * h * s * s * d)  # verify counts it recomputed too
