"""Pictures of a `StepProfile` and of plans: the memory timeline of the step, and the
frontier of checkpointing plans (memory against recomputation) beside the hand recipes.

Figures are made with `matplotlib.figure.Figure` and the Agg canvas directly, never
through `pyplot`, so plotting leaves no global figure behind and needs no display.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from remat.types import Plan
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
            (start + end - 1) / 2,
            y,
            phase,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize="small",
            color=color,
        )


def _draw_baseline(ax, profile: StepProfile) -> None:
    state = profile.param_bytes + profile.buffer_bytes + profile.optimizer_bytes
    if state > 0:
        ax.axhline(
            state / MIB,
            color="gray",
            linestyle="--",
            linewidth=1.0,
            label=f"parameters + buffers + optimizer state ({fmt_bytes(state)})",
        )


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
        xy=(k, y),
        xytext=(-12 if right_half else 12, 8),
        textcoords="offset points",
        ha="right" if right_half else "left",
        va="bottom",
        fontsize="small",
        color="crimson",
    )


# -- the frontier of plans ------------------------------------------------------------------------

FRONTIER_COLOR = "#4C72B0"
SEQUENTIAL_PREFIX = "checkpoint_sequential("
BASELINE_STYLES = {  # name: (marker, colour, label)
    "every-block": ("^", "#C44E52", "checkpoint every block"),
    "chen": ("D", "#8172B2", "Chen et al. sqrt(n) segments"),
}
_OTHER_STYLE = ("P", "#937860")


def plot_frontier(
    frontier: list[Plan],
    path: str | Path,
    budget_bytes: int | None = None,
    baselines: dict[str, Plan] | None = None,
) -> None:
    """Write the frontier (predicted peak MiB against extra GFLOP) with the hand recipes to `path`.

    Example:
        >>> prof = remat.profile(model, x)
        >>> plot_frontier(remat.frontier(prof), "frontier.png", budget_bytes=2**30,
        ...               baselines=remat.planner.baseline_plans(prof))

    The frontier is a staircase: below and right of it no plan exists, and each point
    is the least recomputation for its memory.  `baselines` are drawn as markers: the
    `checkpoint_sequential(k)` plans as one series labelled with k, "every-block" and
    "chen" each with their own marker.  The budget is a dashed horizontal line.  When
    the plans carry predicted seconds (a real-mode profile), a second panel shows peak
    against extra seconds.  PNG unless `path` ends in .svg or .pdf; nothing else is written.

    Known limitations: baselines with identical figures share one marker whose label
    lists them all; a frontier of one plan (nothing to recompute) is a single point.
    """
    fig = _frontier_figure(frontier, budget_bytes, baselines or {})
    path = Path(path)
    fig.savefig(path, format=_VECTOR_FORMATS.get(path.suffix.lower(), "png"), dpi=120)


def _frontier_figure(frontier: list[Plan], budget_bytes: int | None, baselines: dict[str, Plan]) -> Figure:
    timed = any(p.extra_s > 0 for p in [*frontier, *baselines.values()])
    fig = Figure(figsize=(13 if timed else 8.5, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True) if timed else [fig.add_subplot()]
    panels = [("recompute_flops", 1e9, "extra forward GFLOP (recomputation)")]
    if timed:
        panels.append(("extra_s", 1.0, "predicted extra seconds (kernel times, offload copies)"))
    for ax, (field, scale, xlabel) in zip(axes, panels):
        _draw_frontier(ax, frontier, field, scale, staircase=(field == "recompute_flops"))
        _draw_baselines(ax, baselines, field, scale)
        if budget_bytes is not None:
            ax.axhline(
                budget_bytes / MIB,
                color="black",
                linestyle="--",
                linewidth=1.0,
                label=f"budget {fmt_bytes(budget_bytes, 'auto')}",
            )
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("predicted peak of the step (MiB)")
    _add_share_axis(axes[0], frontier)
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle(_frontier_title(frontier))
    return fig


def _frontier_title(frontier: list[Plan]) -> str:
    if not frontier:
        return "no plans"
    first = frontier[0]
    return (
        f"{first.model}: least recomputation for each peak ({len(frontier)} plan{'s' if len(frontier) > 1 else ''}, "
        f"unplanned peak {fmt_bytes(first.unplanned_peak_bytes, 'auto')})"
    )


def _draw_frontier(ax, frontier: list[Plan], field: str, scale: float, staircase: bool) -> None:
    """The frontier's points; a staircase on the axis it is optimal for (FLOPs), else joined in order."""
    if not frontier:
        return
    ordered = sorted(frontier, key=lambda p: (p.recompute_flops, -p.peak_bytes))
    xs = [getattr(p, field) / scale for p in ordered]
    ys = [p.peak_bytes / MIB for p in ordered]
    if staircase:
        ax.step(xs, ys, where="post", color=FRONTIER_COLOR, linewidth=1.5, zorder=2)
    else:
        ax.plot(xs, ys, color=FRONTIER_COLOR, linewidth=0.8, alpha=0.5, zorder=2)
    ax.plot(xs, ys, "o", color=FRONTIER_COLOR, markersize=4, zorder=3, label="remat frontier")


def _draw_baselines(ax, baselines: dict[str, Plan], field: str, scale: float) -> None:
    sequential = {n: p for n, p in baselines.items() if n.startswith(SEQUENTIAL_PREFIX)}
    if sequential:
        points = {n: (getattr(p, field) / scale, p.peak_bytes / MIB) for n, p in sequential.items()}
        ax.plot(
            [x for x, _ in points.values()],
            [y for _, y in points.values()],
            "s",
            color="#DD8452",
            markerfacecolor="none",
            markersize=7,
            zorder=4,
            label="checkpoint_sequential(k), k labelled",
        )
        for (x, y), names in _clusters(points, [*baselines.values()], field, scale):
            ax.annotate(
                _k_label(names),
                xy=(x, y),
                xytext=(4, 3),
                textcoords="offset points",
                fontsize="x-small",
                color="#DD8452",
            )
    for name, p in baselines.items():
        if name in sequential:
            continue
        marker, color, label = BASELINE_STYLES.get(name, (*_OTHER_STYLE, name))
        ax.plot(
            [getattr(p, field) / scale],
            [p.peak_bytes / MIB],
            marker,
            color=color,
            markersize=8,
            markerfacecolor="none",
            markeredgewidth=1.5,
            zorder=5,
            label=label,
        )


def _clusters(points: dict[str, tuple[float, float]], everything: list[Plan], field: str, scale: float):
    """Points closer than 2% of the data's span on both axes, so that one label stands for them all."""
    xs = [getattr(p, field) / scale for p in everything]
    ys = [p.peak_bytes / MIB for p in everything]
    dx, dy = 0.02 * (max(xs) - min(xs) or 1.0), 0.02 * (max(ys) - min(ys) or 1.0)
    clusters: list[tuple[tuple[float, float], list[str]]] = []
    for name, (x, y) in sorted(points.items(), key=lambda kv: kv[1]):
        for (cx, cy), names in clusters:
            if abs(x - cx) <= dx and abs(y - cy) <= dy:
                names.append(name)
                break
        else:
            clusters.append(((x, y), [name]))
    return clusters


def _k_label(names: list[str]) -> str:
    """ "k=4", "k=3,4" or "k=15..28" for the checkpoint_sequential(k) plans at one point."""
    inner = [n[len(SEQUENTIAL_PREFIX) : -1] for n in names if n.startswith(SEQUENTIAL_PREFIX) and n.endswith(")")]
    ks = sorted(int(k) for k in inner if k.isdigit())
    if not ks:
        return ", ".join(names)
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"k={ks[0]}..{ks[-1]}"
    return "k=" + ",".join(map(str, ks))


def _add_share_axis(ax, frontier: list[Plan]) -> None:
    """A top axis with the extra FLOPs as a share of the unplanned step's FLOPs."""
    step = next((p.step_flops for p in frontier if p.step_flops), 0)
    if not step:
        return
    gflop = step / 1e9
    top = ax.secondary_xaxis("top", functions=(lambda x: 100 * x / gflop, lambda s: s * gflop / 100))
    top.set_xlabel("extra FLOPs, % of the unplanned step's forward + backward")
