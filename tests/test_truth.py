"""remat's figures held against a counter that is not remat's own: the process's high-water mark.

Each case runs the user's loop (one Adam kept across steps, `zero_grad()` between them) in a
fresh interpreter and measures its third step by the process (NOTE [Measuring a step by the
process]); remat's prediction of that step must be within TOLERANCE of it, unplanned and planned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import process_targets
import remat
from remat.measure import scratch
from remat.procmem import PROCESS_ENV

TOLERANCE = 0.03
"""Issue 12: the prediction within 3% of the process on CPU."""
BUDGET_SLACK = 0.01
"""Issue 12: the planned step in the user's loop within its budget + 1%."""

CASES = {
    # name: budget of the planned case (a fraction of the unplanned peak, above the least plan)
    "chain": 0.5,  # report 001's chain: activations dominate
    "gpt2": 0.7,  # `remat demo`'s GPT-2: attention, tied weights, Adam state of 2 x 81 MiB / 4
    "convnet": 0.75,  # ConvBNNet at 64x64: convolution scratch (NOTE [Kernel scratch]) and BatchNorm
    "attention": 0.6,  # hand-written attention blocks (SDPA, causal), not Hugging Face
}


def _adam(params):
    return torch.optim.Adam(params)


def _target(name: str):
    built = getattr(process_targets, name)()
    return built[0], built[1], (built[2] if len(built) > 2 else None)


def _planned_profile(model, inputs, loss_fn, plan):
    """The untimed profile of the step with `plan` applied; the model is left unplanned."""
    remat.apply(model, plan)
    try:
        return remat.profile(model, inputs, loss_fn, optimizer=_adam, timed=False)
    finally:
        remat.remove(model)


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_steady_step_is_predicted_unplanned_and_planned(name, process_peak, tmp_path, monkeypatch):
    """Each case profiled as a fresh process would: with no kernel scratch an earlier test in this worker measured
    (NOTE [Kernel scratch], Rule 5).  In CI's full run of 2026-12-03 the chain's least plan came out 24,644 bytes
    above the case's budget of half its peak; alone it passes.  Scratch taken from an earlier test is the likely
    cause (it was for test_what_a_checkpoint_frees), not proven here."""
    monkeypatch.setattr(scratch, "MEASURED", {})
    model, inputs, loss_fn = _target(name)
    prof = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    measured = process_peak(name)
    assert _close(prof.peak_bytes, measured), (prof.peak_bytes, measured)
    plan = remat.plan(prof, CASES[name])
    plan.save(tmp_path / "plan.json")
    planned = process_peak(name, tmp_path / "plan.json")
    assert _close(plan.peak_bytes, planned), (plan.peak_bytes, planned)
    assert planned <= (1 + BUDGET_SLACK) * plan.budget_bytes, (planned, plan.budget_bytes)
    assert planned < 0.9 * measured  # the plan does lower the real peak


def test_the_steady_step_holds_the_optimizer_state_the_first_step_does_not(process_peak):
    model, inputs, loss_fn = _target("chain")
    steady = remat.profile(model, inputs, optimizer=_adam)
    first = remat.profile(model, inputs, optimizer=_adam, step="first")
    assert _close(first.peak_bytes, process_peak("chain", step="first")), first.peak_bytes
    # from the second step on, Adam's two moments (2 x the parameters) and its float32 step counters
    # (one per parameter) are resident through backward
    counters = 4 * len(list(model.parameters()))
    assert steady.at_peak.optimizer_bytes == 2 * steady.param_bytes + counters
    assert first.at_peak.optimizer_bytes < steady.at_peak.optimizer_bytes
    assert steady.peak_bytes > first.peak_bytes
    assert steady.first_step_peak_bytes == first.peak_bytes
    assert first.step == "first" and any("first step of the optimizer" in n for n in first.notes)


def test_gradient_accumulation_is_predicted(process_peak):
    model, inputs, _ = _target("chain")
    once = remat.profile(model, inputs, optimizer=_adam)
    twice = remat.profile(model, inputs, optimizer=_adam, accumulate=2)
    measured = process_peak("chain", accumulate=2)
    assert _close(twice.peak_bytes, measured), (twice.peak_bytes, measured)
    # the second pass starts with every gradient resident
    assert twice.peak_bytes - once.peak_bytes >= twice.grad_bytes // 2
    assert twice.accumulate == 2


def test_fake_mode_predicts_the_steady_conv_step_with_its_scratch(process_peak):
    model, inputs, loss_fn = _target("convnet")
    real = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    fake = remat.profile(model, inputs, loss_fn, optimizer=_adam, mode="fake")
    measured = process_peak("convnet")
    assert _close(fake.peak_bytes, measured), (fake.peak_bytes, measured)
    assert real.at_peak.scratch_bytes > 0 and fake.at_peak.scratch_bytes > 0


def test_kernel_scratch_is_measured_once_and_the_same_on_the_next_profile(monkeypatch):
    """NOTE [Kernel scratch], Rules 4-5: a second profile of the same step takes each op's scratch from the
    first one's measurement (no second copy of the process), so it gives the same timeline to the byte."""
    from remat.measure import scratch

    model, inputs, loss_fn = _target("convnet")
    first = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    assert first.at_peak.scratch_bytes > 0 and first.at_peak.scratch_bytes % scratch.SCRATCH_GRAIN == 0

    def no_copy(*args, **kwargs):
        raise AssertionError("a second copy of the process was forked")

    monkeypatch.setattr(scratch, "measure_scratch", no_copy)
    again = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    assert again.timeline.live_bytes == first.timeline.live_bytes and again.peak_bytes == first.peak_bytes


def test_the_planned_step_takes_its_scratch_from_the_unplanned_ones_measurement(monkeypatch):
    """A plan re-runs the same kernels, plus a checkpoint's views (`detach`), which need no measurement: verify's
    planned step forked a second copy of the process for them (2-3 s of `remat demo`)."""
    from remat.measure import scratch

    model, inputs, loss_fn = _target("attention")
    first = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    plan = remat.plan(first, CASES["attention"])
    monkeypatch.setattr(scratch, "measure_scratch", lambda *a, **k: pytest.fail("a second copy was forked"))
    planned = _planned_profile(model, inputs, loss_fn, plan)
    assert planned.peak_bytes <= plan.peak_bytes


def test_a_plan_too_small_to_be_measured_takes_the_scratch_its_unplanned_step_measured(monkeypatch):
    """NOTE [Kernel scratch], Rule 5: a plan's step under MEASURED_FROM_BYTES is not measured; its kernels, the
    unplanned step's, take the scratch measured for them, not the shipped estimate (Rule 3).  A U-Net's plan was
    read by `remat.verify` at +4.3% over its prediction: 4.5 MB estimated where 2 MB was measured."""
    from remat.measure import scratch

    monkeypatch.setattr(scratch, "MEASURED", {})
    model, inputs, loss_fn = _target("convnet")
    first = remat.profile(model, inputs, loss_fn, optimizer=_adam, timed=False)
    plan = remat.plan(first, CASES["convnet"])
    monkeypatch.setattr(scratch, "MEASURED_FROM_BYTES", first.peak_bytes + 1)  # the plan's step is now too small
    monkeypatch.setattr(scratch, "measure_scratch", lambda *a, **k: pytest.fail("the plan's step was measured"))
    planned = _planned_profile(model, inputs, loss_fn, plan)
    assert planned.at_peak.scratch_bytes % scratch.SCRATCH_GRAIN == 0, planned.at_peak  # measured, not estimated
    assert planned.peak_bytes == plan.peak_bytes, (planned.peak_bytes, plan.peak_bytes)


def test_a_view_op_needs_no_scratch_measurement(monkeypatch):
    from remat.measure import scratch

    monkeypatch.setattr(scratch, "MEASURED", {})
    t = torch.ones(4, 4)
    detach = scratch.signature(torch.ops.aten.detach.default, (t,), {})
    mm = scratch.signature(torch.ops.aten.mm.default, (t, t), {})
    assert detach == ("detach", scratch.NO_KERNEL) and mm[0] == "mm" and len(mm) == 3
    assert scratch.known([detach]) == [0] and scratch.known([detach, mm]) is None


def _measured_in_a_copy(model, inputs, loss_fn) -> None:
    """NOTE [Kernel scratch], Rule 2 for a step of any size: each op's scratch, measured in a copy of this process."""
    with pytest.MonkeyPatch.context() as small:
        small.setattr(scratch, "MEASURED_FROM_BYTES", 0)
        remat.profile(model, inputs, loss_fn, optimizer=_adam, timed=False)


def test_a_rise_of_the_mark_while_a_view_runs_is_not_taken_as_its_scratch(monkeypatch):
    """NOTE [Kernel scratch], Rule 4: a view is never measured.  Here the mark reads 2 MiB above the resident set
    throughout the copy that measures: each kernel takes the 2 MiB, each view nothing.  A `t` measured at 1 MiB in
    one test of a full run gave every later step's `t` that 1 MiB: the LoRA Mistral of tests/test_rerun_moment.py,
    profiled next, read 2,188,640 bytes for its plan over layer 0 where its step takes 1,303,904."""
    from remat import procmem

    monkeypatch.setattr(scratch, "MEASURED", {})
    monkeypatch.setattr(procmem, "high_water_mark_bytes", lambda: procmem.resident_bytes() + (2 << 20))
    monkeypatch.setattr(procmem, "reset_high_water_mark", lambda: None)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    _measured_in_a_copy(mlp, torch.randn(32, 64), lambda out: out.square().mean())
    views = {sig: b for sig, b in scratch.MEASURED.items() if scratch.is_view(sig)}
    kernels = {sig: b for sig, b in scratch.MEASURED.items() if not scratch.is_view(sig)}
    assert ("t", scratch.NO_KERNEL) in views and set(views.values()) == {0}, views
    assert set(kernels.values()) == {2 << 20}, kernels  # the copy saw the rise


KEPT: list[bytes] = []
"""What `remat_tests::keeps_2mib` keeps, as a library keeps a cache."""


@torch.library.custom_op("remat_tests::keeps_2mib", mutates_args=())
def _keeps_2mib(x: torch.Tensor) -> torch.Tensor:
    KEPT.append(b"k" * (2 << 20))  # written, so resident, and still so after the op
    return x * 2


@torch.library.custom_op("remat_tests::takes_2mib", mutates_args=())
def _takes_2mib(x: torch.Tensor) -> torch.Tensor:
    work = b"t" * (2 << 20)  # resident while the op runs, given back before it returns
    return x * (len(work) > 0)


_keeps_2mib.register_autograd(lambda ctx, grad: grad * 2)
_takes_2mib.register_autograd(lambda ctx, grad: grad)


class KeepsAndTakes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        return _takes_2mib(_keeps_2mib(self.linear(x)))


def test_memory_an_op_keeps_is_not_its_scratch_and_memory_it_gives_back_is(monkeypatch):
    """NOTE [Kernel scratch], Rule 2: an op's scratch is the rise of the mark it gave back before returning.
    Memory it keeps (a cache, the heap's growth) would be taken by every later op of its signature in the process,
    small ones that every model runs too (backward's `ones_like`, the optimizer's step count's `add_`): seen once
    as a 3 MiB `addmm`."""
    monkeypatch.setattr(scratch, "MEASURED", {})
    try:
        _measured_in_a_copy(KeepsAndTakes(), torch.randn(32, 64), lambda out: out.square().mean())
    finally:
        KEPT.clear()  # the steps this process ran kept theirs too
    by_op = {sig[0]: b for sig, b in scratch.MEASURED.items() if "2mib" in sig[0]}
    assert by_op == {"keeps_2mib": 0, "takes_2mib": 2 << 20}, by_op


def test_scratch_measured_on_ops_the_tracked_step_did_not_run_is_reported_not_placed(monkeypatch):
    from remat.measure import scratch

    monkeypatch.setattr(scratch, "MEASURED", {})
    conv, detach, other = ("convolution", 1), ("detach", 2), ("reorder", 3)
    placed, lost = scratch.placed([conv, detach, conv], ([conv, other, conv], [3 << 20, 5 << 20, 4 << 20]))
    assert placed == [4 << 20, 0, 4 << 20] and lost == 5 << 20  # one figure per signature: the most measured
    assert scratch.known([conv, detach]) == [4 << 20, 0] and scratch.known([other, ("mm", 1)]) is None


def test_a_loop_that_keeps_only_the_loss_is_predicted_and_holds_less(process_peak):
    """NOTE [The step that is measured], Rule 6: Hugging Face's Trainer keeps only the loss; a plain loop keeps
    the output (GPT-2's logits) through backward.  Both loops, by remat and by the process, in real and fake mode."""
    model, inputs, loss_fn = _target("gpt2")
    held = remat.profile(model, inputs, loss_fn, optimizer=_adam)
    loss_only = remat.profile(model, inputs, loss_fn, optimizer=_adam, keep_output=False)
    fake = remat.profile(model, inputs, loss_fn, optimizer=_adam, mode="fake", keep_output=False)
    measured_held, measured_loss = process_peak("gpt2"), process_peak("gpt2", keep_output=False)
    assert _close(held.peak_bytes, measured_held), (held.peak_bytes, measured_held)
    assert _close(loss_only.peak_bytes, measured_loss), (loss_only.peak_bytes, measured_loss)
    assert fake.peak_bytes == loss_only.peak_bytes
    with torch.no_grad():
        logits_bytes = model(**inputs).logits.untyped_storage().nbytes()
    assert held.peak_bytes - loss_only.peak_bytes == logits_bytes  # the logits, let go before backward
    assert measured_held - measured_loss > 0.9 * logits_bytes
    assert (held.keep_output, loss_only.keep_output) == (True, False)
    assert "only the loss kept" in str(loss_only) and "output kept until after backward" in str(held)


HEAP_POLLUTED = """
import ctypes, json, torch, torch.nn as nn
from remat.measure.loop import Loop
from remat.verifier.process import forked_peak_bytes
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
x = torch.randn(512, 1024)
loop = Loop.of("steady", 1, True)
peaks = [forked_peak_bytes(model, x, None, torch.optim.Adam, loop).peak_bytes]
ctypes.CDLL(None).mallopt(-3, 32 << 20)  # as glibc's threshold rises in a long-running process
model(x).sum().backward()  # these 4 MiB gradients now live on the heap; the copy's zero_grad frees them there
peaks += [forked_peak_bytes(model, x, None, torch.optim.Adam, loop).peak_bytes for _ in range(3)]
print(json.dumps(peaks))
"""


def test_the_forked_copy_counts_the_same_step_when_its_parent_left_tensors_on_the_heap():
    # CI once saw the process 20 MiB under the tracker on a 245 MiB step: tensors the parent had put on its heap,
    # freed in the copy, served the measured step from resident memory (NOTE [Measuring a step by the process]).
    # In a subprocess: the heap settings changed here must not reach the other tests.
    done = subprocess.run([sys.executable, "-c", HEAP_POLLUTED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    clean, *polluted = json.loads(done.stdout.strip().splitlines()[-1])
    for peak in polluted:  # before the fix: 4.2 MiB under or 2.1 MiB over, of 76 MiB
        assert abs(peak - clean) <= 0.005 * clean, (clean, polluted)


def test_dropouts_mask_is_counted_where_it_is_made_not_as_bernoullis_scratch(monkeypatch):
    """NOTE [Kernel scratch], Rule 6: `empty_like` leaves its mask's pages uncommitted and `bernoulli_` writes them;
    measured by the mark alone, that was 1.0x the mask as `bernoulli_`'s scratch, on top of the mask itself (the
    Encoder's recomputed dropout: tracked 4 MiB over the allocator's own events)."""
    from remat.measure import scratch
    from remat.measure.loop import Loop
    from remat.measure.step import normalize_inputs

    monkeypatch.setattr(scratch, "MEASURED", {})
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Dropout(0.1))
    x = torch.randn(8192, 512)  # the mask: 16 MiB
    ops, measured = scratch.measure_scratch(model, normalize_inputs(x), None, None, Loop())
    by_op = {}
    for sig, b in zip(ops, measured):
        by_op[sig[0]] = max(by_op.get(sig[0], 0), b)
    assert "bernoulli_" in by_op and "empty_like" in by_op, sorted(by_op)
    assert by_op["bernoulli_"] == 0 and by_op["empty_like"] == 0, by_op
    assert ("cpu", "bernoulli_") not in scratch.SCRATCH_MODELS  # the shipped estimate, fitted the same way


FORKED_FAILS = """
from remat.procmem import CopyFailed, in_forked_copy
try:
    in_forked_copy(lambda: {"not json": object()})
except CopyFailed as e:
    print("parent:", e)
"""


def test_a_forked_copy_that_cannot_report_says_why_and_never_goes_on_as_its_parent():
    """The copy reports through a pipe and leaves; its report failing (a result that is not JSON, or a parent
    killed while it ran, which closes the pipe) once let the copy unwind into its parent's code and run on as a second
    parent.  In a subprocess, so such a copy could not run on as this test session."""
    done = subprocess.run([sys.executable, "-c", FORKED_FAILS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["parent: TypeError: Object of type object is not JSON serializable"], (
        done.stdout + done.stderr[-2000:]
    )


HEAP_REUSE = """
import torch
from remat.procmem import release_free_heap, resident_bytes
small = [torch.ones(10_000) for _ in range(1600)]  # 40 kB each: under the mmap threshold, on the heap
top = torch.ones(10_000)  # keeps the freed ones in the middle of the heap, where malloc never trims by itself
del small
held = resident_bytes()
release_free_heap()
given = resident_bytes()
again = [torch.ones(10_000) for _ in range(1600)]
print(held - given, resident_bytes() - given)
"""


def test_small_tensors_freed_on_the_heap_are_given_back_so_a_step_reusing_them_is_counted():
    """Tensors under the mmap threshold live on the heap, and what a step frees there stays resident: the next step
    reused it unseen, and the peers' in-process peaks of one compiled Llama step ranged 20.8-26.4 MiB over six
    processes.  `release_free_heap` gives those pages back, so allocating them again raises the resident set."""
    env = {**os.environ, **PROCESS_ENV}
    done = subprocess.run([sys.executable, "-c", HEAP_REUSE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    released, regrown = (int(x) for x in done.stdout.split())
    assert released >= 0.9 * 1600 * 40_000, done.stdout
    assert regrown >= 0.9 * 1600 * 40_000, done.stdout
