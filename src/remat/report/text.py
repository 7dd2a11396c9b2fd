"""Text reports: a `StepProfile` as a plain, deterministic table report.

Everything here is a pure function of the data: nothing is measured, nothing is
printed.  Tables are laid out by `rich` on an in-memory console with no colour, so
the same profile always gives the same text (golden-file tested).
"""

from __future__ import annotations

import io
import textwrap

from rich import box
from rich.console import Console
from rich.table import Table

from remat.types import CATEGORIES, BlockProfile, Breakdown, StepProfile
from remat.types.kinds import Mode, ParallelKind

REPORT_WIDTH = 100
MIB = 1024**2
_UNITS = {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": 1024**3, "TiB": 1024**4}

_TYPE_WIDTH = 16  # longer class names are cut with an ellipsis

_CHECKPOINT_LABELS = {"checkpoint_wrapper": "wrapper", "recomputed": "recomputed"}

_CATEGORY_LABELS = {
    "params": "parameters",
    "buffers": "buffers",
    "inputs": "inputs",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "gathered": "gathered parameters (FSDP)",
    "workspaces": "library workspaces (cuBLAS)",
    "activations": "activations (saved for backward)",
    "temporaries": "temporaries",
    "scratch": "kernel scratch (no tensor)",
}


# -- number formatting (shared: import these rather than writing another) ----------


def fmt_bytes(n: int, unit: str = "MiB", digits: int = 1, suffix: bool = True) -> str:
    """Bytes in a binary unit, thousands separated: `fmt_bytes(656891912)` -> "626.5 MiB".

    Example:
        >>> fmt_bytes(3 * 2**30, "auto")
        '3.0 GiB'
        >>> fmt_bytes(16384, suffix=False)
        '<0.1'

    `unit` is one of B, KiB, MiB, GiB, TiB or "auto" (the largest unit in which the
    value is at least 1).  A nonzero amount too small to show at `digits` decimals
    is written `<0.1` rather than a misleading `0.0`.

    Known limitations: no SI (MB) units.
    """
    if unit == "auto":
        unit = _auto_unit(n)
    scale = _UNITS[unit]
    value = n / scale
    smallest = 10.0**-digits
    if unit != "B" and 0 < abs(value) < smallest / 2:
        text = f"<{smallest:.{digits}f}"
    else:
        text = f"{value:,.{digits if unit != 'B' else 0}f}"
    return f"{text} {unit}" if suffix else text


def _auto_unit(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= _UNITS[unit]:
            return unit
    return "B"


def fmt_flops(flops: int, digits: int = 2) -> str:
    """FLOPs in GFLOP (10**9): `fmt_flops(1_610_612_736)` -> "1.61"."""
    return f"{flops / 1e9:,.{digits}f}"


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal; "-" for 0 (not timed, e.g. fake mode)."""
    return f"{seconds * 1e3:.1f}" if seconds > 0 else "-"


def fmt_timing(timing: str) -> str:
    """Where a profile's or plan's seconds come from, in words (`StepProfile.timing`)."""
    if timing.startswith("roofline "):
        return f"predicted for {timing.split(' ', 1)[1]}"
    return {"measured": "measured", "tracked": "timed while tracked"}.get(timing, timing)


def fmt_share(part: int, total: int) -> str:
    """`part` as a percentage of `total` with one decimal ("-" when total is 0)."""
    return f"{100.0 * part / total:.1f}%" if total else "-"


def module_label(profile: StepProfile, module: str) -> str:
    """A module's dotted name for people: "" (the model itself) becomes "<ModelClass>"."""
    return module if module else f"<{profile.model}>"


# -- the profile report -------------------------------------------------------------


def render_profile(profile: StepProfile, top: int = 10) -> str:
    """The report of one profiled training step as plain text (what `str(profile)` shows).

    Example:
        >>> prof = remat.profile(model, x, optimizer=torch.optim.Adam(model.parameters()))
        >>> print(render_profile(prof, top=5))

    Sections: a header (model, mode, device, peak and where it happened), the
    memory breakdown at the peak and at the end of forward, the `top` candidate
    blocks by bytes saved for backward, and the profile's notes.

    Known limitations: the layout is fixed at 100 columns; long module names wrap
    inside their column.
    """
    console = plain_console()
    for line in _header_lines(profile):
        console.print(line)
    console.print()
    console.print(_breakdown_table(profile.at_peak, profile.end_of_forward))
    console.print()
    if top > 0:
        console.print(_blocks_table(profile, top))
        console.print()
    if profile.notes:
        console.print("Notes:")
        console.print(_bullets(profile.notes))
    return console_text(console)


def console_text(console: Console) -> str:
    """What was printed on a `plain_console()`, without trailing spaces on any line."""
    printed = console.file.getvalue() if isinstance(console.file, io.StringIO) else ""
    lines = [line.rstrip() for line in printed.rstrip().splitlines()]
    return "\n".join(lines) + "\n"


def plain_console() -> Console:
    """A rich console that renders into memory: 100 columns, no colour, no markup (deterministic)."""
    return Console(
        file=io.StringIO(),
        width=REPORT_WIDTH,
        force_terminal=False,
        color_system=None,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )


def _header_lines(p: StepProfile) -> list[str]:
    device = f"{p.device} (simulated on CPU)" if p.simulated_device else p.device
    where = f"{p.mode} mode on {device}"
    if p.parallel:
        label = {ParallelKind.FSDP: "FSDP2", ParallelKind.DDP: "DDP"}[p.parallel]
        where += (
            f", rank {p.rank} of {p.world_size} ({label})"
            if p.mode == Mode.REAL
            else f", one rank of {p.world_size} ({label})"
        )
    if p.allocation_rounding_bytes > 1:
        where += f", storages rounded up to {p.allocation_rounding_bytes} B"
    gib = f"{fmt_bytes(p.peak_bytes, 'GiB')}, " if p.peak_bytes >= 2**30 else ""
    peak = f"peak {fmt_bytes(p.peak_bytes)} ({gib}{p.peak_bytes:,} bytes) in {p.peak_phase}"
    at = f"  at op {p.peak_op} in module {module_label(p, p.peak_module)}"
    state = (
        f"parameters {fmt_bytes(p.param_bytes)}, gradients {fmt_bytes(p.grad_bytes)}, "
        f"optimizer state {fmt_bytes(p.optimizer_bytes)}, activations {fmt_bytes(p.activation_bytes)}"
    )
    work = f"forward {fmt_flops(p.forward_flops)} GFLOP, backward {fmt_flops(p.backward_flops)} GFLOP"
    if p.recompute_flops:
        work += f", recomputed {fmt_flops(p.recompute_flops)} GFLOP"
    if p.step_time_s > 0:
        work += f", step {fmt_ms(p.step_time_s)} ms ({fmt_timing(p.timing)})"
    elif p.step_s > 0:
        work += f", step {p.step_s:.2f} s (with tracking overhead)"
    lines = [f"remat profile of {p.model}: {where}", _loop_line(p), peak, at, state, work]
    return lines + ([_reserve_line(p.gpu_reserve)] if p.gpu_reserve is not None else [])


def _reserve_line(r) -> str:
    """What the GPU's caching allocator would hold (NOTE [The caching allocator's reserve])."""
    return (
        f"on the GPU (the caching allocator replayed): max_memory_allocated {fmt_bytes(r.allocated_bytes)}, "
        f"reserved {fmt_bytes(r.reserved_bytes)}; with expandable_segments:True reserved "
        f"{fmt_bytes(r.expandable_reserved_bytes)}"
    )


def _loop_line(p: StepProfile) -> str:
    """Which step of which loop the figures are, with which optimizer (NOTE [The step that is measured])."""
    which = p.optimizer or "the optimizer"  # a profile written before the field (version 5) has no name
    if not p.optimizer and not p.optimizer_bytes:
        step = f"{'steady' if p.step == 'steady' else 'first'} step, no optimizer (none of its state counted)"
    elif p.step == "steady":
        step = f"steady step with {which} (its state resident)"
    else:
        step = f"first step of {which} (its state made during the step)"
    passes = f", {p.accumulate} micro-batches per optimizer step" if p.accumulate > 1 else ""
    kept = (
        "the output kept until after backward"
        if p.keep_output
        else "only the loss kept (the output let go before backward)"
    )
    return f"loop: {step}{passes}, {kept}"


def _breakdown_table(at_peak: Breakdown, end_fwd: Breakdown) -> Table:
    table = _table("Memory by category (live tensor bytes)")
    table.add_column("category")
    table.add_column("at peak", justify="right")
    table.add_column("end of forward", justify="right")
    peak_total, fwd_total = at_peak.total_bytes, end_fwd.total_bytes
    peak_parts, fwd_parts = at_peak.as_dict(), end_fwd.as_dict()
    for cat in CATEGORIES:
        if cat in ("gathered", "workspaces") and not (peak_parts[cat] or fwd_parts[cat]):
            continue  # a row only where FSDP gathers, or a GPU's libraries keep memory
        table.add_row(
            _CATEGORY_LABELS[cat],
            _amount(peak_parts[cat], peak_total),
            _amount(fwd_parts[cat], fwd_total),
        )
    table.add_section()
    table.add_row("total", _amount(peak_total, peak_total), _amount(fwd_total, fwd_total))
    return table


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)


def _amount(n: int, total: int) -> str:
    return f"{fmt_bytes(n)} {fmt_share(n, total):>6}"


def _blocks_table(p: StepProfile, top: int) -> Table:
    chosen = top_blocks(p.blocks, top)
    title = f"Top {len(chosen)} of {len(p.blocks)} candidate blocks by bytes saved for backward"
    table = _table(title)
    table.add_column("block", overflow="fold")  # the one column that wraps when space is short
    table.add_column("type", overflow="ellipsis", no_wrap=True, max_width=_TYPE_WIDTH)
    for header in ("saved\nMiB", "output\nMiB", "fwd\nGFLOP", "fwd\nms", "bwd\nms"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("checkpointed", no_wrap=True)
    for b in chosen:
        table.add_row(
            module_label(p, b.name),
            b.type,
            fmt_bytes(b.saved_bytes, suffix=False),
            fmt_bytes(b.output_bytes, suffix=False),
            fmt_flops(b.forward_flops),
            fmt_ms(b.forward_s),
            fmt_ms(b.backward_s),
            _CHECKPOINT_LABELS.get(b.checkpoint_kind, b.checkpoint_kind) or ("yes" if b.checkpointed else "-"),
        )
    if not chosen:
        table.add_row("(no candidate blocks ran)", "", "", "", "", "", "", "")
    return table


def top_blocks(blocks: list[BlockProfile], n: int) -> list[BlockProfile]:
    """The `n` blocks that save the most bytes for backward, ties in execution order."""
    return sorted(blocks, key=lambda b: (-b.saved_bytes, b.index))[: max(n, 0)]


def _bullets(items: list[str]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", width=3)
    grid.add_column(overflow="fold")
    for item in items:
        grid.add_row("-", item)
    return grid


# -- plain words ----------------------------------------------------------------------


def summarize_profile(profile: StepProfile) -> str:
    """One paragraph in plain words: what dominates the peak, the activations, the biggest block.

    Example:
        >>> print(summarize_profile(remat.profile(model, x)))
        The step peaks at 626.5 MiB, in backward ...

    Known limitations: English only; wrapped at 100 columns.
    """
    p = profile
    sentences = [_peak_sentence(p), _activation_sentence(p), _block_sentence(p)]
    text = " ".join(s for s in sentences if s)
    wrapped = textwrap.fill(text, width=REPORT_WIDTH, break_on_hyphens=False, break_long_words=False)
    return wrapped.replace(_NBSP, " ") + "\n"


_NBSP = "\u00a0"  # joins a number to its unit so that wrapping never separates them


def _nb(amount: str) -> str:
    return amount.replace(" ", _NBSP)


def _peak_sentence(p: StepProfile) -> str:
    parts = sorted(p.at_peak.as_dict().items(), key=lambda kv: -kv[1])
    total = p.at_peak.total_bytes
    big, big_bytes = parts[0]
    rest = [f"{_CATEGORY_LABELS[c]} {_nb(fmt_bytes(n))}" for c, n in parts[1:3] if n > 0]
    then = f", then {' and '.join(rest)}" if rest else ""
    return (
        f"The step peaks at {_nb(fmt_bytes(p.peak_bytes))} in {p.peak_phase} "
        f"(while {module_label(p, p.peak_module)} ran {p.peak_op}); "
        f"the largest part of that peak is {_CATEGORY_LABELS[big]}, {_nb(fmt_bytes(big_bytes))} "
        f"({fmt_share(big_bytes, total)}){then}."
    )


def _activation_sentence(p: StepProfile) -> str:
    return (
        f"At the end of forward, autograd holds {p.activation_bytes:,} bytes "
        f"({_nb(fmt_bytes(p.activation_bytes))}) of activations saved for backward, "
        f"against {_nb(fmt_bytes(p.param_bytes))} of parameters."
    )


def _block_sentence(p: StepProfile) -> str:
    chosen = top_blocks(p.blocks, 1)
    if not chosen or chosen[0].saved_bytes == 0:
        return ""
    b = chosen[0]
    ties = sum(1 for o in p.blocks if o is not b and o.saved_bytes == b.saved_bytes)
    also = f" ({ties} other block{'s' if ties > 1 else ''} save as much)" if ties else ""
    return (
        f"The block that saves the most is {module_label(p, b.name)} ({b.type}), "
        f"{_nb(fmt_bytes(b.saved_bytes))}{also}; a checkpoint around it would free the "
        f"{_nb(fmt_bytes(b.internal_bytes))} that only its own ops save, keep its inputs "
        f"({_nb(fmt_bytes(b.input_bytes))}) instead, and run its forward again during backward."
    )
