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
          returned, and no more than it gave back before it returned (the mark less the resident
          set then): memory still resident after the op is no scratch of it but a lasting growth
          of the process (the interpreter's heap, a library's cache; an `addmm` kept 3 MiB so).
          Counted as that op's scratch, it was taken by every later op of its signature in the
          process (Rule 5), small ones shared by all models too (the optimizer's step count's
          `add_`, backward's `ones_like`).  Rises under SCRATCH_FLOOR are noise (interpreter
          objects, small heap growth) and count as 0.
          It runs after the tracked step, with the model and optimizer restored, for steps of
          MEASURED_FROM_BYTES or more.
  Rule 3. In fake mode, and for a smaller real step, it is estimated per op from measurements remat ships (`SCRATCH_MODELS`:
          bytes as multiples of the op's input and output bytes, fitted on this kind of machine);
          ops without a model have none.  A real step's op whose signature this process measured
          (Rule 5) takes that measurement instead.
  Rule 4. A measurement belongs to the op's signature (`signature`: the op, the dtype, shape
          and stride of each tensor argument, the other arguments): a kernel given the same
          arguments asks for the same scratch.  A view op allocates nothing: its signature is its
          name and NO_KERNEL, known to need none and never measured: the mark can rise while one runs
          (the interpreter's heap grows), and a `t` once measured at 1 MiB gave each `t` of every later step
          in the process 1 MiB (the LoRA Mistral of `tests/test_rerun_moment.py` then read 2,188,640
          bytes for a plan whose step takes 1,303,904; `tests/test_truth.py` holds the rule).  A measurement is rounded
          to SCRATCH_GRAIN, so that the tens of KiB by which the mark wanders between runs give the
          same figure every run.
          The copy runs on one thread (a forked process hangs on its parent's OpenMP pool):
          scratch that a kernel takes per thread is counted for one.
          Each tracked op gets the most its signature was measured to need (the copy runs
          without the tracker's hooks, so a few bookkeeping ops such as `detach` differ and
          have none); scratch measured on a signature the tracked step did not run is not
          counted, and the profile says how many bytes that was.
  Rule 5. Measurements are kept for the life of the process (`MEASURED`).  A later step
          whose ops all have one (verify's steps with and without the plan, explain's runs)
          takes them from there and forks no copy, so it counts the same scratch.  So does a
          later real step under MEASURED_FROM_BYTES for each op measured (a plan of a step that
          was measured: its kernels are the unplanned step's, and the plan was predicted with
          their measured scratch; a U-Net's plan, estimated instead, read 4.3% over it).
  Rule 6. An op that returns memory it does not write (`empty_like`, ...: UNINITIALIZED) leaves
          its pages uncommitted, and the process's mark rises when the next op writes them:
          measured so, dropout's `bernoulli_` seemed to draw into a temporary the size of its
          mask, counted on top of the mask itself (a recomputed dropout was the Encoder's peak in
          `tests/test_selective.py`, 4 MiB over the allocator's own events).  The copy writes
          such an op's new storages at once, so their pages rise with the op that made them.
"""

from __future__ import annotations

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

UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
"""Rule 6: ops whose outputs are allocated, not written."""

SCRATCH_GRAIN = 1 << 20
"""Rule 4: measured scratch is rounded to the nearest MiB."""

MEASURED_FROM_BYTES = 64 << 20
"""Rule 2 runs for steps whose tracked peak is this large; smaller ones keep the estimate (Rule 3): their
scratch is mostly under SCRATCH_FLOOR, and measuring costs a second run of the loop."""

SCRATCH_MODELS: dict[tuple[str, str], tuple[float, float]] = {}
"""Rule 3: {(device type, op): (bytes per input byte, bytes per output byte)}; filled below."""

Signature = tuple
NO_KERNEL = "a view: no kernel"
"""Rule 4: a view op's whole signature after its name: it has no scratch, measured or not (a checkpoint's
`detach`es, seen only in a planned step, sent `remat.verify` to measure the whole step again: 3 s of the demo)."""
MEASURED: dict[Signature, int] = {}
"""Rule 5: the scratch bytes measured in this process, by op signature."""


def signature(func, args, kwargs) -> Signature:
    """Rule 4: what decides an op's kernel and its scratch: the op, each tensor's dtype, shape and stride,
    and the other arguments."""
    if getattr(func, "is_view", False):
        return (op_name(func), NO_KERNEL)  # a view (`detach`, `t`, `view`) allocates nothing, whatever its arguments
    parts: list = [op_name(func)]
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, torch.Tensor):
            parts.append((str(a.dtype), tuple(a.shape), tuple(a.stride()), a.device.type))
        elif a is None or isinstance(a, (bool, int, float, str)):
            parts.append(a)
        else:
            parts.append(
                str(a)
                if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format))
                else type(a).__name__
            )
    return tuple(parts)


def is_view(sig: Signature) -> bool:
    """Rule 4: the signature of a view, which needs no scratch and is never measured."""
    return sig[1:] == (NO_KERNEL,)


def known(signatures: list[Signature]) -> list[int] | None:
    """Rule 5: the scratch of each op from earlier measurements, if every op has one."""
    if not all(s in MEASURED or is_view(s) for s in signatures):
        return None
    return [MEASURED.get(s, 0) for s in signatures]


def unestimated_notes(device: str) -> list[str]:
    """Rule 3 has nothing to go on for a device remat ships no measurements for: say so, not 0 silently."""
    if any(d == device for d, _ in SCRATCH_MODELS):
        return []
    shipped = sorted({d for d, _ in SCRATCH_MODELS}) or ["no device"]
    return [
        f"Kernel scratch on {device} is not estimated in fake mode (remat ships measurements for "
        f"{', '.join(shipped)}): the peak may miss cuBLAS/cuDNN workspaces. "
        "A real-mode profile on the device measures them."
    ]


def mismatch_note(lost: int) -> str:
    return (
        f"Kernel scratch: {lost} bytes measured in the copy of this process fell on ops the tracked step did not "
        "run, and are not counted."
    )


class ScratchMeter(TorchDispatchMode):
    """Rule 2: each op's rise of the process's high-water mark beyond the storages it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Signature] = []
        self.scratch: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(signature(func, args, kwargs))
        if is_view(self.ops[-1]):  # Rule 4: never measured; a rise of the mark meanwhile is not its own
            self.scratch.append(0)
            return func(*args, **kwargs)
        before = procmem.resident_bytes()
        if procmem.high_water_mark_bytes() - before > SCRATCH_FLOOR // 4:  # else the mark is already near enough
            procmem.reset_high_water_mark()
        out = func(*args, **kwargs)
        made = made_by(args, kwargs, out)
        if op_name(func) in UNINITIALIZED:  # Rule 6: its pages are the process's from here, not the next writer's
            for t in made:
                t.untyped_storage().fill_(0)
        mark = procmem.high_water_mark_bytes()
        extra = min(mark - before - storage_bytes(made), mark - procmem.resident_bytes())  # Rule 2: given back
        self.scratch.append(round(extra / SCRATCH_GRAIN) * SCRATCH_GRAIN if extra >= SCRATCH_FLOOR else 0)
        return out


def measure_scratch(
    model: nn.Module, step: StepInputs, loss_fn: Callable | None, opt: torch.optim.Optimizer | None, loop: Loop
) -> tuple[list[Signature], list[int]]:
    """Rule 2: (op signatures, scratch bytes) of each op of the tracked pass and the optimizer step, measured in a
    forked copy of this process that runs the same loop from the same state.  Call it before the step."""

    def run() -> dict:
        meter = ScratchMeter()
        held = lead_in(model, step, loss_fn, opt, loop).held
        procmem.map_large_allocations()  # NOTE [Measuring a step by the process], Rule 1
        with meter:
            micro_batch(model, step, loss_fn, held, keep_output=loop.keep_output)
            if opt is not None:
                run_user_code("the optimizer step", opt.step)
        return {"ops": meter.ops, "scratch": meter.scratch}

    found = procmem.in_forked_copy(run)  # JSON comes back: a signature's tuples as lists
    return [_tuples(sig) for sig in found["ops"]], found["scratch"]


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def placed(ops: list[Signature], measured: tuple[list[Signature], list[int]]) -> tuple[list[int], int]:
    """Rules 4 and 5: the scratch of each tracked op (given by signature) after keeping the copy's
    measurements, and the bytes measured on signatures the tracked step did not run."""
    their_ops, their_scratch = measured
    for sig, b in zip(their_ops, their_scratch):
        MEASURED[sig] = max(MEASURED.get(sig, 0), b)
    for sig in ops:
        MEASURED.setdefault(sig, 0)  # a bookkeeping op of the tracked step alone: no kernel, no scratch
    ran = set(ops)
    return [MEASURED[s] for s in ops], sum(b for sig, b in zip(their_ops, their_scratch) if sig not in ran)


class Estimate:
    """Rule 3, as a `Tracker.scratch_probe`: each op's scratch on `device` from the shipped models; with
    `signed` (real mode), also each op's signature, to place a measurement on it later (Rules 4 and 5), and an
    op measured before takes its measurement (Rule 5)."""

    def __init__(self, device: str, signed: bool = False):
        self.device = device
        self.signatures: list[Signature] | None = [] if signed else None

    def start(self) -> None:
        return None

    def stop(self, started, func, args, kwargs, out) -> int:
        if self.signatures is not None:
            sig = signature(func, args, kwargs)
            self.signatures.append(sig)
            if sig in MEASURED:  # Rule 5: a kernel measured in this process, by a larger step of the same model
                return MEASURED[sig]
        model = SCRATCH_MODELS.get((self.device, op_name(func)))
        if model is None:
            return 0
        per_in, per_out = model
        return int(
            per_in * storage_bytes(tree_flatten((args, kwargs))[0]) + per_out * storage_bytes(tree_flatten(out)[0])
        )


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
