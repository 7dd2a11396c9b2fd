"""remat's figures held against a counter that is not remat's own: the process's high-water mark.

MEASURING.md: the process figure is the step's real peak plus a few MB of interpreter
and autograd overhead, so remat's tracked peak sits a little under it.  These tests hold
the first step of a fresh Adam, as `remat.profile` measures it; the steady state from the
second step on is issue 12's.
"""

from __future__ import annotations

import torch

import remat
from process_targets import chain

TOLERANCE = 0.03
"""The issue-12 target: prediction within 3% of the process."""
PLANNED_GAP = 0.10
"""Seen 2026-11-23 on this chain planned at 50%: predicted 82.6 MB, the process 89.7 MB (+7.9%);
the tracker itself agrees with the prediction to the byte (`remat.verify`), so the gap is memory the
tracker does not see in a checkpointed step.  Issue 12 closes it to TOLERANCE; until then this bound
keeps it from growing."""


def _adam(params):
    return torch.optim.Adam(params)


def test_the_tracked_peak_is_the_process_peak_unplanned(process_peak):
    model, x = chain()
    tracked = remat.profile(model, x, optimizer=_adam).peak_bytes
    measured = process_peak("chain")
    assert abs(measured - tracked) <= TOLERANCE * measured, (tracked, measured)


def test_a_planned_step_peaks_near_where_remat_predicted_by_the_process(process_peak, tmp_path):
    model, x = chain()
    prof = remat.profile(model, x, optimizer=_adam)
    plan = remat.plan(prof, 0.5)
    plan.save(tmp_path / "plan.json")
    measured = process_peak("chain", tmp_path / "plan.json")
    unplanned = process_peak("chain")
    assert measured < unplanned - (prof.peak_bytes - plan.peak_bytes) // 2  # the plan does lower the real peak
    assert plan.peak_bytes <= measured <= (1 + PLANNED_GAP) * plan.peak_bytes, (plan.peak_bytes, measured)
