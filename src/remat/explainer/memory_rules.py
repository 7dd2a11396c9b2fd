"""The memory findings of `remat.explain` (severity MEMORY): checkpoints that cost memory
instead of saving it (whole-model-checkpoint, checkpoint-too-small, too-many-segments), and
memory that checkpointing cannot reach (activations-not-dominant, kv-cache-in-training).
"""

from __future__ import annotations

from remat.explainer.evidence import Evidence, _b, _few, _gflop
from remat.module_tree import parent_name
from remat.planner import recipes
from remat.planner.api import FIXED_DOMINATES
from remat.planner.problem import Group, Problem, Unit
from remat.report.text import fmt_share
from remat.types import CheckpointRegion, Finding, Severity, StepProfile

MARGIN = 0.05
"""A predicted alternative counts as better when it lowers the peak by at least this fraction."""
BIG_REGION = 0.5
"""A checkpoint freeing at least this fraction of the step's activations is one big region."""


# -- whole-model-checkpoint ------------------------------------------------------------------------


def whole_model_checkpoint(ev: Evidence) -> list[Finding]:
    """One checkpoint around (nearly) the whole model: backward rebuilds everything at once (report 000)."""
    out = []
    for r in ev.regions:
        if r.depth or r.freed_bytes is None or r.freed_bytes < BIG_REGION * ev.plain.activation_bytes:
            continue
        if r.peak_bytes is None:  # its effect was not predicted or measured
            continue
        group = _inner_group(ev, r)
        if group is None:
            continue
        every_block = recipes.segments_every_block(len(ev.problem.groups[group]))
        per_layer = ev.problem.peak(recipes.units_for(ev.problem, group, every_block))
        if r.peak_bytes - per_layer >= MARGIN * r.peak_bytes:
            out.append(_whole_model(ev, r, group, per_layer, (r.freed_bytes, r.peak_bytes)))
    return out


def _inner_group(ev: Evidence, r: CheckpointRegion) -> Group | None:
    """The largest run of sibling blocks inside the region (its layers), if it has two or more."""
    inside = [g for g, names in ev.problem.groups.items() if len(names) >= 2 and all(n in r.modules for n in names)]
    return max(inside, key=lambda g: len(ev.problem.groups[g]), default=None)


def _whole_model(ev: Evidence, r: CheckpointRegion, group: Group, per_layer: int, effect: tuple[int, int]) -> Finding:
    """`effect`: the region's freed and peak bytes (known)."""
    (freed, peak), plain, layers = effect, ev.plain, ev.problem.groups[group]
    fwd_without = plain.end_of_forward.total_bytes
    fwd_with = fwd_without - freed
    worse = peak - plain.peak_bytes
    change = f": {_b(worse)} more" if worse > 0 else (f": {_b(-worse)} less" if worse < 0 else "")
    if worse > 0 and r.reentrant:
        change += ", as a reentrant checkpoint rebuilds its output beside the one the forward returned"
    message = (
        f"{r.label} wraps all {len(layers)} blocks of {_container(layers)} in one checkpoint. It does lower the end of "
        f"forward ({_b(fwd_with)} live instead of {_b(fwd_without)}), but backward recomputes all of them at once, so "
        f"the step's peak is {_b(peak)} with it and {_b(plain.peak_bytes)} without it ({r.source}){change}. "
        f"With one checkpoint per block, the peak would be {_b(per_layer)} (predicted)."
    )
    seq = _in_code(parent_name(layers[0]))
    fix = (
        f"Checkpoint each block of {_container(layers)} separately, not the model: e.g. "
        f"`for i, layer in enumerate({seq}): {seq}[i] = checkpoint_wrapper(layer)`, or "
        f"`x = checkpoint(layer, x, use_reentrant=False)` inside the loop; or apply remat's plan below."
    )
    figures = dict(
        peak_with_bytes=peak,
        peak_without_bytes=plain.peak_bytes,
        peak_per_layer_bytes=per_layer,
        forward_live_with_bytes=fwd_with,
        forward_live_without_bytes=fwd_without,
        blocks=len(layers),
    )
    at_stake = max(0, peak - per_layer)
    return Finding("whole-model-checkpoint", r.module, message, at_stake, fix, Severity.MEMORY, figures)


def _in_code(path: str) -> str:
    """A module path as the user's code reaches it, before checkpoint_wrapper: `model.layers`."""
    path = path.replace("_checkpoint_wrapped_module.", "").replace("_checkpoint_wrapped_module", "")
    return f"model.{path}" if path else "model"


def _container(names: list[str]) -> str:
    """The module holding these sibling blocks, for people."""
    return parent_name(names[0]) or "the model"


# -- checkpoint-too-small --------------------------------------------------------------------------


def checkpoint_too_small(ev: Evidence) -> list[Finding]:
    """A checkpoint around one op or a tiny block: frees nothing, costs time (report 002).

    checkpoint_sequential segments are left to too-many-segments: their size is the number of segments.
    """
    return [
        _too_small(ev, r)
        for r in ev.regions
        if r.freed_bytes is not None and r.freed_bytes <= 0 and r.kind != "sequential"
    ]


def _too_small(ev: Evidence, r: CheckpointRegion) -> Finding:
    freed = r.freed_bytes or 0  # known: `checkpoint_too_small` takes the regions it was predicted or measured for
    if freed == 0:
        keeps = "what its ops save for backward is its input, kept anyway, so it frees nothing"
    else:
        keeps = (
            "it frees nothing, and keeps its input until backward, a tensor autograd would have freed: "
            f"{_b(-freed)} more saved for backward"
        )
    message = (
        f"{_who(ev, r)} wraps {_region_words(ev, r)}; {keeps} ({r.source}, this checkpoint alone). {_cost_words(r)}"
    )
    fix = (
        "Remove this checkpoint. A checkpoint pays off around a block of several ops whose intermediate tensors it "
        "drops (conv + ReLU + conv together, a whole layer); see remat's plan below for which blocks."
    )
    figures = dict(freed_bytes=freed, recompute_flops=r.recompute_flops or 0)
    return Finding("checkpoint-too-small", r.module, message, max(0, -freed), fix, Severity.MEMORY, figures)


def _who(ev: Evidence, r: CheckpointRegion) -> str:
    """The checkpoint by its label and call number (and caller, for a plain function)."""
    where = f", in {r.module or '<' + ev.plain.model + '>'}" if r.kind == "function" else ""
    return f"{r.label} (call #{r.index}{where})"


def _region_words(ev: Evidence, r: CheckpointRegion) -> str:
    if not r.modules:
        return "a function that runs no module (one op or a few cheap ones)"
    mod = ev.modules.get(r.modules[0])
    if len(r.modules) == 1 and mod is not None and not list(mod.children()):
        return f"a single layer ({type(mod).__name__})"
    return f"{len(r.modules)} modules ({_few(r.modules)})"


def _cost_words(r: CheckpointRegion) -> str:
    flops = r.recompute_flops or 0
    if r.reentrant and flops == 0:
        return "Being reentrant, it re-runs the function in backward (elementwise work, which FLOP counts leave out)."
    if r.reentrant:
        return f"Being reentrant, it re-runs the whole function in backward: {_gflop(flops)} more work."
    if flops == 0:
        return "Non-reentrant checkpoint stops before re-running it, so it costs only the checkpoint's bookkeeping."
    return f"It re-runs {_gflop(flops)} in backward."


# -- too-many-segments -----------------------------------------------------------------------------


def too_many_segments(ev: Evidence) -> list[Finding]:
    """More checkpoints than the sweet spot: their stored inputs cost more than they free (report 001)."""
    out = []
    for group, units in _user_units(ev).items():
        n = len(ev.problem.groups[group])
        if len(units) < 3:
            continue
        peaks = _sequential_peaks(ev.problem, group, n)
        best = min(peaks, key=lambda k: (peaks[k], k))
        mine = ev.problem.peak(units)
        if best - 1 < len(units) and mine - peaks[best] >= MARGIN * mine:
            out.append(_too_many(ev, group, units, peaks, best, mine))
    return out


def _user_units(ev: Evidence) -> dict[Group, list[Unit]]:
    """The model's checkpoints that are planner units, by group (depth 0, predicted)."""
    by_group: dict[Group, list[Unit]] = {}
    for r in ev.regions:
        unit = _unit_of(ev, r)
        if unit is not None and r.depth == 0:
            by_group.setdefault(unit.group, []).append(unit)
    return by_group


def _unit_of(ev: Evidence, r: CheckpointRegion) -> Unit | None:
    try:
        return ev.problem.unit(*r.blocks) if r.blocks else None
    except KeyError:
        return None


def _sequential_peaks(problem: Problem, group: Group, n: int) -> dict[int, int]:
    """Predicted peak of checkpoint_sequential(k) over the group, for k = 2..n."""
    cuts = {k: recipes.segments_checkpoint_sequential(n, k) for k in range(2, n + 1)}
    return {k: problem.peak(recipes.units_for(problem, group, segments)) for k, segments in cuts.items()}


def _too_many(ev: Evidence, group: Group, units: list[Unit], peaks: dict[int, int], best: int, mine: int) -> Finding:
    names = ev.problem.groups[group]
    boundaries = sum(ev.plain.block(u.blocks[0]).input_bytes for u in units)
    only_these = len(ev.regions) == len(units)  # the step as written has no other checkpoint
    written = ev.written if only_these else None
    measured = f"{_b(written.peak_bytes)} measured, " if written is not None else ""
    shown = sorted({k for k in (2, 4, 8, 16, 32, 64, best, len(units) + 1) if k in peaks})
    table = ", ".join(f"{k}: {_b(peaks[k])}" for k in shown)
    message = (
        f"{_segments_words(ev, units, names)}. Each checkpoint keeps its input through backward ({_b(boundaries)} of "
        f"segment boundaries in all), and segments this small free little else, so the peak is {measured}"
        f"{_b(mine)} predicted. Predicted peak of checkpoint_sequential by number of segments: {table}. "
        f"The sweet spot is {best} segments: {_b(peaks[best])}."
    )
    fix = (
        f"Use fewer, longer segments: checkpoint_sequential(seq, {best}, x, use_reentrant=False) (about the square "
        "root of the number of blocks), or remat's plan below, which also picks where to cut."
    )
    figures = dict(
        checkpoints=len(units),
        best_segments=best,
        peak_predicted_bytes=mine,
        best_peak_bytes=peaks[best],
        boundaries_bytes=boundaries,
    )
    if written is not None:
        figures["peak_measured_bytes"] = written.peak_bytes
    return Finding(
        "too-many-segments", parent_name(names[0]), message, mine - peaks[best], fix, Severity.MEMORY, figures
    )


def _segments_words(ev: Evidence, units: list[Unit], names: list[str]) -> str:
    """How the checkpoints cut the blocks; checkpoint_sequential leaves its last segment without one."""
    where = f"the {len(names)} blocks of {_container(names)}"
    if not all(r.kind == "sequential" for r in ev.regions if r.blocks in {u.blocks for u in units}):
        return f"{len(units)} checkpoints over {where}"
    size, rest = len(units[0].blocks), len(names) - sum(len(u.blocks) for u in units)
    return (
        f"checkpoint_sequential with {len(units) + 1} segments over {where}: {len(units)} checkpoints of {size} "
        f"blocks, and the last {rest} blocks without one (checkpoint_sequential never checkpoints its last segment)"
    )


# -- activations-not-dominant ----------------------------------------------------------------------


def activations_not_dominant(ev: Evidence) -> list[Finding]:
    """Parameters, gradients and optimizer state dominate the peak: checkpointing cannot save much (report 002)."""
    p = ev.plain
    at = p.at_peak
    fixed = at.params_bytes + at.grads_bytes + at.optimizer_bytes + at.buffers_bytes
    if fixed < FIXED_DOMINATES * p.peak_bytes:
        return []
    most = p.peak_bytes - ev.least_peak_bytes
    message = (
        f"At the step's peak ({_b(p.peak_bytes)}, in {p.peak_phase}), parameters ({_b(at.params_bytes)}), gradients "
        f"({_b(at.grads_bytes)}) and optimizer state ({_b(at.optimizer_bytes)}) are {fmt_share(fixed, p.peak_bytes)}; "
        f"activations saved for backward are {_b(at.activations_bytes)}. Checkpointing acts only on activations: "
        f"the best plan reaches {_b(ev.least_peak_bytes)} (predicted), {_b(most)} or {fmt_share(most, p.peak_bytes)} "
        f"less, and no checkpointing can do more."
    )
    fix = (
        f"Act on that state instead: mixed precision (bf16 weights and gradients: about "
        f"{_b((at.params_bytes + at.grads_bytes) // 2)} less); {_optimizer_words(p, at.params_bytes)}; sharding "
        "over N GPUs (FSDP, ZeRO) divides parameters, gradients and optimizer state by N."
    )
    figures = dict(
        peak_bytes=p.peak_bytes,
        fixed_bytes=fixed,
        params_bytes=at.params_bytes,
        grads_bytes=at.grads_bytes,
        optimizer_bytes=at.optimizer_bytes,
        least_peak_bytes=ev.least_peak_bytes,
        most_saved_bytes=most,
    )
    return [Finding("activations-not-dominant", "", message, fixed, fix, Severity.MEMORY, figures)]


def _optimizer_words(p: StepProfile, params_bytes: int) -> str:
    if p.optimizer_bytes:
        return (
            f"a lighter optimizer (its state is {_b(p.optimizer_bytes)} here; Adam keeps two values per parameter, "
            "SGD with momentum one, 8-bit Adam a quarter of Adam's)"
        )
    return f"keep the optimizer light (none was counted here; Adam would add {_b(2 * params_bytes)})"


# -- kv-cache-in-training --------------------------------------------------------------------------


def kv_cache_in_training(ev: Evidence) -> list[Finding]:
    """A Hugging Face model trained with use_cache=True keeps every layer's keys and values through the step."""
    if ev.kv_cache is None or ev.kv_cache[0] <= ev.kv_cache[1]:
        return []
    with_cache, without = ev.kv_cache
    again = ""
    if ev.recomputed:
        again = ", and each checkpoint recomputation appends the layer's keys and values to it again"
    message = (
        "use_cache is True (the Hugging Face default), so the forward also builds every layer's key/value cache and "
        f"returns it with the output, which the training step holds to its end{again}. Peak {_b(with_cache)} with "
        f"the cache, {_b(without)} with use_cache=False (measured): {_b(with_cache - without)} for a cache training "
        "never reads."
    )
    fix = (
        "Train with use_cache=False: model.config.use_cache = False, or pass use_cache=False to forward. Hugging "
        "Face's gradient_checkpointing_enable() switches it off for this reason; torch.utils.checkpoint and "
        "checkpoint_wrapper do not."
    )
    return [
        Finding(
            "kv-cache-in-training",
            "",
            message,
            with_cache - without,
            fix,
            Severity.MEMORY,
            dict(peak_with_cache_bytes=with_cache, peak_without_cache_bytes=without),
        )
    ]
