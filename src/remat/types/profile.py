"""Plain data produced by the measurement: `StepProfile` and its parts.

Everything here is a frozen dataclass of ints, floats, strings and lists, so a profile taken on one machine can be
saved as JSON and read, reported or planned on another.  Field names carry their units (`*_bytes`, `*_s`, `*_flops`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from remat.errors import RematError, listing
from remat.types import _json
from remat.types._text import render
from remat.types.kinds import Mode, ParallelKind, Step
from remat.types.profile_versions import UPGRADES
from remat.types.reserve import GpuReserve
from remat.types.timeline import Timeline

PROFILE_FORMAT = "remat.StepProfile"
PROFILE_VERSION = 17
"""What each version added, and how an older one reads: `remat.types.profile_versions`."""

COMPILED_PEAK_MARGIN = 0.02
"""Two measurements of one compiled step by the process counter differed by up to 1.5% (tests/test_compile.py):
a budget needs this margin over `compiled_peak_bytes` to count as met (NOTE [A compiled step's peak])."""
PHASES = ("forward", "loss", "backward", "optimizer")
CATEGORIES = (
    "params",
    "buffers",
    "inputs",
    "grads",
    "optimizer",
    "gathered",
    "workspaces",
    "activations",
    "temporaries",
    "scratch",
)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Live tensor bytes at one moment, split by what the storage is (NOTE [What counts as live memory], tracker)."""

    params_bytes: int = 0
    """Parameters of the model (each shared storage once)."""
    buffers_bytes: int = 0
    """Registered buffers (BatchNorm running stats, position ids, ...)."""
    inputs_bytes: int = 0
    """The sample inputs given to the step."""
    grads_bytes: int = 0
    """Storages that are, or become, a parameter's `.grad`."""
    optimizer_bytes: int = 0
    """Optimizer state (Adam's exp_avg / exp_avg_sq, momentum buffers, ...)."""
    gathered_bytes: int = 0
    """Parameters FSDP2 all-gathered for the units computing (and prefetched) then: 0 without FSDP."""
    workspaces_bytes: int = 0
    """Memory a GPU's libraries keep that is no tensor (cuBLAS's workspace per thread that ran a matmul,
    NOTE [CUDA memory that is no tensor]): 0 on CPU."""
    activations_bytes: int = 0
    """Tensors made in forward or loss and saved by autograd for backward."""
    temporaries_bytes: int = 0
    """Everything else: outputs not saved, backward intermediates, workspaces made of tensors."""
    scratch_bytes: int = 0
    """Working memory of the op running then that is no tensor (NOTE [Kernel scratch]): measured, or estimated."""

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, f"{name}_bytes") for name in CATEGORIES}


@dataclass(frozen=True, slots=True)
class SelectiveVariant:
    """Selective checkpointing of one block that keeps the outputs of the ops in `keeps` and recomputes the
    rest (NOTE [Which outputs a selective checkpoint keeps]); its figures are read as the `selective_*` ones
    of `BlockProfile`, which describe the variant keeping matmul, convolution and attention outputs."""

    keeps: list[str]
    """`remat.ops.op_signature` of each op kept: its name and tensor arguments' shapes."""
    free_bytes: int
    extra_bytes: int
    recompute_flops: int
    recompute_s: float
    recompute_ops: int
    stranded_bytes: int = 0
    kept_made: list[list[int]] = field(default_factory=list)
    """[op index, bytes] of each op the recomputation takes from the cache: what the unplanned forward allocated
    there, and the recomputation does not (NOTE [Which outputs a selective checkpoint keeps], Rule 5)."""
    kept_outside: list[list[int]] = field(default_factory=list)
    """[freed, released, bytes] of each kept output an op outside the block saves or reads after its forward: the
    unplanned step frees it at op `freed`, the cache at `released` (where the block re-runs, or its backward's end)."""
    cast_bytes: int = 0
    """Part of `free_bytes` that autocast's cache holds until it lets go (`BlockProfile.autocast_casts`)."""


@dataclass(frozen=True, slots=True)
class BlockProfile:
    """One candidate module for checkpointing, as it ran in the profiled step."""

    name: str
    """Dotted path in the model (`transformer.h.3`); "" is the model itself."""
    type: str
    """Class name of the module."""
    index: int
    """Position in execution order among the candidates (first forward entry)."""
    depth: int
    """Nesting depth among candidates: 0 for a block inside no other candidate."""
    parent: str | None
    """Name of the nearest enclosing candidate, if any."""
    calls: int
    """How many times its forward ran in the forward phase (shared modules run more than once)."""
    saved_bytes: int
    """Bytes of activations made inside this module and saved for backward (live at end of forward)."""
    output_bytes: int
    """Bytes of the module's output tensors (last call)."""
    output_saved_bytes: int
    """Part of `output_bytes` that autograd keeps for backward (used by the next op, or a checkpoint input)."""
    input_bytes: int
    """Bytes of the module's tensor inputs (last call), what a checkpoint around it would keep."""
    internal_bytes: int
    """Activations made inside and saved only by ops inside: what a checkpoint around it frees."""
    output_kept_by: list[str]
    """Sibling candidates (same parent) whose ops save its output for backward, itself included if
    it saves its own output; "*" if code outside every sibling saves it too.  A checkpointed
    segment of siblings frees the output when all of these are in the segment; `output_own_bytes` aside (v16)."""
    input_unsaved_bytes: int
    """Part of the inputs that autograd does not keep and that would otherwise be freed: a checkpoint around it keeps
    them alive until its backward."""
    forward_flops: int
    """Forward FLOPs (formulas of `torch.utils.flop_counter`)."""
    backward_flops: int
    """Backward FLOPs attributed to this module."""
    recompute_flops: int
    """Forward FLOPs run again during backward because of checkpointing already in the model."""
    checkpoint_recompute_flops: int
    """Forward FLOPs a non-reentrant checkpoint around this module would re-run in backward: its
    ops up to the last one whose output autograd saves inside it (torch stops recomputing there)."""
    selective_free_bytes: int
    """Part of `internal_bytes` that selective checkpointing frees: outputs of ops other than matmuls, convolutions and
    attention (those it keeps)."""
    selective_extra_bytes: int
    """Outputs of its matmul-like ops that autograd does not keep but selective checkpointing caches until the block's
    backward."""
    selective_recompute_flops: int
    """Forward FLOPs selective checkpointing re-runs: the ops it does not keep, up to the last saved one."""
    forward_s: float
    """Seconds of its forward ops (measured, or predicted: `StepProfile.timing`; 0.0 when not timed)."""
    backward_s: float
    """Seconds of its backward ops (as `forward_s`)."""
    selective_recompute_s: float
    """Seconds of the ops selective checkpointing re-runs (as `forward_s`)."""
    peak_bytes: int
    """Highest live bytes of the step seen while this module ran (forward, backward or recompute)."""
    forward_start_op: int
    """Timeline index of its first forward op (first call)."""
    forward_end_op: int
    """Timeline index of its last forward op."""
    backward_start_op: int
    """Timeline index of its first backward op (-1 if it has none)."""
    backward_end_op: int
    """Timeline index of its last backward op (-1 if it has none)."""
    checkpointed: bool
    """True if the step checkpoints it already: its forward ran again in backward."""
    checkpoint_kind: str = ""
    """How: "checkpoint_wrapper", "recomputed" (torch.utils.checkpoint or similar in the user's code), "remat"
    (remat's own: every op re-run is inside a module remat.apply or remat.checkpoint wrapped), or ""."""
    has_dropout: bool = False
    """A random op (dropout, ...) ran inside it."""
    has_batchnorm: bool = False
    """A BatchNorm in training mode ran inside it."""
    batchnorm_stats_bytes: int = 0
    """Their running statistics, which remat's checkpoint copies while it re-runs them (`remat.applier.wrapping`)."""
    checkpoint_recompute_ops: int = 0
    """How many ops a checkpoint around it re-runs (the deterministic tie-break among equal FLOPs)."""
    selective_recompute_ops: int = 0
    """How many ops selective checkpointing re-runs."""
    checkpoint_recompute_s: float = 0.0
    """Seconds of the ops a checkpoint around it re-runs (those of `checkpoint_recompute_flops`)."""
    offload_bytes: int = 0
    """Bytes of the step's tensors (not parameters or buffers) that ops inside it save for backward:
    what offloading it copies to CPU memory in forward and back in backward."""
    container: str = ""
    """Class of the module holding it ("Sequential", "ModuleList", ...): remat can checkpoint a run of
    several siblings as one segment inside an nn.Sequential or an nn.ModuleList, and nowhere else."""
    output_last_use_op: int = -1
    """Timeline index of the last op of forward or loss that reads its saved output (-1: none): a checkpoint
    frees that output no earlier, whoever holds it until then (a skip connection, the model's loop).  A read
    by the enclosing module's own code (not inside a sibling) counts as lasting until that module's forward
    ends: a variable or list there holds the output until it returns."""
    extra: bool = False
    """A module outside the model's blocks (an embedder, stem, final norm or head;
    `remat.module_tree.find_extras`): plans may checkpoint it, the recipes and the chain leave it out."""
    output_free_op: int = -1
    """Timeline index at which the unplanned step frees its saved output (past the step's length if not before its
    last op was over; -1: not recorded).  Past the end of its own backward, something besides autograd holds it
    (the model returns it: `output_hidden_states=True`), and no checkpoint frees it."""
    held_inputs: list[list[int]] = field(default_factory=list)
    """[tensor, bytes, op index at which the unplanned step frees it] for each part of `input_unsaved_bytes`,
    positional or keyword; `tensor` is the same number wherever the step passes the same tensor (T5's
    position bias goes to every layer): a checkpoint holds it from its free until the checkpoint's backward
    is over, and several checkpoints hold it once (`remat.planner.holds`)."""
    kept_inputs: list[list[int]] = field(default_factory=list)
    """As `held_inputs`, for inputs autograd keeps for ops outside it only (NOTE [The memory model of a plan], Rule 2)."""
    output_keys: list[int] = field(default_factory=list)
    """The tensor numbers (as in `held_inputs`) of its saved outputs."""
    output_own_bytes: int = 0
    """Part of `output_saved_bytes` that only its own ops save and read, freed by the unplanned step by the end of
    its backward: an output the caller drops (wav2vec2's feature projection also returns its normalised input, which
    only its own Linear saves).  A checkpoint around it frees that part from `output_own_free_op`, whoever keeps its
    other outputs (NOTE [The memory model of a plan], Rule 1)."""
    output_own_free_op: int = -1
    """Where a checkpoint frees `output_own_bytes` (-1: none): where the step let go of them, else the first
    backward op after the block's forward (NOTE [When the caller lets go of an output] in `remat.measure.block_io`)."""
    autocast_casts: list[list[int]] = field(default_factory=list)
    """[op index, bytes, released] of each part of `internal_bytes` that autocast's cache holds too (a parameter's
    cast to the half dtype): made by that op, let go by the cache before op `released` (the step's length if not in
    it).  A checkpoint frees it from then on (NOTE [A weight autocast casts] in `remat.measure.tracker`)."""
    grad_ops_before: int = 0
    """Forward ops that ran between the previous sibling's forward and this one's and read a tensor that
    requires grad (loop code between nn.ModuleList entries, another module): one checkpoint cannot run both
    siblings (NOTE [A run of nn.ModuleList entries as one checkpoint])."""
    foreign_grad_inputs: int = 0
    """Inputs that require grad and are neither an input nor an output of the previous sibling (the encoder's
    states T5's decoder block passes to its cross-attention layer): one checkpoint cannot run both siblings."""
    selective_stranded_bytes: int = 0
    """Part of `selective_extra_bytes` made after the last op a checkpoint re-runs: the recomputation
    stops before it takes them out of the cache, which holds them until the block's backward is over."""
    selective_variants: list[SelectiveVariant] = field(default_factory=list)
    """Selective checkpoints keeping other sets of outputs than matmul-like ones, from the outputs that are
    dearest to recompute per byte (NOTE [Which outputs a selective checkpoint keeps])."""
    freed_before_forward_bytes: int = 0
    """Bytes the timeline counts after the op before its first forward op that are gone when that op starts
    (storages freed in between and that op's kernel scratch: NOTE [What counts as live memory], Rules 4-5)."""
    freed_before_backward_bytes: int = 0
    """The same before its first backward op: what the previous backward node releases before this block's
    backward starts, and so before a checkpoint around it re-runs (NOTE [The memory model of a plan], Rule 3)."""
    rerun_op: int = -1
    """Timeline index of the op before which backward first unpacked a tensor an op inside it packed: where a checkpoint
    around it re-runs its forward (NOTE [When a checkpoint re-runs], tracker); -1: not recorded, its first backward op."""
    freed_before_rerun_bytes: int = 0
    """As `freed_before_backward_bytes`, before `rerun_op`."""
    selective_replays: bool = True
    """torch's selective checkpoint replays its forward: False where the forward took from autocast's cache a cast
    the re-run makes anew (NOTE [A selective checkpoint and autocast's cache] in `remat.measure.cast_replay`)."""
    selective_matmul_written: bool = False
    """An output the matmul policy keeps is written in place later (a conv's through `nn.ReLU(inplace=True)`): torch's
    selective checkpoint refuses it at the re-run, so only `selective_variants` are planned (they keep no such output)."""
    selective_kept_made: list[list[int]] = field(default_factory=list)
    selective_kept_outside: list[list[int]] = field(default_factory=list)
    """`SelectiveVariant.kept_made` and `kept_outside` of the policy keeping matmul, convolution and attention outputs."""
    call: int = -1
    """-1: all its calls (`StepProfile.blocks`); k >= 0: its k-th forward call alone (`StepProfile.call_blocks`)."""


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Where the memory of one training step goes. Returned by `remat.profile`."""

    model: str
    """Class name of the profiled model."""
    mode: Mode
    """"real" (measured) or "fake" (predicted with fake tensors)."""
    device: str
    """Device the figures are for ("cpu", "cuda"). See `simulated_device`."""
    peak_bytes: int
    """Peak of live tensor bytes during the whole step."""
    peak_phase: str
    """Phase in which the peak happened: forward, loss, backward or optimizer."""
    peak_module: str
    """Innermost module running at the peak ("" for the model itself or code outside modules)."""
    peak_op: str
    """The op whose output made the peak."""
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    """Gradient bytes live at the end of backward."""
    optimizer_bytes: int
    """Optimizer state bytes live at the end of the step."""
    activation_bytes: int
    """Bytes saved for backward, live at the end of forward (and loss)."""
    at_peak: Breakdown
    end_of_forward: Breakdown
    forward_flops: int
    backward_flops: int
    recompute_flops: int
    """Forward FLOPs re-run in backward by checkpointing already in the model."""
    step_s: float
    """Wall seconds of the tracked step, tracking included (0.0 in fake mode); the step's own are `step_time_s`."""
    blocks: list[BlockProfile]
    timeline: Timeline
    call_blocks: list[BlockProfile] = field(default_factory=list)
    """Each call of a candidate whose forward ran more than once (ALBERT's shared layer), as its own block
    (NOTE [A module called more than once] in `remat.measure.calls`), in the order of `blocks` and of the calls."""
    torch_version: str = ""
    allocation_rounding_bytes: int = 1
    """Every storage counted rounded up to this (512 for the CUDA caching allocator)."""
    simulated_device: bool = False
    """True when `device` is a target this machine does not have (CPU kernels, its allocator's rounding)."""
    host_bandwidth_bytes_s: float = 0.0
    """Pinned host<->device copy speed measured after a real CUDA step (what offloading costs); 0.0 otherwise."""
    notes: list[str] = field(default_factory=list)
    """Things the measurement noticed that a reader should know (fallbacks, unsupported parts)."""
    step: Step = Step.STEADY
    """Which step of the training loop was measured: "steady" (from the second step on, the optimizer's
    state resident) or "first" (NOTE [The step that is measured] in `remat.measure.loop`)."""
    accumulate: int = 1
    """Forward/backward passes per optimizer step; the figures are those of the last pass and the optimizer step."""
    optimizer: str = ""
    """The class of the optimizer whose step (and state) the profile counts ("Adam"), "" for none."""
    keep_output: bool = True
    """The loop measured keeps the model's output until after backward (True) or only the loss (False, Hugging Face's
    Trainer) (NOTE [The step that is measured], Rule 6)."""
    first_step_peak_bytes: int | None = None
    """Peak live tensor bytes of the first step, metered before a steady-state measurement (None for step="first")."""
    parallel: ParallelKind = ParallelKind.ONE
    """How the step is spread over ranks: "fsdp" (FSDP2's `fully_shard`), "ddp" (DistributedDataParallel) or ""
    (one process); the figures are one rank's (NOTE [A rank's step] in `remat.measure.parallel`)."""
    world_size: int = 1
    """How many ranks run the step (for a fake-mode prediction, how many it was predicted for)."""
    rank: int = 0
    """The rank whose step was measured (0 in a fake-mode prediction)."""
    timing: str = ""
    """Where the seconds come from (NOTE [The seconds of a step] in `remat.measure.timing`): "measured" (timed
    steps after a warm-up), "tracked" (the tracked step's clock), "roofline <device>" (predicted), or "" (not
    timed: plans minimise FLOPs)."""
    step_time_s: float = 0.0
    """Seconds of a step of the loop without remat: median of timed steps (real), roofline's op sum (fake), or 0.0."""
    checkpoint_op_s: float = 0.0
    """What a checkpoint costs per op it re-runs beyond the op itself (its hooks and frames): a constant of the
    device, the reference machine's on a CPU (NOTE [The seconds of a step], Rule 5); 0.0 when not timed."""
    selective_op_s: float = 0.0
    """Selective checkpointing's policy's cost per op of the module, in forward and in its recomputation (Rule 5)."""
    compiled_peak_bytes: int = 0
    """Of a compiled model (`torch.compile(model)`, `model.compile()`), the compiled step's own peak by a counter
    that is not remat's tracker (`compiled_counter`), measured by `remat.profile`; 0 otherwise.  Every other
    figure is the eager step's (NOTE [A compiled step's peak] in `remat.entry`)."""
    compiled_counter: str = ""
    """The counter that measured `compiled_peak_bytes` (as `VerifyReport.independent_counter` names it)."""
    compiled_step_s: float = 0.0
    """Seconds of one compiled step, timed by the copy that measured `compiled_peak_bytes` (CPU: one thread)."""
    gpu_reserve: GpuReserve | None = None
    """Of a CUDA step, what the caching allocator would allocate and reserve for it, replayed
    (NOTE [The caching allocator's reserve] in `remat.measure.device.cuda_allocator`); None on CPU."""

    @property
    def timed(self) -> bool:
        """Op seconds are known: plans of this profile minimise seconds (FLOPs break ties)."""
        return bool(self.timing)

    # -- convenience ---------------------------------------------------------
    def block(self, name: str) -> BlockProfile:
        for b in self.blocks:
            if b.name == name:
                return b
        raise RematError(
            f"remat: no candidate block named {name!r} in this profile; "
            f"expected one of: {listing((b.name for b in self.blocks), 8)}. "
            "Fix: pass blocks=[...] to remat.profile to add a module as a candidate."
        )

    def __post_init__(self) -> None:  # the words as enums, whoever made the profile (JSON keeps the strings)
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "step", Step(self.step))
        object.__setattr__(self, "parallel", ParallelKind(self.parallel))

    def __str__(self) -> str:
        return render(self)

    # -- JSON ------------------------------------------------------------------
    def to_json(self, indent: int | None = None) -> str:
        return _json.dump(self, PROFILE_FORMAT, PROFILE_VERSION, indent)

    @classmethod
    def from_json(cls, text: str) -> "StepProfile":
        fix = "pass the text written by StepProfile.to_json() or `remat profile --json`"
        data = _json.load(text, PROFILE_FORMAT, PROFILE_VERSION, fix, upgrades=UPGRADES)

        def make() -> StepProfile:
            data["at_peak"] = Breakdown(**data["at_peak"])
            data["end_of_forward"] = Breakdown(**data["end_of_forward"])
            data["blocks"] = [_block(b) for b in data["blocks"]]
            data["call_blocks"] = [_block(b) for b in data.get("call_blocks", [])]
            data["timeline"] = Timeline(**data["timeline"])
            data["gpu_reserve"] = GpuReserve(**data["gpu_reserve"]) if data.get("gpu_reserve") else None
            return cls(**data)

        return _json.build(PROFILE_FORMAT, PROFILE_VERSION, make, "profile")


def _block(fields: dict) -> BlockProfile:
    variants = [SelectiveVariant(**v) for v in fields.get("selective_variants", [])]
    return BlockProfile(**{**fields, "selective_variants": variants})
