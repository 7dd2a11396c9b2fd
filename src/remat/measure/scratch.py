"""Kernel scratch: memory an op allocates and frees inside itself, which no dispatch mode sees.

NOTE [Kernel scratch]
  Rule 1. Kernels allocate working memory that is never a tensor: on CPU, oneDNN's
          reorders of a convolution's input and gradient into its blocked layouts, im2col
          column buffers, BLAS packing; on CUDA, cuBLAS/cuDNN workspaces.  It is live only
          during the op, on top of everything live then (`live_bytes` after the op, Rule 4 of
          NOTE [What counts as live memory]), so a step's peak can be an op's scratch.
  Rule 2. In real mode on CPU it is measured around each op of the tracked pass and the
          optimizer step (`measure_scratch`), in a forked copy of the process that runs the
          same loop (NOTE [Measuring a step by the process], Rules 1 and 5): note the resident
          set, reset the high-water mark to it (only when the mark is over a quarter of
          SCRATCH_FLOOR above it: a reset walks every page of the process), run the op, read
          the mark; the op's scratch is what the mark rose by beyond the new storages the op
          returned.  Rises under SCRATCH_FLOOR are noise (interpreter objects, small heap
          growth) and count as 0.
          It runs after the tracked step, with the model and optimizer restored, for steps of
          MEASURED_FROM_BYTES or more.
  Rule 3. In fake mode, and for a smaller real step, it is estimated per op from measurements remat ships (`SCRATCH_MODELS`:
          bytes as multiples of the op's input and output bytes, fitted on this kind of machine);
          ops without a model have none.
  Rule 4. The copy runs the same ops as the tracked step but without the tracker's hooks, so
          the two op sequences are aligned by name; scratch on an op that does not align is not
          counted, and the profile says how many bytes that was.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable

import torch
import torch.nn as nn

from remat import procmem
from remat._torch_compat import TorchDispatchMode, op_name, tree_flatten
from remat.measure.loop import Loop, lead_in, micro_batch, storage_bytes
from remat.measure.step import StepInputs, run_user_code

SCRATCH_FLOOR = 1 << 20
"""Rule 2: a rise of the high-water mark under 1 MiB is not counted as an op's scratch."""

MEASURED_FROM_BYTES = 64 << 20
"""Rule 2 runs for steps whose tracked peak is this large; smaller ones keep the estimate (Rule 3): their
scratch is mostly under SCRATCH_FLOOR, and measuring costs a second run of the loop."""

SCRATCH_MODELS: dict[tuple[str, str], tuple[float, float]] = {}
"""Rule 3: {(device type, op): (bytes per input byte, bytes per output byte)}; filled below."""

def mismatch_note(lost: int) -> str:
    return (
        f"Kernel scratch: {lost} bytes measured in the copy of this process fell on ops the tracked step did not "
        "run, and are not counted (NOTE [Kernel scratch], Rule 4)."
    )


class ScratchMeter(TorchDispatchMode):
    """Rule 2: each op's rise of the process's high-water mark beyond the storages it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.scratch: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = procmem.resident_bytes()
        if procmem.high_water_mark_bytes() - before > SCRATCH_FLOOR // 4:  # else the mark is already near enough
            procmem.reset_high_water_mark()
        out = func(*args, **kwargs)
        rise = procmem.high_water_mark_bytes() - before
        extra = rise - storage_bytes(made_by(args, kwargs, out))
        self.ops.append(op_name(func))
        self.scratch.append(extra if extra >= SCRATCH_FLOOR else 0)
        return out


def measure_scratch(
    model: nn.Module, step: StepInputs, loss_fn: Callable | None, opt: torch.optim.Optimizer | None, loop: Loop
) -> tuple[list[str], list[int]]:
    """Rule 2: (op names, scratch bytes) of each op of the tracked pass and the optimizer step, measured in a
    forked copy of this process that runs the same loop from the same state.  Call it before the step."""

    def run() -> dict:
        meter = ScratchMeter()
        held = lead_in(model, step, loss_fn, opt, loop).held
        with meter:
            micro_batch(model, step, loss_fn, held)
            if opt is not None:
                run_user_code("the optimizer step", opt.step)
        return {"ops": meter.ops, "scratch": meter.scratch}

    found = procmem.in_forked_copy(run)
    return found["ops"], found["scratch"]


def matched(ops: list[str], measured: tuple[list[str], list[int]]) -> tuple[list[int], int]:
    """Rule 4: the measured scratch placed on the tracked ops, and the bytes of scratch that fell on ops the
    tracked step did not run.  The two sequences are aligned by op name: the copy runs without the tracker's
    hooks, so a few bookkeeping ops (`detach`, `empty`) differ."""
    their_ops, their_scratch = measured
    placed = [0] * len(ops)
    matcher = difflib.SequenceMatcher(None, their_ops, ops, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        placed[b : b + size] = their_scratch[a : a + size]
    return placed, sum(their_scratch) - sum(placed)


class Estimate:
    """Rule 3, as a `Tracker.scratch_probe`: each op's scratch on `device` from the shipped models."""

    def __init__(self, device: str):
        self.device = device

    def start(self) -> None:
        return None

    def stop(self, started, func, args, kwargs, out) -> int:
        model = SCRATCH_MODELS.get((self.device, op_name(func)))
        if model is None:
            return 0
        per_in, per_out = model
        return int(per_in * storage_bytes(tree_flatten((args, kwargs))[0]) + per_out * storage_bytes(tree_flatten(out)[0]))


class CudaAllocatorPeak:
    """A `Tracker.scratch_probe` on CUDA: the caching allocator's peak over the op beyond what it returned
    (cuBLAS/cuDNN workspaces go through the allocator)."""

    def start(self) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def stop(self, started: int, func, args, kwargs, out) -> int:
        torch.cuda.synchronize()
        made = storage_bytes(made_by(args, kwargs, out), rounding=512)
        return max(0, torch.cuda.max_memory_allocated() - started - made)


def made_by(args, kwargs, out) -> list[torch.Tensor]:
    """The op's outputs on storages none of its inputs had: the memory it returned."""
    inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs]


def _load_models() -> None:
    path = os.path.join(os.path.dirname(__file__), "scratch_models.json")
    if os.path.exists(path):
        with open(path) as f:
            for row in json.load(f)["models"]:
                SCRATCH_MODELS[(row["device"], row["op"])] = (row["per_input_byte"], row["per_output_byte"])


_load_models()
