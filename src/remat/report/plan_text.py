"""A `Plan` as a plain, deterministic text report (pure function of the data)."""

from __future__ import annotations

import io
import textwrap
from collections import Counter

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table

from remat.types import BY_HAND, Plan
from remat.types.capped import EXPANDABLE
from remat.types.verification import GRAD_NOISE_FACTOR, PREDICTION_AGREES
from remat.report.text import REPORT_WIDTH, fmt_bytes, fmt_timing

BASELINE_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("strategy", "left"),
    ("peak", "right"),
    ("extra GFLOP", "right"),
    ("fits budget", "left"),
)
VERIFY_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("check", "left"),
    ("measured", "right"),
    ("expected", "right"),
    ("", "left"),
)


def render_plan(plan: Plan, baselines: dict[str, Plan] | None = None) -> str:
    """The decisions and the predicted figures; with `baselines`, the hand recipes beside it."""
    out = io.StringIO()
    console = Console(file=out, width=REPORT_WIDTH, force_terminal=False, color_system=None)
    console.print(_headline(plan))
    if plan.measured_peak_bytes:
        seconds = (
            f", {plan.measured_step_s * 1e3:,.1f} ms a step in the copy that measured it"
            if plan.measured_step_s
            else ""
        )
        console.print(
            f"compiled step with this plan: {fmt_bytes(plan.measured_peak_bytes, 'auto')} by the "
            f"{plan.measured_counter}{seconds} (the predicted peak is the eager step's)"
        )
    table = Table(box=box.SIMPLE_HEAD, title="checkpoints (one per row)", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("modules wrapped together")
    rows = [seg[0] if len(seg) == 1 else f"{seg[0]} .. {seg[-1]} ({len(seg)} modules)" for seg in plan.segments]
    rows += [f"{name} (selective: {_kept(plan.selective_keeps.get(name))})" for name in plan.selective]
    rows += [f"{name} (offload: saved tensors in CPU memory until backward)" for name in plan.offload]
    for i, row in enumerate(rows, 1):
        table.add_row(str(i), row)
    if plan.compiler_budget < 1.0:
        table.add_row(
            "-",
            ("and " if rows else "none of remat's: ") + "torch.compile's activation memory budget "
            f"{plan.compiler_budget:.3g} (Inductor saves that fraction of its activations and recomputes "
            "the rest)",
        )
    elif not rows:
        table.add_row("-", "none: keep every activation")
    console.print(table)
    if baselines:
        console.print(_baseline_table(plan, baselines))
    for note in plan.notes:
        console.print(f"note: {note}")
    return out.getvalue().rstrip() + "\n"


def _headline(plan: Plan) -> str:
    """The plan's predicted peak against the unplanned one and the budget, and what it costs."""
    budget = fmt_bytes(plan.budget_bytes, "auto") if plan.budget_bytes else "none"
    saved = plan.unplanned_peak_bytes - plan.peak_bytes
    return (
        f"remat plan for {plan.model} ({plan.solver}): predicted peak {fmt_bytes(plan.peak_bytes, 'auto')} "
        f"(unplanned {fmt_bytes(plan.unplanned_peak_bytes, 'auto')}, budget {budget}), "
        f"{fmt_bytes(saved, 'auto')} saved for {plan.recompute_flops / 1e9:,.2f} GFLOP of recomputation "
        f"(+{plan.recompute_fraction:.1%} of the step's FLOPs"
        + (
            f"; ~{plan.recompute_s * 1e3:,.1f} ms, +{plan.recompute_s / plan.step_time_s:.1%} of the step's "
            f"{plan.step_time_s * 1e3:,.1f} ms, {fmt_timing(plan.timing)})"
            if plan.step_time_s
            else ")"
        )
        + (
            f", and {fmt_bytes(plan.offload_bytes, 'auto')} offloaded to CPU memory and back "
            f"(~{plan.offload_s * 1e3:,.1f} ms of copies)"
            if plan.offload
            else ""
        )
    )


_KINDS = {
    "matmuls": ("addmm", "mm", "matmul", "linear", "_scaled_mm"),
    "batched matmuls": ("bmm", "baddbmm"),
    "attention": (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
    "convolutions": ("convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"),
    "softmax": ("_softmax", "_safe_softmax", "softmax", "_log_softmax"),
    "norms": (
        "native_layer_norm",
        "layer_norm",
        "_fused_rms_norm",
        "rms_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "native_group_norm",
    ),
    "activations": ("gelu", "tanh", "silu", "relu", "sigmoid", "pow", "erf", "exp", "rsqrt", "sqrt"),
    "dropout": ("native_dropout", "bernoulli"),
    "mask ops": (
        "ones",
        "zeros",
        "full",
        "tril",
        "triu",
        "scalar_tensor",
        "where",
        "masked_fill",
        "arange",
        "lt",
        "gt",
        "le",
        "ge",
        "eq",
        "ne",
        "logical_not",
        "lift_fresh",
    ),
    "elementwise ops": ("mul", "add", "sub", "div", "neg", "rsub", "addcmul", "clamp"),
    "copies": ("clone", "cat", "_to_copy", "copy", "contiguous", "embedding", "index_select", "gather"),
}
_KIND_OF = {op: kind for kind, ops in _KINDS.items() for op in ops}


def _kept(signatures: list[str] | None) -> str:
    """What a selective checkpoint keeps, in words, counted: "keeps matmuls x4, batched matmuls x2, softmax" (the
    ops by name in the plan's JSON, `selective_keeps`); the rest of the module is recomputed."""
    if not signatures:
        return "keeps the matmuls' outputs"
    counts = Counter(_KIND_OF.get(s.split("(", 1)[0], "other ops") for s in signatures)
    return "keeps " + ", ".join(k if c == 1 else f"{k} x{c}" for k, c in counts.items())


def _baseline_table(plan: Plan, baselines: dict[str, Plan]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="the same step with hand recipes (predicted)", title_justify="left")
    for col, just in BASELINE_COLUMNS:
        table.add_column(col, justify=just)
    rows = {"remat": plan, **baselines}
    by_hand = False
    for name, p in rows.items():
        fits = "-" if plan.budget_bytes is None else ("yes" if p.peak_bytes <= plan.budget_bytes else "no")
        hand = BY_HAND in p.notes
        by_hand |= hand
        table.add_row(
            name + (" *" if hand else ""), fmt_bytes(p.peak_bytes, "auto"), f"{p.recompute_flops / 1e9:,.2f}", fits
        )
    if by_hand:
        table.caption = (
            "* by hand only: one checkpoint around several layers outside an nn.Sequential needs your own "
            "function; remat.apply checkpoints such layers one by one"
        )
        table.caption_justify = "left"
    return table


def _time_rows(table: Table, report) -> None:
    """The step's time with the plan, measured beside predicted, and without it."""
    predicted = report.predicted_overhead
    gap = f"{(report.measured_overhead - predicted) * 100:+.0f} pp " + ("ok" if report.time_agrees else "off")
    table.add_row(
        "step time with the plan",
        f"{report.measured_overhead:+.1%}",
        f"{predicted:+.1%}" if predicted else "not timed",
        gap if predicted else "",
    )
    table.add_row("step time without the plan", f"{report.unplanned_step_s * 1e3:,.1f} ms", "", "")


def _grad_expected(report) -> str:
    """The gradient check's bound: the tolerance, or on CUDA the unplanned step's run-to-run difference times
    GRAD_NOISE_FACTOR where that is larger; on CPU, where both steps ran again with deterministic kernels, the
    difference those runs gave."""
    if report.grad_deterministic_diff is not None:
        return f"<= {report.tolerance:g} (deterministic: {report.grad_deterministic_diff:.3g})"
    if report.grad_tolerance > report.tolerance:
        return f"<= {report.grad_tolerance:.3g} ({GRAD_NOISE_FACTOR}x run to run)"
    return f"<= {report.tolerance:g}"


def _cuda_rows(table: Table, cuda) -> None:
    """The CUDA runs of NOTE [The budget is the GPU's memory]: each run's allocated and reserved peaks."""
    budget = fmt_bytes(cuda.budget_bytes, "auto") if cuda.budget_bytes is not None else "no budget"
    runs = [
        ("capped at the budget", cuda.capped),
        (EXPANDABLE + ", capped", cuda.expandable),
        ("no cap", cuda.uncapped),
        ("without the plan, no cap", cuda.unplanned),
    ]
    for name, run in runs:
        if run is None:
            continue
        capped = run.cap_bytes is not None
        if not run.ran:
            table.add_row(f"CUDA step, {name}", "out of memory", f"<= {budget}", "OVER" if capped else "")
            continue
        fits = cuda.budget_bytes is None or run.reserved_bytes <= cuda.budget_bytes
        table.add_row(
            f"CUDA step, {name}: reserved",
            fmt_bytes(run.reserved_bytes, "auto"),
            f"<= {budget}" if capped else "",
            ok_word(fits) if capped else "",
        )
        table.add_row("  allocated (max_memory_allocated)", fmt_bytes(run.allocated_bytes, "auto"), "", "")


def ok_word(flag: bool) -> str:
    return "ok" if flag else "OVER"


def _cuda_verdict(report) -> str:
    """After the table: where the CUDA step ran, the verdict, torch's own words where it ran out, and the fix."""
    cuda, verdict = report.cuda, report.cuda_verdict
    if cuda is None:
        return ""
    lines = [f"CUDA, {cuda.where}" + (f" ({cuda.why_here})" if cuda.why_here else "") + f": {verdict.message}."]
    for run in (cuda.capped, cuda.expandable):
        if run is not None and not run.ran:
            lines.append("torch: " + run.out_of_memory.split(" If reserved but unallocated")[0].strip())
    if verdict.fix:
        lines.append(f"Fix: {verdict.fix}.")
    return "".join(textwrap.fill(line, REPORT_WIDTH) + "\n" for line in lines)


def render_verify(report) -> str:
    """A `VerifyReport` as text: gradients, buffers, FLOPs and peak, each with its verdict."""
    out = io.StringIO()
    console = Console(file=out, width=REPORT_WIDTH, force_terminal=False, color_system=None)
    worst = max(report.grad_max_abs_diff.values(), default=0.0)
    table = Table(box=box.SIMPLE_HEAD, title="verify: the step with and without the plan", title_justify="left")
    for col, just in VERIFY_COLUMNS:
        table.add_column(col, justify=just)
    ok = lambda flag: "ok" if flag else "MISMATCH"  # noqa: E731
    grads = ok(report.grads_equal) if report.unplanned_reproducible else "not judged"
    table.add_row("gradients (max |diff|)", f"{worst:.3g}", _grad_expected(report), grads)
    table.add_row(
        "buffers (BatchNorm stats)", "equal" if report.buffers_equal else "differ", "equal", ok(report.buffers_equal)
    )
    table.add_row(
        "extra FLOPs (FlopCounterMode)",
        f"{report.measured_recompute_flops / 1e9:,.3f} G",
        f"{report.predicted_recompute_flops / 1e9:,.3f} G",
        ok(report.measured_recompute_flops == report.predicted_recompute_flops),
    )
    table.add_row(
        f"peak ({report.step} step, tracked)",
        fmt_bytes(report.measured_peak_bytes, "auto"),
        fmt_bytes(report.predicted_peak_bytes, "auto"),
        f"{report.peak_error:+.1%} " + ok(abs(report.peak_error) <= PREDICTION_AGREES),
    )
    if report.independent_peak_bytes is not None:
        gap = (report.measured_peak_bytes - report.independent_peak_bytes) / report.independent_peak_bytes
        table.add_row(
            f"peak by the {report.independent_counter}",
            fmt_bytes(report.independent_peak_bytes, "auto"),
            f"tracked {gap:+.1%}",
            ok(report.counters_agree) if report.independent_judged else "too small to judge",
        )
    if report.budget_bytes is not None:
        table.add_row("budget", fmt_bytes(report.budget_bytes, "auto"), "", _budget_verdict(report))
    if report.cuda is not None:
        _cuda_rows(table, report.cuda)
    if report.predicted_offload_bytes or report.measured_offload_bytes:
        table.add_row(
            "offloaded to CPU memory",
            fmt_bytes(report.measured_offload_bytes, "auto"),
            fmt_bytes(report.predicted_offload_bytes, "auto"),
            "",
        )
    table.add_row("peak without the plan", fmt_bytes(report.unplanned_peak_bytes, "auto"), "", "")
    if report.timed:
        _time_rows(table, report)
    console.print(table)
    return out.getvalue().rstrip() + "\n" + _after_table(report)


def _after_table(report) -> str:
    """The lines below the verify table: gradients not judged, or judged again, and the CUDA verdict."""
    return _not_replayed(report) + _judged_deterministic(report) + _cuda_verdict(report)


def _not_replayed(report) -> str:
    """After the table, where the step without the plan did not replay itself: why the gradients are not judged,
    and the fix (NOTE [A step that does not replay itself])."""
    if report.unplanned_reproducible:
        return ""
    line = (
        "Gradients: the step without the plan does not replay itself: run twice from one seed"
        f" (torch.manual_seed(0)) its gradients differ by {report.grad_noise:.3g}, so they cannot show what the plan"
        " changes. It draws random numbers a seed does not replay: torch.seed() in its forward (Hugging Face's"
        " Reformer does, in training), numpy or Python's random. Fix: verify with that randomness fixed (dropout 0,"
        " fixed seeds: Reformer's hash_seed) or the calls taken out; the plan's checkpoints replay torch's generator"
        " as the forward drew from it, not a seed taken from the OS inside a checkpointed module."
    )
    return textwrap.fill(line, REPORT_WIDTH) + "\n"


def _judged_deterministic(report) -> str:
    """After the table, where the gradients were judged again with torch's deterministic kernels: why, and what
    those runs said (NOTE [A step that does not replay itself], Rule 3)."""
    again = report.grad_deterministic_diff
    if again is None:
        return ""
    worst = max(report.grad_max_abs_diff, key=report.grad_max_abs_diff.get)
    line = (
        f"Gradients: with the plan they differed by {report.grad_max_abs_diff[worst]:.3g} (at {worst}), where the"
        " step without it replayed itself. Both steps ran again with torch.use_deterministic_algorithms(True): "
        + (
            "their gradients are equal, so the first difference was a kernel that sums in another order from run to"
            " run (on CPU, the backward of indexing with repeated indices), not the plan."
            if report.grads_equal
            else f"they differ by {again:.3g}, so the plan changes the gradients."
        )
    )
    return textwrap.fill(line, REPORT_WIDTH) + "\n"


def _budget_verdict(report) -> str:
    """The budget row's verdict; of a compiled model only by the counter of the compiled step (the tracker's
    peak is the eager step's)."""
    if report.budget_judged:
        return "ok" if report.fits_budget else "MISMATCH"
    return "too small to judge" if report.independent_peak_bytes is not None else "compiled step not measured"


def _compiled_kept_more(report) -> str:
    """Why a compiled step can peak above the eager step a plan was priced on, and what measures it instead."""
    if not report.compiled or report.counters_agree:
        return ""
    return (
        f" The compiled step peaked at {fmt_bytes(report.independent_peak_bytes, 'auto')}, above the eager step's"
        f" {fmt_bytes(report.measured_peak_bytes, 'auto')} that the plan was priced on: the compiled step can hold"
        " more in its backward (a tied weight's gradient Inductor sums at the end, a recomputation it fuses into the"
        " next block's backward, a gradient of zeros for each output the loss does not read; docs/compile.md)."
        " Fix: remat.auto(compiled_model, inputs, budget) compiles and measures its"
        " candidates and applies one whose compiled step fits."
    )


def verdict(report) -> str:
    """One line under a verify table, in words: whether the plan holds, and what its time did against the
    prediction (a guide: seconds are not part of `report.ok`)."""
    if not report.unplanned_reproducible and not report.grads_equal:
        return "Verdict: NOT proved: the step without the plan does not replay itself (see under the table)."
    if not report.ok:
        return "Verdict: the plan does NOT hold: see the rows marked MISMATCH or OVER above." + _compiled_kept_more(
            report
        )
    peak = fmt_bytes(report.measured_peak_bytes, "auto")
    holds = "Verdict: the plan holds: the same gradients, the recomputation predicted, " + (
        f"the peak within the budget ({peak} of {fmt_bytes(report.budget_bytes, 'auto')})"
        if report.budget_bytes is not None
        else f"the peak as predicted ({peak}; the plan has no budget)"
    )
    if not report.timed or not report.predicted_overhead:
        return holds + "."
    took = f"the step took {report.measured_overhead:+.1%} time against {report.predicted_overhead:+.1%} predicted"
    if report.time_agrees:
        return f"{holds}; {took}."
    return (
        f"{holds}. Only the time differs: {took} (seconds measured on a busy machine move from run to run; "
        "they are a guide, not part of the check)."
    )
