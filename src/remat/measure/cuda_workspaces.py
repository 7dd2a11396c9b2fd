"""What CUDA kernels allocate beyond the tensors they return, for a step predicted with fake tensors.

NOTE [CUDA memory that is no tensor]
  A fake step allocates nothing, so memory that CUDA's libraries take through the caching allocator
  without returning it as a tensor must be modelled.  Every figure here was measured on an H100 80GB
  HBM3 with torch 2.11.0+cu130 on 2026-11-26, with torch's own kernels and default settings (cuDNN
  benchmark off, no TF32); the per-op table is tests/gpu_facts/h100/op_facts.json (copied from
  ../shared/gpu-facts), and tests/test_cuda_simulation.py holds this model against it.
  Rule 1. cuBLAS takes a workspace through the allocator at the first matmul of each thread and
          never frees it: CUBLAS_WORKSPACE_BYTES per thread, one for the thread that runs the forward
          (and the optimizer) and one for autograd's backward thread, both resident through every
          step after the first (`add_cublas_workspaces`), in a fake step and in a real one on a GPU alike
          (the size is torch's: `CUBLAS_WORKSPACE_CONFIG` when set, else its default for the device).
  Rule 2. A kernel that needs dense operands (cuBLAS matmuls, cuDNN convolutions and batch norm,
          the attention backwards' output gradient, the normalisation, pooling, upsampling and
          embedding backwards: DENSE_OPS) copies an argument that is expanded (a dimension of stride
          0, as the gradient of a `sum()` arrives) into a dense tensor first, live during the op: its
          dense bytes.  Elementwise kernels, and attention's broadcast masks, are read as they are.
  Rule 3. cuDNN's convolution, for input channels per group of CONV_WORKSPACE_MIN_CHANNELS or more,
          takes a workspace of twice its output plus its weight in forward (64 -> 64 channels 3x3:
          256 MiB beyond a 128 MiB output) and twice the output gradient plus 2 MiB in backward
          when the input gradient is asked for; with 3 input channels it takes none.
  Rule 4. The attention kernels' backward accumulates the query's gradient in float32 (its elements
          x 4 bytes) and keeps one float32 row statistic per query row (flash; two for the
          memory-efficient kernel); with grouped-query attention it first computes the key and value
          gradients at the query's head count, then sums them down.  The memory-efficient kernel asked
          for a bias gradient (T5's position bias) takes one more query-sized buffer (measured once:
          16.5 MiB for a (8, 16, 1024, 64) bfloat16 query).
  Rule 5. The embedding backward sorts its indices and sums the gradient per index in float32:
          per index, the embedding's width x 4 bytes plus EMBEDDING_BYTES_PER_INDEX of index buffers.
  Each figure is rounded up to the allocator's 512 bytes.  Shapes other than those measured follow
  the same formulas; they are a model of cuDNN's and cuBLAS's choices, not their code.
"""

from __future__ import annotations

import math
import os
import re

import torch

from remat._torch_compat import op_name, tensor_leaves
from remat.measure.fake import host_step_counters
from remat.measure.cuda_allocator import ROUND
from remat.measure.tracker import StorageRecord, Tracker, rounded_bytes

ARCH = {"H100": "sm90", "H200": "sm90", "A100": "sm80", "L4": "sm89"}
CUBLAS_WORKSPACE_BYTES = {"sm90": 32 << 20, "other": (4096 * 2 + 16 * 8) << 10}
"""Rule 1: torch's default cuBLAS workspace per thread: 32 MiB on Hopper (H100, H200; measured 33,554,432
bytes on each of the two threads), else ":4096:2:16:8" (8.125 MiB; torch's CublasHandlePool default)."""
CONV_WORKSPACE_MIN_CHANNELS = 8
"""Rule 3: measured with a workspace at 64 input channels, none at 3."""
CONV_BACKWARD_EXTRA_BYTES = 2 << 20
"""Rule 3: measured 2.0-2.1 MiB beyond twice the output gradient (float32 and bfloat16)."""
EMBEDDING_BYTES_PER_INDEX = 689
"""Rule 5: 5,644,288 bytes of index buffers for 8,192 indices."""

MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm"})
ATTENTION_BACKWARDS = {
    "_scaled_dot_product_flash_attention_backward": 1,  # Rule 4: float32 row statistics kept
    "_scaled_dot_product_cudnn_attention_backward": 1,
    "_scaled_dot_product_efficient_attention_backward": 2,
}
EFFICIENT_BACKWARD = "_scaled_dot_product_efficient_attention_backward"
DENSE_OPS = MATMULS | frozenset(ATTENTION_BACKWARDS) | frozenset({
    "convolution", "convolution_backward", "cudnn_convolution", "native_batch_norm_backward",
    "cudnn_batch_norm_backward", "native_layer_norm_backward", "_fused_rms_norm_backward",
    "_softmax_backward_data", "_log_softmax_backward_data", "embedding_dense_backward",
    "max_pool2d_with_indices_backward", "upsample_nearest2d_backward", "upsample_bilinear2d_backward",
})


def as_cuda_holds_it(tracker: Tracker, opt, hardware: str, steady: bool) -> None:
    """A fake CUDA step's memory as the device holds it: cuBLAS's workspaces (Rule 1), and no GPU memory for the
    optimizer's host step counters (NOTE [What counts as live memory], Rule 8)."""
    add_cublas_workspaces(tracker, ARCH.get(hardware, ""), steady)
    for t in host_step_counters(opt):
        if (rec := tracker.record_of(t)) is not None:
            rec.nbytes = 0


def cublas_workspace_bytes(arch: str) -> int:
    """Rule 1: the bytes of one thread's cuBLAS workspace on a GPU of `arch` ("sm90", ...), as torch sizes it:
    `CUBLAS_WORKSPACE_CONFIG` (":SIZE_KIB:COUNT" pairs) when set, else its default."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if pairs:
        return sum(int(size) * int(count) for size, count in pairs) << 10
    return CUBLAS_WORKSPACE_BYTES.get(arch, CUBLAS_WORKSPACE_BYTES["other"])


def device_arch(device: torch.device) -> str:
    """"sm90" for a GPU of compute capability 9.0 (H100, H200), and so on."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def add_cublas_workspaces(tracker: Tracker, arch: str, steady: bool) -> None:
    """Rule 1, on the tracker of a CUDA step just run: a workspace record for each thread that ran a matmul
    (the forward thread, which runs the loss and optimizer too, and autograd's backward thread), resident from
    the step's start in a steady step, from the thread's first matmul in a first step."""
    size = cublas_workspace_bytes(arch)
    first: dict[bool, int] = {}
    for k, op in enumerate(tracker.ops):
        if op.name in MATMULS:
            first.setdefault(op.phase == "backward", k)
    for k in first.values():
        tracker.records.append(StorageRecord(size, -1 if steady else k, "setup", "", category="workspaces"))


class CudaWorkspaces:
    """A `Tracker.scratch_probe` for a fake CUDA step: each op's memory beyond its outputs (Rules 2-5)."""

    def start(self) -> None:
        return None

    def stop(self, started, func, args, kwargs, out) -> int:
        return op_workspace_bytes(op_name(func), args, kwargs)


def op_workspace_bytes(name: str, args, kwargs) -> int:
    """Bytes an op of `name` takes beyond its outputs on CUDA, for these arguments (Rules 2-5)."""
    extra = 0
    if name in DENSE_OPS:  # attention reads a broadcast mask as it is: only its output gradient is copied
        dense = args[:1] if name in ATTENTION_BACKWARDS else tensor_leaves((args, kwargs))
        extra += sum(_rounded(_dense_bytes(t)) for t in dense if _expanded(t))
    if name == "convolution":
        extra += _conv_forward(args)
    elif name == "convolution_backward":
        extra += _conv_backward(args)
    elif name in ATTENTION_BACKWARDS:
        extra += _attention_backward(name, args)
    elif name == "embedding_dense_backward":
        extra += _embedding_backward(args)
    return extra


def _conv_forward(args) -> int:
    """Rule 3, forward: convolution(input, weight, bias, stride, padding, dilation, transposed, ...)."""
    x, weight = args[0], args[1]
    if weight.dim() < 3 or weight.shape[1] < CONV_WORKSPACE_MIN_CHANNELS:
        return 0
    out_numel = _conv_out_numel(x, weight, args)
    return _rounded(2 * out_numel * x.element_size() + _dense_bytes(weight))


def _conv_out_numel(x, weight, args) -> int:
    stride, padding, dilation = args[3], args[4], args[5]
    spatial = [
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    ]
    return x.shape[0] * weight.shape[0] * math.prod(spatial)


def _conv_backward(args) -> int:
    """Rule 3, backward: convolution_backward(grad_output, input, weight, ..., output_mask)."""
    grad_out, weight, output_mask = args[0], args[2], args[-1]
    if not output_mask[0] or weight.dim() < 3 or weight.shape[1] < CONV_WORKSPACE_MIN_CHANNELS:
        return 0
    return _rounded(2 * grad_out.numel() * grad_out.element_size() + CONV_BACKWARD_EXTRA_BYTES)


def _attention_backward(name: str, args) -> int:
    """Rule 4: (grad_out, query, key, value, ...) -> float32 dq, row statistics, GQA's wide dk and dv."""
    query, key = args[1], args[2]
    b, heads, rows = query.shape[0], query.shape[1], query.shape[2]
    extra = _rounded(query.numel() * 4) + ATTENTION_BACKWARDS[name] * _rounded(b * heads * rows * 4)
    if key.shape[1] != heads:
        wide = key.numel() // key.shape[1] * heads * key.element_size()
        extra += 2 * _rounded(wide)
    if name == EFFICIENT_BACKWARD and len(args) > 10 and args[10][3]:  # grad_input_mask: the bias's gradient
        extra += _rounded(query.numel() * query.element_size())
    return extra


def _embedding_backward(args) -> int:
    """Rule 5: embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad)."""
    grad_out, indices = args[0], args[1]
    width = grad_out.shape[-1]
    return _rounded(indices.numel() * width * 4) + _rounded(indices.numel() * EMBEDDING_BYTES_PER_INDEX)


def _expanded(t: torch.Tensor) -> bool:
    """Rule 2: a dimension of more than one element at stride 0 (an expanded tensor)."""
    return any(st == 0 and size > 1 for size, st in zip(t.shape, t.stride()))


def _dense_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _rounded(n: int) -> int:
    return rounded_bytes(n, ROUND)
