"""`remat.profile`: measure (or predict) where the memory of one training step goes."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from remat._torch_compat import FakeTensorMode, ModuleTracker, real_kernel_rules
from remat._torch_compat.distributed import is_compiled, uncompiled
from remat.errors import RematError, UnsupportedOp
from remat import hf
from remat import procmem
from remat.measure import scratch
from remat.measure.device import cuda_kernels, cuda_workspaces, fake, roofline
from remat.measure.device.known import KnownValues, traced_unless_known
from remat.measure.block_io import BlockIO
from remat.measure.build import Setup, build_profile, classify, register_state
from remat.measure.device.cuda_allocator import ROUND
from remat.measure.outputs import COMPILED_NOTE, unread_note, unread_outputs
from remat.measure.loop import FIRST_STEP_NOTE, Loop, first_step_note, fresh_cast_cache, lead_in, optimizer_state
from remat.measure.parallel import Parallel, ddp_buckets, parallel_of
from remat.measure.ranks import check_request, optimizer_for, predicted_ddp_buckets, prediction_note
from remat.measure.ranks import rank_share, sharded_copy
from remat.measure.step import (
    StateSnapshot,
    StepInputs,
    check_model,
    check_optimizer,
    compute_loss,
    make_optimizer,
    normalize_inputs,
    run_user_code,
)
from remat.measure.timing import StepTimes, host_bandwidth, settle, time_loop
from remat.measure.tracker import Tracker
from remat.module_tree import class_name, find_candidates
from remat.progress import Progress, resolve, say
from remat.types import Mode, ParallelKind, Step, StepProfile

SIMULATED_NOTE = (
    "CUDA target simulated on CPU: storages rounded to 512 bytes like the CUDA caching allocator; "
    "optimizer, autocast, attention, dropout and cuBLAS/cuDNN workspaces as on CUDA (docs/validation.md §4.1)."
)


def profile(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable | None = None,
    optimizer: Any = None,
    mode: str = "real",
    *,
    device: str | torch.device | None = None,
    blocks: list[str] | None = None,
    progress: bool | Progress | None = None,
    step: str = "steady",
    accumulate: int = 1,
    world_size: int = 1,
    wrap: Any = "fsdp",
    hardware: str | None = None,
    keep_output: bool = True,
    timed: bool = True,
) -> StepProfile:
    """The eager step of `model` measured or predicted: `remat.profile` (in `remat.entry`, whose docstring says
    what each argument does) without the compiled step's own peak, which it adds for a compiled model."""
    compiled, model = model, uncompiled(check_model(model))  # the model inside torch.compile
    check_request(model, mode, world_size, wrap)
    loop, say_phase = Loop.of(step, accumulate, keep_output), resolve(progress, "profile")
    options = _Options(mode, device, blocks, say_phase, loop, hardware, timed, world_size, wrap, is_compiled(compiled))
    args = (model, inputs, loss_fn, optimizer, options)
    prof = _profile(*args) if world_size == 1 else _predict_ranks(*args)
    return dataclasses.replace(prof, notes=prof.notes + [COMPILED_NOTE]) if is_compiled(compiled) else prof


@dataclasses.dataclass(frozen=True)
class _Options:
    mode: str
    device: str | torch.device | None
    blocks: list[str] | None
    progress: Progress | None
    loop: Loop
    hardware: str | None = None
    timed: bool = True
    world_size: int = 1
    wrap: Any = None
    """With `world_size` > 1: how the model is spread over the ranks predicted (NOTE [N ranks from one process])."""
    compiled: bool = False


def _predict_ranks(model, inputs, loss_fn, optimizer, options: _Options) -> StepProfile:
    """NOTE [N ranks from one process]: the step of rank 0 of `options.world_size`, the model wrapped by
    `options.wrap`."""
    world_size, wrap = options.world_size, options.wrap
    share, note = rank_share(inputs, world_size), prediction_note(world_size, wrap, inputs)
    if wrap == "ddp":
        ddp = Parallel("ddp", world_size, 0, None, tuple(predicted_ddp_buckets(model)))
        prof = _profile(model, share, loss_fn, optimizer, options, ddp)
    else:
        setup = _setup(model, options.mode, options.device, options.hardware)
        with sharded_copy(model, world_size, wrap, _run_device(setup)) as sharded:
            prof = _profile(sharded, share, loss_fn, optimizer_for(optimizer, model, sharded), options)
    return dataclasses.replace(prof, model=type(model).__name__, notes=prof.notes + [note])


@torch.compiler.set_stance("force_eager")  # see _torch_compat.distributed.uncompiled: code compiled elsewhere too
def _profile(model, inputs, loss_fn, optimizer, options: _Options, parallel: Parallel | None = None) -> StepProfile:
    """`profile` of one process's step; `parallel` says how a prediction spreads it (else found on the model)."""
    model, found = parallel_of(model)  # NOTE [A rank's step]
    step_inputs = normalize_inputs(inputs)
    setup = dataclasses.replace(_setup(model, options.mode, options.device, options.hardware), timed=options.timed)
    setup = dataclasses.replace(setup, compiled=options.compiled)
    check_optimizer(optimizer, model)
    candidates = find_candidates(model, options.blocks)
    run = _Run(model, loss_fn, candidates, setup, options.progress, options.loop, parallel or found)
    real = setup.mode == Mode.REAL  # NOTE [A kernel Hugging Face runs as its reference]:
    with hf.reference_kernels_heard(setup.target.type == "cuda") as heard:
        prof = _measure_real(run, step_inputs, optimizer) if real else _measure_fake(run, inputs, optimizer)
    return dataclasses.replace(prof, notes=prof.notes + hf.reference_note(heard, not real))


def _measure_real(run: "_Run", step_inputs: StepInputs, optimizer: Any) -> StepProfile:
    opt = make_optimizer(optimizer, run.model)
    snapshot = StateSnapshot(run.model, opt, step_inputs.tensors())
    try:
        return run.measure(step_inputs, opt, snapshot.restore)
    finally:
        snapshot.restore()


def _setup(model: nn.Module, mode: str, device: str | torch.device | None, hardware: str | None = None) -> Setup:
    """Check the mode, device and hardware asked for, and decide how the step is measured."""
    if mode not in tuple(Mode):
        raise RematError(f"remat: mode must be 'real' or 'fake'; saw {mode!r}. Fix: pick one of the two.")
    model_device = _model_device(model)
    target = torch.device(device) if device is not None else model_device
    if mode == Mode.REAL and target.type != model_device.type:
        raise RematError(
            f"remat: mode='real' measures on the model's device ({model_device}), but device={target} was asked. "
            f"Fix: move the model with model.to('{target}'), or predict with mode='fake', device='{target}'."
        )
    if mode == Mode.REAL and hardware is not None:
        raise RematError(
            f"remat: hardware={hardware!r} names the device a fake-mode prediction is timed for; a real step is "
            "timed as it runs. Fix: leave hardware out, or predict with mode='fake'."
        )
    simulated = mode == Mode.FAKE and target.type == "cuda" and not torch.cuda.is_available()
    rounding = ROUND if target.type == "cuda" else 1
    hw, note = roofline.hardware(hardware, target) if mode == Mode.FAKE else (None, None)
    notes = ([SIMULATED_NOTE] if simulated else []) + ([note] if note else [])
    return Setup(Mode(mode), target, rounding, simulated, tuple(notes), hw)


def _run_device(setup: Setup) -> torch.device:
    """Where a fake step's tensors live: the CPU for a simulated CUDA target."""
    return torch.device("cpu") if setup.simulated else setup.target


def _measure_fake(run: "_Run", inputs: Any, optimizer: Any) -> StepProfile:
    """The step on fake tensors: the model's parameters and buffers swapped for fake ones meanwhile.  Where an op
    needs values the fake step has not, again with the inputs' values (NOTE [Values a fake step can know], Rule 6)."""
    notes = list(run.notes)
    try:
        return _fake_step(run, inputs, optimizer, None)
    except UnsupportedOp:
        run.notes[:] = notes
        return _fake_step(run, inputs, optimizer, KnownValues())


def _fake_step(run: "_Run", inputs: Any, optimizer: Any, known: KnownValues | None) -> StepProfile:
    fake_mode = fake.existing_fake_mode(run.model) or FakeTensorMode(allow_non_fake_inputs=True)
    run_device = _run_device(run.setup)
    buffers = list(run.model.buffers()) if known is not None else []  # their real values, before the swap
    with (
        fake.fake_model(run.model, fake_mode, run_device) as table,
        hf.unpacked_sequences_unless_given(inputs) as packed,  # NOTE [Packed sequences under fake tensors]
        hf.masks_read_where_known(traced_unless_known(known)),  # NOTE [A mask Hugging Face reads, under fake tensors]
    ):
        faked = fake.fake_inputs(inputs, fake_mode, run_device)
        if known is not None:
            known.know_step((faked, inputs), table, buffers)
        fake_step = normalize_inputs(faked)
        opt = make_optimizer(optimizer, run.model)
        if opt is not None and any(id(p) in table for g in opt.param_groups for p in g["params"]):
            opt = fake.fake_optimizer(opt, table, fake_mode, run_device)
        if opt is not None and run.setup.target.type == "cuda" and fake.multi_tensor_as_on_cuda(opt):
            run.notes.append(fake.FOREACH_NOTE)
        if not run.setup.fake_cuda:
            run.notes.extend(scratch.unestimated_notes(run.setup.target.type))
        run.notes.extend([hf.PACKED_NOTE] if packed else [])
        kernels = cuda_kernels.as_on_cuda() if run.setup.simulated else contextlib.nullcontext()
        values = known if known is not None else contextlib.nullcontext()
        with fake_mode, values, kernels as simulated, real_kernel_rules():  # NOTE [A CUDA step simulated on CPU]
            prof = run.measure(fake_step, opt)
    return dataclasses.replace(prof, notes=prof.notes + simulated.notes()) if simulated is not None else prof


@dataclasses.dataclass
class _Run:
    """One tracked step of `model`: the tracker and hooks around forward, loss, backward and optimizer."""

    model: nn.Module
    loss_fn: Callable | None
    candidates: list[str]
    setup: Setup
    progress: Progress | None
    loop: Loop = Loop()
    parallel: Parallel = Parallel()
    notes: list[str] = dataclasses.field(default_factory=list)
    """What this run noticed, beside the `setup`'s notes decided before it (the profile's `notes`)."""

    @property
    def runner(self) -> nn.Module:
        """What the training loop calls: the DDP wrapper, else the model (NOTE [A rank's step])."""
        return self.parallel.runner or self.model

    def measure(self, step: StepInputs, opt: torch.optim.Optimizer | None, restore=None) -> StepProfile:
        """The profile of the step; `restore()` puts the model and optimizer back as before it (real mode)."""
        cuda_real = self.setup.cuda_real
        # NOTE [The seconds of a step], Rule 4
        timed = self.setup.mode == Mode.REAL and self.setup.timed and not self.parallel.kind
        tracker = self._new_tracker(timed)
        io = BlockIO(self.model, self.candidates, tracker)
        with hf.no_cache_in_training(self.model) as cache:  # NOTE [The key/value cache in training]
            # NOTE [A rank's step], Rule 3
            lead = lead_in(
                self.runner,
                step,
                self.loss_fn,
                opt,
                self.loop,
                self.setup.rounding,
                warm_steps=int(self.parallel.kind == "ddp"),
                skip_host=cuda_real,
            )
            kinds = register_state(tracker, self.model, step, opt, lead.held)  # before the clock starts
            base_allocated = _reset_cuda_peak() if cuda_real else 0
            fresh_cast_cache()
            t0 = time.perf_counter()
            self._step(tracker, io, step, opt, kinds, lead.held)
            step_s = time.perf_counter() - t0 if self.setup.mode == Mode.REAL else 0.0
        self._as_the_device_holds_it(tracker, opt, base_allocated)
        if cache.turned_off:
            self.notes.append(hf.CACHE_NOTE)
        if timed:
            say(self.progress, "timing the step")
        timing = settle(
            tracker, self.setup, bool(self.parallel.kind), lambda: self._time_again(step, opt), io.modules, self.notes
        )
        prof = build_profile(class_name(self.model), tracker, io, self.setup, step_s, self.notes)
        if restore is not None and self._measures_scratch(prof):
            say(self.progress, "kernel scratch, in a copy of the process")
            probe: Any = tracker.scratch_probe  # the `_scratch_probe()` set above: a measuring one
            tracker.scratch = self._measured_scratch(probe.signatures, step, opt, restore)
            prof = build_profile(class_name(self.model), tracker, io, self.setup, step_s, self.notes)
        return self._with_loop(prof, opt, lead.first_peak, timing)

    def _new_tracker(self, timed: bool) -> Tracker:
        cuda_real = self.setup.cuda_real
        tracker = Tracker(
            self.parallel.tracker_root(self.model),
            self.setup.rounding,
            timed,
            torch.cuda.synchronize if cuda_real else None,
            skip_host=cuda_real,
        )  # NOTE [What counts as live memory], Rule 8
        tracker.scratch_probe, tracker.roofline = self._scratch_probe(), self.setup.hardware
        tracker.nominal = None if self.setup.hardware else roofline.nominal(self.setup.target)
        return tracker

    def _with_loop(self, prof: StepProfile, opt, first_peak: int | None, timing: dict) -> StepProfile:
        """`prof` with what the loop and the ranks add: the step, the optimizer, the first step's peak, their
        notes, and the seconds (`timing`)."""
        notes = first_step_note(first_peak, prof.peak_bytes) if first_peak is not None else [FIRST_STEP_NOTE]
        par = self.parallel
        notes += par.notes() if self.setup.mode == Mode.REAL else []  # a prediction says so itself
        prof = dataclasses.replace(
            prof,
            step=Step(self.loop.step),
            accumulate=self.loop.accumulate,
            keep_output=self.loop.keep_output,
            optimizer=type(opt).__name__ if opt is not None else "",
            first_step_peak_bytes=first_peak,
            notes=prof.notes + notes,
            parallel=ParallelKind(par.kind),
            world_size=par.world_size,
            rank=par.rank,
            **timing,
        )
        if self.setup.cuda_real:
            prof = dataclasses.replace(prof, host_bandwidth_bytes_s=host_bandwidth(self.setup.target))
        return prof

    def _as_the_device_holds_it(self, tracker: Tracker, opt, base_allocated: int) -> None:
        """A CUDA step's memory that is no tensor: cuBLAS's workspaces, and (fake) Adam's host step counters
        left out (NOTE [CUDA memory that is no tensor], Rule 1); a real step notes the allocator's own peak."""
        steady = self.loop.step == Step.STEADY
        if self.setup.fake_cuda and self.setup.hardware is not None:  # a fake step always has its roofline
            cuda_workspaces.as_cuda_holds_it(tracker, opt, self.setup.hardware.name, steady)
        if self.setup.cuda_real:
            torch.cuda.synchronize()
            cuda_workspaces.add_cublas_workspaces(tracker, cuda_workspaces.device_arch(self.setup.target), steady)
            peak = torch.cuda.max_memory_allocated()
            self.notes.append(
                f"torch.cuda.max_memory_allocated() over the step: {peak} bytes, {peak - base_allocated} above its start"
            )

    def _time_again(self, step: StepInputs, opt) -> StepTimes:
        """NOTE [The seconds of a step], Rule 1: timed steps of the loop after the tracked one."""
        with hf.no_cache_in_training(self.model):
            return time_loop(self.model, step, self.loss_fn, opt, self.loop, cuda=self.setup.cuda_real)

    def _measures_scratch(self, prof: StepProfile) -> bool:
        """NOTE [Kernel scratch], Rule 2: measured on CPU in real mode, for a step large enough to show it; never
        in a rank of a job (NOTE [A rank's step], Rule 5)."""
        real_cpu = self.setup.mode == Mode.REAL and self.setup.target.type == "cpu" and not self.parallel.kind
        return real_cpu and procmem.available() and prof.peak_bytes >= scratch.MEASURED_FROM_BYTES

    def _scratch_probe(self):
        """NOTE [Kernel scratch]: the allocator's peak on CUDA, else estimated per op (Rule 3) until measured."""
        if self.setup.cuda_real:
            return scratch.CudaAllocatorPeak()
        if self.setup.fake_cuda:
            return cuda_workspaces.CudaWorkspaces(self.setup.hardware.name)  # NOTE [CUDA memory that is no tensor]
        return scratch.Estimate(self.setup.target.type, signed=self.setup.mode == Mode.REAL)

    def _measured_scratch(self, signatures: list, step: StepInputs, opt, restore) -> list[int]:
        """NOTE [Kernel scratch], Rules 2, 4 and 5: each tracked op's scratch, as measured in this process
        before or now in a copy of it that runs the loop again from the state before the step."""
        placed = scratch.known(signatures)
        if placed is not None:
            return placed
        restore()
        with hf.no_cache_in_training(self.model):
            measured = scratch.measure_scratch(self.model, step, self.loss_fn, opt, self.loop)
        placed, lost = scratch.placed(signatures, measured)
        if lost:
            self.notes.append(scratch.mismatch_note(lost))
        return placed

    def _step(self, tracker: Tracker, io: BlockIO, step: StepInputs, opt, kinds: dict[str, list], held: list) -> None:
        """Forward, loss, backward and the optimizer step, each phase labelled on the tracker; `kinds` are the
        tensors whose category is known (`register_state`), grown by the gradients and optimizer state;
        `held`, the previous pass's output and loss, is let go when the forward returns
        (NOTE [The step that is measured], Rule 4)."""
        model, runner = self.model, self.runner
        with contextlib.ExitStack() as stack:
            tracker.modules = stack.enter_context(ModuleTracker(tracker.root_type))
            stack.enter_context(io.hooks())
            stack.enter_context(tracker)
            phase = _phase_setter(tracker, self.progress)
            try:
                phase("forward")
                with torch.autograd.graph.saved_tensors_hooks(tracker.mark_saved, tracker.mark_unpacked):
                    out = run_user_code("the model's forward", lambda: runner(*step.args, **step.kwargs))
                    held.clear()
                    phase("loss")
                    loss = run_user_code("the loss", lambda: compute_loss(out, self.loss_fn))  # noqa: F821  (run here)
                    said = unread_note(unread_outputs(out, loss)) if self.setup.compiled else []
                    self.notes.extend(n for n in said if n not in self.notes)  # NOTE [An output the loss does not read]
                    if not self.loop.keep_output:  # NOTE [The step that is measured], Rule 6
                        out = None
                phase("backward")
                run_user_code("backward", loss.backward)
                kinds["grads"] += [p.grad for p in model.parameters() if p.grad is not None]
                if opt is not None:
                    phase("optimizer")
                    run_user_code("the optimizer step", opt.step)
                    kinds["optimizer"] += optimizer_state(opt)
                classify(tracker, kinds)
                self.notes.extend(ddp_buckets(tracker, self.parallel))
                del out, loss
            finally:
                tracker.modules = None


def _reset_cuda_peak() -> int:
    """The allocator's peak reset to what is allocated now, which it returns."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _model_device(model: nn.Module) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device if t.device.type != "meta" else torch.device("cpu")
    return torch.device("cpu")


def _phase_setter(tracker: Tracker, progress: Progress | None):
    def set_phase(name: str) -> None:
        tracker.phase = name
        say(progress, name, len(tracker.ops))

    return set_phase
