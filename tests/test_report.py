"""Reports of a StepProfile: the text report (golden file) and the timeline plot."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from remat.report.plot import MAX_POINTS, plot_timeline
from remat.report.text import fmt_bytes, render_profile, summarize_profile, top_blocks
from remat.types import BlockProfile, Breakdown, StepProfile, Timeline

GOLDEN = Path(__file__).parent / "golden"
MiB = 2**20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _block(name: str, index: int, saved_mib: float, **kw) -> BlockProfile:
    fields = dict(
        name=name,
        type="Block",
        index=index,
        depth=0,
        parent=None,
        calls=1,
        saved_bytes=int(saved_mib * MiB),
        output_bytes=2 * MiB,
        output_saved_bytes=2 * MiB,
        input_bytes=2 * MiB,
        internal_bytes=int(saved_mib * MiB) - 2 * MiB,
        output_kept_by=[name],
        input_unsaved_bytes=0,
        forward_flops=1_500_000_000,
        backward_flops=3_000_000_000,
        recompute_flops=0,
        checkpoint_recompute_flops=1_500_000_000,
        forward_s=0.0125,
        backward_s=0.025,
        selective_free_bytes=int(saved_mib * MiB) // 2,
        selective_extra_bytes=0,
        selective_recompute_flops=0,
        selective_recompute_s=0.001,
        peak_bytes=100 * MiB,
        forward_start_op=index,
        forward_end_op=index + 1,
        backward_start_op=8 - index,
        backward_end_op=9 - index,
        checkpointed=False,
    )
    fields.update(kw)
    return BlockProfile(**fields)


def tiny_profile(**changes) -> StepProfile:
    """A small hand-made profile: 3 blocks, 12 ops, one note; every number chosen to be readable."""
    live_mib = [10, 20, 30, 40, 42, 60, 55, 45, 30, 34, 34, 34]
    phases = ["forward"] * 4 + ["loss"] + ["backward"] * 4 + ["optimizer"] * 3
    timeline = Timeline(
        live_bytes=[m * MiB for m in live_mib],
        phases=phases,
        modules=[1, 1, 2, 3, 0, 0, 3, 2, 1, 0, 0, 0],
        module_names=["", "blocks.0", "blocks.1", "blocks.2.attention.very_long_submodule_name"],
    )
    at_peak = Breakdown(
        params_bytes=8 * MiB,
        inputs_bytes=1 * MiB,
        grads_bytes=4 * MiB,
        activations_bytes=35 * MiB,
        temporaries_bytes=12 * MiB,
    )
    end_fwd = Breakdown(
        params_bytes=8 * MiB, inputs_bytes=1 * MiB, activations_bytes=30 * MiB, temporaries_bytes=3 * MiB
    )
    blocks = [
        _block("blocks.0", 0, 10.0),
        _block("blocks.1", 1, 15.5, checkpointed=True, checkpoint_kind="recomputed", recompute_flops=1_500_000_000),
        _block(
            "blocks.2.attention.very_long_submodule_name",
            2,
            4.25,
            type="VeryLongAttentionModuleName",
            depth=1,
            parent="blocks.2",
            forward_s=0.0,
            backward_s=0.0,
        ),
    ]
    profile = StepProfile(
        model="TinyNet",
        mode="real",
        device="cpu",
        peak_bytes=60 * MiB,
        peak_phase="backward",
        peak_module="",
        peak_op="mm",
        param_bytes=8 * MiB,
        buffer_bytes=0,
        input_bytes=1 * MiB,
        grad_bytes=8 * MiB,
        optimizer_bytes=16 * MiB,
        activation_bytes=30 * MiB,
        at_peak=at_peak,
        end_of_forward=end_fwd,
        forward_flops=4_500_000_000,
        backward_flops=9_000_000_000,
        recompute_flops=1_500_000_000,
        step_s=0.25,
        blocks=blocks,
        timeline=timeline,
        torch_version="2.x",
        notes=[
            "a note the measurement left for the reader; long enough that the report has to wrap it onto "
            "a second line, which must stay indented under its bullet."
        ],
    )
    return dataclasses.replace(profile, **changes)


# -- text ------------------------------------------------------------------------------------


def test_render_profile_matches_golden():
    text = render_profile(tiny_profile())
    golden = GOLDEN / "profile_report.txt"
    if os.environ.get("REMAT_REGEN_GOLDEN") == "1":
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), (
        "report changed; review it and regenerate with REMAT_REGEN_GOLDEN=1"
    )


def test_str_of_a_profile_is_the_report():
    prof = tiny_profile()
    assert str(prof) == render_profile(prof)


def test_report_lines_fit_the_width():
    assert max(len(line) for line in render_profile(tiny_profile()).splitlines()) <= 100


def test_top_limits_the_block_table():
    one = render_profile(tiny_profile(), top=1)
    assert "Top 1 of 3 candidate blocks" in one
    assert "blocks.1" in one and "blocks.0 " not in one  # blocks.1 saves the most
    assert "candidate blocks" not in render_profile(tiny_profile(), top=0)


def test_top_blocks_orders_by_saved_bytes_then_execution_order():
    blocks = [_block("a", 0, 1.0), _block("b", 1, 2.0), _block("c", 2, 2.0)]
    assert [b.name for b in top_blocks(blocks, 2)] == ["b", "c"]


def test_fake_simulated_profile_says_so_and_shows_no_times():
    zero = [dataclasses.replace(b, forward_s=0.0, backward_s=0.0) for b in tiny_profile().blocks]
    text = render_profile(
        tiny_profile(
            mode="fake", device="cuda", simulated_device=True, step_s=0.0, allocation_rounding_bytes=512, blocks=zero
        )
    )
    assert "fake mode on cuda (simulated on CPU), storages rounded up to 512 B" in text
    assert "step " not in text.splitlines()[4]
    assert "12.5" not in text  # block times are not shown when not measured


def test_header_has_peak_in_mib_and_bytes():
    text = render_profile(tiny_profile())
    assert "peak 60.0 MiB (62,914,560 bytes) in backward" in text
    assert "at op mm in module <TinyNet>" in text


@pytest.mark.parametrize(
    "n, unit, expected",
    [
        (0, "MiB", "0.0 MiB"),
        (16384, "MiB", "<0.1 MiB"),
        (656891912, "MiB", "626.5 MiB"),
        (3 * 2**30, "auto", "3.0 GiB"),
        (512, "auto", "512 B"),
        (1536, "auto", "1.5 KiB"),
    ],
)
def test_fmt_bytes(n, unit, expected):
    assert fmt_bytes(n, unit) == expected


def test_summary_names_what_dominates_the_activations_and_the_biggest_block():
    text = " ".join(summarize_profile(tiny_profile()).split())
    assert "peaks at 60.0 MiB in backward" in text
    assert "activations (saved for backward), 35.0 MiB" in text
    assert "31,457,280 bytes" in text
    assert "blocks.1 (Block), 15.5 MiB" in text


# -- plot ------------------------------------------------------------------------------------


def test_plot_timeline_writes_a_png_and_nothing_else(tmp_path):
    path = tmp_path / "timeline.png"
    plot_timeline(tiny_profile(), path)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    assert list(tmp_path.iterdir()) == [path]
    assert plt.get_fignums() == []


def test_plot_timeline_of_a_long_step(tmp_path):
    n = 3 * MAX_POINTS + 7
    prof = tiny_profile(timeline=Timeline([i % 1000 * MiB for i in range(n)], ["forward"] * n, [0] * n, [""]))
    plot_timeline(prof, tmp_path / "long.png")
    assert (tmp_path / "long.png").read_bytes().startswith(PNG_SIGNATURE)
    assert plt.get_fignums() == []


# -- the frontier of plans ---------------------------------------------------------------------


def _plan(peak_mib: float, gflop: float, segments: int = 0, seconds: float = 0.0, solver: str = "dp", **kw):
    from remat.types import Plan

    return Plan(
        model="TinyNet",
        solver=solver,
        decisions={},
        segments=[[f"b{i}"] for i in range(segments)],
        peak_bytes=int(peak_mib * MiB),
        recompute_flops=int(gflop * 1e9),
        recompute_s=seconds,
        unplanned_peak_bytes=100 * MiB,
        budget_bytes=None,
        blocks=[],
        step_flops=int(30e9),
        **kw,
    )


def _frontier(seconds: bool = False):
    t = (lambda s: s) if seconds else (lambda s: 0.0)
    return [
        _plan(100, 0, 0, t(0.0), solver="keep"),
        _plan(70, 1, 1, t(0.1)),
        _plan(55, 2.5, 2, t(0.25)),
        _plan(40, 6, 3, t(0.6), selective=["b9"]),
    ]


def _recipes():
    out = {f"checkpoint_sequential({k})": _plan(60 - k, 2 + k, k - 1) for k in range(2, 6)}
    out["checkpoint_sequential(6)"] = _plan(56, 6, 5)  # same point as k=4: one label "k=4,6"
    return {**out, "every-block": _plan(38, 7, 4), "chen": _plan(45, 6.5, 2)}


@pytest.mark.parametrize("seconds", [False, True], ids=["fake profile", "with predicted seconds"])
def test_plot_frontier_writes_a_png_and_nothing_else(tmp_path, seconds):
    from remat.report.plot import plot_frontier

    path = tmp_path / "frontier.png"
    plot_frontier(_frontier(seconds), path, budget_bytes=50 * MiB, baselines=_recipes())
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert list(tmp_path.iterdir()) == [path]
    assert plt.get_fignums() == []


def test_plot_frontier_marks_budget_and_recipes():
    from remat.report.plot import _frontier_figure

    fig = _frontier_figure(_frontier(seconds=True), 50 * MiB, _recipes())
    assert len(fig.axes) >= 2  # a second panel with predicted seconds
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "remat frontier",
        "checkpoint_sequential(k), k labelled",
        "checkpoint every block",
        "Chen et al. sqrt(n) segments",
        "budget 50.0 MiB",
    ]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["k=2", "k=3", "k=4,6", "k=5"]
    budget = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert budget and budget[0].get_ydata()[0] == 50.0


def test_render_frontier_table():
    from remat.report.frontier_text import render_frontier

    text = render_frontier(_frontier(seconds=True), budget_bytes=60 * MiB)
    lines = text.splitlines()
    assert " ".join(text.split()).startswith(
        "remat frontier for TinyNet: 4 plans from keep-everything (100.0 MiB) down to the least memory (40.0 MiB)"
    )
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [r[1] for r in rows] == ["100.0", "70.0", "55.0", "40.0"]
    assert rows[2][3:] == ["2.50", "8.3%", "0", "0.250", "2", "0", "cheapest"]  # ops re-run: 0 here
    assert rows[3][-3:] == ["3", "1", "yes"] and rows[0][-1] == "no"
    assert all(line == line.rstrip() for line in lines)
    assert "fits" not in render_frontier(_frontier())


def test_a_compiled_steps_budget_is_judged_only_by_the_counter_of_the_compiled_step():
    """Of a compiled model the tracker measures the eager step, which a plan chosen for the compiled step may be over
    by design: the budget is judged by the independent counter alone, and not at all on a step too small for it
    (the row says so instead of MISMATCH)."""
    from remat.types.verification import VerifyReport

    mib = 1 << 20
    small = VerifyReport(
        grad_max_abs_diff={"w": 0.0},
        tolerance=0.0,
        buffers_equal=True,
        unplanned_peak_bytes=3 * mib,
        measured_peak_bytes=2 * mib,  # tracked: the eager step, over the budget
        predicted_peak_bytes=2 * mib,
        measured_recompute_flops=7,
        predicted_recompute_flops=7,
        budget_bytes=3 * mib // 2,
        independent_peak_bytes=mib,
        independent_counter="process's high-water mark (compiled)",
        compiled=True,
    )
    assert not small.budget_judged and small.fits_budget and small.ok
    row = next(line for line in str(small).splitlines() if line.strip().startswith("budget"))
    assert row.rstrip().endswith("too small to judge"), row
    unmeasured = dataclasses.replace(small, independent_peak_bytes=None)  # no counter of the compiled step here
    row = next(line for line in str(unmeasured).splitlines() if line.strip().startswith("budget"))
    assert row.rstrip().endswith("compiled step not measured") and unmeasured.fits_budget, row
    eager = dataclasses.replace(small, compiled=False)  # the tracker measures the step that runs: judged, over
    assert eager.budget_judged and not eager.fits_budget and not eager.ok
    large = dataclasses.replace(
        small, measured_peak_bytes=200 * mib, predicted_peak_bytes=200 * mib, budget_bytes=150 * mib
    )
    assert dataclasses.replace(large, independent_peak_bytes=140 * mib).fits_budget  # the compiled step fits
    assert not dataclasses.replace(large, independent_peak_bytes=160 * mib).fits_budget  # over 150 MiB + 1%
