"""The advice findings of `remat.explain` (severity ADVICE): a memory figure read from the wrong
counter (measured-with-reserved-memory), and a model without checkpoints (no-checkpointing).
"""

from __future__ import annotations

from remat.explainer.evidence import Evidence, _b, _gflop
from remat.report.text import summarize_profile
from remat.types import PLAN_FAILED, Finding, Severity

RESERVE_MARGIN = 0.10
"""An observed figure this much above the measured peak looks like reserved memory."""


def measured_with_reserved_memory(ev: Evidence) -> list[Finding]:
    """The user's figure looks like nvidia-smi or memory_reserved, not the tensors' peak."""
    peak = _peak(ev)
    if ev.observed_bytes:
        seen, source = ev.observed_bytes, "You saw"
    else:
        seen, source = ev.reserved_bytes, "The caching allocator reserved"
    if not seen or seen < (1 + RESERVE_MARGIN) * peak:
        return []
    message = (
        f"{source} {_b(seen)}; the step's tensors peak at {_b(peak)} (measured: what torch.cuda.max_memory_allocated() "
        f"reports). The other {_b(seen - peak)} is not tensors: the CUDA caching allocator keeps freed blocks "
        "reserved for reuse (torch.cuda.memory_reserved()), and nvidia-smi adds the CUDA context (hundreds of MiB). "
        "That reserve does not shrink when checkpointing frees tensors, so such figures barely move."
    )
    fix = (
        "Measure the tensors' peak: torch.cuda.reset_peak_memory_stats() before the step, "
        "torch.cuda.max_memory_allocated() after it; not nvidia-smi or memory_reserved() (the reserve), and not "
        "memory_allocated() after the step (what is left then, not the peak)."
    )
    return [Finding("measured-with-reserved-memory", "", message, seen - peak, fix, Severity.ADVICE,
                    dict(seen_bytes=seen, peak_bytes=peak))]


def _peak(ev: Evidence) -> int:
    """The step's measured peak: as written, or without the model's checkpoints if it cannot run."""
    return ev.written.peak_bytes if ev.written is not None else ev.plain.peak_bytes


def no_checkpointing(ev: Evidence) -> list[Finding]:
    """No checkpoint in the model: the profile in plain words and the plan that would help."""
    if ev.regions or ev.plain.recompute_flops:
        return []
    summary = " ".join(summarize_profile(ev.plain).split())
    saved = ev.plain.peak_bytes - ev.plan.peak_bytes
    if saved > 0:
        fix = (
            f"Checkpoint as remat's plan below says: predicted peak {_b(ev.plan.peak_bytes)} ({_b(saved)} less) for "
            f"{_gflop(ev.plan.recompute_flops)} recomputed (+{ev.plan.recompute_fraction:.1%} of the step's FLOPs)."
        )
    elif any(n.startswith(PLAN_FAILED) for n in ev.plan.notes):
        fix = "remat's plan for a lower peak broke this step when run (see the plan's notes): none is recommended."
    else:
        fix = "No checkpointing plan lowers this peak (see the other findings for what does)."
    message = f"The model does no activation checkpointing. {summary}"
    return [Finding("no-checkpointing", "", message, max(0, saved), fix, Severity.ADVICE,
                    dict(peak_bytes=ev.plain.peak_bytes, plan_peak_bytes=ev.plan.peak_bytes))]

