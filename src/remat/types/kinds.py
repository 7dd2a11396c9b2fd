"""The words remat's data is made of: each a `StrEnum`, so JSON and text keep the plain string."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """How a step is profiled."""

    REAL = "real"
    """Run the step and count the storages it makes."""
    FAKE = "fake"
    """Predict the step with fake tensors, allocating nothing."""


class Step(StrEnum):
    """Which step of the training loop a profile measures (NOTE [The step that is measured])."""

    STEADY = "steady"
    """The step a training loop repeats: from the second step on, the optimizer's state resident."""
    FIRST = "first"
    """The first step of the optimizer as given (a fresh one creates its state inside `step()`)."""


class ParallelKind(StrEnum):
    """How a step is spread over ranks (NOTE [A rank's step])."""

    ONE = ""
    """One process."""
    DDP = "ddp"
    """DistributedDataParallel: every rank holds the whole model."""
    FSDP = "fsdp"
    """FSDP2's `fully_shard`: parameters, gradients and optimizer state sharded over the ranks."""


class Action(StrEnum):
    """What a plan does with a candidate module (NOTE [The memory model of a plan])."""

    KEEP = "keep"
    """Nothing: autograd keeps what it saves."""
    RECOMPUTE = "recompute"
    """A non-reentrant checkpoint around it (alone, or a run of nn.Sequential children)."""
    SELECTIVE = "selective"
    """A checkpoint that keeps matmul, convolution and attention outputs and recomputes the rest."""
    OFFLOAD = "offload"
    """What its ops save waits in (pinned) CPU memory between forward and backward."""


class Solver(StrEnum):
    """Who chooses the plan."""

    AUTO = "auto"
    """dp where the blocks plans may checkpoint run as one chain (`dp.line`), ilp otherwise."""
    DP = "dp"
    """The optimal segmentation of a chain, by dynamic programming."""
    ILP = "ilp"
    """An integer program over every unit of the module tree (HiGHS)."""
    CHEN = "chen"
    """Chen et al.'s sqrt(n) segments (ignores the budget)."""


class Recipe(StrEnum):
    """The checkpointing people do by hand, which `remat.apply` also takes by name."""

    EVERY_BLOCK = "every-block"
    CHEN = "chen"


class Severity(StrEnum):
    """How much a finding of `remat.explain` matters, most serious first."""

    CORRECTNESS = "correctness"
    """Training silently changes."""
    MEMORY = "memory"
    ADVICE = "advice"


KEEP_ALL_SOLVER = "keep"
"""`Plan.solver` of the plan that keeps everything (no solver ran)."""
