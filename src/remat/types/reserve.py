"""`GpuReserve`: what CUDA's caching allocator would hold for a step (NOTE [The caching allocator's reserve] in
`remat.measure.device.cuda_allocator`)."""

from __future__ import annotations

from dataclasses import dataclass

EXPANDABLE = "expandable_segments:True"
"""The PYTORCH_CUDA_ALLOC_CONF setting under which a budget may hold where the default allocator's does not."""


@dataclass(frozen=True, slots=True)
class GpuReserve:
    """A CUDA step's third step replayed through a model of torch's caching allocator, in bytes."""

    allocated_bytes: int
    """`torch.cuda.max_memory_allocated` with the default allocator: the live tensors, plus the cached blocks it
    hands out whole rather than split (Rule 3)."""
    reserved_bytes: int
    """`torch.cuda.max_memory_reserved` with the default allocator: what the GPU must have for the step."""
    expandable_reserved_bytes: int
    """`torch.cuda.max_memory_reserved` with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."""
    expandable_allocated_bytes: int = 0
    """`torch.cuda.max_memory_allocated` with expandable segments, which split every block: the live tensors
    (0: not replayed, in plans and profiles saved before 2026-11-27)."""

    def allocator_for(self, budget: int) -> str | None:
        """ "" if the default allocator's reserve fits `budget`, EXPANDABLE if only that setting's does, else None."""
        if self.reserved_bytes <= budget:
            return ""
        return EXPANDABLE if self.expandable_reserved_bytes <= budget else None
