"""Seconds as the cost: measured op times, the roofline, solvers that minimise seconds, and verify's timing.

No test asserts a wall-clock time: what is checked is where seconds come from, the roofline's arithmetic,
which plan the solvers pick from given seconds, and that verify reports what it measured beside the plan.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn as nn

import remat
from remat import zoo
from remat.measure.device import roofline
from remat.measure.timing import RANK_NOTE, UNMATCHED_NOTE, same_seconds_for_copies
from remat.measure.tracker import OpRecord
from remat.planner.problem import Problem
from remat.types import PROFILE_VERSION, StepProfile

aten = torch.ops.aten


def _chain(width: int = 64, blocks: int = 4, batch: int = 32):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)])
    return model, torch.randn(batch, width)


# -- where a profile's seconds come from ---------------------------------------------------------------------


def test_a_real_profile_is_timed_after_the_tracked_step_and_each_op_matched():
    model, x = _chain()
    prof = remat.profile(model, x, optimizer=torch.optim.Adam(model.parameters()))
    assert prof.timing == "measured" and prof.timed
    assert prof.step_time_s > 0 and prof.checkpoint_op_s > 0 and prof.selective_op_s > 0
    layers = [b for b in prof.blocks if b.depth == 0]
    assert len(layers) == 4 and all(b.forward_s > 0 and 0 < b.checkpoint_recompute_s <= b.forward_s for b in layers)
    assert UNMATCHED_NOTE not in prof.notes


def test_copies_of_one_block_take_the_same_seconds_so_the_clock_does_not_pick_the_plan():
    """Rule 6 of NOTE [The seconds of a step]: blocks 1-3 run the same ops (block 0's input needs no gradient,
    so its backward differs), and each of their ops takes the median over the copies."""
    model, x = _chain(blocks=4)
    prof = remat.profile(model, x)
    fields = [
        (b.forward_s, b.backward_s, b.checkpoint_recompute_s, b.selective_recompute_s)
        for b in prof.blocks
        if b.depth == 0
    ]
    assert fields[1] == fields[2] == fields[3] and fields[0] != fields[1]
    assert min(fields[1][:3]) > 0


def _ops(module: str, seconds: list[float], flops: int = 10) -> list[OpRecord]:
    names = ["aten.mm.default", "aten.gelu.default"]
    return [OpRecord(n, "forward", module, flops, s, False) for n, s in zip(names, seconds)]


def test_only_blocks_of_one_class_running_the_same_ops_share_their_seconds():
    ops = [
        OpRecord("aten.ones.default", "setup", "0", 0, 9.0, False),
        *_ops("0", [1.0, 4.0]),
        *_ops("1", [2.0, 5.0]),
        *_ops("2", [6.0, 9.0]),
        *_ops("3", [1.0, 1.0], flops=20),
        *_ops("4", [7.0, 7.0]),
    ]
    candidates = {
        "0": nn.Linear(2, 2),
        "1": nn.Linear(2, 2),
        "2": nn.Linear(2, 2),
        "3": nn.Linear(2, 2),
        "4": nn.ReLU(),
    }
    same_seconds_for_copies(ops, candidates)
    by_module = {m: [op.seconds for op in ops if op.module == m and op.phase != "setup"] for m in candidates}
    assert by_module["0"] == by_module["1"] == by_module["2"] == [2.0, 5.0]  # medians, position by position
    assert by_module["3"] == [1.0, 1.0] and by_module["4"] == [7.0, 7.0]  # other FLOPs, another class
    assert ops[0].seconds == 9.0  # setup ops are not the block's


class _EveryOtherCall(nn.Module):
    """A forward that runs one more op on every third call: the timed steps cannot be matched to the tracked one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.calls = itertools.count()

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if next(self.calls) % 3 == 0 else y


def test_a_forward_that_changes_between_steps_keeps_the_tracked_times_and_says_so():
    prof = remat.profile(_EveryOtherCall(), torch.randn(4, 16))
    assert prof.timing == "tracked" and UNMATCHED_NOTE in prof.notes
    assert "ms (timed while tracked)" in str(prof)  # the words a plan of it prints too (report.text.fmt_timing)
    assert prof.step_time_s > 0 and all(b.forward_s > 0 for b in prof.blocks)


def test_a_fake_profile_is_timed_by_the_roofline_of_the_hardware_named():
    model, x = _chain(width=1024, batch=8192)  # ops long enough to be more than a kernel launch
    h100 = remat.profile(model, x, mode="fake", device="cuda", hardware="H100")
    l4 = remat.profile(model, x, mode="fake", device="cuda", hardware="l4")  # any case
    assert (h100.timing, l4.timing) == ("roofline H100", "roofline L4")
    assert any("roofline of H100" in n for n in h100.notes)
    assert h100.step_time_s == pytest.approx(sum(b.forward_s + b.backward_s for b in h100.blocks), rel=0.5)
    assert l4.step_time_s > h100.step_time_s  # a tenth of the bandwidth, an eighth of the FLOP rate
    default = remat.profile(model, x, mode="fake", device="cuda")
    if not torch.cuda.is_available():
        assert default.timing == "roofline H100" and any("No GPU named here" in n for n in default.notes)
    cpu = remat.profile(model, x, mode="fake")
    assert cpu.timing == "roofline cpu" and any("nominal CPU" in n for n in cpu.notes)


def test_a_fake_profile_and_its_plans_are_the_same_on_every_run():
    model, x = _chain(blocks=6, batch=4096)
    runs = [remat.profile(model, x, mode="fake", device="cuda", hardware="A100") for _ in range(2)]
    assert runs[0].to_json() == runs[1].to_json()
    floor = runs[0].at_peak.workspaces_bytes  # cuBLAS's workspaces: no plan lowers them
    plans = [remat.plan(p, floor + int(0.8 * (p.peak_bytes - floor))) for p in runs]
    assert plans[0].to_json() == plans[1].to_json() and plans[0].recompute_s > 0


def test_hardware_is_checked():
    model, x = _chain()
    with pytest.raises(
        remat.RematError,
        match=r"^remat: hardware must name a device .*A100, H100, H200, L4, cpu; "
        r"saw 'B200'\. Fix: pick the nearest one",
    ):
        remat.profile(model, x, mode="fake", device="cuda", hardware="B200")
    with pytest.raises(
        remat.RematError,
        match=r"^remat: hardware='H100' is a GPU, but the step is predicted for "
        r"device='cpu'\..*Fix: pass device='cuda'",
    ):
        remat.profile(model, x, mode="fake", hardware="H100")
    with pytest.raises(
        remat.RematError,
        match=r"^remat: hardware='A100' names the device a fake-mode prediction is "
        r"timed for; a real step is timed as it runs\. Fix:",
    ):
        remat.profile(model, x, hardware="A100")


def test_a_version_3_profile_reads_as_timed_by_its_tracked_step_or_not_at_all():
    model, x = _chain()
    for prof, expected in ((remat.profile(model, x), "tracked"), (remat.profile(model, x, mode="fake"), "")):
        text = prof.to_json().replace(f'"version": {PROFILE_VERSION}', '"version": 3')
        assert StepProfile.from_json(text).timing == expected


# -- the roofline's arithmetic ------------------------------------------------------------------------------


def test_the_roofline_takes_the_slower_of_compute_and_memory_and_a_floor_per_op():
    h100 = roofline.HARDWARE["H100"]
    a = torch.empty(4096, 4096, device="meta")
    mm = roofline.op_seconds(h100, aten.mm.default, (a, a), {}, a)
    precision = torch.get_float32_matmul_precision()
    fp32_rate = (h100.tf32_flops if precision != "highest" else h100.fp32_flops) * roofline.ACHIEVED_COMPUTE
    assert mm == pytest.approx(2 * 4096**3 / fp32_rate)
    half = a.to(torch.bfloat16)
    assert roofline.op_seconds(h100, aten.mm.default, (half, half), {}, half) == pytest.approx(
        2 * 4096**3 / (h100.half_flops * roofline.ACHIEVED_COMPUTE)
    )
    v = torch.empty(2**24, device="meta")  # 64 MiB: an add reads two and writes one
    add = roofline.op_seconds(h100, aten.add.Tensor, (v, v), {}, torch.empty_like(v))
    assert add == pytest.approx(3 * 4 * 2**24 / (h100.bandwidth * roofline.ACHIEVED_BANDWIDTH))
    assert roofline.op_seconds(h100, aten.add_.Tensor, (v, v), {}, v) == pytest.approx(add * 2 / 3)  # writes its input
    tiny = torch.empty(4, device="meta")
    assert roofline.op_seconds(h100, aten.add.Tensor, (tiny, tiny), {}, tiny) == h100.op_s == roofline.GPU_OP_S
    assert roofline.op_seconds(h100, aten.empty.memory_format, ([2**24],), {}, v) == h100.op_s  # allocates only
    assert roofline.op_seconds(h100, aten.view.default, (v, [4096, 4096]), {}, v.view(4096, 4096)) == 0.0
    cpu = roofline.HARDWARE["cpu"]
    assert roofline.op_seconds(cpu, aten.view.default, (v, [4096, 4096]), {}, v.view(4096, 4096)) == cpu.op_s
    for hw in (h100, cpu):  # asked by fake tensors only: no op of an eager step
        assert roofline.op_seconds(hw, torch.ops.prim.device.default, (v,), {}, torch.device("meta")) == 0.0
        assert roofline.op_seconds(hw, aten.sym_size.default, (v,), {}, [2**24]) == 0.0


def test_the_nominal_cpu_charges_transcendental_ops_the_passes_the_reference_machine_measured():
    """Rule 4: CPU_PASSES is benchmarks/results/cpu_passes.json (the committed measurement), every op over its
    threshold and none under; tanh (a GPT-2 block's activation) costs several times its bytes' pass, an add one."""
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).parents[1] / "benchmarks/results/cpu_passes.json").read_text())
    least = {op: min(rs) for op, rs in results["data"]["ratios"].items()}
    over = {op for op, m in least.items() if m > results["data"]["passes_at"]}
    assert set(roofline.CPU_PASSES) == over and "tanh" in over and "add" not in over
    for op in over:
        assert roofline.CPU_PASSES[op] == pytest.approx(least[op], abs=0.05)
    cpu, v = roofline.HARDWARE["cpu"], torch.empty(2**24, device="meta")
    one_pass = 2 * 4 * 2**24 / (cpu.bandwidth * roofline.ACHIEVED_BANDWIDTH)
    assert roofline.op_seconds(cpu, aten.tanh.default, (v,), {}, v.clone()) == pytest.approx(
        roofline.CPU_PASSES["tanh"] * one_pass
    )
    assert roofline.op_seconds(cpu, aten.relu.default, (v,), {}, v.clone()) == pytest.approx(one_pass)
    h100 = roofline.HARDWARE["H100"]  # a GPU's tanh streams its bytes
    assert roofline.op_seconds(h100, aten.tanh.default, (v,), {}, v.clone()) == pytest.approx(
        2 * 4 * 2**24 / (h100.bandwidth * roofline.ACHIEVED_BANDWIDTH)
    )


def test_a_fake_step_counts_the_ops_an_eager_step_runs_and_no_metadata_question():
    """Fake tensors ask `prim.device` and the like (thousands of times in a Hugging Face model); an eager step does
    not: they are neither timed nor counted among the ops a checkpoint re-runs (each costs `checkpoint_op_s`)."""
    model, x = _chain()
    real, fake = remat.profile(model, x), remat.profile(model, x, mode="fake")
    spans = [
        [(b.forward_start_op, b.forward_end_op, b.backward_start_op, b.checkpoint_recompute_ops) for b in prof.blocks]
        for prof in (real, fake)
    ]
    assert spans[0] == spans[1] and any(s[3] > 0 for s in spans[0])


# -- solvers minimise seconds, FLOPs break ties --------------------------------------------------------------


def _two_ways(prof: StepProfile) -> StepProfile:
    """Block 0 re-runs more FLOPs but takes less time than block 1; the others are too costly to pick."""
    blocks = []
    for b in prof.blocks:
        if b.name in ("0", "1"):
            flops, seconds = (10**9, 1e-3) if b.name == "0" else (10**6, 5e-3)
        else:
            flops, seconds = 10**12, 1.0
        blocks.append(
            dataclasses.replace(
                b, checkpoint_recompute_flops=flops, checkpoint_recompute_s=seconds, selective_free_bytes=0
            )
        )
    return dataclasses.replace(prof, blocks=blocks, checkpoint_op_s=0.0, selective_op_s=0.0)


@pytest.mark.parametrize("solver", ["dp", "ilp"])
def test_the_solvers_minimise_seconds_when_timed_and_flops_when_not(solver):
    model, x = _chain(blocks=4, batch=1024)  # activations outweigh the parameters: one block's memory matters
    prof = _two_ways(remat.profile(model, x, mode="fake", device="cuda", hardware="H100"))
    one_block = prof.peak_bytes - min(Problem.from_profile(prof).unit(n).reduction_bytes for n in ("0", "1")) // 2
    timed = remat.plan(prof, one_block, solver)
    untimed = remat.plan(dataclasses.replace(prof, timing=""), one_block, solver)
    assert timed.segments == [["0"]] and timed.recompute_s == pytest.approx(1e-3)
    assert untimed.segments == [["1"]] and untimed.recompute_flops == 10**6


def test_a_plans_seconds_include_checkpointings_own_cost_per_op():
    model, x = _chain()
    prof = remat.profile(model, x, mode="fake", device="cuda", hardware="H100")
    problem = Problem.from_profile(prof)
    b = prof.blocks[0]
    unit = problem.unit(b.name)
    assert unit.cost_s == pytest.approx(b.checkpoint_recompute_s + b.checkpoint_recompute_ops * prof.checkpoint_op_s)
    assert prof.checkpoint_op_s == roofline.GPU_CHECKPOINT_OP_S  # what the kernels do not hide
    assert remat.profile(model, x, mode="fake").checkpoint_op_s == roofline.HOST_CHECKPOINT_OP_S


def test_a_measured_profile_charges_checkpointing_the_devices_constants_not_a_noisy_measurement():
    # measured per profile, these moved 2-3x between processes and `remat demo` printed two plans in four runs
    model, x = _chain()
    first, second = remat.profile(model, x), remat.profile(model, x)
    assert first.timing == second.timing == "measured"
    for prof in (first, second):
        assert (prof.checkpoint_op_s, prof.selective_op_s) == (
            roofline.HOST_CHECKPOINT_OP_S,
            roofline.HOST_SELECTIVE_OP_S,
        )
    assert roofline.overheads_on(torch.device("cuda")) == {
        "checkpoint_op_s": roofline.GPU_CHECKPOINT_OP_S,
        "selective_op_s": roofline.GPU_SELECTIVE_OP_S,
    }


def test_a_rank_of_a_job_is_not_timed_and_plans_by_flops():
    from remat.measure.timing import settle
    from remat.measure.build import Setup
    from remat.measure.tracker import Tracker
    from remat.types import Mode

    setup, notes = Setup(Mode.REAL, torch.device("cpu"), 1, False), []
    fields = settle(Tracker("M"), setup, True, lambda: pytest.fail("a rank must not run timed steps"), {}, notes)
    assert fields == {"timing": "", "step_time_s": 0.0, "checkpoint_op_s": 0.0, "selective_op_s": 0.0}
    assert notes == [RANK_NOTE] and setup.notes == ()


# -- verify measures the overhead beside the prediction -----------------------------------------------------


def test_verify_times_the_step_without_and_with_the_plan_beside_the_prediction():
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=4, seq=64, batch=2, vocab=512)
    prof = remat.profile(model, inputs)
    plan = remat.plan(prof, 0.8)
    assert plan.timing == "measured" and plan.step_time_s == prof.step_time_s
    assert plan.extra_fraction == pytest.approx(plan.extra_s / prof.step_time_s) and plan.extra_fraction > 0
    report = remat.verify(model, inputs, plan, time_rounds=3)
    assert report.ok, str(report)
    assert report.timed and report.unplanned_step_s > 0 and report.planned_step_s > 0
    assert report.predicted_overhead == plan.extra_fraction
    text = str(report)
    assert "step time with the plan" in text and f"{plan.extra_fraction:+.1%}" in text
    assert "ms, +" in str(plan) and "measured)" in str(plan)
    untimed = remat.verify(model, inputs, plan, time_rounds=0)
    assert not untimed.timed and "step time" not in str(untimed)
