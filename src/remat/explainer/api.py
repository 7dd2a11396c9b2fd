"""`remat.explain`: why the model's own checkpointing does not help, measured on the model itself.

NOTE [How explain gets its numbers]
  Rule 1. The step is profiled as written (every checkpoint call recorded, see NOTE
          [Recording the user's checkpoints] in `remat.explainer.record`) and again with every
          checkpoint call running its function directly: "with" and "without" are both
          measured, on the same model, inputs, loss and optimizer.
  Rule 2. What one checkpoint does alone is predicted with the memory model of
          `remat.plan` (NOTE [The memory model of a plan]) when its region is a candidate
          block or a run of sibling candidates, the units that model was checked on;
          otherwise it is measured by profiling the step with only that checkpoint kept
          (at most MAX_MEASURED of them).  A model with a single checkpoint call reuses
          the step as written.
  Rule 3. Alternatives the user did not run (per-layer checkpoints, another number of
          segments, remat's plan) are predictions on the step without checkpoints, and
          are labelled "predicted" wherever they are shown.  The plan shown is the one
          `remat.plan` gives for the least peak any plan reaches.
  Rule 4. That plan is recommended only once it has run: it is applied and the step
          without the model's checkpoints profiled with it, and its notes give the
          measured peak.  A plan that fails to run is replaced by keeping everything,
          with the error in its notes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from remat import applier, planner
from remat._torch_compat import tree_flatten
from remat._torch_compat.compiler import activation_memory_budget_set
from remat._torch_compat.distributed import is_compiled, uncompiled
from remat.errors import InfeasibleBudget, RematError, listing
from remat.explainer.evidence import _b, _few
from remat.explainer.record import Policy, RecordedCall, Recorder
from remat.explainer.rules import RULES, Evidence
from remat.hf import builds_cache, cache_as_configured, hf_checkpointing_off
from remat.measure import profile
from remat.measure.step import check_model, normalize_inputs
from remat.planner.budget import parse_budget
from remat.planner.problem import MAX_SEGMENT, Problem, Unit
from remat.planner.result import keep_all, with_notes
from remat.types import PLAN_FAILED, CheckpointRegion, Explanation, Finding, Plan, Severity, StepProfile
from remat.types.kinds import Mode

HF_OFF = (
    "to follow this plan, turn Hugging Face gradient checkpointing off (model.gradient_checkpointing_disable()): "
    "remat.apply leaves the modules it checkpoints to it"
)
MAX_MEASURED = 12
"""Most checkpoints measured one at a time (each costs one more profiled step)."""


def explain(
    model: nn.Module,
    inputs: Any,
    loss_fn=None,
    optimizer: Any = None,
    *,
    mode: str = "real",
    device: str | torch.device | None = None,
    observed: int | str | None = None,
) -> Explanation:
    """Why the model's checkpointing does not lower memory: findings with measured bytes, and the fix.

    Example:
        >>> findings = remat.explain(model, x, optimizer=lambda ps: torch.optim.Adam(ps))
        >>> [(f.code, f.module, f.bytes_at_stake) for f in findings]
        [('checkpoint-too-small', 'conv2', 0), ...]
        >>> print(findings)          # the report: findings, checkpoints, the plan remat would use

    Arguments are those of `remat.profile`; `observed` is a figure the user saw (bytes, or
    "7212MiB") to compare with the measured peak.  A model without checkpointing gets a
    `no-checkpointing` finding with the profile summary and the plan that would help.

    Known limitations: runs the step two or more times
    (NOTE [How explain gets its numbers]); sees only checkpointing done through `torch.utils.checkpoint`
    (`checkpoint`, `checkpoint_sequential`, `checkpoint_wrapper`, Hugging Face's
    gradient checkpointing); in fake mode dropout is seen only through dropout modules.
    """
    compiled, model = is_compiled(check_model(model)), uncompiled(model)  # the model inside torch.compile
    normalize_inputs(inputs)
    step = _Step(model, inputs, loss_fn, optimizer, mode, device)
    ev, calls = _evidence(step, model, _observed(observed), compiled)
    findings = sorted((f for rule in RULES for f in rule(ev)), key=_order)
    notes = _notes(ev.plain, ev.regions, calls, ev.written is None)
    return Explanation(
        findings, profile=ev.plain, written_profile=ev.written, plan=ev.plan, checkpoints=ev.regions, notes=notes
    )


def _evidence(step: "_Step", model: nn.Module, observed_bytes: int | None, compiled: bool) -> tuple[Evidence, list]:
    """The step as written and without its checkpoints, each checkpoint's region, and the plan remat recommends
    (NOTE [How explain gets its numbers]); and the checkpoint calls seen."""
    written, recorder, error = step.run_as_written()
    calls = recorder.calls
    plain = step.run(lambda i: False)[0] if calls or written is None else written
    problem = Problem.from_profile(plain, max(MAX_SEGMENT, _longest_run(calls)))
    regions = [_region(c, step, problem, plain, written, len(calls)) for c in calls]
    least = _least_peak(plain)
    recommended = _seen_run(step, plain, planner.plan(plain, least))  # the least recomputation that reaches it
    ev = Evidence(
        modules=dict(model.named_modules()),
        plain=plain,
        written=written,
        written_error=str(error) if error else "",
        regions=regions,
        recomputed=recorder.recomputed,
        problem=problem,
        plan=recommended,
        least_peak_bytes=least,
        kv_cache=_kv_cache(step, model, written, plain),
        observed_bytes=observed_bytes,
        reserved_bytes=step.reserved_bytes,
        compiled=compiled,
        compiler_budget=activation_memory_budget_set(),
    )
    return ev, calls


def _seen_run(step: "_Step", plain: StepProfile, plan: Plan) -> Plan:
    """`plan` with the peak its step measured in its notes; keep-everything if it fails to run (Rule 4)."""
    if not (plan.segments or plan.selective or plan.offload):
        return plan
    try:
        with hf_checkpointing_off(step.model) as hf_was_on, applier.taken_off(step.model):  # the plan replaces it
            applier.apply(step.model, plan)
            try:
                seen = step.run(lambda i: False, as_written=False)[0]
            finally:
                applier.remove(step.model)
    except Exception as e:  # noqa: BLE001 - whatever the user's step raises with the plan applied
        named = [n for seg in plan.segments for n in seg] + plan.selective + plan.offload
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return keep_all(plain, None, f"{PLAN_FAILED} ({_few(named)}), so none is recommended: {first_line}")
    without_cache = ", use_cache=False as remat.apply trains" if builds_cache(step.model, _cache_asked(step)) else ""
    notes = [
        f"seen run: the step with this plan measured {_b(seen.peak_bytes)} ({seen.mode} mode, remat's tracker"
        f"{without_cache})"
    ]
    if hf_was_on:
        notes.append(HF_OFF)
    return with_notes(plan, [*plan.notes, *notes])


def _order(f: Finding):
    return list(Severity).index(f.severity), -f.bytes_at_stake, f.code, f.module


# -- running the step ---------------------------------------------------------------------------


@dataclass
class _Step:
    """The user's training step, run under a checkpoint policy (NOTE [Recording the user's checkpoints])."""

    model: nn.Module
    inputs: Any
    loss_fn: Any
    optimizer: Any
    mode: str
    device: Any
    reserved_bytes: int | None = None
    """CUDA, real mode: `torch.cuda.max_memory_reserved()` over the step as written."""

    def run(self, policy: Policy, *, as_written: bool = True) -> tuple[StepProfile, Recorder]:
        """The step under `policy`; with its key/value cache as written, or turned off as Hugging Face
        trains under checkpointing (NOTE [The key/value cache in training])."""
        recorder = Recorder(self.model, policy)
        cache = cache_as_configured() if as_written else contextlib.nullcontext()
        own = applier.taken_off(self.model) if as_written else contextlib.nullcontext()  # remat's plan: not the model's
        with own, recorder.active(), _input_grads_kept(self.inputs), cache:
            prof = profile(self.model, self.inputs, self.loss_fn, self.optimizer, self.mode, device=self.device)
        return prof, recorder

    def run_as_written(self) -> tuple[StepProfile | None, Recorder, RematError | None]:
        """The step as written; a step that fails only because a reentrant checkpoint cut every
        gradient is a finding, not an error, so it comes back as (None, recorder, error)."""
        recorder = Recorder(self.model, lambda i: True)
        try:
            with (
                applier.taken_off(self.model),
                recorder.active(),
                _input_grads_kept(self.inputs),
                cache_as_configured(),
            ):
                prof = profile(self.model, self.inputs, self.loss_fn, self.optimizer, self.mode, device=self.device)
        except RematError as e:
            if not any(c.site.reentrant and not c.site.input_requires_grad for c in recorder.calls):
                raise
            return None, recorder, e
        if self.mode == Mode.REAL and prof.device == "cuda":
            self.reserved_bytes = torch.cuda.max_memory_reserved()
        return prof, recorder, None


@contextlib.contextmanager
def _input_grads_kept(inputs: Any) -> Iterator[None]:
    """`remat.profile` leaves `.grad` on inputs that require grad; every run here must start alike."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = [t.grad for t in leaves]
    try:
        yield
    finally:
        for t, g in zip(leaves, grads):
            t.grad = g


def _observed(observed: int | str | None) -> int | None:
    if observed is None:
        return None
    # a fraction or percentage of a peak of 0 reads as 0: like a float, not a figure anyone saw
    seen = 0 if isinstance(observed, (float, bool)) else parse_budget(observed, 0)
    if seen == 0:
        raise RematError(
            f"remat: observed must be bytes (an int) or a string with units such as '7212MiB'; saw {observed!r}. "
            "Fix: pass the figure you saw, e.g. observed='7212MiB'."
        )
    return seen


# -- one checkpoint alone (Rule 2) ------------------------------------------------------------------


def _run_of(call: RecordedCall) -> tuple[str, ...] | None:
    """The candidate blocks a checkpoint call wraps exactly, if it wraps blocks and nothing else."""
    if call.site.kind == "module":
        return (call.site.module,)
    if call.site.kind == "sequential":
        names = call.sequence[call.start : call.end + 1]
        return None if "?" in names else names
    return None


def _longest_run(calls: list[RecordedCall]) -> int:
    return max((len(_run_of(c) or ()) for c in calls), default=0)


def _region(call: RecordedCall, step: _Step, problem: Problem, plain: StepProfile, written, n_calls: int):
    unit = _unit(problem, call)
    if unit is not None:
        flops = sum(plain.block(b).forward_flops for b in unit.blocks) if call.site.reentrant else unit.cost_flops
        effect: tuple[int | None, int | None, int | None, str] = (
            unit.reduction_bytes,
            flops,
            problem.peak([unit]),
            "predicted",
        )
    elif n_calls == 1 and written is not None:
        effect = _measured(plain, written)
    elif call.site.index < MAX_MEASURED and written is not None:  # a step that cannot run cannot be measured
        effect = _measured(plain, step.run(lambda i: i == call.site.index)[0])
    else:
        effect = (None, None, None, "")
    return CheckpointRegion(
        **dataclasses.asdict(call.site),
        modules=tuple(call.modules),
        draws_random=call.draws_random,
        blocks=unit.blocks if unit is not None else (),
        freed_bytes=effect[0],
        recompute_flops=effect[1],
        peak_bytes=effect[2],
        source=effect[3],
    )


def _unit(problem: Problem, call: RecordedCall) -> Unit | None:
    names = _run_of(call)
    return _find_unit(problem, names) if names else None


def _find_unit(problem: Problem, names: tuple[str, ...]) -> Unit | None:
    """The checkpoint unit of exactly these sibling blocks, if the planner has one."""
    try:
        return problem.unit(*names)
    except KeyError:
        return None


def _measured(plain: StepProfile, alone: StepProfile) -> tuple[int, int, int, str]:
    return plain.activation_bytes - alone.activation_bytes, alone.recompute_flops, alone.peak_bytes, "measured"


# -- what remat would do instead (Rule 3) ----------------------------------------------------------------


def _least_peak(plain: StepProfile) -> int:
    """The least peak any plan reaches: what `remat.plan` reports when asked for one byte."""
    try:
        return planner.plan(plain, 1).peak_bytes
    except InfeasibleBudget as e:
        return e.min_bytes


# -- the key/value cache of Hugging Face models ------------------------------------------------------------


def _kv_cache(step: _Step, model: nn.Module, written, plain: StepProfile) -> tuple[int, int] | None:
    """(peak with the cache, peak without it), measured, when the model would build a KV cache in training."""
    if not builds_cache(model, _cache_asked(step)):
        return None
    base = written if written is not None else plain  # the step as written, if it runs
    without = step.run(lambda i: written is not None, as_written=False)[0]
    return base.peak_bytes, without.peak_bytes


def _cache_asked(step: _Step) -> bool | None:
    """`use_cache` as the inputs pass it, if they do."""
    return step.inputs.get("use_cache") if isinstance(step.inputs, dict) else None


# -- notes -------------------------------------------------------------------------------------------------


def _notes(plain: StepProfile, regions: list[CheckpointRegion], calls: list[RecordedCall], failed: bool) -> list[str]:
    notes = []
    if plain.recompute_flops and calls:
        notes.append(
            "the step still recomputes after every torch.utils.checkpoint call was switched off: some checkpointing "
            "does not go through torch.utils.checkpoint, so 'without' figures still include it"
        )
    unmeasured = [r.label for r in regions if not r.source]
    if unmeasured:
        why = "the step as written does not run" if failed else f"more than {MAX_MEASURED} would each need a step"
        notes.append(f"{len(unmeasured)} checkpoint(s) not measured one by one ({why}): " + listing(unmeasured, 4))
    return notes
