"""The GPU's caching allocator replayed (NOTE [The caching allocator's reserve]) and plans that fit its reserve
(NOTE [A plan fits the GPU's reserve]): the allocator's rules by hand, the replay against what an H200 allocated and
reserved for the same steps (tests/gpu_facts/h200/gpu_check_steps.json, 2026-11-26), and the planning loop."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import remat
from remat import zoo
from remat.cli import main
from remat.gpu_fit import MIN_STEP, RESERVE_MARGIN, fit_reserve
from remat.measure.device.cuda_allocator import (
    LARGE_BUFFER,
    MiB,
    CachingAllocator,
    ExpandableAllocator,
    OutOfMemory,
    segment_size,
)
from remat.types.reserve import EXPANDABLE, GpuReserve

ROOT = Path(__file__).resolve().parent.parent
H200 = json.loads((ROOT / "tests" / "gpu_facts" / "h200" / "gpu_check_steps.json").read_text())


# -- the allocator's rules, by hand ---------------------------------------------------------------------------


def test_segments_are_two_mib_for_small_twenty_for_medium_and_rounded_to_two_mib_above():
    """Rule 2."""
    assert segment_size(512) == segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == LARGE_BUFFER
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(16 * MiB + 512) == 18 * MiB


def test_a_large_block_is_handed_out_whole_when_less_than_a_mib_would_remain():
    """Rule 3: what max_memory_allocated counts beyond the tensors."""
    a = CachingAllocator()
    first = a.malloc(3 * MiB)  # a 20 MiB segment, split: 17 MiB stay cached
    assert (a.allocated, a.reserved) == (3 * MiB, 20 * MiB)
    a.malloc(16 * MiB + 512)  # fits the cached 17 MiB; under 1 MiB would remain: not split
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)
    a.free(first)
    a.malloc(int(19.5 * MiB))  # its own segment of 20 MiB, 0.5 MiB left in it: counted whole
    assert (a.allocated, a.reserved) == (37 * MiB, 40 * MiB)


def test_small_blocks_split_down_to_512_bytes_and_merge_back_when_freed():
    a = CachingAllocator()
    blocks = [a.malloc(100) for _ in range(4)]
    assert (a.allocated, a.reserved) == (4 * 512, 2 * MiB)
    for b in blocks:
        a.free(b)
    a.release_cached()  # one free block per segment again: it goes back
    assert (a.allocated, a.reserved) == (0, 0)


def test_under_a_cap_cached_segments_are_released_before_the_step_runs_out():
    """Rule 5."""
    a = CachingAllocator(cap=40 * MiB)
    a.free(a.malloc(30 * MiB))  # 30 MiB cached, nothing allocated
    a.malloc(36 * MiB)  # 30 + 36 > 40: the cached segment goes back first, then it fits
    assert (a.allocated, a.reserved, a.peak_reserved) == (36 * MiB, 36 * MiB, 36 * MiB)
    with pytest.raises(OutOfMemory):
        a.malloc(6 * MiB)  # a 20 MiB segment: 56 > 40 with nothing to release


def test_expandable_segments_split_every_block_and_reserve_the_pages_touched():
    """Rule 4: pages of 20 MiB in the large pool; no block handed out whole."""
    a = ExpandableAllocator()
    x = a.malloc(3 * MiB)
    y = a.malloc(30 * MiB)
    assert (a.allocated, a.reserved) == (33 * MiB, 40 * MiB)  # bytes 0..33 MiB touch pages 0 and 1
    a.free(x)
    a.malloc(2 * MiB)  # best fit: x's 3 MiB, split; nothing new mapped
    assert (a.allocated, a.reserved) == (32 * MiB, 40 * MiB)
    a.free(y)
    a.release_cached()  # page 0 still holds the 2 MiB block
    assert a.reserved == LARGE_BUFFER


# -- the replay against an H200 --------------------------------------------------------------------------------


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cuda_reserve

    return cuda_reserve


STEPS = [(m, k) for m in H200["steps"] for k in H200["steps"][m]]
RESERVE_SPREAD = 0.10
"""How far the replayed reserve of the default allocator is from the H200's: -7.9% to +9.3% over these 14 steps
(2026-11-27; 0.1-3.4% under for BERT's and the Llama's steps before CUDA's reduction staging buffers were modelled,
NOTE [CUDA memory that is no tensor] Rule 6: those transients make where the allocator puts each block matter)."""


@pytest.mark.parametrize("name, kind", STEPS)
def test_the_replayed_step_allocates_and_reserves_what_the_h200_did(name, kind):
    """Every step of the GPU check that the H200 ran uncapped: max_memory_allocated within 1% (the unsplit blocks,
    T5's math-path attention, cuDNN's convolution workspaces and the reductions' staging buffers counted: before
    2026-11-27 T5 was 24% under, the U-Net 7.6%, the MLP 5.7%), the default allocator's reserve within
    RESERVE_SPREAD, and with expandable segments within 5% where the H200 ran it."""
    import transformers

    if name == "t5" and transformers.__version__ != H200["transformers"]:
        pytest.skip(
            f"T5 of transformers {transformers.__version__} makes its attention bias dense, that of "
            f"{H200['transformers']} (the H200's) does not: the steps differ (tests/test_cuda_h200.py)"
        )
    truth = H200["steps"][name][kind]
    r = _gpu_check().predicted(name, kind).gpu_reserve
    assert abs(r.allocated_bytes - truth["allocated"]) <= 0.01 * truth["allocated"], (r, truth)
    assert abs(r.reserved_bytes - truth["reserved"]) <= RESERVE_SPREAD * truth["reserved"], (r, truth)
    if "expandable_reserved" in truth:
        assert abs(r.expandable_reserved_bytes - truth["expandable_reserved"]) <= 0.05 * truth["expandable_reserved"]


# -- plans that fit the reserve --------------------------------------------------------------------------------


def _plan(peak: int, budget: int, name: str = "p") -> remat.Plan:
    return remat.Plan(
        model="M",
        solver=name,
        decisions={},
        segments=[[name]],
        peak_bytes=peak,
        recompute_flops=peak,
        recompute_s=0.0,
        unplanned_peak_bytes=1000 * MiB,
        budget_bytes=budget,
        blocks=[],
    )


def _reserve(default: int, expandable: int) -> GpuReserve:
    return GpuReserve(default, default, expandable)


def test_a_plan_over_the_reserve_is_planned_again_for_fewer_tensors_until_it_fits():
    """Rule 2: the excess and the margin off the tensors' budget; the first plan that fits is the plan."""
    budget = 1000 * MiB
    asked = []
    reserves = {"first": _reserve(1100 * MiB, 1050 * MiB), "second": _reserve(950 * MiB, 940 * MiB)}

    def replan(target):
        asked.append(target)
        return _plan(target - MiB, budget, "second")

    chosen = fit_reserve(_plan(990 * MiB, budget, "first"), budget, replan, lambda p: reserves[p.solver])
    assert asked == [budget - (int(1100 * MiB * (1 + RESERVE_MARGIN)) - budget)]
    assert chosen.solver == "second" and chosen.allocator == "" and chosen.gpu_reserve == reserves["second"]
    assert "would reserve 950.0 MiB" in chosen.notes[-1]


def test_a_plan_far_under_the_budget_is_planned_again_under_its_own_tensors_not_checked_twice():
    """Rule 2: the budget less the excess would give the same plan back (GPT-2 at 80% spent all four checks on one
    plan): the next is asked for at least MIN_STEP under the plan checked."""
    budget = 1000 * MiB
    asked = []

    def replan(target):
        asked.append(target)
        return _plan(target, budget, "first" if target > 700 * MiB else "second")

    reserves = {"first": _reserve(1010 * MiB, 1005 * MiB), "second": _reserve(900 * MiB, 880 * MiB)}
    chosen = fit_reserve(_plan(800 * MiB, budget, "first"), budget, replan, lambda p: reserves[p.solver])
    assert asked[0] == 800 * MiB - MIN_STEP  # not budget - excess: 949.6 MiB, which the 800 MiB plan fits again
    assert all(b < a for a, b in zip(asked, asked[1:]))
    assert chosen.solver == "second" and chosen.peak_bytes <= 700 * MiB


def test_where_only_expandable_segments_fit_the_plan_says_to_set_them():
    """Rule 3."""
    budget = 1000 * MiB

    def replan(target):
        raise remat.InfeasibleBudget("remat: none", target, target)

    chosen = fit_reserve(_plan(900 * MiB, budget), budget, replan, lambda p: _reserve(1100 * MiB, 950 * MiB))
    assert chosen.allocator == EXPANDABLE
    assert f"set PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE} before torch is imported" in chosen.notes[-1]


def test_where_nothing_fits_the_error_gives_the_least_budget_that_would():
    """Rule 4."""
    budget = 1000 * MiB

    def replan(target):
        raise remat.InfeasibleBudget("remat: none", target, target)

    with pytest.raises(remat.InfeasibleBudget) as e:
        fit_reserve(_plan(990 * MiB, budget), budget, replan, lambda p: _reserve(1200 * MiB, 1100 * MiB))
    least = int(1100 * MiB * (1 + RESERVE_MARGIN)) + 1
    assert str(e.value).startswith("remat: no plan's step fits a GPU budget of 1,000.0 MiB: of 1 plan checked")
    assert f"give a budget of at least {least} bytes" in str(e.value) and e.value.min_bytes == least
    assert f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}" in str(e.value)


def test_a_reserve_over_the_budget_by_more_than_its_tensors_ends_at_the_least_plan_not_a_budget_of_nothing():
    """Rule 2: each check lowers the target by the reserve's excess; where that excess is larger than the plan's
    tensors (Qwen2-1.5B on a 24 GiB GPU: 11 GiB of fragmentation over a 22.7 GiB least plan) the target reached 0
    and remat.plan refused it as a budget ("cannot read the budget 0").  It stops at the least plan, then at
    Rule 4's error."""
    model, x = zoo.mlp_report000()
    prof = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake", device="cuda")
    budget = prof.peak_bytes
    first = remat.plan(prof, budget)
    asked = []

    def replan(target):
        asked.append(target)
        return remat.plan(prof, target)

    swollen = _reserve(3 * budget, 3 * budget)
    with pytest.raises(remat.InfeasibleBudget) as e:
        fit_reserve(first, budget, replan, lambda p: swollen)
    assert asked and min(asked) > 0
    assert str(e.value).startswith("remat: no plan's step fits a GPU budget of")
    with pytest.raises(remat.InfeasibleBudget) as least:
        remat.plan(prof, 1)
    assert asked[-1] == least.value.min_bytes  # the last plan checked is the least-memory one


def test_remat_plan_on_the_command_line_fits_the_reserve_where_the_tensors_alone_would_not(tmp_path, capsys):
    """A budget above the unplanned step's tensors but under what the GPU reserves for them: remat.plan keeps
    everything (and says the reserve is not checked); `remat plan TARGET` recomputes until the replayed planned
    step, profiled again here on a fresh model, reserves RESERVE_MARGIN under the budget."""
    model, x = zoo.bert()
    prof = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake", device="cuda")
    budget = (prof.peak_bytes + prof.gpu_reserve.reserved_bytes) // 2
    assert prof.peak_bytes < budget < prof.gpu_reserve.reserved_bytes
    kept = remat.plan(prof, budget)
    assert not kept.segments and any(n.startswith("This plan counts live tensors;") for n in kept.notes)
    out = tmp_path / "plan.json"
    code = main(
        ["plan", "remat.zoo:bert", "--mode", "fake", "--device", "cuda", "--budget", str(budget), "--out", str(out)]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    plan = remat.load_plan(out)
    assert plan.segments and plan.budget_bytes == budget and plan.gpu_reserve is not None
    assert "On the GPU the caching allocator would reserve" in " ".join(stdout.split())
    fresh, x = zoo.bert()
    remat.apply(fresh, plan)
    again = remat.profile(fresh, x, optimizer=torch.optim.Adam, mode="fake", device="cuda")
    assert again.gpu_reserve == plan.gpu_reserve
    assert again.gpu_reserve.reserved_bytes * (1 + RESERVE_MARGIN) <= budget


def test_a_cuda_profile_says_what_the_allocator_would_hold_and_a_cpu_one_does_not():
    model, x = zoo.bert()
    cuda = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake", device="cuda")
    cpu = remat.profile(model, x, optimizer=torch.optim.Adam, mode="fake")
    assert cpu.gpu_reserve is None and "caching allocator" not in str(cpu)
    r = cuda.gpu_reserve
    assert cuda.peak_bytes <= r.allocated_bytes <= r.reserved_bytes and r.expandable_reserved_bytes <= r.reserved_bytes
    assert "on the GPU (the caching allocator replayed): max_memory_allocated" in str(cuda)
    assert remat.StepProfile.from_json(cuda.to_json()).gpu_reserve == r


# -- a run of layers that takes a tensor from outside it --------------------------------------------------------


class _Decoder(nn.Module):
    """T5's decoder block in small: self-attention, cross-attention on the encoder's states, feed-forward."""

    def __init__(self, d: int):
        super().__init__()
        self.layer = nn.ModuleList(
            [
                nn.Sequential(nn.Linear(d, d), nn.ReLU()),
                nn.Bilinear(d, d, d),
                nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
            ]
        )

    def forward(self, x, enc):
        x = self.layer[0](x)
        x = self.layer[1](x, enc)
        return self.layer[2](x)


class _EncDec(nn.Module):
    def __init__(self, d: int = 64):
        super().__init__()
        self.encoder = nn.Linear(d, d)
        self.blocks = nn.ModuleList([_Decoder(d) for _ in range(2)])

    def forward(self, src, tgt):
        enc = self.encoder(src)
        for block in self.blocks:
            tgt = block(tgt, enc)
        return tgt


def test_a_layer_that_takes_the_encoders_states_does_not_join_its_predecessors_checkpoint():
    """T5's least-memory plan for the H200 wrapped decoder.block.4.layer.0 .. layer.1, and remat.apply refused the
    cross-attention's outside tensor in that run (docs/validation.md section 6.1): the profile now marks such a
    layer, and the planner builds no run that ends at it, while the run after it stays."""
    from remat.planner.problem import Problem
    from remat.types.kinds import Action

    torch.manual_seed(0)
    model, src, tgt = _EncDec(), torch.randn(256, 64), torch.randn(256, 64)
    prof = remat.profile(model, (src, tgt), optimizer=torch.optim.Adam)
    marked = {b.name for b in prof.blocks if b.foreign_grad_inputs}
    assert {"blocks.0.layer.1", "blocks.1.layer.1"} <= marked and "blocks.0.layer.2" not in marked
    units = {u.blocks: u for u in Problem.from_profile(prof).units if u.action == Action.RECOMPUTE}
    assert not units[("blocks.0.layer.0", "blocks.0.layer.1")].appliable
    assert not units[("blocks.0.layer.0", "blocks.0.layer.1", "blocks.0.layer.2")].appliable
    assert units[("blocks.0.layer.1", "blocks.0.layer.2")].appliable
    least = remat.frontier(prof)[-1]
    report = remat.verify(model, (src, tgt), least, optimizer=torch.optim.Adam)
    assert report.grads_equal and max(report.grad_max_abs_diff.values()) == 0.0, str(report)


def test_auto_warns_when_its_plan_needs_an_allocator_setting_this_process_lacks(monkeypatch):
    """remat.auto applies the plan in a process whose allocator is set already: it says what to set, and where."""
    import dataclasses

    import remat.entry

    monkeypatch.setattr(
        remat.entry, "fit_gpu", lambda m, s, p, plan, o: dataclasses.replace(plan, allocator=EXPANDABLE)
    )
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)))
    x = torch.randn(512, 64)
    with pytest.warns(
        UserWarning,
        match=rf"^remat: this plan fits the budget only with PYTORCH_CUDA_ALLOC_CONF="
        rf"{EXPANDABLE}, and this process runs without it",
    ):
        remat.auto(model, x, budget=0.9)
    remat.remove(model)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", EXPANDABLE)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        remat.auto(model, x, budget=0.9)
