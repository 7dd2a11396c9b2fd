"""`VerifyReport`: what `remat.verify` measured with and without a plan."""

from __future__ import annotations

from dataclasses import dataclass

from remat.types._text import render
from remat.types.capped import CapVerdict, CudaCheck


PREDICTION_AGREES = 0.05
"""The tracked peak of the planned step within this fraction of the plan's prediction."""
COUNTERS_AGREE = 0.03
"""The tracked peak within this fraction of the independent counter's."""
TIME_AGREES = 0.10
"""The predicted step-time overhead within this many percentage points (/100) of the measured one: a guide,
not part of `ok` (step times on a shared machine drift by more than this between runs)."""
GRAD_NOISE_FACTOR = 10
"""On CUDA, gradients with the plan count as equal within this many times the unplanned step's own run-to-run
difference (`VerifyReport.grad_noise`).  H200, 2026-11-26: two unplanned runs from one RNG state differed by up to
1.7e-8 (Llama-like), 2.4e-8 (BERT-base) and 1.0e-7 (GPT-2 medium's shape), from non-deterministic kernels; plans
that change nothing else differed by 1.1-1.2 times that; the differences found beyond it were over 10,000 times."""
BUDGET_SLACK = 0.01
"""The planned step may exceed its budget by this fraction (allocator and interpreter noise)."""
COUNTER_RESOLVES_BYTES = 64 << 20
"""The process counter judges steps from this size on.  Small tensors come from heap memory the process
already holds, interpreter objects move it by a few MB: on a step of a few MB it reads 25-70% off either
way (seen on 2-10 MiB Hugging Face steps), so there it is shown but not judged."""


@dataclass(frozen=True)
class VerifyReport:
    """The step with and without the plan, from the same RNG state."""

    grad_max_abs_diff: dict[str, float]
    """Per parameter: the largest |grad with plan - grad without|."""
    tolerance: float
    """The largest difference accepted, as the caller gave it (`grad_tolerance` is what is applied)."""
    buffers_equal: bool
    """Buffers after the step (BatchNorm running statistics) equal with and without the plan."""
    unplanned_peak_bytes: int
    measured_peak_bytes: int
    """Peak of the planned step, measured by remat's tracker (real mode)."""
    predicted_peak_bytes: int
    measured_recompute_flops: int
    """FlopCounterMode total (forward + backward) with the plan, minus without."""
    predicted_recompute_flops: int
    budget_bytes: int | None = None
    measured_offload_bytes: int = 0
    """Bytes the offloaded modules copied to CPU memory in the planned step."""
    predicted_offload_bytes: int = 0
    independent_peak_bytes: int | None = None
    """Peak of the planned step by a counter that is not remat's tracker (`independent_counter`); None if none
    could be read here."""
    independent_counter: str = ""
    """What measured `independent_peak_bytes`: the process's high-water mark on CPU, the CUDA allocator on CUDA."""
    compiled: bool = False
    """The model was compiled (`torch.compile`): the independent counter measured the compiled step, the
    tracker the eager one (gradients, FLOPs and the tracked peak are the eager step's)."""
    step: str = "steady"
    """The step of the training loop measured ("steady": from the second step on; "first")."""
    unplanned_step_s: float = 0.0
    """Seconds of a step of the loop without the plan (median of interleaved rounds; 0.0 when not timed)."""
    planned_step_s: float = 0.0
    """Seconds of a step of the loop with the plan (as `unplanned_step_s`)."""
    measured_overhead: float = 0.0
    """Median over the rounds of (with the plan / without) - 1: what the plan costs in time, measured."""
    predicted_overhead: float = 0.0
    """The plan's prediction of it: `Plan.extra_fraction` (0.0 for a plan of an untimed profile)."""
    grad_noise: float = 0.0
    """The largest |difference| between the gradients of two runs of the unplanned step from the same RNG state:
    on CUDA, non-deterministic kernels (on CPU, the few that are: `grad_deterministic_diff`); 0.0 where it was not
    measured (CPU, when the gradients with the plan are equal)."""
    unplanned_reproducible: bool = True
    """The step without the plan, run again from the same RNG state, replayed its first run (checked on CUDA always,
    on CPU where the gradients differ; NOTE [A step that does not replay itself] in `remat.verifier.replay`).
    False: it draws random numbers a seed does not replay (`torch.seed()` in its forward, numpy), and the gradients
    cannot show what the plan changed: `ok` is False and the report says how to make the step replay."""
    grad_deterministic_diff: float | None = None
    """On CPU, where the gradients with the plan were not judged equal and the step replayed itself: the largest
    |difference| with the plan when both steps ran again with `torch.use_deterministic_algorithms(True)`, which
    judges the gradients instead (a kernel that sums in another order each run, the backward of an index with
    repeated indices, differs now and then on a busy machine: NOTE [A step that does not replay itself], Rule 3).
    None where they did not run."""
    cuda: CudaCheck | None = None
    """On CUDA, the planned step run again in a process capped at the budget, with `max_memory_allocated` and
    `max_memory_reserved` (NOTE [The budget is the GPU's memory] in `remat.verifier.verify`); None on CPU."""

    @property
    def cuda_verdict(self) -> CapVerdict | None:
        """Whether the budget held on the GPU (the allocator's reserve, not the allocated peak); None on CPU."""
        return None if self.cuda is None else self.cuda.verdict(self.measured_peak_bytes)

    @property
    def grad_tolerance(self) -> float:
        """The gradient difference accepted: `tolerance`, or GRAD_NOISE_FACTOR times `grad_noise` if larger (the
        kernels' noise; not where the step did not replay itself, `unplanned_reproducible`)."""
        if not self.unplanned_reproducible:
            return self.tolerance
        return max(self.tolerance, GRAD_NOISE_FACTOR * self.grad_noise)

    @property
    def timed(self) -> bool:
        return self.unplanned_step_s > 0

    @property
    def time_agrees(self) -> bool:
        """The predicted overhead within TIME_AGREES of the measured one (True where either is not known)."""
        if not self.timed or not self.predicted_overhead:
            return True
        return abs(self.measured_overhead - self.predicted_overhead) <= TIME_AGREES

    @property
    def grads_equal(self) -> bool:
        if self.grad_deterministic_diff is not None:
            return self.grad_deterministic_diff <= self.tolerance
        return all(d <= self.grad_tolerance for d in self.grad_max_abs_diff.values())

    @property
    def peak_error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.measured_peak_bytes - self.predicted_peak_bytes) / self.predicted_peak_bytes

    @property
    def independent_judged(self) -> bool:
        """There is an independent figure, and the step is large enough for it (COUNTER_RESOLVES_BYTES)."""
        figure = self.independent_peak_bytes
        return figure is not None and max(figure, self.measured_peak_bytes) >= COUNTER_RESOLVES_BYTES

    @property
    def counters_agree(self) -> bool:
        """The tracker and the independent counter within COUNTERS_AGREE of each other (True where it is not
        judged: `independent_judged`); for a compiled model, the compiled step at most COUNTERS_AGREE above the
        eager one the tracker measured (the compiler usually keeps less; more is flagged)."""
        figure = self.independent_peak_bytes
        if figure is None or not self.independent_judged:
            return True
        if self.compiled:
            return figure <= (1 + COUNTERS_AGREE) * self.measured_peak_bytes
        return abs(self.measured_peak_bytes - figure) <= COUNTERS_AGREE * figure

    @property
    def budget_judged(self) -> bool:
        """A budget to judge, and a counter of the step that runs to judge it: of a compiled model only the
        independent counter measures the compiled step (the tracker measures the eager one), and not on a step
        too small for it (`independent_judged`)."""
        return self.budget_bytes is not None and (not self.compiled or self.independent_judged)

    @property
    def fits_budget(self) -> bool:
        """The planned step's peak within the budget (+1%): by both counters where the independent one is judged;
        of a compiled model, by the independent counter alone, which measures the compiled step the loop runs
        (True where that is not judged: `budget_judged`)."""
        if self.budget_bytes is None or not self.budget_judged:
            return True
        allowed = (1 + BUDGET_SLACK) * self.budget_bytes
        figure = self.independent_peak_bytes if self.independent_judged else None
        if self.compiled and figure is not None:
            return figure <= allowed
        return max([self.measured_peak_bytes] + ([figure] if figure is not None else [])) <= allowed

    @property
    def ok(self) -> bool:
        """Gradients and buffers equal, FLOPs as predicted, the tracked peak within 5% of the prediction and
        within 3% of the independent counter, and the step within the plan's budget; on CUDA also the step run to
        its end in a process capped at the budget, with the default allocator or with expandable segments."""
        cuda = self.cuda_verdict  # None on CPU
        return (
            self.grads_equal
            and self.buffers_equal
            and self.measured_recompute_flops == self.predicted_recompute_flops
            and abs(self.peak_error) <= PREDICTION_AGREES
            and self.counters_agree
            and self.fits_budget
            and (cuda is None or cuda.ok)
        )

    def __str__(self) -> str:
        return render(self)
