"""What one setup's step needs of a GPU: `Outcome`, and how an answer is decided from the bytes.

NOTE [Does a step fit]
  Rule 1. A step fits a GPU of G bytes when what CUDA's caching allocator would reserve for it, with
          RESERVE_MARGIN to spare, is at most G: the rule `remat plan` and `remat.auto` fit a CUDA plan by
          (NOTE [A plan fits the GPU's reserve]).  It fits *as is* when the unplanned step's reserve does.
  Rule 2. Else it fits *with a plan* when a checkpointing plan's replayed reserve does: the first that
          `remat.gpu_fit.fit_reserve` finds (`--out` writes it).  Each check profiles the whole planned step (as
          long as the profile itself: 10-40 s for a 7-8B model), so the first plan checked is not the one for the
          GPU's memory, whose reserve exceeds it by about the unplanned step's excess of reserve over tensors, but
          the one for the GPU's memory less that excess; each next one is planned for its predecessor's tensors
          less its reserve's excess, never below the least-memory plan.  A plan between the first that fits and
          the GPU's memory may be cheaper: the answer's extra time is then an upper bound.
  Rule 3. Either may need `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (its reserve fits where the default
          allocator's does not); the answer says so.
  Rule 4. Else it does not fit: the least is the least budget any plan reaches (`InfeasibleBudget.min_bytes`), in
          tensors where even the least-memory plan's tensors exceed G, else in the GPU memory its reserve needs.
  Rule 5. Plans are remat.plan's by its dp solver, the optimal segmentation of the chain (the embeddings, layers,
          final norm and head of a Hugging Face model; selective checkpoints included), where the step has such a
          chain; remat.plan's own pick (its ilp over the module tree where the blocks nest) only where dp finds no
          plan for the bytes asked, and for the least any plan reaches.  On Llama-3-8B with LoRA at 2048 tokens dp
          plans in 0.14 s what the ilp finds in 60 s (the same peak and seconds), and each plan fit_reserve checks
          is planned anew.  An encoder-decoder's chain is one stack (T5's encoder): below dp's least, the ilp's
          plans of both stacks (test_fit: an 8+8-layer T5's least 293 MiB of tensors, dp's 410).
"""

from __future__ import annotations

from dataclasses import dataclass

from remat.fit.setup import Setup
from remat.gpu_fit import RESERVE_MARGIN
from remat.types import Plan, StepProfile
from remat.types.reserve import EXPANDABLE

AS_IS, WITH_PLAN, NO = "fits as is", "fits with a plan", "does not fit"


@dataclass(frozen=True)
class Outcome:
    """One setup's answer (NOTE [Does a step fit]); `estimated` says how, where no full step was profiled."""

    setup: Setup
    verdict: str
    """AS_IS, WITH_PLAN or NO."""
    allocator: str = ""
    """"" or EXPANDABLE: the PYTORCH_CUDA_ALLOC_CONF the fit needs (Rule 3)."""
    reserve_bytes: int = 0
    """What the caching allocator would reserve for the step that fits: unplanned (AS_IS) or planned (WITH_PLAN)."""
    peak_bytes: int = 0
    """Live tensor bytes at that step's peak."""
    least_bytes: int = 0
    """NO: the least GPU memory any plan needs (Rule 4); an estimate WITH_PLAN: what its least-memory plan
    reserves."""
    least_is_reserve: bool = False
    """NO: `least_bytes` counts the caching allocator's reserve (True), or tensors only (False: the least-memory
    plan's tensors alone are over the GPU, and its reserve is more)."""
    extra_fraction: float = 0.0
    """WITH_PLAN: the plan's predicted extra time (or FLOPs, `extra_unit`) over the unplanned step's."""
    extra_unit: str = "time"
    states_bytes: int = 0
    """Parameters + gradients + optimizer state of the step: what no checkpointing plan removes."""
    least_tensors_bytes: int = 0
    """The least-memory plan's tensors (0 where not computed)."""
    plan: Plan | None = None
    profile: StepProfile | None = None
    estimated: str = ""
    """"" where the step itself was profiled; else how the figures were estimated."""
    skipped: str = ""
    """Not evaluated: why no plan of this setup can fit (a bound); the verdict is NO."""
    close: bool = False
    """An estimate too close to the GPU's memory to call: it fits the GPU, but not with the estimate's own margin
    (NOTE [A deep model from two shallow ones], Rule 4); the verdict is NO."""

    @property
    def fits(self) -> bool:
        return self.verdict in (AS_IS, WITH_PLAN)

    @property
    def step_profile(self) -> StepProfile:
        """`profile`, which every setup evaluated has (a `skipped` one has none)."""
        assert self.profile is not None, f"no profile: {self.skipped or 'not evaluated'}"
        return self.profile


def fits_reserve(reserved: int, gpu_bytes: int) -> bool:
    """Rule 1."""
    return reserved * (1 + RESERVE_MARGIN) <= gpu_bytes


def with_margin(reserved: int) -> int:
    """The GPU memory a step that reserves `reserved` bytes needs (Rule 1)."""
    return int(reserved * (1 + RESERVE_MARGIN)) + 1


def states_of(prof: StepProfile) -> int:
    """Parameters, gradients and optimizer state of a profiled step."""
    return prof.param_bytes + prof.grad_bytes + prof.optimizer_bytes


def allocator_words(allocator: str) -> str:
    return f" with PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}" if allocator else ""
