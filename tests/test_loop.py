"""The training loop around the measured step (NOTE [The step that is measured]): the user's model and
optimizer untouched, bad loop arguments refused, and `remat.verify` judged by the process's counter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import remat
from remat.measure.loop import first_step_note


def _mlp(width: int = 256, depth: int = 4, batch: int = 512):
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    return nn.Sequential(*blocks), torch.randn(batch, width)


def _stepped_adam(model, x):
    """A live optimizer that has already stepped, as a user's is mid-training."""
    opt = torch.optim.Adam(model.parameters())
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    return opt


def _state(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    moments = [
        (k, v.clone()) for st in opt.state.values() for k, v in sorted(st.items()) if isinstance(v, torch.Tensor)
    ]
    return params, moments, torch.get_rng_state()


def _same(a, b) -> bool:
    params = all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    moments = all(k1 == k2 and torch.equal(v1, v2) for (k1, v1), (k2, v2) in zip(a[1], b[1]))
    return params and moments and torch.equal(a[2], b[2]) and len(a[1]) == len(b[1])


@pytest.mark.parametrize("mode", ["real", "fake"])
@pytest.mark.parametrize("step", ["steady", "first"])
def test_a_live_optimizer_that_has_stepped_profiles_and_is_left_as_it_was(mode, step):
    model, x = _mlp()
    opt = _stepped_adam(model, x)
    before = _state(model, opt)
    prof = remat.profile(model, x, optimizer=opt, mode=mode, step=step)
    assert _same(before, _state(model, opt))
    assert all(p.grad is None for p in model.parameters())
    # its moments (2 x the parameters) and float32 step counters exist before the step either way: resident at the peak
    assert prof.at_peak.optimizer_bytes == 2 * prof.param_bytes + 4 * len(list(model.parameters()))


def test_fake_and_real_steady_steps_agree_to_the_byte_on_cpu():
    model, x = _mlp()
    real = remat.profile(model, x, optimizer=torch.optim.Adam)
    fake = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake")
    assert fake.peak_bytes == real.peak_bytes
    assert fake.first_step_peak_bytes == real.first_step_peak_bytes


def test_a_simulated_cuda_step_runs_adams_multi_tensor_kernels():
    model, x = _mlp()
    prof = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake", device="cuda")
    assert any("foreach" in n for n in prof.notes)
    mine = torch.optim.Adam(model.parameters())
    remat.profile(model, x, optimizer=mine, mode="fake", device="cuda")
    assert mine.param_groups[0]["foreach"] is None  # the user's optimizer keeps its own setting


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"accumulate": 0}, "accumulate must be a whole number of micro-batches per optimizer step, 1 or more; saw 0"),
        ({"accumulate": 1.5}, "saw 1.5"),
        ({"step": "third"}, "step must be 'steady'"),
        ({"keep_output": "logits"}, "keep_output must be True (your loop keeps the model's output until after"),
        ({"optimizer": lambda ps: 1 / 0}, "the optimizer factory raised ZeroDivisionError: division by zero"),
        ({"optimizer": torch.optim.Adam(nn.Linear(2, 2).parameters())}, "2 of the 2 tensors it holds are not"),
    ],
)
def test_bad_loop_arguments_get_a_remat_error_and_leave_everything_as_it_was(kwargs, words):
    model, x = _mlp()
    opt = _stepped_adam(model, x)
    before = _state(model, opt)
    with pytest.raises(remat.RematError) as info:
        remat.profile(model, x, **kwargs)
    message = str(info.value)
    assert message.startswith("remat: ") and words in message and "Fix:" in message, message
    assert _same(before, _state(model, opt))


def test_verify_reports_the_process_counter_and_fails_a_step_over_its_budget():
    model, x = _mlp(width=1024, depth=8, batch=4096)  # a step of ~250 MiB: the process counter resolves it
    prof = remat.profile(model, x, optimizer=torch.optim.Adam)
    plan = remat.plan(prof, 0.9)  # Adam's state is over half of this step: the least plan is ~83%
    report = remat.verify(model, x, plan, optimizer=torch.optim.Adam)
    assert report.independent_counter == "process's high-water mark" and report.independent_judged
    assert abs(report.independent_peak_bytes - report.measured_peak_bytes) <= 0.03 * report.independent_peak_bytes
    assert report.ok, str(report)
    assert "peak by the process's high-water mark" in str(report)
    squeezed = dataclasses.replace(report, budget_bytes=int(report.independent_peak_bytes * 0.9))
    assert not squeezed.fits_budget and not squeezed.ok
    apart = dataclasses.replace(report, independent_peak_bytes=int(report.measured_peak_bytes * 1.05))
    assert not apart.counters_agree and not apart.ok


def test_the_profile_says_when_the_first_step_is_the_larger():
    assert first_step_note(None, 10) == [] and first_step_note(9, 10) == []
    (note,) = first_step_note(12, 10)
    assert "first step peaks higher than the steady state measured here: 12 vs 10 bytes" in note
    assert "step='first'" in note and "--first-step" in note
