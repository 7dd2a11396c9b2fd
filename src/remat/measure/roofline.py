"""Predicted seconds of an op on a named device: the roofline of its FLOPs and the bytes it moves.

NOTE [An op's seconds, predicted]
  Rule 1. An op takes max(FLOPs / F, bytes / B, t0) seconds on a device that computes F FLOP/s
          and moves B bytes/s, where t0 is the least an op costs (a kernel launch on a GPU, the
          eager dispatch on a CPU).  FLOPs are `FlopCounterMode`'s (matmuls, convolutions and
          attention; 0 for pointwise ops); bytes are those of its tensor inputs and outputs,
          each read or written once.
  Rule 2. F is the device's dense matmul rate for the op's dtype: bf16/fp16 on tensor cores,
          TF32 for float32 when torch allows it (`torch.get_float32_matmul_precision()` is not
          "highest"), plain fp32 otherwise.  F and B are the data sheet's peaks derated by
          ACHIEVED_COMPUTE and ACHIEVED_BANDWIDTH: eager kernels reach about that much of them.
  Rule 3. A view (the op's output aliases an input: `view`, `t`, `expand`, ...) moves no bytes
          and launches no kernel: 0 seconds on a GPU, t0 on a CPU (the dispatch still runs).
  Rule 4. "cpu" is a nominal CPU (CPU_FLOPS, CPU_BANDWIDTH, CPU_OP_S, near the 2-core machine
          this project is tested on), not this machine measured: a prediction is the same on
          every run and every machine.  A real profile measures this machine's own seconds.
  Rule 5. Checkpointing's own per-op costs (NOTE [The seconds of a step], Rule 5) are host
          Python, the same whatever the device: a prediction takes HOST_CHECKPOINT_OP_S and
          HOST_SELECTIVE_OP_S, as measured on the reference machine.
  The roofline orders ops by cost and puts a step's recomputation in proportion; it is no
  stopwatch (it ignores caches, fusion and overlap).  A real profile measures instead
  (NOTE [The seconds of a step] in `remat.measure.timing`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from remat._torch_compat import flops_of, tensor_leaves
from remat.errors import RematError

ACHIEVED_COMPUTE = 0.7
"""Fraction of the data sheet's matmul rate an eager kernel reaches."""
ACHIEVED_BANDWIDTH = 0.8
"""Fraction of the data sheet's memory bandwidth a pointwise kernel reaches."""
TFLOPS, TBS, US = 1e12, 1e12, 1e-6


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
    """The least an op costs (Rule 1)."""
    gpu: bool = True

    def matmul_rate(self, dtype: torch.dtype) -> float:
        """Rule 2: the FLOP/s an eager matmul of `dtype` reaches."""
        if dtype in (torch.bfloat16, torch.float16):
            rate = self.half_flops
        elif dtype == torch.float32 and self.gpu and torch.get_float32_matmul_precision() != "highest":
            rate = self.tf32_flops
        elif dtype == torch.float64:
            rate = self.fp32_flops / 2
        else:
            rate = self.fp32_flops
        return rate * ACHIEVED_COMPUTE

    def describe(self) -> str:
        if not self.gpu:
            return (f"a nominal CPU ({CPU_FLOPS / 1e9:g} GFLOP/s, {CPU_BANDWIDTH / 1e9:g} GB/s, {CPU_OP_S / US:g} us "
                    "per op; profile in real mode for this machine's own seconds)")
        return (f"{self.name} ({self.half_flops / TFLOPS:g} TFLOP/s bf16, {self.fp32_flops / TFLOPS:g} fp32, "
                f"{self.bandwidth / TBS:g} TB/s; eager kernels at {ACHIEVED_COMPUTE:.0%} of its FLOP rate and "
                f"{ACHIEVED_BANDWIDTH:.0%} of its bandwidth)")


HARDWARE = {  # NVIDIA data sheets, SXM parts where there are several
    "A100": Hardware("A100", 312 * TFLOPS, 156 * TFLOPS, 19.5 * TFLOPS, 2.039 * TBS, 4 * US),
    "H100": Hardware("H100", 989 * TFLOPS, 495 * TFLOPS, 67 * TFLOPS, 3.35 * TBS, 4 * US),
    "H200": Hardware("H200", 989 * TFLOPS, 495 * TFLOPS, 67 * TFLOPS, 4.8 * TBS, 4 * US),
    "L4": Hardware("L4", 121 * TFLOPS, 60 * TFLOPS, 30.3 * TFLOPS, 0.3 * TBS, 4 * US),
}
CPU_FLOPS, CPU_BANDWIDTH, CPU_OP_S = 0.3 * TFLOPS, 0.03 * TBS, 2 * US
"""Rule 4: what an eager float32 matmul, a pointwise kernel and the least op reach on the reference machine
(measured 2026-11-24: 0.30 TFLOP/s, 25-30 GB/s, 1-2 us per op), as achieved rates."""
HARDWARE["cpu"] = Hardware("cpu", CPU_FLOPS / ACHIEVED_COMPUTE, CPU_FLOPS / ACHIEVED_COMPUTE,
                           CPU_FLOPS / ACHIEVED_COMPUTE, CPU_BANDWIDTH / ACHIEVED_BANDWIDTH, CPU_OP_S, gpu=False)
NAMES = tuple(HARDWARE)
GPUS = tuple(n for n, hw in HARDWARE.items() if hw.gpu)
HOST_CHECKPOINT_OP_S, HOST_SELECTIVE_OP_S = 16 * US, 20 * US
"""Rule 5: what a checkpoint adds per op it re-runs, and selective checkpointing's policy per op and pass, on
the reference machine (`remat.measure.timing.bookkeeping`, and a dispatch mode on a Llama's forward)."""
DEFAULT_GPU = "H100"


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
    if getattr(func, "is_view", False):
        return 0.0 if hw.gpu else hw.op_s  # Rule 3
    flops = flops_of(func, args, kwargs, out) if flops is None else flops
    tensors = tensor_leaves((args, kwargs)) + tensor_leaves(out)
    moved = sum(t.numel() * t.element_size() for t in tensors)
    compute = flops / hw.matmul_rate(_dtype(tensors)) if flops else 0.0
    return max(compute, moved / (hw.bandwidth * ACHIEVED_BANDWIDTH), hw.op_s)


def _dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
