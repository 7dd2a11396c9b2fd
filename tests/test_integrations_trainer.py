"""remat.integrations.RematCallback in a real Hugging Face Trainer (issue 37): the Trainer's own step planned at
the start of training, the run unchanged but for memory (bit-equal parameters on CPU), the planned step within its
budget by the process's own counter, and the Trainer's own checkpointing refused in its words."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings

import pytest
import torch

import remat
from remat.applier import applied
from remat.integrations._common import first_batch, optimizer_factory
from remat.types.verification import BUDGET_SLACK

from trainer_runs import differing, gpt2, parameters, trained, trainer  # tests/ is on the path

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from remat.integrations import RematCallback  # noqa: E402
from remat.integrations.transformers import refuse_trainer_checkpointing  # noqa: E402


@pytest.fixture(scope="module")
def unplanned(tmp_path_factory):
    """(parameters at the start, parameters after 3 unplanned steps) of `gpt2()`."""
    model = gpt2()
    start = parameters(model)
    return start, parameters(trained(model, tmp_path_factory.mktemp("unplanned")))


def test_the_trainer_with_the_callback_trains_as_without_it_within_its_budget(unplanned, tmp_path, capsys):
    start, without = unplanned
    model = gpt2()
    callback = RematCallback(budget=0.6)
    run = trainer(model, tmp_path, [callback])
    run.train()
    assert differing(without, parameters(model)) == []  # bit-equal: remat preserves the RNG, and drew nothing
    assert len(differing(start, without)) == len(start)  # and the run trained every parameter
    prof, plan = callback.profile, callback.plan
    assert applied(model) is plan and (plan.segments or plan.selective)  # the plan checkpoints something
    assert plan.peak_bytes <= plan.budget_bytes == int(0.6 * prof.peak_bytes) < prof.peak_bytes
    # the Trainer's step: its optimizer (fused AdamW, its two groups), only the loss kept, one micro-batch
    assert (prof.mode, prof.optimizer, prof.keep_output, prof.accumulate) == ("real", "AdamW", False, 1)
    copy = callback.step.optimizer(model.parameters())  # (the scheduler has moved the Trainer's lr since)
    assert [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in copy.param_groups] == [
        {k: v for k, v in g.items() if k not in ("params", "lr")} for g in run.optimizer.param_groups
    ]
    assert [g["params"] for g in copy.param_groups] == [g["params"] for g in run.optimizer.param_groups]
    out = capsys.readouterr().out
    assert out.startswith(
        f"remat: RematCallback planned GPT2LMHeadModel's training step for a budget of "
        f"{plan.budget_bytes / 2**20:,.1f} MiB (unplanned {prof.peak_bytes / 2**20:,.1f} MiB, "
        "real mode on cpu):\nremat plan for GPT2LMHeadModel"
    )
    report = callback.verify(model, time_rounds=0)
    assert report.grads_equal and report.independent_judged, str(report)  # the counter resolves a step this size
    assert report.independent_peak_bytes <= (1 + BUDGET_SLACK) * plan.budget_bytes, str(report)
    assert report.ok, str(report)


def test_an_h100_target_with_gradient_accumulation_is_predicted_and_trains_as_without(tmp_path):
    without = parameters(trained(gpt2(), tmp_path / "without", gradient_accumulation_steps=2))
    model = gpt2()
    callback = RematCallback(budget=0.8, target="H100", show=False)  # cuBLAS workspaces: 72% of 0.6
    trained(model, tmp_path / "with", [callback], gradient_accumulation_steps=2)
    prof = callback.profile
    assert (prof.mode, prof.device, prof.accumulate, prof.keep_output) == ("fake", "cuda", 2, False)
    assert any("roofline of H100" in n for n in prof.notes)
    assert callback.plan.segments or callback.plan.selective
    assert differing(without, parameters(model)) == []


def test_the_trainers_own_checkpointing_is_refused_in_its_words(tmp_path):
    import transformers

    new = hasattr(transformers.TrainingArguments, "activation_checkpointing")  # transformers 5; 4 has the old name
    name = "activation_checkpointing" if new else "gradient_checkpointing"
    also = r" \(or its old name gradient_checkpointing=True\)" if new else ""
    for given in {name, "gradient_checkpointing"}:  # in transformers 5 the old name is a deprecated alias
        model = gpt2(n_layer=2)
        with (
            warnings.catch_warnings(),
            pytest.raises(
                remat.RematError,
                match=rf"^remat: RematCallback expects the Trainer's own activation checkpointing off, and saw "
                rf"TrainingArguments\({name}=True\){also}: .* Fix: set TrainingArguments\({name}=False\)",
            ),
        ):
            warnings.simplefilter("ignore", FutureWarning)
            trainer(model, tmp_path, [RematCallback(budget=0.6)], **{given: True}).train()
        assert applied(model) is None


def test_a_model_hugging_face_checkpoints_already_is_refused(tmp_path):
    model = gpt2(n_layer=2)
    new = hasattr(model, "activation_checkpointing_enable")  # transformers 5; 4 has the old name
    enable = "activation_checkpointing" if new else "gradient_checkpointing"
    getattr(model, f"{enable}_enable")()
    with pytest.raises(
        remat.RematError,
        match=r"^remat: a remat plan is for a model without other activation "
        r"checkpointing; saw Hugging Face gradient checkpointing on in GPT2LMHeadModel \(transformer"
        rf".*\).* Fix: call model.{enable}_disable\(\) before trainer.train\(\)",
    ):
        trainer(model, tmp_path, [RematCallback(budget=0.6)]).train()


def test_fsdps_activation_checkpointing_is_refused():
    args = types.SimpleNamespace(
        activation_checkpointing=False, gradient_checkpointing=False, fsdp_config={"activation_checkpointing": "true"}
    )
    with pytest.raises(
        remat.RematError,
        match=r"^remat: RematCallback expects no other activation checkpointing, "
        r"and saw TrainingArguments\(fsdp_config=\{'activation_checkpointing': True\}\).* Fix: set "
        r"fsdp_config\['activation_checkpointing'\] to False",
    ):
        refuse_trainer_checkpointing(args, torch.nn.Linear(1, 1))
    args.fsdp_config = {"activation_checkpointing": False}
    refuse_trainer_checkpointing(args, torch.nn.Linear(1, 1))


def test_a_budget_no_plan_reaches_says_the_least_and_how_to_get_there_with_the_trainer(tmp_path):
    model = gpt2(n_layer=2)
    with pytest.raises(remat.InfeasibleBudget) as raised:
        trainer(model, tmp_path, [RematCallback(budget="1MiB", target="cpu")]).train()
    e = raised.value
    assert e.budget_bytes == 2**20 < e.min_bytes
    assert str(e).startswith("remat: no plan fits the budget of 1.0 MiB (1048576 bytes); the least any")
    assert str(e).endswith(
        f"Fix: give a budget of at least {e.min_bytes} bytes, or a smaller batch. With the "
        "Trainer: RematCallback(budget=...) at least that, or a smaller TrainingArguments("
        "per_device_train_batch_size=...), with a larger gradient_accumulation_steps to keep the "
        "batch."
    )
    assert applied(model) is None


def test_the_first_batch_is_drawn_with_every_generator_put_back():
    data = torch.utils.data.TensorDataset(torch.arange(20.0))
    own = torch.Generator().manual_seed(3)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=own)
    states = torch.get_rng_state(), own.get_state()
    batch = first_batch(loader, "a loader")
    assert torch.equal(torch.get_rng_state(), states[0]) and torch.equal(own.get_state(), states[1])
    assert torch.equal(batch[0], next(iter(loader))[0])  # the batch the run itself draws first


def test_an_optimizer_of_other_parameters_is_copied_by_its_class_only():
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    factory = optimizer_factory(torch.optim.AdamW(other.parameters(), lr=0.5, fused=True), model)
    copy = factory(model.parameters())
    assert type(copy) is torch.optim.AdamW and copy.defaults["lr"] == 0.5 and copy.defaults["fused"]
    assert optimizer_factory(None, model) is None


def test_import_remat_imports_no_framework():
    code = (
        "import sys, remat, remat.integrations; "
        "print([m for m in ('transformers', 'lightning', 'peft', 'accelerate') if m in sys.modules])"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
