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
          dense bytes.  Elementwise kernels, and attention's broadcast masks, are read as they are.  A
          batched matmul (`bmm`, `baddbmm`) hands cuBLAS each operand's batch stride as it is, 0 too (a
          weight `matmul` broadcast over a non-contiguous input's batch): only an operand expanded within
          its matrices is copied (torch's `prepare_batch_matrix_for_cublas` clones for a stride-0 row or
          column), and the added `input` of `baddbmm` is copied into the output, no extra.  From torch's
          source, not yet measured (`benchmarks/gpu_probe.py`, "linear of a frozen weight on a transposed ...").
  Rule 3. cuDNN's convolution, for input channels per group of CONV_WORKSPACE_MIN_CHANNELS or more,
          takes a workspace of twice its output plus its weight in forward (64 -> 64 channels 3x3:
          256 MiB beyond a 128 MiB output) and twice the output gradient plus 2 MiB in backward
          when the input gradient is asked for; with 3 input channels it takes none.  That is the
          common case, not a law: cuDNN picks the algorithm, hence the workspace, by heuristics of
          its own.  Measured over 22 shapes at batch 16 and 8 on an H200 (`cuda_conv_workspaces.json`,
          torch 2.11.0+cu130, cuDNN benchmark off, 2026-11-27) forward took 0 to 4 times the output
          (1x1 kernels none) and backward 0 to 4 times the output gradient (1x1 up to 12 times:
          36 MiB for the 3 MiB gradient of a 32 -> 3 head at 16 x 128 x 128).  On sm90 a shape in
          that table takes its measured bytes at its batch, or scaled from the nearest batch (at 8
          from 16: forward exact for 18 of 22 shapes, backward for 11, others 0.5-2x off: cuDNN
          chooses again per batch); other shapes the formula above.
  Rule 4. The attention kernels' backward accumulates the query's gradient in float32 (its elements
          x 4 bytes) and keeps one float32 row statistic per query row (flash; two for the
          memory-efficient kernel); with grouped-query attention it first computes the key and value
          gradients at the query's head count, then sums them down.  The memory-efficient kernel asked
          for a bias gradient (T5's position bias) takes one more query-sized buffer (measured once:
          16.5 MiB for a (8, 16, 1024, 64) bfloat16 query).
  Rule 5. The embedding backward sorts its indices and sums the gradient per index in float32:
          per index, the embedding's width x 4 bytes plus EMBEDDING_BYTES_PER_INDEX of index buffers.
  Rule 6. A reduction (`sum`, `mean`) over many inputs per output stages partial results in a buffer
          of the accumulator's type taken through the allocator, sized by torch's `setReduceConfig`
          (`_reduction_staging`: block shape, outputs vectorised by 4, input split across up to one
          wave of thread blocks of the device's SMs).  Reducing a dimension that is not the
          innermost, as autograd makes a Linear's bias gradient, is the large case: each of the
          32 x 4 outputs a block writes gets a slot per block on its column, 4 x outputs x blocks x
          128 bytes: 128 MiB for the bias of a (16384, 1024) gradient.  Measured on an H200 (torch
          2.11.0+cu130, 132 SMs, 2026-11-27, `benchmarks/gpu_probe.py`): 134,218,240 / 33,554,944 /
          138,412,544 bytes for (16384, 1024), (4096, 1024) and (8192, 4096) float32 and 134,218,240 for
          (16384, 1024) bfloat16 over dim 0, 3,072 for all of a (16384, 1024), as this rule computes.
  Each figure is rounded up to the allocator's 512 bytes.  Shapes other than those measured follow
  the same formulas; they are a model of cuDNN's and cuBLAS's choices, not their code.
"""

from __future__ import annotations

import json
import math
import os
import re

import torch

from remat._torch_compat import op_name, tensor_leaves
from remat.measure.device.fake import host_step_counters
from remat.measure.device.cuda_allocator import ROUND
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

SMS = {"H100": 132, "H200": 132, "A100": 108, "L4": 58}
"""Rule 6: streaming multiprocessors of each GPU (SXM parts; `multiProcessorCount`)."""
THREADS_PER_SM = {"sm90": 2048, "sm80": 2048, "sm89": 1536}
"""Rule 6: `maxThreadsPerMultiProcessor` by architecture."""
REDUCTIONS = frozenset({"sum", "mean"})
REDUCE_THREADS, REDUCE_VALUES_MIN, REDUCE_VALUES_MAX = 512, 16, 256
"""Rule 6: torch's reduction kernel's most threads a block, and its least and most values per thread."""

MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm"})
BATCHED_MATMULS = {"bmm": slice(0, 2), "baddbmm": slice(1, 3)}
"""Rule 2: the batched matmuls, and where their two batched operands are among the arguments."""
ATTENTION_BACKWARDS = {
    "_scaled_dot_product_flash_attention_backward": 1,  # Rule 4: float32 row statistics kept
    "_scaled_dot_product_cudnn_attention_backward": 1,
    "_scaled_dot_product_efficient_attention_backward": 2,
}
EFFICIENT_BACKWARD = "_scaled_dot_product_efficient_attention_backward"
DENSE_OPS = (
    MATMULS
    | frozenset(ATTENTION_BACKWARDS)
    | frozenset(
        {
            "convolution",
            "convolution_backward",
            "cudnn_convolution",
            "native_batch_norm_backward",
            "cudnn_batch_norm_backward",
            "native_layer_norm_backward",
            "_fused_rms_norm_backward",
            "_softmax_backward_data",
            "_log_softmax_backward_data",
            "embedding_dense_backward",
            "max_pool2d_with_indices_backward",
            "upsample_nearest2d_backward",
            "upsample_bilinear2d_backward",
        }
    )
)


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
    """ "sm90" for a GPU of compute capability 9.0 (H100, H200), and so on."""
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
    """A `Tracker.scratch_probe` for a fake CUDA step on `hardware` ("H100", ...): each op's memory beyond its
    outputs (Rules 2-6)."""

    def __init__(self, hardware: str = "H100"):
        self.arch = ARCH.get(hardware, "sm90")
        self.sms = SMS.get(hardware, SMS["H100"])
        self.threads_per_sm = THREADS_PER_SM.get(self.arch, 2048)

    def start(self) -> None:
        return None

    def stop(self, started, func, args, kwargs, out) -> int:
        return op_workspace_bytes(op_name(func), args, kwargs, self.arch, self.sms * self.threads_per_sm)


def op_workspace_bytes(name: str, args, kwargs, arch: str, device_threads: int) -> int:
    """Bytes an op of `name` takes beyond its outputs on CUDA of `arch` ("sm90", ...) running `device_threads`
    threads at once (SMs x threads per SM), for these arguments (Rules 2-6)."""
    if name in REDUCTIONS and args and isinstance(args[0], torch.Tensor):
        return _reduction_staging(args[0], args[1] if len(args) > 1 else kwargs.get("dim"), device_threads)
    extra = 0
    if name in BATCHED_MATMULS:  # Rule 2: the batch's stride reaches cuBLAS as it is
        operands = args[BATCHED_MATMULS[name]]
        extra += sum(_rounded(_dense_bytes(t)) for t in operands if isinstance(t, torch.Tensor) and _expanded(t, 1))
    elif name in DENSE_OPS:  # attention reads a broadcast mask as it is: only its output gradient is copied
        dense = args[:1] if name in ATTENTION_BACKWARDS else tensor_leaves((args, kwargs))
        extra += sum(_rounded(_dense_bytes(t)) for t in dense if _expanded(t))
    if name == "convolution":
        measured = _measured_conv(args, "forward_bytes", arch)
        extra += measured if measured is not None else _conv_forward(args)
    elif name == "convolution_backward":  # measured with every gradient asked for
        measured = _measured_conv(args[1:], "backward_bytes", arch) if all(args[-1]) else None
        extra += measured if measured is not None else _conv_backward(args)
    elif name in ATTENTION_BACKWARDS:
        extra += _attention_backward(name, args)
    elif name == "embedding_dense_backward":
        extra += _embedding_backward(args)
    return extra


def _measured_conv(args, which: str, arch: str) -> int | None:
    """Rule 3: the workspace measured for this convolution's shape on `arch` at its batch, or else at the nearest
    batch measured, split into whole halves of the output's bytes, which scale with the batch, and a rest that
    does not (the weight, in most rows: an H100 at batch 32 took 2 x output + weight where the H200 table has it
    at 16); None for a shape not measured.
    `args`: (input, weight, bias, stride, padding, dilation, transposed, ...) of `convolution`."""
    x, weight = args[0], args[1]
    if arch not in CONV_WORKSPACES or x.dim() != 4 or x.shape[0] == 0:
        return None
    batches = CONV_WORKSPACES[arch].get(_conv_key(x.shape[1:], weight.shape, args[3], args[4], args[6], x.dtype))
    if not batches:
        return None
    batch = min(batches, key=lambda b: abs(math.log(b / x.shape[0])))
    row = batches[batch]
    measured, output = row[which], row["output_bytes"]
    halves = 2 * measured // output
    return _rounded(halves * output * x.shape[0] // (2 * batch) + measured - halves * output // 2)


def _conv_key(per_item, weight, stride, padding, transposed, dtype) -> tuple:
    return (tuple(per_item), tuple(weight), _pair(stride), _pair(padding), bool(transposed), str(dtype))


def _pair(v) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


def _load_conv_workspaces() -> dict:
    """Rule 3's table (`cuda_conv_workspaces.json`): arch -> shape key -> {batch measured: its row}."""
    path = os.path.join(os.path.dirname(__file__), "cuda_conv_workspaces.json")
    with open(path) as f:
        data = json.load(f)
    table: dict[tuple, dict[int, dict]] = {}
    for row in data["rows"]:
        key = _conv_key(
            row["input"][1:], row["weight"], row["stride"], row["padding"], row["transposed"], "torch." + row["dtype"]
        )
        table.setdefault(key, {})[row["input"][0]] = row
    return {data["arch"]: table}


CONV_WORKSPACES = _load_conv_workspaces()


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


def _reduction_staging(x: torch.Tensor, dims, device_threads: int) -> int:
    """Rule 6: the staging buffer and semaphores of a sum or mean of `x` over `dims` (None or empty: all), as
    torch's `setReduceConfig` sizes them for a GPU that runs `device_threads` threads at once (SMs x threads per
    SM).  The iterator's dimensions: size-1 ones dropped, the reduced ones first, each group sorted by stride and
    merged where contiguous."""
    if x.dim() == 0:
        return 0
    reduced = set(range(x.dim())) if not dims and dims != 0 else {d % x.dim() for d in _as_list(dims)}
    groups = [
        _merged(sorted((x.stride(d), n) for d in range(x.dim()) if (n := x.shape[d]) > 1 and (d in reduced) == r))
        for r in (True, False)
    ]
    if not groups[0] or x.numel() == 0:
        return 0
    outputs = math.prod(n for _, n in groups[1])
    inputs = x.numel() // outputs
    on_fastest = not groups[1] or groups[0][0][0] < groups[1][0][0]
    fastest = groups[0][0][0] if on_fastest else groups[1][0][0]
    dim0, dim1, vec = (inputs, outputs, 1) if on_fastest else (outputs, inputs, 1)
    if fastest == 1 and on_fastest and dim0 > 128 and len(groups[0]) == 1:
        dim0 //= 4  # inputs vectorised by 4
    elif fastest == 1 and not on_fastest:
        vec = next(v for v in (4, 2, 1) if all(n % v == 0 for n in _vec_sizes(groups)))
        dim0 //= vec
    most = REDUCE_THREADS // vec
    pow0, pow1 = (min(_last_pow2(d), most) for d in (dim0, dim1))
    height = min(pow1, most // min(pow0, 32))
    width = min(pow0, most // height)
    step_in, step_out = (width, 1) if on_fastest else (1, width)
    split_input = -(-inputs // step_in) >= min(height * REDUCE_VALUES_MIN, REDUCE_VALUES_MAX)  # either suffices
    step_in, step_out = (step_in * height, step_out) if split_input else (step_in, step_out * height)
    grid = -(-(outputs // vec) // step_out)
    values = -(-inputs // step_in)
    target = device_threads // (width * height)  # one wave: blocks per SM x SMs
    if not split_input or values < REDUCE_VALUES_MAX or grid > target:
        return 0
    ctas = max(min(-(-target // grid), -(-values // REDUCE_VALUES_MIN)), -(-values // REDUCE_VALUES_MAX))
    if ctas <= 1:
        return 0
    acc = 8 if x.dtype in (torch.float64, torch.int64) or not x.is_floating_point() else 4
    staging = acc * outputs * ctas * (1 if on_fastest else width * vec)
    return _rounded(staging) + _rounded(4 * grid)


def _as_list(dims) -> list[int]:
    return [dims] if isinstance(dims, int) else list(dims)


def _merged(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(stride, size) pairs, fastest first, with each pair merged into the one before where it continues it."""
    out: list[tuple[int, int]] = []
    for stride, size in dims:
        if out and out[-1][0] * out[-1][1] == stride:
            out[-1] = (out[-1][0], out[-1][1] * size)
        else:
            out.append((stride, size))
    return out


def _vec_sizes(groups) -> list[int]:
    """What an output vector's width must divide: the fastest kept dimension's size and every other stride."""
    kept = groups[1]
    return [kept[0][1], *(s for s, _ in groups[0]), *(s for s, _ in kept[1:])]


def _last_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _expanded(t: torch.Tensor, batch_dims: int = 0) -> bool:
    """Rule 2: a dimension of more than one element at stride 0 (an expanded tensor), past the first `batch_dims`."""
    return any(st == 0 and size > 1 for size, st in list(zip(t.shape, t.stride()))[batch_dims:])


def _dense_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _rounded(n: int) -> int:
    return rounded_bytes(n, ROUND)
