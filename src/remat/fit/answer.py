"""`FitAnswer`: will one training step of a model fit a GPU, and if not, what to change; and its text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from remat.fit.estimate import ESTIMATE_MARGIN
from remat.fit.outcome import AS_IS, NO, WITH_PLAN, Outcome, allocator_words
from remat.fit.setup import DEFAULT_OPTIM, OPTIMS, Gpu
from remat.gpu_fit import gpu_reserve
from remat.fit.suggest import Suggestion
from remat.report.text import fmt_bytes
from remat.types import Plan, StepProfile

EXIT_FITS, EXIT_DOES_NOT_FIT = 0, 1


@dataclass
class FitAnswer:
    """The answer of `remat.fit.will_it_fit`: `str(answer)` says it in plain words."""

    model: str
    """The class built ("LlamaForCausalLM"; wrapped by peft's PeftModel with --lora)."""
    source: str
    params: int
    trainable: int
    gpu: Gpu
    outcome: Outcome
    """As asked: `outcome.verdict` is "fits as is", "fits with a plan" or "does not fit"; `outcome.plan` the plan."""
    suggestions: list[Suggestion] = field(default_factory=list)
    """Where it does not fit: each change tried (NOTE [What to change])."""
    notes: list[str] = field(default_factory=list)
    row: str = ""
    """What one row of the batch is, where not `setup.seq` tokens ("30 s of audio (3000 log-mel frames) and ...")."""

    @property
    def fits(self) -> bool:
        return self.outcome.fits

    @property
    def profile(self) -> StepProfile:
        return self.outcome.step_profile

    @property
    def plan(self) -> Plan | None:
        return self.outcome.plan

    @property
    def exit_status(self) -> int:
        return EXIT_FITS if self.fits else EXIT_DOES_NOT_FIT

    def __str__(self) -> str:
        return "\n".join(render(self)) + "\n"


def gib(n: float) -> str:
    return fmt_bytes(int(n), "auto")


def count(n: int) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.1f} M"


def render(a: FitAnswer) -> list[str]:
    setup, prof = a.outcome.setup, a.outcome.step_profile
    trained = "all trained"
    if a.trainable != a.params:  # LoRA's adapters, or what the model freezes itself (Whisper's audio positions)
        trained = f"{count(a.trainable)} trained" + (f" (LoRA r={setup.lora})" if setup.lora else ", the rest frozen")
    ranks = f"each of {setup.world_size} GPUs (FSDP2)" if setup.world_size > 1 else "one GPU"
    lines = [
        (f"remat fit: {a.model} from {a.source}: {count(a.params)} parameters, {trained}; {setup.trains()}"),
        (
            f"step: batch {setup.batch} x {a.row or f'{setup.seq} tokens'} per GPU, {OPTIMS[setup.optim]}, "
            f"the loss kept (Hugging Face's Trainer), on {ranks} of {gib(a.gpu.memory_bytes)} "
            f"({a.gpu.label}{'; ' + a.gpu.note if a.gpu.note else ''})"
        ),
        *_memory(prof),
        "",
        *_verdict(a),
    ]
    if a.suggestions:
        lines += ["", *_suggestions(a)]
    lines += [f"note: {n}" for n in a.notes]
    return lines


def _memory(prof: StepProfile) -> list[str]:
    p = prof.at_peak
    other = p.buffers_bytes + p.inputs_bytes + p.gathered_bytes + p.workspaces_bytes + p.scratch_bytes
    r = gpu_reserve(prof)
    return [
        (
            f"memory (predicted): parameters {gib(prof.param_bytes)}, gradients {gib(prof.grad_bytes)}, "
            f"optimizer state {gib(prof.optimizer_bytes)}, activations saved for backward {gib(prof.activation_bytes)}"
        ),
        (
            f"  peak {gib(prof.peak_bytes)} in {prof.peak_phase}: parameters {gib(p.params_bytes)}, gradients "
            f"{gib(p.grads_bytes)}, optimizer state {gib(p.optimizer_bytes)}, activations {gib(p.activations_bytes)}, "
            f"temporaries {gib(p.temporaries_bytes)}, other {gib(other)}; the caching allocator reserves "
            f"{gib(r.reserved_bytes)} ({gib(r.expandable_reserved_bytes)} with expandable segments)"
        ),
    ]


def _verdict(a: FitAnswer) -> list[str]:
    o, room = a.outcome, gib(a.gpu.memory_bytes)
    setting = allocator_words(o.allocator)
    if o.verdict == AS_IS:
        return [f"answer: fits as is{setting}: the step reserves {gib(o.reserve_bytes)} of the GPU's {room}."]
    if o.verdict == WITH_PLAN:
        plan = o.plan
        assert plan is not None, "an outcome that fits with a plan has it"
        return [
            (
                f"answer: fits with this plan at +{o.extra_fraction:.0%} {o.extra_unit}{setting}: its step peaks at "
                f"{gib(plan.peak_bytes)} of tensors and reserves {gib(o.reserve_bytes)} of the GPU's {room}."
            ),
            f"  checkpoints ({len(plan.segments) + len(plan.selective) + len(plan.offload)}): {checkpoints(plan)}",
            '  (--out plan.json writes it; in the training script: remat.apply(model, remat.load_plan("plan.json")))',
        ]
    what = "of GPU memory (the caching allocator's reserve)" if o.least_is_reserve else "of tensors"
    more = "" if o.least_is_reserve else ", and the caching allocator reserves more than its tensors"
    return [
        (
            f"answer: does not fit: the least any checkpointing plan needs is {gib(o.least_bytes)} {what}, over "
            f"the GPU's {room}{more}; parameters, gradients and optimizer state alone are {gib(o.states_bytes)}."
        ),
        *_optimizer_floor(o),
    ]


def _optimizer_floor(o: Outcome) -> list[str]:
    """Where the least any plan reaches is the optimizer step's own peak, which no checkpoint changes: a line that
    says so, with AdamW's temporaries where it makes them (its foreach kernels: one of every parameter's size)."""
    prof = o.step_profile
    optimizer_peak = prof.timeline.phase_peak("optimizer")
    least = o.least_tensors_bytes or (0 if o.least_is_reserve else o.least_bytes)
    if not least or optimizer_peak < least:
        return []
    p = prof.at_peak
    besides = p.workspaces_bytes + p.buffers_bytes + p.inputs_bytes  # there all step long
    temporaries = optimizer_peak - o.states_bytes - besides
    made = (
        f", {gib(temporaries)} of AdamW's temporaries (its foreach kernels' intermediates; fused AdamW, "
        f"--optim {DEFAULT_OPTIM}, updates in place)"
        if not o.setup.fused
        else ""
    )
    workspaces = f", and cuBLAS's workspaces, {gib(p.workspaces_bytes)}" if p.workspaces_bytes else ""
    return [
        f"  the least is the optimizer step's peak, which no checkpoint lowers: those {gib(o.states_bytes)}{made}"
        f"{workspaces}"
    ]


def checkpoints(plan: Plan) -> str:
    """The plan's checkpoints, runs of numbered layers written as ranges: "model.layers.0-11, 14"."""
    parts = [_ranges([seg[0] for seg in plan.segments if len(seg) == 1])]
    parts += [f"{seg[0]} .. {seg[-1]} together" for seg in plan.segments if len(seg) > 1]
    if plan.selective:
        parts.append(f"selective (some ops' outputs kept): {_ranges(plan.selective)}")
    if plan.offload:
        parts.append(f"offloaded: {_ranges(plan.offload)}")
    return "; ".join(p for p in parts if p) or "none"


def _natural(name: str) -> list:
    """ "decoder.block.2." before "decoder.block.10."."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _ranges(names: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    loose = []
    for name in names:
        m = re.match(r"^(.*\.)(\d+)$", name)
        if m:
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
        else:
            loose.append(name)
    out = []
    for prefix, numbers in sorted(groups.items(), key=lambda kv: _natural(kv[0])):
        numbers, runs = sorted(numbers), list[list[int]]()
        for n in numbers:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        out.append(prefix + ", ".join(f"{s}" if s == e else f"{s}-{e}" for s, e in runs))
    return ", ".join(out + loose)


def _suggestions(a: FitAnswer) -> list[str]:
    how = next((s.outcome.estimated for s in a.suggestions if s.outcome and s.outcome.estimated), "")
    rows = [
        (change, _suggestion(group[0]) if len(group) == 1 else _ruled_out(group))
        for change, group in _grouped(a.suggestions)
    ]
    width = max(len(change) for change, _ in rows)
    lines = [f"what to change, one at a time{' (' + how + ')' if how else ''}:"]
    lines += [f"  {change:<{width}}  {text}" for change, text in rows]
    fitting = [s for s in a.suggestions if s.outcome and s.outcome.fits]
    fitting = [s for i, s in enumerate(fitting) if i == 0 or fitting[i - 1].kind != s.kind]  # the least of each kind
    if fitting:
        lines.append(f"so: {' or '.join(s.change for s in fitting)}; run remat fit with it to check the whole model.")
    else:
        lines.append("so: no single change fits; combine them (run remat fit with two), or take a larger GPU.")
    return lines


def _grouped(suggestions: list[Suggestion]) -> list[tuple[str, list[Suggestion]]]:
    """Runs of changes of one kind ruled out by the bound, as one row ("--seq 4096 .. 128")."""
    groups: list[list[Suggestion]] = []
    for s in suggestions:
        ruled_out = bool(s.outcome and s.outcome.skipped)
        before = groups[-1][-1] if groups else None
        if ruled_out and before is not None and before.kind == s.kind and before.outcome and before.outcome.skipped:
            groups[-1].append(s)
        else:
            groups.append([s])
    return [(g[0].change if len(g) == 1 else f"{g[0].change} .. {g[-1].change.split()[-1]}", g) for g in groups]


def _ruled_out(group: list[Suggestion]) -> str:
    least = min(s.outcome.least_bytes for s in group if s.outcome is not None)  # every one was ruled out
    return f"does not fit: each needs at least {gib(least)} of tensors, by a bound (docs/cli.md, remat fit)"


def _suggestion(s: Suggestion) -> str:
    o = s.outcome
    if o is None:
        return s.note
    about = "about " if o.estimated else ""
    setting = allocator_words(o.allocator)
    if o.skipped:
        return f"does not fit: {o.skipped}"
    if o.verdict == AS_IS:
        return f"fits as is{setting} ({about}{gib(o.reserve_bytes)} reserved)"
    if o.verdict == WITH_PLAN:
        if o.estimated:  # no plan was made: the least-memory plan's reserve says how much room is left
            return (
                f"fits with a plan, +{o.extra_fraction:.0%} {o.extra_unit} at most{setting} (least-memory plan: "
                f"about {gib(o.least_bytes)} reserved)"
            )
        return f"fits with a plan, +{o.extra_fraction:.0%} {o.extra_unit}{setting} ({gib(o.reserve_bytes)} reserved)"
    if o.close:
        return (
            f"too close to call from the estimate: the least is about {gib(o.least_bytes)} reserved, within "
            f"{ESTIMATE_MARGIN:.0%} of the GPU's memory; run remat fit with it"
        )
    assert o.verdict == NO
    what = "reserved" if o.least_is_reserve else "of tensors"
    return f"does not fit: the least is {about}{gib(o.least_bytes)} {what}"
