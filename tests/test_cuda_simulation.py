"""A CUDA step predicted on the CPU, held against what an H100 measured (tests/gpu_facts/, from ../shared/gpu-facts,
2026-11-26: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, transformers 5.24).

Per op (`h100/op_facts.json`): the tensors autograd saves, what forward leaves allocated, and the peaks of forward
and backward over what was allocated before them, for the same calls run here on fake CPU tensors as remat
simulates a CUDA step (NOTE [A CUDA step simulated on CPU], NOTE [CUDA memory that is no tensor]).  Per model
(`h100/zoo_truth.json`): each `remat.zoo` model's steady step (Adam, third step, `max_memory_allocated`) in a loop
that keeps the output through backward and in one that keeps only the loss.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat import zoo
from remat._torch_compat import FakeTensorMode
from remat.measure.device import cuda_kernels
from remat.measure.device.cuda_workspaces import CudaWorkspaces
from remat.measure.tracker import Tracker

FACTS = Path(__file__).parent / "gpu_facts" / "h100"
OP_TOLERANCE = 0.01
"""Issue 34: each op's figures within 1% of the H100's, as a share of the op's footprint (its largest figure): the
backward of bf16 attention with a float mask peaks 511 KiB (0.52%) above the H100's, which a per-figure 1% would
fail on."""
MODEL_TOLERANCE = 0.02
"""Issue 34: each zoo model's steady step within 2% of `max_memory_allocated`."""
FIGURES = ("saved_bytes", "held_after_forward", "forward_peak", "backward_peak")


def _cases() -> list[tuple]:
    """The calls of gpu_facts/op_facts.py (the script that measured the H100 table), made on fake CPU tensors."""
    source = (Path(__file__).parent / "gpu_facts" / "op_facts.py").read_text()
    body = source[source.index("B, L, D, H, V = ") : source.index("for c in cases:")]
    body = body.split("rows = []")[0] + "cases = [" + body.split("cases = [", 1)[1]

    def t(*shape, dtype=torch.float32, grad=True):
        return torch.empty(*shape, dtype=dtype).requires_grad_(grad)

    scope = {"torch": torch, "F": F, "bf": torch.bfloat16, "dev": "cpu", "t": t}
    exec(body, scope)  # the case table only: shapes, dtypes and the call of each op
    return scope["cases"]


CASES = {case[0]: case for case in _cases()}
OP_FACTS = {row["case"]: row for row in json.loads((FACTS / "op_facts.json").read_text())["rows"]}


def _simulate(case: tuple) -> dict[str, int]:
    """op_facts.py's measurement of one call, on the tracker of a simulated CUDA step."""
    _, make, fn = case[:3]
    autocast = case[3] if len(case) > 3 else None
    saved: dict[int, int] = {}

    def pack(x):
        saved[id(x.untyped_storage())] = x.untyped_storage().nbytes()
        return x

    with cuda_kernels.as_on_cuda(), FakeTensorMode(allow_non_fake_inputs=True):
        args = make()
        tracker = Tracker("op", rounding=512, time_ops=False)
        tracker.scratch_probe = CudaWorkspaces()
        for a in args:
            tracker.record_of(a, before_step=True)
        with tracker:
            tracker.phase = "forward"
            on_cuda = torch.autocast("cuda", dtype=autocast) if autocast else torch.autocast("cuda", enabled=False)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), on_cuda:
                out = fn(*args)
            forward_ops = len(tracker.ops)
            outs = out if isinstance(out, tuple) else (out,)
            loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
            before_backward = len(tracker.ops)
            tracker.phase = "backward"
            loss.backward()
    inputs = {id(a.untyped_storage()) for a in args}
    return _figures(tracker, sum(b for k, b in saved.items() if k not in inputs), forward_ops, before_backward)


def _figures(tracker: Tracker, saved_bytes: int, forward_ops: int, before_backward: int) -> dict[str, int]:
    def live(k: int, scratch: bool = True) -> int:
        tensors = sum(r.nbytes for r in tracker.records if r.live_at(k))
        return tensors + (tracker.scratch[k] if scratch else 0)

    base = sum(r.nbytes for r in tracker.records if r.alloc_step < 0)
    held = sum(
        r.nbytes
        for r in tracker.records
        if r.alloc_step < forward_ops and (r.free_step is None or r.free_step > forward_ops)
    )
    return {
        "saved_bytes": saved_bytes,
        "held_after_forward": held - base,
        "forward_peak": max(live(k) for k in range(forward_ops)) - base,
        "backward_peak": max(live(k) for k in range(before_backward, len(tracker.ops)))
        - live(before_backward - 1, scratch=False),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_op_of_a_simulated_cuda_step_holds_what_an_h100_holds(name):
    truth, simulated = OP_FACTS[name], _simulate(CASES[name])
    footprint = max(truth[f] for f in FIGURES)
    off = {f: (simulated[f], truth[f]) for f in FIGURES if abs(simulated[f] - truth[f]) > OP_TOLERANCE * footprint}
    assert not off, off


def test_the_per_op_table_has_every_case_and_no_error():
    assert set(CASES) == set(OP_FACTS) and not any("error" in row for row in OP_FACTS.values())
    assert len(CASES) == 32


def test_dropout_saves_a_bool_mask_and_convolution_a_workspace_as_on_cuda():
    """The two largest single corrections, by name: a float32 dropout saved 4 bytes an element before (H100: 1);
    a 64 -> 64 channel 3x3 convolution peaked at its output, 128 MiB (H100: 384 MiB, to the byte: twice the
    output plus the weight at 512-byte rounding; Rule 3's table has the shape at batch 16 from an H200)."""
    dropout, conv = _simulate(CASES["dropout 0.1 fp32"]), _simulate(CASES["conv2d fp32 64->64 3x3"])
    assert dropout["saved_bytes"] == 8192 * 1024 == OP_FACTS["dropout 0.1 fp32"]["saved_bytes"]
    assert conv["forward_peak"] == 3 * 128 * 2**20 + 147968 == OP_FACTS["conv2d fp32 64->64 3x3"]["forward_peak"]
    assert _simulate(CASES["conv2d fp32 3->64 3x3"])["forward_peak"] == 128 * 2**20  # 3 channels: no workspace


def test_a_bfloat16_layer_norm_keeps_its_statistics_in_float32_as_on_cuda():
    """NOTE [A CUDA step simulated on CPU], Rule 5: CUDA keeps a half input's mean and inverse deviation per row in
    float32, where CPU keeps the input's dtype: 32 KiB saved for 8192 rows before, 64 KiB on the H100."""
    simulated, truth = _simulate(CASES["layer_norm bf16"]), OP_FACTS["layer_norm bf16"]
    assert simulated["saved_bytes"] == 2 * 8192 * 4 == truth["saved_bytes"]
    assert simulated["forward_peak"] == truth["forward_peak"]
    assert simulated["held_after_forward"] == truth["held_after_forward"]


class _Linear(nn.Module):
    def __init__(self, matmul: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64))
        self.matmul = matmul

    def forward(self, x):
        return x @ self.w if self.matmul else x * self.w[0]


@pytest.mark.parametrize("hardware, per_thread", [("H100", 32 << 20), ("H200", 32 << 20), ("A100", 8320 << 10)])
def test_cublas_keeps_a_workspace_for_each_thread_that_ran_a_matmul(hardware, per_thread):
    """NOTE [CUDA memory that is no tensor], Rule 1: H100 measured 33,554,432 bytes on the forward thread and
    as many on autograd's backward thread; other GPUs get torch's default of 8.125 MiB."""
    x = torch.randn(8, 64, requires_grad=True)
    prof = remat.profile(_Linear(True), x, mode="fake", device="cuda", hardware=hardware)
    assert prof.at_peak.workspaces_bytes == 2 * per_thread
    none = remat.profile(_Linear(False), x, mode="fake", device="cuda", hardware=hardware)
    assert none.at_peak.workspaces_bytes == 0 and prof.peak_bytes - none.peak_bytes >= 2 * per_thread
    assert "library workspaces (cuBLAS)" in str(prof) and "library workspaces" not in str(none)
    assert remat.profile(_Linear(True), x, mode="fake").at_peak.workspaces_bytes == 0  # a CPU step has none


ZOO_TRUTH = json.loads((FACTS / "zoo_truth.json").read_text())["models"]
AS_MEASURED = {"demo": zoo.gpt2}
"""The H100 measured `zoo.demo` when it was `zoo.gpt2()` at its default batch of 8 (it is batch 4 since 2026-11-27)."""
ZOO = sorted(ZOO_TRUTH)
"""BERT was 3.0% low until 2026-11-27: the staging buffer of its bias gradients' sums (Rule 6), 10 MiB."""


def simulated_step(name: str, loop: str) -> remat.StepProfile:
    """The zoo model `name` as the H100 measured it, its step (Adam) predicted in fake mode for an H100; `loop`
    "held" keeps the output through backward, "loss" only the loss."""
    built = AS_MEASURED.get(name, getattr(zoo, name))()
    return remat.profile(
        built[0],
        built[1],
        built[2] if len(built) > 2 else None,
        optimizer=torch.optim.Adam,
        mode="fake",
        device="cuda",
        hardware="H100",
        keep_output=loop == "held",
    )


@pytest.mark.parametrize("loop", ["held", "loss"])
@pytest.mark.parametrize("name", ZOO)
def test_each_zoo_models_steady_step_is_predicted_within_two_percent_of_the_h100(name, loop):
    prof = simulated_step(name, loop)
    truth = ZOO_TRUTH[name][loop]["peak"]
    assert abs(prof.peak_bytes - truth) <= MODEL_TOLERANCE * truth, (prof.peak_bytes, truth)


def test_the_cublas_workspace_is_sized_as_torch_sizes_it(monkeypatch):
    """Rule 1: torch's default per thread (32 MiB on sm90, ":4096:2:16:8" elsewhere), or CUBLAS_WORKSPACE_CONFIG."""
    from remat.measure.device.cuda_workspaces import cublas_workspace_bytes

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cublas_workspace_bytes("sm90") == 33554432 == OP_FACTS_CUBLAS
    assert cublas_workspace_bytes("sm80") == (4096 * 2 + 16 * 8) * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic runs set
    assert cublas_workspace_bytes("sm80") == 4096 * 8 * 1024
    x = torch.randn(8, 64, requires_grad=True)
    prof = remat.profile(_Linear(True), x, mode="fake", device="cuda", hardware="A100")
    assert prof.at_peak.workspaces_bytes == 2 * 4096 * 8 * 1024


OP_FACTS_CUBLAS = json.loads((FACTS / "op_facts.json").read_text())["cublas_forward_thread_bytes"]


def test_a_weight_broadcast_over_a_batched_matmul_is_not_copied():
    """F.linear on a non-contiguous 3-D input runs as `bmm` with the weight expanded over the batch (stride 0), and
    torch hands cuBLAS that batch stride as it is (`prepare_batch_matrix_for_cublas` clones only an operand with a
    stride-0 row or column).  Counted as a dense copy, the input projection of nn.MultiheadAttention in a SigLIP
    classifier's head with LoRA was predicted 441 MiB of kernel scratch (196 x 768 x 1536 bf16) it never takes."""
    from remat.measure.device.cuda_workspaces import op_workspace_bytes

    x, weight = torch.randn(196, 16, 768), torch.randn(768, 1536)
    threads = 132 * 2048
    assert op_workspace_bytes("bmm", (x, weight.expand(196, 768, 1536)), {}, "sm90", threads) == 0
    mask = torch.randn(1, 16, 1536).expand(196, 16, 1536)  # baddbmm's added input: copied into the output
    assert op_workspace_bytes("baddbmm", (mask, x, weight.expand(196, 768, 1536)), {}, "sm90", threads) == 0
    column = torch.randn(196, 768, 1).expand(196, 768, 1536)  # a stride-0 column: cuBLAS cannot read it
    assert op_workspace_bytes("bmm", (x, column), {}, "sm90", threads) == 196 * 768 * 1536 * 4
    summed = torch.ones(()).expand(64, 16)  # a sum's gradient reaching mm: copied dense (Rule 2)
    assert op_workspace_bytes("mm", (summed, torch.randn(16, 8)), {}, "sm90", threads) == 64 * 16 * 4
