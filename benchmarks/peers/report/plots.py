"""The per-model figure of the peers report: measured peak against extra FLOPs and against step time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from _catalog import TITLES  # noqa: E402

from .fmt import MiB  # noqa: E402
from .verdicts import configs_by_key  # noqa: E402

STYLE = {
    "none": ("black", "o", "no checkpointing"),
    "every_block": ("tab:blue", "s", "every block"),
    "checkpoint_sequential": ("tab:cyan", "v", "checkpoint_sequential(k)"),
    "chen": ("tab:purple", "D", "Chen sqrt(n)"),
    "sac": ("tab:green", "P", "selective (SAC)"),
    "compile": ("tab:orange", "X", "torch.compile budget"),
    "remat": ("tab:red", "*", "remat (measured)"),
    "remat_compiled": ("darkred", "h", "remat + torch.compile (measured)"),
    "diagnostic": ("lightgray", "*", "diagnostic: hand-built selective"),
}


def plot_model(m: str, E: dict, C: dict | None, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    front = E.get("frontier", [])
    if front:
        offset = E.get("rss_offset", 0)
        xs = [f["flops"] / 1e9 for f in front]
        ys = [(f["peak"] + offset) / MiB for f in front]
        axes[0].step(
            xs,
            ys,
            where="post",
            color="tab:red",
            alpha=0.45,
            lw=1.2,
            label="remat frontier (predicted, + process offset)",
        )
    for fam, items in _points(E, C).items():
        _scatter(axes, fam, items)
    _decorate(axes, m, configs_by_key(E)["none"]["rss_peak"] / MiB)
    fig.suptitle(f"{TITLES.get(m, m)} — {E.get('describe', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _points(E: dict, C: dict | None) -> dict[str, list]:
    """family -> [(extra GFLOP, time ratio, process peak MiB, label)] of every measured strategy."""
    pts: dict[str, list] = {}
    for c in E["configs"]:
        if c.get("rss_peak") is None:
            continue
        pts.setdefault(c["family"], []).append(
            (c.get("extra_flops", 0) / 1e9, c.get("time_ratio"), c["rss_peak"] / MiB, c["label"])
        )
    for r in (C or {}).get("budgets", []):
        if "rss_peak" in r:
            pts.setdefault("compile", []).append(
                (r["extra_flops"] / 1e9, r.get("time_ratio"), r["rss_peak"] / MiB, f"{r['budget']:g}")
            )
    for r in (C or {}).get("remat_compiled", []):
        if "rss_peak" in r:
            pts.setdefault("remat_compiled", []).append(
                (r["extra_flops"] / 1e9, r.get("time_ratio"), r["rss_peak"] / MiB, r["plan"])
            )
    return pts


def _scatter(axes, fam: str, items: list) -> None:
    color, marker, lab = STYLE.get(fam, ("gray", "o", fam))
    size = 140 if fam == "remat" else 55
    axes[0].scatter(
        [i[0] for i in items],
        [i[2] for i in items],
        c=color,
        marker=marker,
        s=size,
        label=lab,
        edgecolors="k",
        linewidths=0.4,
        zorder=3,
    )
    tt = [(i[1], i[2]) for i in items if i[1] is not None]
    axes[1].scatter(
        [t[0] for t in tt], [t[1] for t in tt], c=color, marker=marker, s=size, edgecolors="k", linewidths=0.4, zorder=3
    )
    if fam == "compile":
        for i in items:
            axes[0].annotate(i[3], (i[0], i[2]), fontsize=7, xytext=(3, 3), textcoords="offset points")
            if i[1] is not None:
                axes[1].annotate(i[3], (i[1], i[2]), fontsize=7, xytext=(3, 3), textcoords="offset points")


def _decorate(axes, m: str, none_mib: float) -> None:
    axes[0].axhline(none_mib, color="gray", lw=0.6, ls=":")
    axes[1].axhline(none_mib, color="gray", lw=0.6, ls=":")
    axes[1].axvline(1.0, color="gray", lw=0.6, ls=":")
    axes[0].set_xlabel("extra GFLOP per step (FlopCounterMode; compile: its graphs)")
    axes[1].set_xlabel("step time / no checkpointing (median of interleaved rounds)")
    axes[0].set_ylabel("measured peak, MiB (process RSS method)")
    axes[0].set_title(f"{m}: peak vs recomputation", fontsize=10)
    axes[1].set_title(f"{m}: peak vs step time", fontsize=10)
    axes[0].legend(fontsize=7, loc="best", framealpha=0.8)
    for ax in axes:
        ax.grid(alpha=0.3)
