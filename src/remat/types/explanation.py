"""What `remat.explain` returns: findings, and the measurements behind them."""

from __future__ import annotations

from dataclasses import dataclass, field

from remat.types._text import render
from remat.types.kinds import Severity
from remat.types.plan import Plan
from remat.types.profile import StepProfile


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason the model's checkpointing does not do what was meant, with its numbers and the fix."""

    code: str
    """Stable identifier: whole-model-checkpoint, checkpoint-too-small, ... (see docs/explain.md)."""
    module: str
    """Dotted name of the module it is about ("" for the model as a whole)."""
    message: str
    """What happens and why, with the measured (or predicted, when it says so) figures."""
    bytes_at_stake: int
    """Bytes of the step's peak the finding is about (what the fix would give back, or what is affected)."""
    fix: str
    severity: Severity = Severity.MEMORY
    """CORRECTNESS (training silently changes), MEMORY or ADVICE: the report's order."""
    figures: dict[str, int] = field(default_factory=dict)
    """The numbers in the message, by name (`*_bytes`, `*_flops`, counts), for programs and tests."""


@dataclass(frozen=True, slots=True)
class CheckpointCallSite:
    """One `torch.utils.checkpoint` call of the model, as `remat.explain` recorded it."""

    index: int
    """Position among the model's checkpoint calls, in forward order."""
    label: str
    """What was checkpointed: `checkpoint(conv2)`, `checkpoint(F.relu)`, `checkpoint_wrapper(layers.3)`, ..."""
    module: str
    """The checkpointed module; for a plain function, the module that called checkpoint."""
    kind: str
    """"module", "sequential" (a checkpoint_sequential segment) or "function"."""
    via: str
    """"checkpoint", "checkpoint_wrapper" or "checkpoint_sequential"."""
    reentrant: bool
    preserve_rng_state: bool
    input_requires_grad: bool
    """Some tensor argument requires grad (only top-level tensors count for the reentrant variant)."""
    depth: int
    """Checkpoint calls it runs inside (0: none)."""
    keyword_tensors: tuple[str, ...] = field(default=(), kw_only=True)
    """Non-reentrant, with no tensor among its positional arguments: the keyword arguments that hold its
    tensors ("functools.partial" for tensors bound in the function).  torch saves the GPU random state only
    for the devices of positional tensors, so on a GPU such a checkpoint does not replay dropout."""


@dataclass(frozen=True, slots=True)
class CheckpointRegion(CheckpointCallSite):
    """One `torch.utils.checkpoint` call of the model, with what it does to memory on its own."""

    modules: tuple[str, ...]
    """Modules of the model whose forward ran inside it."""
    blocks: tuple[str, ...]
    """The candidate blocks it wraps exactly (a module, or a checkpoint_sequential segment); () otherwise."""
    draws_random: bool
    """The random generator moved during its forward (dropout); not seen in fake mode."""
    freed_bytes: int | None
    """Bytes fewer saved for backward at the end of forward with this checkpoint alone (negative: more);
    None if not measured."""
    recompute_flops: int | None
    """Forward FLOPs this checkpoint alone re-runs in backward."""
    peak_bytes: int | None
    """The step's peak with this checkpoint alone."""
    source: str
    """"measured" (profiled with only this checkpoint), "predicted" (remat's memory model) or "" (neither)."""


PLAN_FAILED = "remat's least-memory plan failed when run"
"""How the notes of a keep-everything plan in an Explanation begin when the plan explain would have shown
broke the step (NOTE [How explain gets its numbers], Rule 4)."""


class Explanation(list):
    """The findings, most serious first (a list of `Finding`), with the profiles and plan behind them.

    `str()` is the report `remat explain` prints.
    """

    def __init__(
        self,
        findings: list[Finding],
        *,
        profile: StepProfile,
        written_profile: StepProfile | None,
        plan: Plan,
        checkpoints: list[CheckpointRegion],
        notes: list[str],
    ):
        super().__init__(findings)
        self.profile = profile
        """The step without the model's checkpoints (all of them run their function directly)."""
        self.written_profile = written_profile
        """The step as written, checkpoints included (None if it has none, or if it cannot run)."""
        self.plan = plan
        """The plan remat would use instead (predicted on `profile`)."""
        self.checkpoints = checkpoints
        self.notes = notes

    def codes(self) -> list[str]:
        return [f.code for f in self]

    def __str__(self) -> str:
        return render(self)

    __repr__ = list.__repr__
