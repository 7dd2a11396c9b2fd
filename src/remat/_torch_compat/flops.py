"""FLOP formulas: torch's (`torch.utils.flop_counter`), but attention's own where torch's cannot take
grouped-query shapes.

torch before 2.12 asserts in its attention formulas that key and value have the query's head count, so
a step calling `F.scaled_dot_product_attention(..., enable_gqa=True)` on CUDA (flash, memory-efficient or
cuDNN kernel, key/value with fewer heads) crashes remat's tracker and `FlopCounterMode` alike.  Here the
attention ops whose formulas take (query, key, value) shapes count the key/value heads broadcast to the
query's, as torch 2.12 and later do (the same numbers); every other op keeps torch's formula, read from
torch's registry at the time of the call.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils.flop_counter as _flop_counter

__all__ = ["flop_counter", "flops_of", "flop_formulas"]

_aten = torch.ops.aten


def _ops(names: tuple[str, ...]) -> tuple[Any, ...]:
    """The op packets of these names with their `*_backward` packets (those this torch has)."""
    found = [getattr(_aten, n, None) for name in names for n in (name, f"{name}_backward")]
    return tuple(op for op in found if op is not None)


def _dims(x) -> tuple[int, ...]:
    """A tensor's shape, or the shape itself (FlopCounterMode passes shapes to a `custom_mapping` formula)."""
    return tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(x)


def _bmm(batch: int, m: int, n: int, k: int) -> int:
    """FLOPs of a batched (m x k) @ (k x n) product: one multiply and one add per term."""
    return 2 * batch * m * n * k


def attention_forward_flops(query, key, value, *args, **kwargs) -> int:
    """Scores q @ k^T, then probabilities @ v, over the query's heads (key/value heads broadcast to them)."""
    (b, h, s_q, d_qk), (s_k, d_v) = _dims(query), (_dims(key)[-2], _dims(value)[-1])
    return _bmm(b * h, s_q, s_k, d_qk) + _bmm(b * h, s_q, d_v, s_k)


def attention_backward_flops(grad_out, query, key, value, *args, **kwargs) -> int:
    """The scores recomputed, then the gradients of the probabilities, of v, of q and of k: five products."""
    (b, h, s_q, d_qk), (s_k, d_v) = _dims(query), (_dims(key)[-2], _dims(value)[-1])
    scores = _bmm(b * h, s_q, s_k, d_qk)
    grad_probs, grad_v = _bmm(b * h, s_q, s_k, d_v), _bmm(b * h, s_k, d_v, s_q)
    grad_q, grad_k = _bmm(b * h, s_q, d_qk, s_k), _bmm(b * h, d_qk, s_k, s_q)
    return scores + grad_probs + grad_v + grad_q + grad_k


_ATTENTION = _ops(
    (
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
    )
)
_ATTENTION_IF_COUNTED = _ops(("_scaled_dot_product_flash_attention_for_cpu",))
"""Counted only where torch's registry has a formula for them (none up to 2.13: CPU attention counts 0)."""


def _formula(op) -> Callable[..., int]:
    return attention_backward_flops if op.__name__.endswith("_backward") else attention_forward_flops


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """The attention formulas that replace torch's, by op packet: the `custom_mapping` of every
    `FlopCounterMode` remat makes, so that it counts what `flops_of` counts."""
    registry = _flop_counter.flop_registry
    ops = _ATTENTION + tuple(op for op in _ATTENTION_IF_COUNTED if op in registry)
    return {op: _formula(op) for op in ops}


def flop_counter() -> _flop_counter.FlopCounterMode:
    """`FlopCounterMode(display=False, custom_mapping=flop_formulas())` whose module tracker is remat's
    (`ModuleTracker`, a private attribute, hence here): torch's own raises "Expected gradient function to be set"
    on a module called under `torch.no_grad()` with a view of a tensor that requires grad, as Hugging Face's
    Reformer calls its reversible layers (torch 2.13).  The totals are the same; only which module is running is
    known better."""
    from remat._torch_compat.module_tracker import ModuleTracker  # imports this package: not at its import

    counter = _flop_counter.FlopCounterMode(display=False, custom_mapping=flop_formulas())
    counter.mod_tracker = ModuleTracker()
    return counter


def flops_of(func, args, kwargs, out) -> int:
    """FLOPs of one aten op, with the same formulas `FlopCounterMode(custom_mapping=flop_formulas())` uses
    (0 if it has none)."""
    packet = func._overloadpacket
    registry = _flop_counter.flop_registry
    if packet in _ATTENTION or (packet in _ATTENTION_IF_COUNTED and packet in registry):
        return int(_formula(packet)(*args, **kwargs))
    formula = registry.get(packet)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))
