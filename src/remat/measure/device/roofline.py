"""Predicted seconds of an op on a named device: the roofline of its FLOPs and the bytes it moves.

NOTE [An op's seconds, predicted]
  Rule 1. An op takes max(kernel, t0) seconds, where the kernel takes max(FLOPs / F, bytes / B) on a
          device that computes F FLOP/s and moves B bytes/s, and t0 is the least an op costs: the
          host's time to issue it (on a GPU the host runs ahead of the kernels, so a kernel longer than
          t0 hides it).  FLOPs are `FlopCounterMode`'s (matmuls, convolutions and attention; 0 for
          pointwise ops); bytes are those of its tensor inputs and outputs, each read or written once
          (an in-place op's output is the input it wrote).
  Rule 2. F is the device's dense matmul rate for the op's dtype: bf16/fp16 on tensor cores,
          TF32 for float32 when torch allows it (`torch.get_float32_matmul_precision()` is not
          "highest"), plain fp32 otherwise.  F and B are the data sheet's peaks derated by
          ACHIEVED_COMPUTE and ACHIEVED_BANDWIDTH: eager kernels reach about that much of them.
  Rule 3. A view (the op's output aliases an input: `view`, `t`, `expand`, ...) moves no bytes
          and launches no kernel: 0 seconds on a GPU, t0 on a CPU (the dispatch still runs).  Ops
          that only answer a question about metadata (`prim.device`, `aten.sym_size`) are no ops of
          the step at all: fake tensors ask them, an eager step does not; `empty` allocates and runs
          nothing: t0.
  Rule 4. "cpu" is a nominal CPU (CPU_FLOPS, CPU_BANDWIDTH, CPU_OP_S, near the 2-core machine
          this project is tested on), not this machine measured: a prediction is the same on
          every run and every machine.  Its transcendental functions (tanh, erf, exp, ...) take
          CPU_PASSES times their bytes: they compute more per element than its memory feeds.  A
          real profile measures this machine's own seconds, and asks the roofline of its device
          (`nominal`) only for orders the clock's noise must not decide (`OpRecord.predicted_s`).
  Rule 5. Checkpointing's own per-op costs (NOTE [The seconds of a step], Rule 5) are host
          Python.  On a CPU all of it shows: HOST_CHECKPOINT_OP_S and HOST_SELECTIVE_OP_S, as
          measured on the reference machine (`benchmarks/checkpoint_overheads.py`), in a real
          profile as in a prediction (`overheads_on`).  On a GPU the host works while the kernels run and only
          what they do not hide shows: GPU_CHECKPOINT_OP_S per op re-run (and selective's in the same
          proportion), fitted to every-layer checkpointing measured on an H100.
  Rule 6. On a GPU, kernels of a class run at the fraction of the data sheet they reached on an H100
          (`tests/gpu_facts/h100/op_times.json`, 2026-11-26; other GPUs scale by their data sheets):
          attention at ATTENTION[kernel, dtype] of the matmul peak per direction, slowed by dropout, a
          mask and a bias that needs a gradient; a convolution takes FLOPs at CONVOLUTION's fraction of
          the tensor-core peak (cuDNN runs float32 as TF32 unless `torch.backends.cudnn.allow_tf32` is
          off) plus its bytes at CONVOLUTION_BANDWIDTH; ops measured to pass over their bytes more
          than once (normalisation, softmax's and pooling's backward, an embedding's gradient) take
          PASSES times their bytes.
  Rule 7. On a GPU t0 is GPU_OP_S, the host's time per op of an eager step, fitted to eager steps
          measured on an H100; `.item()` (Adam's step counters live in host memory) costs CPU_OP_S.
  The roofline orders ops by cost and puts a step's recomputation in proportion; it is no
  stopwatch (it ignores caches, fusion and overlap beyond Rule 1).  A real profile measures instead
  (NOTE [The seconds of a step] in `remat.measure.timing`).  docs/validation.md §5 holds it against
  the H100's figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from remat._torch_compat import flops_of, op_name, tensor_leaves
from remat._torch_compat.schema import named_arguments, runs_no_kernel
from remat.errors import RematError

ACHIEVED_COMPUTE = 0.7
"""Fraction of the data sheet's matmul rate an eager kernel reaches (H100, 2026-11-26: a float32 Linear of
8192 x 1024 -> 4096 at 0.69 of fp32 forward and backward, bf16 under autocast 0.6-0.8 with its casts)."""
ACHIEVED_BANDWIDTH = 0.8
"""Fraction of the data sheet's memory bandwidth a pointwise kernel reaches."""
TFLOPS, TBS, US = 1e12, 1e12, 1e-6

ATTENTION = {("flash", "half"): (0.37, 0.44), ("efficient", "half"): (0.22, 0.23), ("efficient", "fp32"): (0.47, 0.46)}
"""Rule 6: the fraction of the matmul peak (half: tensor cores; fp32: no TF32) SDPA's fused kernels reach, forward
and backward, on FLOPs as counted (a causal mask counts the whole square).  H100, torch 2.11, 2026-11-26, (8, 16,
1024, 64): flash bf16 causal 93 / 196 us, memory-efficient float32 1094 / 2764 us, bf16 with a float mask 189 / 394."""
ATTENTION_DROPOUT, ATTENTION_MASK, ATTENTION_BIAS_GRAD = (0.65, 0.85), (0.81, 0.95), (0.45, 0.30)
"""Rule 6: the rate's factor with dropout (flash bf16 0.53 / 0.81, float32 0.78 / 0.88), with a mask or bias (float32
with a boolean mask 0.81 / 0.95) and with a bias that needs a gradient (T5's: 0.45 / 0.30), forward / backward."""
CONVOLUTION, CONVOLUTION_BANDWIDTH = (0.34, 0.22), 0.4
"""Rule 6: a cuDNN convolution's FLOPs (as counted) at this fraction of the tensor-core peak, forward / backward, plus
its bytes at this fraction of the bandwidth: fitted to 3x3 convolutions of 32 x 64 x 128 x 128 (float32 as TF32
391 / 989 us, bf16 248 / 473) and of 3 channels in (122 / 155)."""
PASSES = {
    "native_batch_norm": 3.3,
    "cudnn_batch_norm": 3.3,
    "native_batch_norm_backward": 5.7,
    "cudnn_batch_norm_backward": 5.7,
    "_softmax_backward_data": 1.9,
    "max_pool2d_with_indices_backward": 2.7,
    "embedding_dense_backward": 4.5,
}
"""Rule 6: ops measured over their bytes more than once on the H100 (2026-11-26): the measured kernel's seconds over
the one-pass prediction (batch norm 335 / 861 us on 128 MiB, softmax's backward 287, pooling's 372, an embedding's
gradient 274)."""
CPU_PASSES = {"tanh": 4.8, "where": 4.0, "erf": 2.5, "gelu_backward": 2.2, "log": 1.9, "exp": 1.6}
"""Rule 4: on the nominal CPU, ops measured at more than 1.5 passes over their bytes on the reference machine
(2026-11-27, float32, 16 MiB, the least of 15 rounds; `python benchmarks/cpu_passes.py`, results/cpu_passes.md):
transcendental functions compute more per element than the memory feeds.  By it a GPT-2 block's tanh outranks its
q @ k, as measured (NOTE [Which outputs a selective checkpoint keeps], Rule 2)."""


@dataclass(frozen=True)
class Hardware:
    """A device's peak rates (data sheet, dense: no sparsity) and the least an op costs on it."""

    name: str
    half_flops: float
    """bf16 / fp16 matmul FLOP/s."""
    tf32_flops: float
    fp32_flops: float
    bandwidth: float
    """Memory bytes/s."""
    op_s: float
    """The least an op costs (Rules 1 and 7)."""
    gpu: bool = True
    checkpoint_op_s: float = 0.0
    """What a checkpoint adds per op it re-runs, as much as shows in a step (Rule 5)."""
    selective_op_s: float = 0.0
    """What a selective checkpoint's policy adds per op and pass, as much as shows (Rule 5)."""

    def matmul_rate(self, dtype: torch.dtype) -> float:
        """Rule 2: the FLOP/s an eager matmul of `dtype` reaches."""
        return self.peak(dtype, tf32=self.gpu and torch.get_float32_matmul_precision() != "highest") * ACHIEVED_COMPUTE

    def peak(self, dtype: torch.dtype, tf32: bool = False) -> float:
        """The data sheet's matmul FLOP/s for `dtype` (float32 on TF32 tensor cores if `tf32`)."""
        if dtype in (torch.bfloat16, torch.float16):
            return self.half_flops
        if dtype == torch.float32 and tf32:
            return self.tf32_flops
        return self.fp32_flops / 2 if dtype == torch.float64 else self.fp32_flops

    def overheads(self) -> dict[str, float]:
        """Rule 5: a step's `checkpoint_op_s` and `selective_op_s` on this device."""
        return {"checkpoint_op_s": self.checkpoint_op_s, "selective_op_s": self.selective_op_s}

    def describe(self) -> str:
        if not self.gpu:
            return (
                f"a nominal CPU ({CPU_FLOPS / 1e9:g} GFLOP/s, {CPU_BANDWIDTH / 1e9:g} GB/s, {CPU_OP_S / US:g} us "
                "per op; profile in real mode for this machine's own seconds)"
            )
        return (
            f"{self.name} ({self.half_flops / TFLOPS:g} TFLOP/s bf16, {self.fp32_flops / TFLOPS:g} fp32, "
            f"{self.bandwidth / TBS:g} TB/s; eager kernels at the fractions of its peaks an H100 reached, "
            f"{self.op_s / US:g} us per op)"
        )


GPU_OP_S = 10 * US
"""Rule 7: the host's time per op of an eager step on a GPU: fitted to the steps of eager models measured on an
H100 (tests/gpu_facts/h100/step_times.json and zoo_truth.json, docs/validation.md §5)."""
GPU_CHECKPOINT_OP_S = 4 * US
"""Rule 5: a checkpoint's own cost per op re-run that shows on a GPU: every-layer checkpointing cost an H100 +31% on
a Llama-style decoder and +26% on BERT-base (issue 36, 2026-11-26), 4-5 us per op beyond the ops' own seconds."""
HOST_CHECKPOINT_OP_S, HOST_SELECTIVE_OP_S = 16 * US, 20 * US
"""Rule 5: what a checkpoint adds per op it re-runs, and selective checkpointing's policy per op and pass, on
the reference machine (`python benchmarks/checkpoint_overheads.py`): medians 13.9 and 11.0 us on 2026-11-27, 8.4 and
5.9 on 2026-12-05 (the same kind of machine, a faster day; docs/validation.md §5), and more per op on models than
on its chain; kept at what the plans of `benchmarks/seconds.py` were checked with."""
GPU_SELECTIVE_OP_S = HOST_SELECTIVE_OP_S * GPU_CHECKPOINT_OP_S / HOST_CHECKPOINT_OP_S
"""Rule 5: not measured on a GPU; hidden by the kernels in the proportion a checkpoint's own cost is."""


def _gpu(name: str, half: float, tf32: float, fp32: float, bandwidth: float) -> Hardware:
    return Hardware(
        name,
        half * TFLOPS,
        tf32 * TFLOPS,
        fp32 * TFLOPS,
        bandwidth * TBS,
        GPU_OP_S,
        True,
        GPU_CHECKPOINT_OP_S,
        GPU_SELECTIVE_OP_S,
    )


HARDWARE = {  # NVIDIA data sheets, SXM parts where there are several
    "A100": _gpu("A100", 312, 156, 19.5, 2.039),
    "H100": _gpu("H100", 989, 495, 67, 3.35),
    "H200": _gpu("H200", 989, 495, 67, 4.8),
    "L4": _gpu("L4", 121, 60, 30.3, 0.3),
}
CPU_FLOPS, CPU_BANDWIDTH, CPU_OP_S = 0.3 * TFLOPS, 0.03 * TBS, 2 * US
"""Rule 4: what an eager float32 matmul, a pointwise kernel and the least op reach on the reference machine
(measured 2026-11-24: 0.30 TFLOP/s, 25-30 GB/s, 1-2 us per op), as achieved rates."""
HARDWARE["cpu"] = Hardware(
    "cpu",
    CPU_FLOPS / ACHIEVED_COMPUTE,
    CPU_FLOPS / ACHIEVED_COMPUTE,
    CPU_FLOPS / ACHIEVED_COMPUTE,
    CPU_BANDWIDTH / ACHIEVED_BANDWIDTH,
    CPU_OP_S,
    False,
    HOST_CHECKPOINT_OP_S,
    HOST_SELECTIVE_OP_S,
)
NAMES = tuple(HARDWARE)
GPUS = tuple(n for n, hw in HARDWARE.items() if hw.gpu)
DEFAULT_GPU = "H100"


def nominal(device: torch.device) -> Hardware:
    """The roofline of a real step's device: this machine's GPU when it is a named one, else DEFAULT_GPU for
    CUDA, the nominal CPU (Rule 4) for a CPU."""
    return HARDWARE[(_local_gpu() or DEFAULT_GPU) if device.type == "cuda" else "cpu"]


def overheads_on(device: torch.device) -> dict[str, float]:
    """Rule 5: a measured step's `checkpoint_op_s` and `selective_op_s` on `device`: the same as a prediction's
    (NOTE [The seconds of a step], Rule 5; every GPU has the same)."""
    return nominal(device).overheads()


def hardware(name: str | None, target: torch.device) -> tuple[Hardware, str]:
    """The roofline a fake-mode step on `target` is timed by, and a note saying which one it is.

    `name` is one of NAMES (any case), or None: the GPU of this machine when it is a named one,
    else DEFAULT_GPU for a CUDA target, and this machine for a CPU one."""
    if name is None:
        name = _local_gpu() if target.type == "cuda" else "cpu"
        guessed = name is None
        name = name or DEFAULT_GPU
    else:
        guessed = False
        name = _known(name)
    hw = HARDWARE[name]
    if hw.gpu != (target.type == "cuda"):
        where = "a GPU" if hw.gpu else "a CPU"
        raise RematError(
            f"remat: hardware={name!r} is {where}, but the step is predicted for device={target.type!r}. "
            f"Expected a GPU name ({', '.join(GPUS)}) with device='cuda', or 'cpu' with device='cpu'. "
            f"Fix: pass device='{'cuda' if hw.gpu else 'cpu'}', or another hardware."
        )
    note = f"Seconds predicted by the roofline of {hw.describe()} (docs/validation.md §5)"
    if guessed:
        note += f". No GPU named here: pass hardware= ({', '.join(GPUS)}) for yours"
    return hw, note + "."


def _known(name: str) -> str:
    for known in NAMES:
        if str(name).lower() == known.lower():
            return known
    raise RematError(
        f"remat: hardware must name a device remat has a roofline for: {', '.join(NAMES)}; saw {name!r}. "
        "Fix: pick the nearest one (the prediction scales with its FLOP rate and bandwidth), or profile "
        "with mode='real' on the device itself."
    )


def _local_gpu() -> str | None:
    if not torch.cuda.is_available():
        return None
    found = torch.cuda.get_device_name().upper()
    return next((n for n in sorted(GPUS, key=len, reverse=True) if n in found), None)


def op_seconds(hw: Hardware, func, args, kwargs, out, flops: int | None = None) -> float:
    """Rule 1: the predicted seconds of one aten op (`func` on `args`, `kwargs`, returning `out`)."""
    if runs_no_kernel(func):
        return 0.0  # Rule 3
    if getattr(func, "is_view", False):
        return 0.0 if hw.gpu else hw.op_s  # Rule 3
    name = op_name(func)
    if name in ALLOCATES_ONLY:
        return hw.op_s  # Rule 3
    if hw.gpu and name == "_local_scalar_dense":
        return CPU_OP_S  # Rule 7
    flops = flops_of(func, args, kwargs, out) if flops is None else flops
    inputs = tensor_leaves((args, kwargs))
    seen = {id(t) for t in inputs}
    tensors = inputs + [t for t in tensor_leaves(out) if id(t) not in seen]  # an in-place op's output is its input
    moved = sum(t.numel() * t.element_size() for t in tensors)
    dtype = _dtype(tensors)
    if hw.gpu and flops and name.startswith(_ATTENTION):
        return max(flops / _attention_rate(hw, func, args, kwargs, dtype), hw.op_s)  # Rule 6
    if hw.gpu and flops and name.startswith("convolution"):
        return max(_convolution_s(hw, name, flops, moved, dtype), hw.op_s)  # Rule 6
    compute = flops / hw.matmul_rate(dtype) if flops else 0.0
    passes = (PASSES if hw.gpu else CPU_PASSES).get(name, 1.0)
    return max(compute, passes * moved / (hw.bandwidth * ACHIEVED_BANDWIDTH), hw.op_s)


ALLOCATES_ONLY = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
_ATTENTION = (
    "_scaled_dot_product_flash",
    "_scaled_dot_product_efficient",
    "_scaled_dot_product_cudnn",
    "_flash_attention",
    "_efficient_attention",
)


def _attention_rate(hw: Hardware, func, args, kwargs, dtype: torch.dtype) -> float:
    """Rule 6: the FLOP/s one of SDPA's fused kernels reaches, forward or backward."""
    named = named_arguments(func, args, kwargs)
    name = op_name(func)
    backward = name.endswith("_backward")
    half = dtype in (torch.bfloat16, torch.float16)
    kernel = "flash" if half and "efficient" not in name else "efficient"
    fraction = ATTENTION[kernel, "half" if half else "fp32"][backward]
    if named.get("dropout_p", 0.0):
        fraction *= ATTENTION_DROPOUT[backward]
    bias = named.get("attn_bias")
    if isinstance(bias, torch.Tensor):
        fraction *= ATTENTION_MASK[backward]
        mask = named.get("grad_input_mask")
        if mask[3] if backward and mask is not None else bias.requires_grad:
            fraction *= ATTENTION_BIAS_GRAD[backward]
    return hw.peak(dtype) * fraction


def _convolution_s(hw: Hardware, name: str, flops: int, moved: int, dtype: torch.dtype) -> float:
    """Rule 6: a cuDNN convolution's seconds, its FLOPs at the tensor-core rate plus its bytes."""
    backward = name.endswith("_backward")
    rate = hw.peak(dtype, tf32=torch.backends.cudnn.allow_tf32) * CONVOLUTION[backward]
    return flops / rate + moved / (hw.bandwidth * CONVOLUTION_BANDWIDTH)


def _dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
