"""The advice findings of `remat.explain` (severity ADVICE): a memory figure read from the wrong
counter (measured-with-reserved-memory), a model without checkpoints (no-checkpointing), and memory
that torch.compile's fused kernels would give back for less time than eager recomputation
(compiler-fuses-it).
"""

from __future__ import annotations

from remat.explainer.evidence import Evidence, _b, _gflop
from remat.planner.problem import Problem
from remat.report.text import summarize_profile
from remat.types import PLAN_FAILED, Action, Finding, Severity

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


FUSED_SHARE = 0.20
"""compiler-fuses-it: the pointwise outputs kept at the peak are at least this share of it..."""
FUSED_TIME = 0.10
"""...and recomputing them eagerly costs at least this share of the step's measured seconds."""


def compiler_fuses_it(ev: Evidence) -> list[Finding]:
    """Much of the peak is outputs of cheap ops (pointwise, norms, softmax) that eager recomputation pays for in
    time although their FLOPs are few: torch.compile's fused kernels do not store most of them.  Given when the
    user is choosing how to save memory: no checkpoint in the model, not compiled, op seconds measured."""
    if ev.compiled or ev.regions or ev.plain.timing != "measured" or not ev.plain.step_time_s:
        return []
    chosen: list = []
    for u in sorted((u for u in ev.problem.units if u.action == Action.SELECTIVE and ev.problem.is_useful(u)),
                    key=lambda u: -u.reduction_bytes):
        if Problem.compatible([*chosen, u]):
            chosen.append(u)
    peak = ev.plain.peak_bytes
    freed = peak - ev.problem.peak(chosen) if chosen else 0
    seconds = sum(u.cost_s for u in chosen)
    if freed < FUSED_SHARE * peak or seconds < FUSED_TIME * ev.plain.step_time_s:
        return []
    flops, step_flops = sum(u.cost_flops for u in chosen), ev.plain.forward_flops + ev.plain.backward_flops
    message = (
        f"{_b(freed)} of this step's {_b(peak)} peak ({freed / peak:.0%}, predicted) are outputs of pointwise ops, "
        f"norms and softmax inside {len(chosen)} blocks, kept for backward. Recomputing them eagerly (a selective "
        f"checkpoint per block) re-runs {_gflop(flops)} ({flops / max(1, step_flops):.1%} of the step's "
        f"FLOPs) but costs {seconds:.3g} s a step ({seconds / ev.plain.step_time_s:.0%} of the measured "
        f"{ev.plain.step_time_s:.3g} s): eager kernels read and write each tensor again. torch.compile's Inductor "
        "fuses such ops into the kernels around them and stores few of their outputs, for little or no time; "
        "here the compiler's own budget is the better tool."
    )
    fix = (
        "Compile the step first (torch.compile(model); lower torch._functorch.config.activation_memory_budget from "
        "1.0 to have it recompute more, op by op), then plan what is left on the compiled model: "
        "remat.profile(torch.compile(model), ...) and remat.verify(compiled, inputs, plan), which measures the "
        "compiled step by the process counter (docs/compile.md)."
    )
    return [Finding("compiler-fuses-it", "", message, freed, fix, Severity.ADVICE,
                    dict(freed_bytes=freed, peak_bytes=peak, recompute_flops=flops,
                         recompute_us=round(seconds * 1e6), step_us=round(ev.plain.step_time_s * 1e6)))]
