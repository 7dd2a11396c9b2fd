"""The `remat` command line, called through `remat.cli.main` (no subprocess, CPU only)."""

from __future__ import annotations

import logging
import re
import textwrap

import pytest
import torch

import remat
from remat._torch_compat import FakeTensor
from remat.cli import main, pareto
from remat.errors import RematError
from remat.target import load_target

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TARGET_SOURCE = """
import torch
import torch.nn as nn

SIZE = 32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(SIZE, 64), nn.ReLU(), nn.Linear(64, SIZE))

    def forward(self, x):
        return self.layers(x)


def make():
    torch.manual_seed(0)
    return Net(), torch.randn(16, SIZE)


def make_with_loss():
    torch.manual_seed(0)
    y = torch.randn(16, SIZE)
    return Net(), torch.randn(16, SIZE), lambda out: ((out - y) ** 2).mean()


def bare():
    return Net()


def four():
    return Net(), torch.randn(2, SIZE), None, 1


def not_a_module():
    return torch.randn(2), torch.randn(2)


def bad_loss():
    return Net(), torch.randn(2, SIZE), "mse"


def boom():
    raise ValueError("no weights here")


def needs_arg(n):
    return Net(), torch.randn(n, SIZE)


def data_dependent():  # fake tensors have no values, so this needs a real build
    torch.manual_seed(0)
    scale = float(torch.rand(1)) + 1.0
    return Net(), torch.randn(16, SIZE) * scale


class Padded(nn.Module):  # as Longformer: a branch on the padding mask, a selection by the ids
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, SIZE)
        self.body = nn.Sequential(nn.Linear(SIZE, 64), nn.GELU(), nn.Linear(64, SIZE))
        self.pad = nn.Sequential(nn.Linear(SIZE, 512), nn.GELU(), nn.Linear(512, SIZE))

    def forward(self, ids, mask, labels):
        h = self.emb(ids)
        if not bool((mask == 1).all()):
            h = self.pad(h * mask[..., None])
        return (self.body(h)[labels >= 4] ** 2).mean()


def padded():  # the ids and labels are views of one tensor, as a causal LM's shifted labels
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (8, 257))
    mask = torch.ones(8, 256, dtype=torch.long)
    mask[:, 200:] = 0
    return Padded(), (tokens[:, :-1], mask, tokens[:, 1:]), lambda out: out


def mlp_chain():  # activations dominate: something to plan
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(512, 64)


def wide_chain():  # a step large enough for the process's counter to judge (64 MiB and more)
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(12288, 256)
"""


@pytest.fixture
def target_file(tmp_path):
    path = tmp_path / "target.py"
    path.write_text(textwrap.dedent(TARGET_SOURCE))
    (tmp_path / "syntax_error.py").write_text("x = (\n")
    (tmp_path / "bad_import.py").write_text("import remat_no_such_package_xyz\n\ndef make():\n    pass\n")
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- remat profile ---------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["make", "make_with_loss"])
def test_profile_a_file_target(capsys, target_file, factory):
    code, out, err = run(capsys, "profile", f"{target_file}:{factory}")
    assert code == 0, err
    assert out.startswith("remat profile of Net: real mode on cpu")
    assert "Memory by category" in out and "layers.0" in out


def test_profile_a_module_target(capsys):
    code, out, err = run(capsys, "profile", "remat.zoo:mlp_report000", "--top", "3")
    assert code == 0, err
    assert "remat profile of FeedForward" in out
    assert "Top 3 of" in out


def test_world_size_predicts_one_rank_and_plans_it(capsys):
    """Issue 14: --world-size N with --mode fake predicts one FSDP2 rank of N from this process (its shard of the
    parameters, the gathered ones as a row of their own); with --mode real it is a `remat:` error (rc 2)."""
    code, out, err = run(capsys, "profile", "remat.zoo:gpt2", "--mode", "fake", "--world-size", "4")
    assert code == 0, err
    assert out.startswith("remat profile of GPT2LMHeadModel: fake mode on cpu, one rank of 4 (FSDP2)")
    assert re.search(r"gathered parameters \(FSDP\) +\d+\.\d MiB", out) and "predicted for one rank of 4" in out
    code, out, err = run(capsys, "plan", "remat.zoo:gpt2", "--mode", "fake", "--world-size", "4", "--budget", "0.8")
    assert code == 0, err
    assert "sharded with FSDP2: each checkpoint wraps one module" in out
    # for a CUDA rank the plan's reserve is not replayed (remat.apply refused the sharded copy: rc 2 before)
    code, out, err = run(
        capsys, "plan", "remat.zoo:gpt2", "--mode", "fake", "--device", "cuda", "--world-size", "2", "--budget", "0.8"
    )
    assert code == 0, err
    assert "note: The GPU reserve of this plan for one rank of a job is not checked" in out
    code, out, err = run(capsys, "profile", "remat.zoo:gpt2", "--world-size", "4")
    assert code == 2 and err.startswith(
        "remat: --world-size 4 predicts one rank of 4 in fake mode; saw --mode real. Fix: pass --mode fake"
    )  # the library's words as the CLI's flags


def test_profile_json_round_trips(capsys, target_file, tmp_path):
    path = tmp_path / "profile.json"
    code, out, _ = run(capsys, "profile", f"{target_file}:make", "--json", path)
    assert code == 0
    assert f"wrote the profile as JSON to {path}" in out
    text = path.read_text()
    prof = remat.StepProfile.from_json(text)
    assert prof.to_json() == text
    assert out.startswith(str(prof))


def test_profile_json_equals_the_library_result_in_fake_mode(capsys, target_file, tmp_path):
    path = tmp_path / "profile.json"
    code, _, _ = run(capsys, "profile", f"{target_file}:make", "--mode", "fake", "--json", path)
    assert code == 0
    model, inputs, loss_fn = load_target(f"{target_file}:make", fake=True)
    expected = remat.profile(model, inputs, loss_fn, optimizer=lambda ps: torch.optim.Adam(ps), mode="fake")
    assert remat.StepProfile.from_json(path.read_text()) == expected


def test_profile_fake_mode(capsys, target_file):
    code, out, err = run(capsys, "profile", f"{target_file}:make", "--mode", "fake")
    assert code == 0, err
    assert "fake mode on cpu" in out
    assert err == ""


def test_profile_fake_simulated_cuda(capsys):
    code, out, _ = run(capsys, "profile", "remat.zoo:mlp_report000", "--mode", "fake", "--device", "cuda")
    assert code == 0
    assert "fake mode on cuda" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_profile_real_on_cuda_without_a_gpu_is_an_error(capsys, target_file):
    code, out, err = run(capsys, "profile", f"{target_file}:make", "--device", "cuda")
    assert code == 2 and out == ""
    assert err.startswith("remat: --device cuda with --mode real") and "--mode fake --device cuda" in err


@pytest.mark.parametrize("optimizer, has_state", [("adam", True), ("sgd", False), ("none", False)])
def test_profile_optimizer_choice(capsys, target_file, tmp_path, optimizer, has_state):
    path = tmp_path / "p.json"
    code, _, _ = run(
        capsys, "profile", f"{target_file}:make", "--mode", "fake", "--optimizer", optimizer, "--json", path
    )
    assert code == 0
    prof = remat.StepProfile.from_json(path.read_text())
    assert (prof.optimizer_bytes > 0) == has_state
    assert ("optimizer" in prof.timeline.phases) == (optimizer != "none")


def test_profile_plot(capsys, target_file, tmp_path):
    path = tmp_path / "timeline.png"
    code, out, _ = run(capsys, "profile", f"{target_file}:make", "--plot", path)
    assert code == 0
    assert f"wrote the memory timeline plot to {path}" in out
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_unwritable_output_is_a_remat_error(capsys, target_file, tmp_path):
    code, _, err = run(capsys, "profile", f"{target_file}:make", "--json", tmp_path / "no" / "such" / "p.json")
    assert code == 2
    assert err.startswith("remat: could not write the profile as JSON")


BAD_TARGETS = [
    ("{dir}/target.py", "no colon"),
    ("{dir}/target.py:", "nothing on one side of the colon"),
    ("{dir}/missing.py:make", "does not exist"),
    ("remat_no_such_module_xyz:make", "cannot be imported: ModuleNotFoundError"),
    ("{dir}/syntax_error.py:make", "SyntaxError"),
    ("{dir}/bad_import.py:make", "ModuleNotFoundError: No module named 'remat_no_such_package_xyz'"),
    ("{dir}/target.py:nope", "Callables it defines: make, make_with_loss"),
    ("remat.zoo:nope", "Callables it defines: gpt2"),
    ("{dir}/target.py:SIZE", "is not callable (its type is int)"),
    ("{dir}/target.py:needs_arg", "requires arguments (n)"),
    ("{dir}/target.py:boom", "raised ValueError: no weights here (at target.py:"),
    ("{dir}/target.py:bare", "returned a bare model (Net)"),
    ("{dir}/target.py:four", "returned a 4-tuple"),
    ("{dir}/target.py:not_a_module", "a tensor of shape (2,) as its first element"),
    ("{dir}/target.py:bad_loss", "a str as loss_fn"),
]


@pytest.mark.parametrize("spec, expected", BAD_TARGETS, ids=[s for s, _ in BAD_TARGETS])
def test_bad_target_exits_2_with_a_remat_message(capsys, target_file, spec, expected):
    code, out, err = run(capsys, "profile", spec.format(dir=target_file.parent))
    assert code == 2
    assert out == ""
    assert err.startswith("remat:") and "Traceback" not in err
    assert expected in err
    assert "Fix:" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["profile"],
        ["profile", "x:y", "--mode", "imaginary"],
        ["profile", "x:y", "--top", "-1"],
        ["profile", "x:y", "--device", "not-a-device"],
        [],
    ],
)
def test_argparse_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"remat {remat.__version__}")


def test_main_leaves_no_logging_handler_behind(capsys, target_file):
    before = list(logging.getLogger("remat").handlers)
    run(capsys, "profile", f"{target_file}:boom")
    assert logging.getLogger("remat").handlers == before


# -- remat plan ------------------------------------------------------------------------------------

FAKE = ("--mode", "fake", "--optimizer", "none")


def _library_profile(spec: str) -> remat.StepProfile:
    model, inputs, loss_fn = load_target(spec, fake=True)
    return remat.profile(model, inputs, loss_fn, optimizer=None, mode="fake")


def test_plan_prints_the_plan_beside_the_hand_recipes(capsys, target_file):
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.8", *FAKE)
    assert code == 0, err
    assert out.startswith("remat plan for Sequential (dp): predicted peak")
    assert "checkpoints (one per row)" in out and "the same step with hand recipes" in out
    table = out[out.index("the same step with hand recipes") :].splitlines()[4:]  # title, blank, header, rule
    strategies = [line.split()[0] for line in table if line.strip()]
    assert strategies[:3] == ["remat", "every-block", "chen"]
    assert len(strategies) == 4 and strategies[3].startswith("checkpoint_sequential(")  # the best-fitting k only


def test_plan_out_round_trips_and_equals_the_library_result(capsys, target_file, tmp_path):
    path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "80%", "--out", path, *FAKE)
    assert code == 0
    assert f"wrote the plan as JSON to {path}" in out
    saved = remat.load_plan(path)
    assert saved == remat.plan(_library_profile(f"{target_file}:mlp_chain"), 0.8)
    assert saved.peak_bytes <= saved.budget_bytes and saved.segments
    assert out.startswith(str(saved).splitlines()[0])


def test_plan_reads_a_saved_profile(capsys, target_file, tmp_path):
    prof = _library_profile(f"{target_file}:mlp_chain")
    (tmp_path / "prof.json").write_text(prof.to_json())
    budget = prof.peak_bytes * 4 // 5
    code, out, err = run(
        capsys,
        "plan",
        tmp_path / "prof.json",
        "--budget",
        str(budget),
        "--solver",
        "ilp",
        "--out",
        tmp_path / "plan.json",
    )
    assert code == 0, err
    assert out.startswith("remat plan for Sequential (ilp)")
    assert remat.load_plan(tmp_path / "plan.json") == remat.plan(prof, budget, solver="ilp")


def test_plan_infeasible_budget_exits_2_with_the_least_budget(capsys, target_file):
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "1KiB", *FAKE)
    assert code == 2 and out == ""
    assert err.startswith("remat: no plan fits the budget of") and "Fix: give a budget of at least" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("budget", ["6 gigs", "1.5", "0", "-1GiB", "6XB"])
def test_plan_unreadable_budget_exits_2_before_running_the_step(capsys, target_file, budget):
    code, out, err = run(capsys, "plan", f"{target_file}:boom", f"--budget={budget}")  # boom would raise if run
    assert code == 2 and out == ""
    assert err.startswith("remat: cannot read the budget") and "Fix:" in err


def test_plan_without_a_budget_exits_2(capsys, target_file, tmp_path):
    code, _, err = run(capsys, "plan", f"{target_file}:mlp_chain", *FAKE)
    assert code == 2 and err.startswith("remat: `remat plan` needs a memory budget")
    code, _, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--frontier", "--out", tmp_path / "p.json")
    assert code == 2 and err.startswith("remat: --out")


def test_plan_bad_solver_and_unreadable_profile(capsys, target_file, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["plan", f"{target_file}:mlp_chain", "--budget", "0.5", "--solver", "rotor"])
    assert exc.value.code == 2
    capsys.readouterr()
    (tmp_path / "bad.json").write_text("{")
    code, _, err = run(capsys, "plan", tmp_path / "bad.json", "--budget", "0.5")
    assert code == 2 and err.startswith("remat: expected a remat.StepProfile JSON document")
    code, _, err = run(capsys, "plan", tmp_path / "missing.json", "--budget", "0.5")
    assert code == 2 and err.startswith("remat: could not read the profile")


def test_plan_frontier_table_and_plot(capsys, target_file, tmp_path):
    path = tmp_path / "frontier.png"
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--frontier", "--plot", path, *FAKE)
    assert code == 0, err
    assert out.startswith("remat frontier for Sequential:")
    plans = remat.frontier(_library_profile(f"{target_file}:mlp_chain"), max_points=256)
    shown = pareto(plans)  # the plot: a plan with the same FLOPs as another and a higher peak is not drawn
    assert all(
        any(q.peak_bytes <= p.peak_bytes and q.recompute_flops <= p.recompute_flops for q in shown) for p in plans
    )
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert len(rows) == len(plans) >= 3  # the table: every plan, with its ops re-run
    assert [int(r[5]) for r in rows] == [p.recompute_ops for p in plans]
    assert rows[0][1:6] == ["1.5", "MiB", "0.00", "0.0%", "0"] and rows[0][-1] == "0"  # keep everything
    assert f"wrote the frontier plot to {path}" in out
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_plan_with_budget_and_frontier_marks_the_cheapest_fitting_plan(capsys, target_file, tmp_path):
    code, out, _ = run(
        capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.8", "--frontier", "--plot", tmp_path / "f.png"
    )
    assert code == 0
    assert "remat plan for Sequential" in out and "remat frontier for Sequential" in out
    cheapest = [line.split() for line in out.splitlines() if line.rstrip().endswith(" cheapest")]
    assert len(cheapest) == 1
    planned = re.search(r"predicted peak ([\d.]+ MiB)", out).group(1).split()
    assert cheapest[0][1:3] == planned  # the row marked is the plan printed above it
    assert (tmp_path / "f.png").read_bytes().startswith(PNG_SIGNATURE)


# -- load_target ------------------------------------------------------------------------------


def test_load_target_fake_allocates_nothing(target_file):
    model, inputs, loss_fn = load_target(f"{target_file}:make", fake=True)
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    assert isinstance(inputs, FakeTensor) and loss_fn is None


def test_load_target_fake_keeps_the_values_of_ids_and_masks(target_file):
    """NOTE [Values a fake step can know], Rule 8: the parameters fake, the inputs' ids and masks real, with the values
    a real build gives them, and two views of one tensor still sharing one storage."""
    model, (ids, mask, labels), _ = load_target(f"{target_file}:padded", fake=True)
    _, (real_ids, real_mask, real_labels), _ = load_target(f"{target_file}:padded")
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    for got, real in ((ids, real_ids), (mask, real_mask), (labels, real_labels)):
        assert type(got) is torch.Tensor and torch.equal(got, real) and got.stride() == real.stride()
    assert ids.untyped_storage().data_ptr() == labels.untyped_storage().data_ptr()
    assert ids.untyped_storage().nbytes() == real_ids.untyped_storage().nbytes()


def test_profile_fake_mode_runs_a_step_that_reads_its_inputs_values(capsys, target_file, tmp_path):
    """The step branches on its padding mask and selects by its labels: `--mode fake` stopped there ("fake mode
    cannot run op aten._local_scalar_dense") where the library's fake mode, given real inputs, ran; now it
    predicts the real step's peak to the byte."""
    path = tmp_path / "profile.json"
    code, _, err = run(capsys, "profile", f"{target_file}:padded", "--mode", "fake", "--json", path)
    assert code == 0, err
    model, inputs, loss_fn = load_target(f"{target_file}:padded")
    real = remat.profile(model, inputs, loss_fn, optimizer=lambda ps: torch.optim.Adam(ps))
    assert remat.StepProfile.from_json(path.read_text()).peak_bytes == real.peak_bytes


def test_load_target_returns_the_loss_fn(target_file):
    model, inputs, loss_fn = load_target(f"{target_file}:make_with_loss")
    assert callable(loss_fn) and loss_fn(model(inputs)).item() > 0


def test_load_target_falls_back_to_a_real_build(target_file, caplog):
    with caplog.at_level(logging.WARNING, logger="remat.target"):
        model, inputs, _ = load_target(f"{target_file}:data_dependent", fake=True)
    assert not isinstance(next(model.parameters()), FakeTensor)
    assert "built it for real instead" in caplog.text


def test_fake_fallback_is_shown_by_the_cli(capsys, target_file):
    code, out, err = run(capsys, "profile", f"{target_file}:data_dependent", "--mode", "fake")
    assert code == 0 and "fake mode" in out
    assert err.startswith("remat: building") and "built it for real instead" in err


def test_load_target_error_type(target_file):
    with pytest.raises(RematError, match=r"^remat: "):
        load_target("no-colon")


# -- remat demo -------------------------------------------------------------------------------


def test_plan_verify_applies_and_checks_the_plan(capsys, target_file):
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.8", "--verify")
    assert code == 0, err
    assert "verify: the step with and without the plan" in out
    for check in ("gradients (max |diff|)", "buffers (BatchNorm stats)", "extra FLOPs (FlopCounterMode)"):
        line = next(line for line in out.splitlines() if check in line)
        assert line.rstrip().endswith("ok")


def test_plan_verify_needs_a_real_target(capsys, target_file):
    code, _, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.8", "--verify", *FAKE)
    assert code == 2 and err.startswith("remat: --verify runs the real step")


def test_plan_offloads_on_a_fake_gpu_step_when_told_the_link_speed(capsys):
    args = ["plan", "remat.zoo:gpt2", "--mode", "fake", "--device", "cuda", "--budget", "0.7"]
    code, out, _ = run(capsys, *args, "--offload-bandwidth", "1TB/s", "--device-flops", "1TFLOPs/s")
    assert code == 0
    assert "(offload: saved tensors in CPU memory until backward)" in out
    assert "offloaded to CPU memory and back" in out
    code, out, _ = run(capsys, *args[:-1], "0.8")  # at 0.7 no plan's replayed GPU reserve fits (test_gpu_reserve)
    assert code == 0 and "offload" not in out.split("note:")[0]
    assert "note: offload not weighed: give offload_bandwidth" in out
    code, _, err = run(capsys, *args, "--offload-bandwidth", "16GB", "--device-flops", "1TFLOPs/s")
    assert code == 2 and err.startswith("remat: cannot read --offload-bandwidth 16GB;")  # in the CLI's words


def test_max_segment_limits_the_modules_one_checkpoint_wraps(capsys, target_file, tmp_path):
    prof = _library_profile(f"{target_file}:mlp_chain")
    least = remat.frontier(prof)[-1]
    least_of_3 = remat.frontier(prof, max_segment=3)[-1]
    assert max(len(s) for s in least.segments) > 3 and least_of_3.peak_bytes > least.peak_bytes
    code, out, err = run(
        capsys,
        "plan",
        f"{target_file}:mlp_chain",
        "--budget",
        least_of_3.peak_bytes,
        "--max-segment",
        "3",
        "--out",
        tmp_path / "p.json",
        *FAKE,
    )
    assert code == 0, err
    plan = remat.load_plan(tmp_path / "p.json")
    assert plan.segments and max(len(s) for s in plan.segments) <= 3
    code, _, err = run(
        capsys, "plan", f"{target_file}:mlp_chain", "--budget", least.peak_bytes, "--max-segment", "3", *FAKE
    )
    assert code == 2 and f"reaches is {least_of_3.peak_bytes / 2**20:,.1f} MiB" in err
    code, _, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.5", "--max-segment", "0", *FAKE)
    assert code == 2 and err.startswith("remat: max_segment is the most blocks one checkpoint may wrap")


def test_the_plan_printed_is_in_the_frontier_table_even_between_its_points(capsys, target_file, monkeypatch):
    """The frontier steps 0.1% of the peak from point to point; a budget's plan can lie in such a gap (here
    made so by leaving it out of the frontier): the table still lists it and marks it cheapest."""
    real = remat.frontier
    prof = _library_profile(f"{target_file}:mlp_chain")
    plan = remat.plan(prof, 0.8)
    monkeypatch.setattr(
        remat, "frontier", lambda *a, **k: [p for p in real(*a, **k) if p.peak_bytes != plan.peak_bytes]
    )
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.8", "--frontier", *FAKE)
    assert code == 0, err
    cheapest = [line.split() for line in out.splitlines() if line.rstrip().endswith(" cheapest")]
    assert len(cheapest) == 1
    assert cheapest[0][1:3] == re.search(r"predicted peak ([\d.]+ MiB)", out).group(1).split()


# -- remat plan --compile --------------------------------------------------------------------


def test_plan_compile_chooses_the_plan_by_measuring_the_compiled_step(capsys, target_file, tmp_path, monkeypatch):
    """`--compile`: the plan remat.auto would apply to torch.compile(model), chosen by compiling and measuring
    candidates, printed with what the compiled step measured and written for `remat.apply(torch.compile(model),
    plan)`; no hand recipes beside it (their peaks are the eager step's).  `--verify` judges the compiled step by the
    counter that measures it, and so does the budget row (a step of some 110 MiB: the counter judges it)."""
    out_path = tmp_path / "compiled_plan.json"
    monkeypatch.setenv("REMAT_PROGRESS", "lines")  # the progress lines on stderr: each candidate before it compiles
    code, out, err = run(
        capsys, "plan", f"{target_file}:wide_chain", "--budget", "0.75", "--compile", "--trials", "2",
        "--out", out_path, "--verify",
    )  # fmt: skip
    assert code == 0, out[-3000:] + err[-3000:]
    assert "compiled step with this plan: " in out and "note: chosen for the compiled step: " in out
    assert "hand recipes" not in out
    said = [
        line for line in err.splitlines() if line.startswith("remat: compiling and measuring candidate plans: cand")
    ]
    measured = out.split("note: measured: ")[1].split(".\n")[0].replace("\n", " ").count(" MiB, ")
    assert len(said) == measured >= 2, err  # each candidate said before it compiled, numbered
    assert said[0].startswith("remat: compiling and measuring candidate plans: candidate 1 of at most 6: "), said
    plan = remat.load_plan(out_path)
    assert 0 < plan.measured_peak_bytes <= plan.budget_bytes and plan.measured_counter.endswith("(compiled)")
    budget_row = next(line for line in out.splitlines() if line.strip().startswith("budget"))
    assert budget_row.rstrip().endswith("ok"), budget_row


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--budget", "0.7", "--mode", "fake"], "seen with --mode fake."),
        (["--budget", "0.7", "--frontier"], "seen with --frontier."),
        (["--budget", "0.7", "--accumulate", "2", "--loss-only"], "seen with --loss-only, --accumulate 2."),
        ([], "remat: --compile chooses a plan for a memory budget; none was given."),
        (["--budget", "0.7", "--trials", "0"], "saw 0. Fix: --trials 4"),
    ],
)
def test_plan_compile_refuses_what_it_cannot_measure_before_the_step_runs(capsys, target_file, extra, said):
    code, out, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--compile", *extra)
    assert code == 2 and err.startswith("remat: ") and said in err, err
    assert "running the step" not in err


def test_plan_compile_says_what_no_candidate_reached_in_the_clis_words(capsys, target_file, monkeypatch):
    import remat.cli.plan_cmd as plan_cmd
    from remat.compiled_plans import MORE_TRIALS, UNCOMPILED

    def infeasible(model, step, prof, budget, trials, options, progress=None):
        raise remat.InfeasibleBudget(
            f"remat: no plan tried fits. Fix: a budget of 2 MiB or more, or {MORE_TRIALS}, or {UNCOMPILED}: its "
            "eager step with remat's plan for this budget is predicted at 1 MiB.",
            2 << 20,
            budget,
        )

    monkeypatch.setattr(plan_cmd, "plan_for", infeasible)
    code, _, err = run(capsys, "plan", f"{target_file}:mlp_chain", "--budget", "0.5", "--compile")
    assert code == 2 and "or more candidates (--trials 8), or the same command without --compile: its eager" in err
    assert "trials=" not in err and "torch.compile" not in err, err
