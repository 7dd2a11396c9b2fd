"""Pictures of a `StepProfile`: the memory timeline of the step.

Figures are made with `matplotlib.figure.Figure` and the Agg canvas directly, never
through `pyplot`, so plotting leaves no global figure behind and needs no display.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from remat.report.text import MIB, fmt_bytes, module_label
from remat.types import StepProfile

PHASE_COLORS = {"forward": "#4C72B0", "loss": "#8172B2", "backward": "#DD8452", "optimizer": "#55A868"}
MAX_POINTS = 20_000  # longer timelines are reduced to per-bucket maxima (peaks survive)
_VECTOR_FORMATS = {".svg": "svg", ".pdf": "pdf"}


def plot_timeline(profile: StepProfile, path: str | Path) -> None:
    """Write the step's memory timeline (live MiB after each op, phases shaded, peak marked) to `path`.

    Example:
        >>> plot_timeline(remat.profile(model, x), "timeline.png")

    The picture is a PNG unless `path` ends in .svg or .pdf.  The dashed line is the
    state that lives across steps (parameters, buffers, optimizer state).  Nothing is
    written anywhere but `path`.

    Known limitations: a timeline longer than 20,000 ops is drawn from per-bucket
    maxima, so dips shorter than a bucket are not visible (peaks are).
    """
    fig = _timeline_figure(profile)
    path = Path(path)
    fig.savefig(path, format=_VECTOR_FORMATS.get(path.suffix.lower(), "png"), dpi=120)


def _timeline_figure(profile: StepProfile) -> Figure:
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs, mib = _series(profile.timeline.live_bytes)
    ax.plot(xs, mib, color="black", linewidth=1.0, label="live tensors")
    _shade_phases(ax, profile)
    _draw_baseline(ax, profile)
    _mark_peak(ax, profile)
    ax.set_xlim(0, max(len(profile.timeline) - 1, 1))
    ax.set_ylim(0, max(mib, default=0.0) * 1.25 or 1.0)
    ax.set_xlabel("op index in the step")
    ax.set_ylabel("live tensor memory (MiB)")
    device = f"{profile.device}, simulated" if profile.simulated_device else profile.device
    ax.set_title(f"{profile.model}: memory of one training step ({profile.mode} mode, {device})")
    ax.legend(loc="best", fontsize="small")
    return fig


def _series(live: list[int]) -> tuple[list[int], list[float]]:
    """(op indices, MiB), reduced to bucket maxima when longer than MAX_POINTS."""
    step = max(1, -(-len(live) // MAX_POINTS))
    xs = list(range(0, len(live), step))
    return xs, [max(live[i : i + step]) / MIB for i in xs]


def _shade_phases(ax, profile: StepProfile) -> None:
    """A band per phase, labelled at the top; labels of narrow bands are dropped a line."""
    total = max(len(profile.timeline), 1)
    for phase, start, end in profile.timeline.phase_spans():
        color = PHASE_COLORS.get(phase, "#999999")
        ax.axvspan(start - 0.5, end - 0.5, color=color, alpha=0.15, linewidth=0)
        y = 0.98 if (end - start) / total >= 0.05 else 0.93
        ax.text(
            (start + end - 1) / 2, y, phase, transform=ax.get_xaxis_transform(),
            ha="center", va="top", fontsize="small", color=color,
        )


def _draw_baseline(ax, profile: StepProfile) -> None:
    state = profile.param_bytes + profile.buffer_bytes + profile.optimizer_bytes
    if state > 0:
        ax.axhline(state / MIB, color="gray", linestyle="--", linewidth=1.0,
                   label=f"parameters + buffers + optimizer state ({fmt_bytes(state)})")


def _mark_peak(ax, profile: StepProfile) -> None:
    live = profile.timeline.live_bytes
    if not live:
        return
    k = live.index(max(live))
    y = live[k] / MIB
    ax.plot([k], [y], "o", color="crimson", zorder=3)
    where = f"{profile.peak_phase} ({module_label(profile, profile.peak_module)})"
    right_half = k > len(live) / 2
    ax.annotate(
        f"peak {fmt_bytes(profile.peak_bytes)} in {where}",
        xy=(k, y), xytext=(-12 if right_half else 12, 8), textcoords="offset points",
        ha="right" if right_half else "left", va="bottom", fontsize="small", color="crimson",
    )
