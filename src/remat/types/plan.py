"""`Plan`: what to do with each candidate module, and what it is predicted to cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from remat.errors import RematError
from remat.types import _json
from remat.types._text import render
from remat.types.kinds import Action, ParallelKind
from remat.types.reserve import GpuReserve

BY_HAND = (
    "by hand only: a checkpoint around several layers that are not children of one nn.Sequential "
    "or nn.ModuleList needs a function that calls them in turn; remat.apply wraps such layers one by one"
)
"""The note on a hand-recipe plan (`baseline_plans`) that remat.apply cannot build."""

PLAN_FORMAT = "remat.Plan"
PLAN_VERSION = 5
"""2: PlannedBlock lost `output_bytes`, which nothing read.  3: `called_directly`.  4: `gpu_reserve`, `allocator`.
Version 1 to 3 files still load."""


@dataclass(frozen=True, slots=True)
class PlannedBlock:
    """What the plan assumed about a block, so `apply` can tell a plan made for another model."""

    name: str
    type: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Decisions for one model's training step, with predicted peak and recomputation."""

    model: str
    solver: str
    """Which solver made it: chen, dp, ilp, every-block, checkpoint_sequential(k), keep."""
    decisions: dict[str, Action]
    """{candidate module: keep | recompute | selective | offload}; a module inside one inherits its decision."""
    segments: list[list[str]]
    """Each list: consecutive sibling modules wrapped in one checkpoint (recomputed in backward)."""
    peak_bytes: int
    """Predicted peak of the whole step under the plan (NOTE [The memory model of a plan])."""
    recompute_flops: int
    """Extra forward FLOPs the plan costs (`FlopCounterMode` formulas)."""
    recompute_s: float
    """Extra seconds: those of the ops re-run, as the profile timed them (`timing`; 0.0 when not timed)."""
    unplanned_peak_bytes: int
    budget_bytes: int | None
    blocks: list[PlannedBlock]
    selective: list[str] = field(default_factory=list)
    """Modules checkpointed selectively: matmul, convolution and attention outputs kept, the rest recomputed
    (unless `selective_keeps` names the ops to keep)."""
    offload: list[str] = field(default_factory=list)
    """Modules whose saved tensors go to (pinned) CPU memory in forward and come back in backward."""
    offload_bytes: int = 0
    """Bytes the offloaded modules copy to CPU memory (and back) per step."""
    offload_s: float = 0.0
    """Predicted seconds of those copies at the plan's host bandwidth (not overlapped with compute)."""
    recompute_ops: int = 0
    """Ops re-run in backward: among plans of equal FLOPs, the one with fewer is cheaper (elementwise ops
    count 0 FLOPs but not 0 time)."""
    step_flops: int = 0
    """Forward + backward FLOPs of the unplanned step, to put `recompute_flops` in proportion."""
    notes: list[str] = field(default_factory=list)
    step_time_s: float = 0.0
    """Seconds of the unplanned step (`StepProfile.step_time_s`), to put `extra_s` in proportion."""
    timing: str = ""
    """Where the seconds come from (`StepProfile.timing`): "measured", "tracked", "roofline <device>" or ""
    (not timed: the plan minimised FLOPs)."""
    measured_peak_bytes: int = 0
    """The compiled step's peak under this plan by `measured_counter`, when `remat.auto` chose the plan for a
    compiled model by measuring it (NOTE [Plans for a compiled step]); 0 otherwise.  `peak_bytes` stays the eager
    step's prediction, which the compiled step keeps less than."""
    measured_counter: str = ""
    selective_keeps: dict[str, list[str]] = field(default_factory=dict)
    """For a module of `selective` that keeps other outputs than matmul-like ones: the `remat.ops.op_signature`
    of each op it keeps (NOTE [Which outputs a selective checkpoint keeps]).  Signatures hold argument shapes:
    the plan is for inputs of the shapes profiled."""
    compiler_budget: float = 1.0
    """torch.compile's own activation memory budget for the model's compiled graph, from 0 (save only what
    a checkpoint of the whole graph would) to 1.0 (Inductor's default: not set).  Below 1.0 the plan is for a
    compiled model (NOTE [The compiler's budget as a plan]), and its checkpoints, if any, are remat's part of a
    hybrid; `remat.auto` chooses such a plan when it measured it the fastest to fit."""
    measured_step_s: float = 0.0
    """Seconds of the compiled step under this plan, as the copy that measured `measured_peak_bytes` timed it
    (one thread on CPU); 0.0 when not measured."""
    called_directly: list[str] = field(default_factory=list)
    """nn.Sequential modules whose forward the profiled step never ran, the model's code calling their children
    (`x = seq[1](seq[0](x))`, `for m in seq: x = m(x)`): `remat.apply` checkpoints a segment of their children, or
    one of them (a block standing for its children), as a run of entries the model calls, never through their
    forward (NOTE [An nn.Sequential the model never calls])."""
    gpu_reserve: GpuReserve | None = None
    """Of a CUDA plan that `remat.auto` or `remat plan TARGET` checked: the planned step, profiled and replayed
    through the caching allocator (NOTE [A plan fits the GPU's reserve] in `remat.gpu_fit`); None otherwise."""
    allocator: str = ""
    """The PYTORCH_CUDA_ALLOC_CONF the budget needs: "" (the default allocator's reserve fits) or
    "expandable_segments:True" (only that setting's does)."""
    parallel: ParallelKind = ParallelKind.ONE
    """The job the profile was of (`StepProfile.parallel`): "ddp" or "fsdp" for a rank's step, measured or predicted,
    "" for one process.  `remat.apply` warns when a plan of "" goes on a DistributedDataParallel model: its gradient
    buckets are in no such profile (version 5)."""

    @property
    def extra_s(self) -> float:
        """Predicted extra seconds: recomputation (the profile's op seconds) plus offload copies."""
        return self.recompute_s + self.offload_s

    @property
    def extra_fraction(self) -> float:
        """Predicted extra seconds as a fraction of the unplanned step's (0.0 when not timed)."""
        return self.extra_s / self.step_time_s if self.step_time_s else 0.0

    @property
    def recompute_fraction(self) -> float:
        """Extra FLOPs as a fraction of the unplanned step's FLOPs."""
        return self.recompute_flops / self.step_flops if self.step_flops else 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "parallel", ParallelKind(self.parallel))

    def __str__(self) -> str:
        return render(self)

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self, indent: int | None = 2) -> str:
        return _json.dump(self, PLAN_FORMAT, PLAN_VERSION, indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = _json.load(
            text,
            PLAN_FORMAT,
            PLAN_VERSION,
            "pass a file written by Plan.save, or plan again",
            upgrades={1: _from_version_1, 2: dict, 3: dict, 4: dict},
        )

        def make() -> Plan:
            data["blocks"] = [PlannedBlock(**b) for b in data["blocks"]]
            data["gpu_reserve"] = GpuReserve(**data["gpu_reserve"]) if data.get("gpu_reserve") else None
            return cls(**data)

        return _json.build(PLAN_FORMAT, PLAN_VERSION, make, "plan")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())


def _from_version_1(data: dict) -> dict:
    """A version 1 plan's fields as later versions have them: blocks without `output_bytes`."""
    for b in data.get("blocks", []):
        b.pop("output_bytes", None)
    return data


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by `Plan.save`."""
    p = Path(path)
    if not p.is_file():
        raise RematError(f"remat: no plan file at {str(p)!r}. Fix: write one with `remat plan TARGET --out {p}`.")
    return Plan.from_json(p.read_text())
