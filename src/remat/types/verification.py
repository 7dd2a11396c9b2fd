"""`VerifyReport`: what `remat.verify` measured with and without a plan."""

from __future__ import annotations

from dataclasses import dataclass

from remat.types._text import render


@dataclass(frozen=True)
class VerifyReport:
    """The step with and without the plan, from the same RNG state."""

    grad_max_abs_diff: dict[str, float]
    """Per parameter: the largest |grad with plan - grad without|."""
    tolerance: float
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

    @property
    def grads_equal(self) -> bool:
        return all(d <= self.tolerance for d in self.grad_max_abs_diff.values())

    @property
    def peak_error(self) -> float:
        """(measured - predicted) / predicted."""
        return (self.measured_peak_bytes - self.predicted_peak_bytes) / self.predicted_peak_bytes

    @property
    def ok(self) -> bool:
        """Gradients and buffers equal, FLOPs as predicted, peak within 5% of the prediction."""
        return (
            self.grads_equal
            and self.buffers_equal
            and self.measured_recompute_flops == self.predicted_recompute_flops
            and abs(self.peak_error) <= 0.05
        )

    def __str__(self) -> str:
        return render(self)
