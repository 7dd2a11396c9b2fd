"""Fake kernels where torch's meta kernel refuses what the real kernel runs, or lays out its output otherwise.

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
    Rule 3. `aten.native_layer_norm_backward` returns its input gradient contiguous, as the CPU and the CUDA
            kernels both do (each allocates it like the contiguous input: layer_norm.cpp, layer_norm_kernel.cu);
            torch's meta kernel lays it out like the incoming gradient.  Where that gradient is not contiguous
            (a LayerNorm followed by a permute: Swin's windows) a later `view` of the fake gradient failed and
            `reshape` copied, where the real step views: Swin's fake peak was 8,192 bytes (+1.2%) above its real
            one (benchmarks/unseen_models.py, 2026-11-28).  torch runs its decomposition of this op before any
            rule registered beside its fake kernels, and caches the result for every fake mode of the process,
            so the fix is made where remat's steps see each op: the tracker and the peak meter take the op's
            outputs as the kernel lays them out (`as_the_kernel_lays_out`) before they record them.  The
            gradient torch made is dropped unrecorded, and the user's fake tensors keep torch's layout.  Other
            norms' backward kernels lay out by device (group norm: the input's memory format on CPU, contiguous
            on CUDA), so those keep torch's meta kernels.
    Rule 4. A layer, group or batch norm of a half input with float32 weights (under CPU autocast, which leaves
            their arguments as they come) runs CPU's mixed-type kernel, which returns its mean and inverse
            deviation in float32; torch's meta kernels return them in the input's dtype.  Fake peaks under bf16
            autocast were below the real ones: RoBERTa's by 256 bytes (64 rows of a LayerNorm), Swin's by 3,840,
            wav2vec2's by 19,408 (benchmarks/unseen_models.py --autocast, 2026-12-02).  Taken as Rule 3 takes
            its outputs (a simulated CUDA step too, where no GPU figure holds a mixed-type norm yet).  Inside
            `cuda_statistics()` (a simulated CUDA step: NOTE [A CUDA step simulated on CPU], Rule 5) a layer norm
            of any half input keeps them in float32, as CUDA's kernel does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor  # private: fake tensors

from remat._torch_compat.schema import named_arguments

_depth = {"rules": 0, "cuda": 0}  # how many of each region the current fake step is inside


@contextlib.contextmanager
def _within(region: str) -> Iterator[None]:
    _depth[region] += 1
    try:
        yield
    finally:
        _depth[region] -= 1


def real_kernel_rules() -> contextlib.AbstractContextManager[None]:
    """Rule 1 applies within."""
    return _within("rules")


def cuda_statistics() -> contextlib.AbstractContextManager[None]:
    """Rule 4's layer norm as CUDA's kernel runs it, within."""
    return _within("cuda")


def _grouped_mm(fake_mode, func, *args, **kwargs):
    bound = named_arguments(func, args, kwargs)
    a, b = bound["self"], bound["mat2"]
    if not _depth["rules"] or (a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16):
        return NotImplemented  # Rule 2, or torch's own meta kernel
    try:
        from torch._meta_registrations import _create_grouped_mm_output_tensor  # private: the meta kernel's shape
        from torch._subclasses.fake_impls import in_kernel_invocation_manager
    except ImportError:
        return NotImplemented  # a torch without them: its meta kernel decides

    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(a, b, bound.get("offs"), bound.get("out_dtype") or a.dtype)
    return FakeTensor(fake_mode, out, a.fake_device)


_CONTIGUOUS_OUTPUTS = frozenset({torch.ops.aten.native_layer_norm_backward.default})  # Rule 3


def as_the_kernel_lays_out(func, out, args: tuple = ()):
    """`func`'s outputs (on `args`) laid out as its kernel lays them out (Rules 3-4): fake tensors only, a real
    kernel's as it made them."""
    if func in _MIXED_TYPE_WEIGHT and _float32_statistics(func, args):
        return out[0], _fake_float32(out[1]), _fake_float32(out[2]), *out[3:]
    if func not in _CONTIGUOUS_OUTPUTS:
        return out
    return tuple(_contiguous_fake(t) for t in out)


_MIXED_TYPE_WEIGHT = {  # Rule 4: the norms whose outputs 1 and 2 are float32 statistics, and their weight's position
    torch.ops.aten.native_layer_norm.default: 2,
    torch.ops.aten.native_group_norm.default: 1,
    torch.ops.aten.native_batch_norm.default: 1,
    torch.ops.aten._native_batch_norm_legit.default: 1,
}


def _float32_statistics(func, args: tuple) -> bool:
    """Rule 4: the norm's input is half and its weight float32, or, in a simulated CUDA step, a layer norm's input is
    half."""
    x, at = args[0], _MIXED_TYPE_WEIGHT[func]
    if not isinstance(x, FakeTensor) or x.dtype not in (torch.float16, torch.bfloat16):
        return False
    if _depth["cuda"] and func is torch.ops.aten.native_layer_norm.default:
        return True
    return getattr(args[at] if len(args) > at else None, "dtype", None) == torch.float32


def _fake_float32(t):
    return torch.empty_like(t, dtype=torch.float32) if isinstance(t, FakeTensor) else t


def _contiguous_fake(t):
    if not isinstance(t, FakeTensor) or t.is_contiguous():
        return t
    return torch.empty_like(t, memory_format=torch.contiguous_format)


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
