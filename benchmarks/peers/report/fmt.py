"""How the peers report writes a figure: MiB, GFLOP, ratios, seconds, gradients, tables."""

from __future__ import annotations

from _common import md_table

MiB = 2**20


def mib(b) -> str:
    return "—" if b is None else f"{b / MiB:,.1f}"


def pct(a, base) -> str:
    if a is None or not base:
        return ""
    return f"{(a - base) / base:+.0%}"


def gflop(f) -> str:
    return "—" if f is None else f"{f / 1e9:,.2f}"


def ratio(r) -> str:
    return "—" if r is None else f"{r:.2f}×"


def secs(s) -> str:
    if s is None:
        return "—"
    return f"{s:.2f}" if s < 10 else f"{s:.0f}"


def grads_text(g: dict | None, rng_note: bool = False) -> str:
    if not g:
        return "—"
    if g.get("equal"):
        return "exact"
    if g.get("rel", 1) < 1e-4:
        return f"≈ (rel {g['rel']:.0e})"
    return f"DIFFER (rel {g['rel']:.0e})" + (" ¹" if rng_note else "")


def grads_differ(g: dict | None) -> bool:
    """Gradients that are neither bit-exact nor within 1e-4 of the reference."""
    return bool(g) and not g.get("equal") and g.get("rel", 1) >= 1e-4


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table of preformatted cells (`_common.md_table`, unpadded: the report's cells are long)."""
    return md_table(headers, [[str(c) for c in r] for r in rows], pad=False)
