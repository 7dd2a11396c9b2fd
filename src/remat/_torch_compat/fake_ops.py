"""Fake kernels where torch's meta kernel refuses what the real kernel runs.

NOTE [A meta kernel stricter than its kernel]
  torch's meta kernel of `aten._grouped_mm` (the grouped matmul of a mixture of experts: Hugging Face's experts
  since transformers 5) refuses inputs that are not bfloat16, as CUDA's fast kernel does; the kernels run them
  (a float32 Mixtral trains on a CPU, and CUDA falls back to one matmul per group).  A fake step of a float32 MoE
  raised "Expected inputs of BF16 type" (found 2026-11-28 on transformers 5.24's Mixtral, torch 2.13).  So:
    Rule 1. Inside `real_kernel_rules()` (remat's fake steps), such a call returns a tensor of the shape torch's
            meta kernel gives and the dtype the real kernel does (`out_dtype`, else the inputs'); bfloat16 inputs
            and every other op keep torch's own meta kernels.
    Rule 2. Outside it the rule steps aside (NotImplemented), so torch's fake tensors behave as before in the
            user's process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from remat._torch_compat.schema import named_arguments

_active = 0


@contextlib.contextmanager
def real_kernel_rules() -> Iterator[None]:
    """Rule 1 applies within."""
    global _active
    _active += 1
    try:
        yield
    finally:
        _active -= 1


def _grouped_mm(fake_mode, func, *args, **kwargs):
    bound = named_arguments(func, args, kwargs)
    a, b = bound["self"], bound["mat2"]
    if not _active or (a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16):
        return NotImplemented  # Rule 2, or torch's own meta kernel
    try:
        from torch._meta_registrations import _create_grouped_mm_output_tensor  # private: the meta kernel's shape
        from torch._subclasses.fake_impls import in_kernel_invocation_manager
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:
        return NotImplemented  # a torch without them: its meta kernel decides

    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(a, b, bound.get("offs"), bound.get("out_dtype") or a.dtype)
    return FakeTensor(fake_mode, out, a.fake_device)


def _register() -> None:
    """Once per process; where this torch has no such op or rule table, nothing (its meta kernel decides)."""
    try:
        from torch._subclasses.fake_impls import op_implementations_dict, register_op_impl

        op = torch.ops.aten._grouped_mm.default
    except (ImportError, AttributeError):
        return
    if op not in op_implementations_dict:
        register_op_impl(op)(_grouped_mm)


_register()
