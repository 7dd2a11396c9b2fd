"""NOTE [The budget is the GPU's memory]: the verdict of a CUDA step capped at its budget, from numbers (no GPU
needed), the runner's options for it, CPU `remat.verify` untouched, and the real thing where a GPU is lent."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import remat
from remat import zoo
from remat.types.capped import (
    EXPANDABLE,
    EXPANDABLE_FIX,
    FRESH_PROCESS,
    THIS_PROCESS,
    CappedStep,
    CudaCheck,
    device_full,
    judge_cap,
    needs_expandable_rerun,
    needs_uncapped_run,
    parse_oom,
)
from remat.types.verification import VerifyReport
from remat.measure.loop import Loop
from remat.measure.step import run_user_code
from remat.verifier.cuda_cap import (
    _built,
    _cannot_save,
    _fresh_run,
    _planned_runs,
    _runner_optimizer,
    check_runner_args,
    out_of_memory,
    with_expandable,
)
from remat.verifier.process import (
    UNLOADABLE_EXIT,
    Unloadable,
    alloc_env,
    device_options,
    run_measuring,
    runner_parser,
)

GiB = 1 << 30
MiB = 1 << 20

# BERT's 65% plan on an H100 (2026-11-26): its allocated peak 17% under its 12.41 GiB budget, and under a cap of that
# budget it asked for a 1.86 GiB block with 12.06 GiB in use (allocated 9.80 GiB, 2.26 GiB reserved but unallocated).
BERT_BUDGET = round(12.41 * GiB)
BERT_ALLOCATED = round(0.83 * BERT_BUDGET)
BERT_OOM = (
    "CUDA out of memory. Tried to allocate 1.86 GiB. GPU 0 has a total capacity of 79.19 GiB of which 64.73 GiB is "
    "free. Including non-PyTorch memory, this process has 12.58 GiB memory in use. 12.41 GiB allowed; Of the "
    "allocated memory 9.80 GiB is allocated by PyTorch, and 2.26 GiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html)"
)
BERT_CAPPED = CappedStep(out_of_memory=BERT_OOM, cap_bytes=BERT_BUDGET)


def test_torchs_out_of_memory_message_is_read_in_bytes():
    f = parse_oom(BERT_OOM)
    assert f.tried == round(1.86 * GiB) and f.allowed == BERT_BUDGET and f.free == round(64.73 * GiB)
    assert f.allocated == round(9.80 * GiB) and f.unallocated == round(2.26 * GiB)
    assert f.in_use == round(9.80 * GiB) + round(2.26 * GiB)
    small = parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB. Of the allocated memory 512 bytes is "
        "allocated by PyTorch, and 1,024.00 KiB is reserved by PyTorch but unallocated."
    )
    assert (small.tried, small.allocated, small.unallocated, small.allowed) == (20 * MiB, 512, 1 << 20, None)
    assert parse_oom("something else").in_use is None


def test_bert_allocated_under_its_budget_but_out_of_memory_is_not_ok_and_the_fix_is_expandable_segments():
    """The H100's case before the rerun: the allocated peak fits, the allocator's reserve does not."""
    assert needs_expandable_rerun(BERT_BUDGET, BERT_CAPPED)
    v = judge_cap(BERT_BUDGET, BERT_ALLOCATED, BERT_CAPPED)
    assert not v.ok and v.allocator == ""
    assert "asked for 1.86 GiB with 12.06 GiB of 12.41 GiB in use" in v.message, v.message
    assert "9.80 GiB allocated, 2.26 GiB reserved but unallocated" in v.message, v.message
    assert "17% under the budget" in v.message, v.message
    assert (
        EXPANDABLE_FIX in v.fix
        and "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch is imported" in v.fix
    )


def test_the_budget_holds_with_expandable_segments_when_their_rerun_runs():
    rerun = CappedStep(round(10.3 * GiB), round(10.5 * GiB), alloc_conf=EXPANDABLE, cap_bytes=BERT_BUDGET)
    assert not needs_uncapped_run(BERT_BUDGET, BERT_CAPPED, rerun)
    v = judge_cap(BERT_BUDGET, BERT_ALLOCATED, BERT_CAPPED, rerun)
    assert v.ok and v.allocator == EXPANDABLE and EXPANDABLE_FIX in v.fix, v
    assert "with the default allocator it ran out of memory" in v.message and "it ran: reserved 10.50 GiB" in v.message


def test_when_neither_allocator_holds_the_fix_is_a_lower_budget_by_reserved_minus_budget():
    rerun = CappedStep(
        out_of_memory=BERT_OOM.replace("1.86 GiB", "1.20 GiB"), alloc_conf=EXPANDABLE, cap_bytes=BERT_BUDGET
    )
    assert needs_uncapped_run(BERT_BUDGET, BERT_CAPPED, rerun)
    measured = judge_cap(BERT_BUDGET, BERT_ALLOCATED, BERT_CAPPED, rerun, uncapped_reserved=round(13.5 * GiB))
    assert not measured.ok and measured.shortfall_bytes == round(13.5 * GiB) - BERT_BUDGET
    assert "needs a budget 1.09 GiB lower (reserved minus budget)" in measured.fix, measured.fix
    assert (
        "plan again for 11.32 GiB or less" in measured.fix and "expandable_segments:True it ran out" in measured.message
    )
    # without a run that has no cap: what was reserved plus the block asked for, minus the budget, at least
    least = judge_cap(BERT_BUDGET, BERT_ALLOCATED, BERT_CAPPED, rerun)
    assert least.shortfall_bytes == round(9.80 * GiB) + round(2.26 * GiB) + round(1.86 * GiB) - BERT_BUDGET
    assert "at least 1.51 GiB lower" in least.fix, least.fix


def test_a_step_that_runs_under_its_cap_holds_with_the_default_allocator():
    ran = CappedStep(round(9.0 * GiB), round(9.5 * GiB), cap_bytes=BERT_BUDGET)
    assert not needs_expandable_rerun(BERT_BUDGET, ran) and not needs_uncapped_run(BERT_BUDGET, ran, None)
    v = judge_cap(BERT_BUDGET, ran.allocated_bytes, ran)
    assert v.ok and v.allocator == "default allocator" and v.fix == "" and "reserved 9.50 GiB" in v.message
    # not capped (a budget over the GPU's memory) and reserved over it: the rerun is due, as after running out
    over = CappedStep(round(12.0 * GiB), round(12.9 * GiB))
    assert needs_expandable_rerun(BERT_BUDGET, over) and not needs_uncapped_run(BERT_BUDGET, over, None)
    v = judge_cap(BERT_BUDGET, over.allocated_bytes, over, CappedStep(out_of_memory=BERT_OOM, alloc_conf=EXPANDABLE))
    assert not v.ok and v.shortfall_bytes == round(12.9 * GiB) - BERT_BUDGET and "over the budget" in v.message


def test_an_allocated_peak_over_the_budget_needs_a_lower_budget_not_another_allocator():
    v = judge_cap(BERT_BUDGET, round(13 * GiB), BERT_CAPPED)
    assert not v.ok and EXPANDABLE not in v.fix and "needs a budget at least" in v.fix, v.fix
    # a process already on expandable segments is not rerun with them
    on = CappedStep(out_of_memory=BERT_OOM, alloc_conf="max_split_size_mb:128,expandable_segments:True")
    assert on.expandable and not needs_expandable_rerun(BERT_BUDGET, on)
    assert "lower" in judge_cap(BERT_BUDGET, BERT_ALLOCATED, on).fix


def test_no_budget_is_not_capped_and_is_ok_where_the_step_ran():
    assert judge_cap(None, 5, CappedStep(5, 6)).ok and not needs_expandable_rerun(None, CappedStep(out_of_memory="x"))
    assert not judge_cap(None, 5, CappedStep(out_of_memory="CUDA out of memory. Tried")).ok


def test_a_run_in_this_process_judges_the_step_without_what_the_process_held_besides():
    held = round(2 * GiB)
    oom = BERT_OOM.replace("9.80 GiB is allocated", "11.80 GiB is allocated").replace(
        "12.41 GiB allowed", "14.41 GiB allowed"
    )
    here = CappedStep(out_of_memory=oom, cap_bytes=BERT_BUDGET, held_bytes=held)
    v = judge_cap(BERT_BUDGET, BERT_ALLOCATED, here)
    assert "with 12.06 GiB of 12.41 GiB in use" in v.message, v.message


def test_a_gpu_full_of_other_processes_is_not_blamed_on_the_budget():
    full = BERT_OOM.replace("of which 64.73 GiB is free", "of which 512.00 MiB is free").replace(
        "9.80 GiB is allocated", "4.00 GiB is allocated"
    )
    step = CappedStep(out_of_memory=full, cap_bytes=BERT_BUDGET)
    assert device_full(step) and not device_full(BERT_CAPPED)
    v = judge_cap(BERT_BUDGET, BERT_ALLOCATED, step)
    assert not v.ok and "the GPU itself had only 512.00 MiB free" in v.message and "the GPU was full" in v.fix, v


def test_the_loops_user_code_error_is_read_as_torchs_out_of_memory():
    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    with pytest.raises(remat.RematError) as info:
        run_user_code("the model's forward", oom)
    assert out_of_memory(info.value) == "CUDA out of memory. Tried to allocate 2.00 GiB."
    other = remat.RematError("remat: something else")
    with pytest.raises(remat.RematError, match="something else"):
        out_of_memory(other)


def test_the_runs_after_the_capped_one_are_the_ones_the_note_asks_for():
    """Rule 3's rerun only where the default allocator did not hold; Rule 4's run without a cap only where nothing
    held; none of them in this process, whose allocator's settings are fixed."""
    calls = []

    def fake(results):
        def run(planned, cap, conf):
            calls.append((planned, cap, conf))
            step = results[(cap is not None, conf is not None)]
            return step, (None if not step.ran else 1)

        return run

    ran = CappedStep(1, 2)
    calls.clear()
    runs, peak = _planned_runs(fake({(True, False): ran}), 10, here=False)
    assert calls == [(True, 10, None)] and runs["expandable"] is None and peak == 1
    calls.clear()
    runs, _ = _planned_runs(fake({(True, False): BERT_CAPPED, (True, True): ran}), 10, here=False)
    assert [c[2] is not None for c in calls] == [False, True] and runs["expandable"] is ran and runs["uncapped"] is None
    calls.clear()
    runs, peak = _planned_runs(
        fake({(True, False): BERT_CAPPED, (True, True): BERT_CAPPED, (False, False): ran}), 10, here=False
    )
    assert calls[-1] == (True, None, None) and runs["uncapped"] is ran and peak == 1
    calls.clear()
    runs, _ = _planned_runs(fake({(True, False): BERT_CAPPED, (False, False): ran}), 10, here=True)
    assert [c[1:] for c in calls] == [(10, None), (None, None)] and runs["expandable"] is None


def test_a_saved_step_loads_in_a_fresh_interpreter_or_says_it_cannot(tmp_path):
    model, x = zoo.mlp_report000(hidden=32, intermediate=64, layers=2, seq=4, batch=2)
    remat.profile(model, x)  # what verify ran before saving leaves nothing torch.save cannot write
    plan_path = tmp_path / "plan.json"
    run, where, why = _fresh_run(
        model, (x, None, torch.optim.Adam), Loop(), ("cpu", str(plan_path), str(tmp_path)), None
    )
    assert run is not None and (where, why) == (FRESH_PROCESS, "")
    args = _args("--saved", str(tmp_path / "step.pt"), "--device", "cuda")
    loaded, inputs, loss_fn, opt = _built(args)
    assert isinstance(opt, torch.optim.Adam) and torch.equal(inputs, x) and loss_fn is None
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in model.named_parameters()]
    _, _, why = _fresh_run(model, (x, None, lambda ps: torch.optim.Adam(ps)), Loop(), ("cpu", "p", str(tmp_path)), None)
    assert why.startswith("torch.save cannot save it"), why
    torch.save({"model": _Local(), "inputs": x, "loss_fn": None, "optimizer": None}, tmp_path / "local.pt")
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit) as info:
        mp.delattr(sys.modules[_Local.__module__], "_Local")  # as a fresh interpreter that cannot import it sees it
        _built(_args("--saved", str(tmp_path / "local.pt"), "--device", "cuda"))
    assert info.value.code == UNLOADABLE_EXIT


def test_the_runners_own_refusal_and_a_model_it_cannot_load_reach_the_caller():
    refuse = [sys.executable, "-c", "import sys; print('remat: no. Fix: yes.', file=sys.stderr); sys.exit(2)"]
    with pytest.raises(remat.RematError, match="^remat: no. Fix: yes.$"):
        run_measuring(refuse, {})
    with pytest.raises(Unloadable):
        run_measuring([sys.executable, "-c", f"import sys; sys.exit({UNLOADABLE_EXIT})"], {})


def _report(cuda: CudaCheck | None) -> VerifyReport:
    return VerifyReport(
        grad_max_abs_diff={"w": 0.0},
        tolerance=0.0,
        buffers_equal=True,
        unplanned_peak_bytes=round(15 * GiB),
        measured_peak_bytes=BERT_ALLOCATED,
        predicted_peak_bytes=BERT_ALLOCATED,
        measured_recompute_flops=7,
        predicted_recompute_flops=7,
        budget_bytes=BERT_BUDGET,
        independent_peak_bytes=None,
        cuda=cuda,
    )


def test_the_report_is_not_ok_says_what_torch_said_and_names_the_fix():
    unplanned = CappedStep(round(15 * GiB), round(16 * GiB))
    check = CudaCheck(FRESH_PROCESS, round(79.19 * GiB), BERT_BUDGET, BERT_CAPPED, unplanned=unplanned)
    report = _report(check)
    assert _report(None).ok and not report.ok
    text = " ".join(str(report).split())  # the verdict's lines are wrapped at the report's width
    assert "CUDA step, capped at the budget" in text and "out of memory" in text, text
    assert "CUDA, fresh process: with the default allocator it ran out of memory" in text, text
    assert "torch: CUDA out of memory. Tried to allocate 1.86 GiB." in text and "If reserved but" not in text, text
    assert "Fix: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch is imported" in text, text
    assert "without the plan, no cap: reserved" in text and "16.0 GiB" in text, text
    rerun = CappedStep(round(10.3 * GiB), round(10.5 * GiB), alloc_conf=EXPANDABLE, cap_bytes=BERT_BUDGET)
    held = _report(dataclasses.replace(check, expandable=rerun))
    assert held.ok and held.cuda_verdict.allocator == EXPANDABLE, str(held)
    assert "expandable_segments:True, capped: reserved" in str(held)
    here = _report(dataclasses.replace(check, where=THIS_PROCESS, why_here="its class Net is defined in __main__"))
    assert "CUDA, this process, after empty_cache (its class Net is defined in __main__)" in " ".join(str(here).split())
    json.dumps(dataclasses.asdict(held))  # the report's fields stay JSON


def _args(*argv: str):
    return runner_parser().parse_args(list(argv))


def test_the_runners_cuda_options_parse():
    args = _args("remat.zoo:mlp_report000", "--device", "cuda", "--budget-bytes", "123", "--alloc-conf", EXPANDABLE)
    assert (args.device, args.budget_bytes, args.alloc_conf, args.device_fraction) == ("cuda", 123, EXPANDABLE, None)
    check_runner_args(args, cuda_available=True)
    check_runner_args(_args("--saved", "f.pt", "--device", "cuda:0", "--device-fraction", "0.5"), cuda_available=True)
    check_runner_args(_args("remat.zoo:mlp_report000"), cuda_available=False)  # the CPU runner as before
    assert device_options("cuda:0", 123, EXPANDABLE) == [
        "--device",
        "cuda:0",
        "--budget-bytes",
        "123",
        "--alloc-conf",
        EXPANDABLE,
    ]
    assert device_options(None, None, None) == [] and alloc_env(None) == {}
    assert alloc_env(EXPANDABLE) == {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE, "PYTORCH_ALLOC_CONF": EXPANDABLE}
    assert with_expandable("") == EXPANDABLE
    assert with_expandable("max_split_size_mb:128,expandable_segments:False") == f"max_split_size_mb:128,{EXPANDABLE}"


@pytest.mark.parametrize(
    "argv, cuda, words",
    [
        (("T", "--device-fraction", "0.5"), True, "--device-fraction is for a CUDA step"),
        (("T", "--budget-bytes", "100"), True, "--budget-bytes is for a CUDA step"),
        (("T", "--alloc-conf", EXPANDABLE), True, "--alloc-conf is for a CUDA step"),
        (("--saved", "f.pt"), True, "--saved is for a CUDA step"),
        (("T", "--device", "cuda", "--device-fraction", "1.5"), True, "in (0, 1]; saw 1.5"),
        (("T", "--device", "cuda", "--device-fraction", "0.5", "--budget-bytes", "9"), True, "both set the cap"),
        (("T", "--device", "cuda", "--budget-bytes", "0"), True, "more than 0; saw 0"),
        (("T", "--device", "cuda", "--alloc-conf", "expandable"), True, "key:value"),
        (("T", "--device", "cuda", "--budget-bytes", "9"), False, "has no CUDA device"),
        (("T", "--device", "mps"), True, "cpu or cuda"),
        ((), True, "saw neither"),
        (("T", "--saved", "f.pt", "--device", "cuda"), True, "saw both"),
    ],
)
def test_the_runners_options_are_refused_where_they_make_no_sense(argv, cuda, words):
    with pytest.raises(remat.RematError) as info:
        check_runner_args(_args(*argv), cuda_available=cuda)
    message = str(info.value)
    assert message.startswith("remat: ") and words in message and "Fix:" in message, message


def test_the_runner_refuses_a_fraction_on_a_cpu_target_with_a_remat_error():
    cmd = [sys.executable, "-m", "remat.verifier.process", "remat.zoo:mlp_report000", "--device-fraction", "0.5"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "RESULT" not in done.stdout, done
    refusal = [line for line in done.stderr.splitlines() if line.startswith("remat: ")]  # after runpy's warning
    assert refusal and refusal[0].startswith("remat: --device-fraction is for a CUDA step"), done.stderr


class _Local(nn.Module):  # importable as tests' module, not as __main__
    def forward(self, x):
        return x


def test_which_models_a_fresh_interpreter_can_rebuild():
    from remat.cli.common import OPTIMIZERS

    assert [_runner_optimizer(OPTIMIZERS[n]) for n in ("adam", "sgd", "none")] == ["adam", "sgd", "none"]
    assert _runner_optimizer(torch.optim.Adam) is None and _runner_optimizer(lambda ps: None) is None
    assert _cannot_save(_Local()) == ""
    main = type("Net", (nn.Module,), {"__module__": "__main__", "forward": lambda self, x: x})()
    assert "its class Net is defined in __main__" in _cannot_save(main)


def test_verify_on_the_cpu_has_no_cuda_runs():
    model, x = zoo.mlp_report000(hidden=64, intermediate=256, layers=4, seq=64, batch=8)
    prof = remat.profile(model, x)
    report = remat.verify(model, x, remat.plan(prof, remat.frontier(prof)[-1].peak_bytes), time_rounds=0)
    assert report.cuda is None and report.cuda_verdict is None
    assert "CUDA" not in str(report), str(report)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the cap is the CUDA caching allocator's")
def test_on_a_gpu_verify_runs_the_planned_step_capped_at_its_budget_in_a_fresh_process():
    from remat.verifier.process import step_peak_bytes

    torch.manual_seed(0)
    model, x = zoo.chain_report001(width=1024, blocks=16, batch=1024)
    model, x = model.cuda(), x.cuda()
    prof = remat.profile(model, x, optimizer=torch.optim.Adam)
    plan = remat.plan(prof, 0.8)
    report = remat.verify(model, x, plan, optimizer=torch.optim.Adam, time_rounds=0)
    cuda = report.cuda
    assert cuda is not None and cuda.where == FRESH_PROCESS, (cuda, str(report))
    assert cuda.unplanned is not None and cuda.unplanned.ran and cuda.unplanned.reserved_bytes > 0
    assert cuda.capped.cap_bytes == plan.budget_bytes
    if cuda.capped.ran:
        assert cuda.capped.allocated_bytes <= cuda.capped.reserved_bytes <= plan.budget_bytes, str(report)
    assert report.cuda_verdict.ok == (cuda.capped.ran or (cuda.expandable is not None and cuda.expandable.ran))
    assert report.independent_counter.endswith("(fresh process)") or report.independent_peak_bytes is None
    # a budget far under the step runs out of memory under its cap, with torch's numbers, and is not ok
    tiny = dataclasses.replace(plan, budget_bytes=plan.budget_bytes // 8)
    squeezed = remat.verify(model, x, tiny, optimizer=torch.optim.Adam, time_rounds=0)
    assert not squeezed.cuda.capped.ran and not squeezed.ok, str(squeezed)
    assert parse_oom(squeezed.cuda.capped.out_of_memory).tried is not None
    assert squeezed.cuda_verdict.shortfall_bytes > 0 and "lower" in squeezed.cuda_verdict.fix, str(squeezed)
    # the TARGET path: the runner itself, capped
    peak = step_peak_bytes("remat.zoo:mlp_report000", device="cuda", budget_bytes=8 * GiB)
    assert peak.out_of_memory == "" and 0 < peak.allocated_peak_bytes <= peak.reserved_peak_bytes <= 8 * GiB
    tight = step_peak_bytes("remat.zoo:mlp_report000", device="cuda", budget_bytes=MiB, alloc_conf=EXPANDABLE)
    assert tight.out_of_memory.startswith("CUDA out of memory"), tight
