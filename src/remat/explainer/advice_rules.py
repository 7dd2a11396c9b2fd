"""The advice findings of `remat.explain` (severity ADVICE): a memory figure read from the wrong
counter (measured-with-reserved-memory), a model without checkpoints (no-checkpointing), a model
that follows remat's own plan (remat-plan), and memory that torch.compile's fused kernels would give
back for less time than eager recomputation (compiler-fuses-it).
"""

from __future__ import annotations

import torch.nn as nn

from remat.applier.apply import applied
from remat.applier.wrapping import MARK
from remat.explainer.correctness_rules import TORCH_RNG_BUG
from remat.explainer.evidence import Evidence, _b, _few, _gflop, dropouts
from remat.planner.problem import Problem
from remat.report.text import summarize_profile
from remat.types import PLAN_FAILED, Action, Finding, Plan, Severity

RESERVE_MARGIN = 0.10
"""An observed figure this much above the measured peak looks like reserved memory."""


def measured_with_reserved_memory(ev: Evidence) -> list[Finding]:
    """The user's figure looks like nvidia-smi or memory_reserved, not the tensors' peak."""
    peak = _peak(ev)
    seen: int | None
    if ev.observed_bytes:
        seen, source = ev.observed_bytes, "You saw"
    else:
        seen, source = ev.reserved_bytes, "The caching allocator reserved"
    if not seen or seen < (1 + RESERVE_MARGIN) * peak:
        return []
    message, fix = (
        _not_tensors_cpu(source, seen, peak) if _device(ev) == "cpu" else _not_tensors_cuda(source, seen, peak)
    )
    return [
        Finding(
            "measured-with-reserved-memory",
            "",
            message,
            seen - peak,
            fix,
            Severity.ADVICE,
            dict(seen_bytes=seen, peak_bytes=peak),
        )
    ]


def _not_tensors_cuda(source: str, seen: int, peak: int) -> tuple[str, str]:
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
    return message, fix


def _not_tensors_cpu(source: str, seen: int, peak: int) -> tuple[str, str]:
    """The same finding for a step on the CPU, where no caching allocator is involved: a process's memory."""
    message = (
        f"{source} {_b(seen)}; the step's tensors peak at {_b(peak)} (measured on the CPU). The other "
        f"{_b(seen - peak)} is not the step's tensors: a process's resident memory (what top, ps or a memory "
        "monitor show) also holds Python, torch's libraries (hundreds of MiB), the data and what the C allocator "
        "keeps after frees. Checkpointing frees only tensors, so such figures move less than the step's peak."
    )
    fix = (
        "Measure the step's own peak: remat.profile(model, inputs), or the process's high-water mark (VmHWM in "
        "/proc/self/status) less its resident memory just before the step; remat.verify reports both."
    )
    return message, fix


def _device(ev: Evidence) -> str:
    prof = ev.written if ev.written is not None else ev.plain
    return prof.device


def _peak(ev: Evidence) -> int:
    """The step's measured peak: as written, or without the model's checkpoints if it cannot run."""
    return ev.written.peak_bytes if ev.written is not None else ev.plain.peak_bytes


def remat_plan(ev: Evidence) -> list[Finding]:
    """The model follows remat's own plan (remat.apply, remat.auto) or carries remat.checkpoint marks: not checkpointing
    of the model's own, which explain is about, so the step was measured without them
    (NOTE [How explain gets its numbers]); this says so, with what the plan was made to do."""
    plan, counts = _own_checkpoints(ev.modules)
    if not counts[0] + counts[2]:
        return []
    what = (
        f"a plan by {plan.solver}"
        if isinstance(plan, Plan)
        else f"the recipe {plan!r}"
        if plan is not None
        else "remat.checkpoint marks"
    )
    offloaded = f", {counts[2]} offloaded" if counts[2] else ""
    message = (
        f"The model follows remat's own plan ({what}: {_count(counts[0], 'checkpoint')} over "
        f"{_count(counts[1], 'module')}{offloaded}). "
        "It is not checkpointing of the model's own, which is what explain looks at: the step was measured without "
        f"it, peak {_b(ev.plain.peak_bytes)} (measured), and the plan was put back after."
    )
    saved = 0
    if isinstance(plan, Plan):
        saved = max(0, plan.unplanned_peak_bytes - plan.peak_bytes)
        message += (
            f" When it was made, the plan predicted a peak of {_b(plan.peak_bytes)}, {_b(saved)} below the "
            f"{_b(plan.unplanned_peak_bytes)} without it, for {_gflop(plan.recompute_flops)} recomputed."
        )
    fix = (
        "To measure the plan on this step (gradients, FLOPs and peak with it and without it): remat.verify(model, "
        "inputs, plan). To explain or profile the model without it for good: remat.remove(model) first."
    )
    return [
        Finding(
            "remat-plan",
            "",
            message,
            saved,
            fix,
            Severity.ADVICE,
            dict(checkpoints=counts[0], modules=counts[1], offloaded=counts[2], peak_bytes=ev.plain.peak_bytes),
        )
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _own_checkpoints(modules: dict[str, nn.Module]) -> tuple[object, tuple[int, int, int]]:
    """The plan or recipe the model follows (None for none), and (checkpoints, modules checkpointed, modules
    offloaded): the plan's own counts, or, for a recipe and remat.checkpoint marks, those of the wrapped modules."""
    plan = applied(modules[""])
    if isinstance(plan, Plan):
        names = {n for seg in plan.segments for n in seg} | set(plan.selective)
        return plan, (len(plan.segments) + len(plan.selective), len(names), len(plan.offload))
    roles = [m.__dict__[MARK].role for m in modules.values() if MARK in m.__dict__]
    return plan, (roles.count("head"), sum(r != "offload" for r in roles), roles.count("offload"))


def no_checkpointing(ev: Evidence) -> list[Finding]:
    """No checkpoint in the model (nor remat's own: `remat_plan`): the profile in plain words and the plan that
    would help."""
    if ev.regions or ev.plain.recompute_flops or remat_plan(ev):
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
    return [
        Finding(
            "no-checkpointing",
            "",
            message,
            max(0, saved),
            fix,
            Severity.ADVICE,
            dict(peak_bytes=ev.plain.peak_bytes, plan_peak_bytes=ev.plan.peak_bytes),
        )
    ]


FUSED_SHARE = 0.20
"""compiler-fuses-it: the pointwise outputs kept at the peak are at least this share of it..."""
FUSED_TIME = 0.10
"""...and recomputing them eagerly costs at least this share of the step's measured seconds."""


def _selective_everywhere(problem: Problem) -> list:
    """The selective checkpoints that free the most, one per block, as many blocks as can take one."""
    chosen: list = []
    for u in sorted(
        (u for u in problem.units if u.action == Action.SELECTIVE and problem.is_useful(u)),
        key=lambda u: -u.reduction_bytes,
    ):
        if Problem.compatible([*chosen, u]):
            chosen.append(u)
    return chosen


def compiler_fuses_it(ev: Evidence) -> list[Finding]:
    """Much of the peak is outputs of cheap ops (pointwise, norms, softmax) that eager recomputation pays for in
    time although their FLOPs are few: torch.compile's fused kernels do not store most of them.  Given when the
    user is choosing how to save memory: no checkpoint in the model, not compiled, op seconds measured."""
    if ev.compiled or ev.regions or ev.plain.timing != "measured" or not ev.plain.step_time_s:
        return []
    chosen = _selective_everywhere(ev.problem)
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
    fix = _compile_first(ev)
    return [
        Finding(
            "compiler-fuses-it",
            "",
            message,
            freed,
            fix,
            Severity.ADVICE,
            dict(
                freed_bytes=freed,
                peak_bytes=peak,
                recompute_flops=flops,
                recompute_us=round(seconds * 1e6),
                step_us=round(ev.plain.step_time_s * 1e6),
            ),
        )
    ]


def _compile_first(ev: Evidence) -> str:
    """compiler-fuses-it's fix: remat.auto on the compiled model, and, with dropout, not torch's budget by hand."""
    drops = dropouts(ev)
    return (
        "Compile the step first (torch.compile(model)), then let remat.auto(torch.compile(model), inputs, budget) "
        "choose what the compiled step recomputes: it compiles and measures remat's checkpoints and torch.compile's "
        "own activation memory budget (op by op, with dropout's masks kept) and applies the fastest that fits; "
        "remat.verify(compiled, inputs, plan) measures the compiled step by the process counter (docs/compile.md)."
        + (
            f" Not torch._functorch.config.activation_memory_budget by hand: this model trains with dropout "
            f"({_few(drops)}), which below 1.0 torch re-draws in backward, so the gradients come out silently wrong "
            f"({TORCH_RNG_BUG})."
            if drops
            else ""
        )
    )
