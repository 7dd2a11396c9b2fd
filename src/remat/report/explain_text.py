"""`remat.explain`'s result as a plain, deterministic text report (pure function of the data)."""

from __future__ import annotations

import textwrap
from itertools import groupby

from rich import box
from rich.table import Table

from remat.types import PLAN_FAILED, CheckpointRegion, Explanation, Finding
from remat.report.plan_text import render_plan
from remat.report.text import REPORT_WIDTH, console_text, fmt_bytes, fmt_flops, module_label, plain_console


def render_explanation(expl: Explanation) -> str:
    """The report `remat explain` prints: the findings, the model's checkpoints, the plan remat would use.

    Example:
        >>> print(render_explanation(remat.explain(model, x)))

    Findings come most serious first (what silently changes training, then memory, then
    advice), by bytes at stake within each; several findings of one code share one fix.
    Every figure says whether it was measured or predicted.

    Known limitations: fixed at 100 columns; English only.
    """
    console = plain_console()
    for line in _header(expl):
        console.print(line)
    console.print()
    console.print("Findings, most serious first:" if expl else NO_FINDINGS)
    for i, group in enumerate(_by_code(list(expl)), start=1):
        console.print()
        console.print(_group_text(expl, i, group))
    if expl.checkpoints:
        console.print()
        console.print(_checkpoint_table(expl.checkpoints))
    console.print()
    console.print(_plan_text(expl))
    for note in expl.notes:
        console.print(_wrap(f"note: {note}", "", "      "))
    return console_text(console)


def _header(expl: Explanation) -> list[str]:
    p, w, n = expl.profile, expl.written_profile, len(expl.checkpoints)
    device = f"{p.device} (simulated on CPU)" if p.simulated_device else p.device
    calls = f"{n} checkpoint call{'s' if n != 1 else ''}"
    if not n and "remat-plan" in expl.codes():  # remat's own checkpoints are not the model's: see that finding
        second = (
            f"no torch.utils.checkpoint call of the model's own; peak {_exact(p.peak_bytes)} in {p.peak_phase} "
            "(measured without remat's own plan, which the model follows)"
        )
    elif not n:
        second = f"no torch.utils.checkpoint call; peak {_exact(p.peak_bytes)} in {p.peak_phase} (measured)"
    elif w is None:
        second = f"{calls}; the step as written does not run; without the checkpoints: peak {_exact(p.peak_bytes)}"
    else:
        second = f"{calls}; peak as written {_exact(w.peak_bytes)}, without them {_exact(p.peak_bytes)}, both measured"
    return [f"remat explain of {p.model}: {p.mode} mode on {device}", *_wrap(second, "", "").splitlines()]


def _exact(n: int) -> str:
    return f"{_b(n)} ({n:,} bytes)"


def _by_code(findings: list[Finding]) -> list[list[Finding]]:
    """Findings grouped by code, each group where its first finding stands."""
    order = list(dict.fromkeys(f.code for f in findings))
    return [[f for f in findings if f.code == code] for code in order]


NO_FINDINGS = "Findings: none; the checkpoints do what they are meant to."
FULL_IN_GROUP = 6
"""A code found in more places than this shows the first ones in full, then only where the others are."""


def _group_text(expl: Explanation, i: int, group: list[Finding]) -> str:
    first = group[0]
    at_stake = _b(sum(f.bytes_at_stake for f in group))
    if len(group) == 1:
        where = module_label(expl.profile, first.module)
        head = f"{i:>2}. {first.code} in {where} [{first.severity}], {at_stake} at stake"
        lines = [head, _wrap(first.message, "    ", "    ")]
    else:
        head = f"{i:>2}. {first.code} [{first.severity}], {len(group)} places, {at_stake} at stake"
        shown = group if len(group) <= FULL_IN_GROUP else group[: FULL_IN_GROUP - 1]
        lines = [head] + [_wrap(f.message, "    - ", "      ") for f in shown]
        if len(shown) < len(group):
            rest = ", ".join(
                f"{module_label(expl.profile, f.module)} ({_b(f.bytes_at_stake)})" for f in group[len(shown) :]
            )
            lines.append(_wrap(f"- and {len(group) - len(shown)} more like these, in {rest}", "    ", "      "))
    fixes = list(dict.fromkeys(f.fix for f in group))
    lines += [_wrap(f"Fix: {fix}", "    ", "         ") for fix in fixes]
    return "\n".join(lines)


def _wrap(text: str, first: str, rest: str) -> str:
    return textwrap.fill(
        text,
        width=REPORT_WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    )


# -- the model's checkpoints --------------------------------------------------------------------


def _checkpoint_table(regions: list[CheckpointRegion]) -> Table:
    table = Table(
        title="The model's checkpoints, each alone", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("checkpoint", overflow="fold", min_width=min(38, max(len(_label(run)) for run in _runs(regions))))
    table.add_column("variant", no_wrap=True)
    for header in ("frees", "recompute\nGFLOP", "peak"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("source", no_wrap=True)
    for run in _runs(regions):
        r = run[0]
        number = str(r.index) if len(run) == 1 else f"{r.index}-{run[-1].index}"
        table.add_row(number, "  " * r.depth + _label(run), _variant(r), *_effect_cells(r))
    return table


def _label(run: list[CheckpointRegion]) -> str:
    if len(run) == 1:
        return run[0].label
    base, first = run[0].label.rsplit("[", 1)
    return f"{base} x {len(run)}, each: [{first} .. [{run[-1].label.rsplit('[', 1)[1]}"


def _runs(regions: list[CheckpointRegion]) -> list[list[CheckpointRegion]]:
    """Consecutive checkpoint_sequential segments with the same figures, shown as one row."""

    def key(r: CheckpointRegion):
        same = (r.label.rsplit("[", 1)[0], r.reentrant, r.freed_bytes, r.recompute_flops, r.peak_bytes)
        return same if r.kind == "sequential" else (r.index,)

    return [list(run) for _, run in groupby(regions, key=key)]


def _variant(r: CheckpointRegion) -> str:
    return ("reentrant" if r.reentrant else "non-reentrant") + ("" if r.preserve_rng_state else ", no RNG")


def _effect_cells(r: CheckpointRegion) -> list[str]:
    if not r.source:
        return ["-", "-", "-", "not measured"]
    flops = "-" if r.recompute_flops is None else fmt_flops(r.recompute_flops)
    return [_b(r.freed_bytes), flops, _b(r.peak_bytes), r.source]


# -- the plan ----------------------------------------------------------------------------------------


def _plan_text(expl: Explanation) -> str:
    plan, w = expl.plan, expl.written_profile
    where = " on the step without your checkpoints" if expl.checkpoints else ""
    if not plan.segments and not getattr(plan, "selective", None):
        failed = [n for n in plan.notes if n.startswith(PLAN_FAILED)]
        if failed:
            return _wrap(
                f"What remat would do instead: nothing it has seen run{where}. {failed[0].rstrip('.')}.", "", ""
            )
        return f"What remat would do instead: nothing; no checkpointing plan lowers the peak{where}."
    lines = [f"What remat would do instead (predicted{where}):", render_plan(plan).rstrip()]
    if w is not None and expl.checkpoints:
        lines.append(
            _wrap(
                f"Yours, as written: peak {_b(w.peak_bytes)} for {fmt_flops(w.recompute_flops)} GFLOP recomputed "
                f"(measured); remat's plan: peak {_b(plan.peak_bytes)} for {fmt_flops(plan.recompute_flops)} GFLOP "
                "(predicted).",
                "",
                "",
            )
        )
    return "\n".join(lines)


def _b(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n, "auto")
