"""A peft LoRA model planned by remat (issue 37): its frozen base and trainable adapters profiled, planned, applied
and trained under the Hugging Face Trainer with remat.integrations.RematCallback; the optimizer state counted is
the adapters' only; the adapters' gradients through a checkpointed first block whose input needs no grad."""

from __future__ import annotations

import pytest
import torch

import remat
from remat.hf import CACHE_NOTE
from remat.types.verification import BUDGET_SLACK

from trainer_runs import differing, gpt2, parameters, trained  # tests/ is on the path

peft = pytest.importorskip("peft")
pytest.importorskip("accelerate")  # the Trainer needs it

from remat.integrations import RematCallback  # noqa: E402


def lora(n_layer: int = 4):
    """`gpt2(n_layer)` with LoRA adapters on its attention's input projection: the base frozen, embeddings too."""
    model = gpt2(n_layer)
    torch.manual_seed(0)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.1, fan_in_fan_out=True, init_lora_weights=False
    )  # B not zero: every adapter gets a gradient from step 1
    return peft.get_peft_model(model, config)


def adapters(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in parameters(model).items() if "lora_" in n}


def test_lora_under_the_trainer_trains_as_without_the_callback_within_its_budget(tmp_path):
    without = lora()
    start = adapters(without)
    without = adapters(trained(without, tmp_path / "without"))
    model = lora()
    callback = RematCallback(budget=0.6, show=False)
    trained(model, tmp_path / "with", [callback])
    assert differing(without, adapters(model)) == []  # bit-equal adapters after 3 steps
    assert len(differing(start, without)) == len(start) == 2 * 4  # A and B of 4 layers, all trained
    prof, plan = callback.profile, callback.plan
    assert plan.segments or plan.selective
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    # AdamW's state: exp_avg and exp_avg_sq (fp32) of each adapter element, and its step (one fp32 scalar each)
    assert prof.optimizer_bytes == 2 * 4 * sum(p.numel() for p in trainable) + 4 * len(trainable)
    assert prof.grad_bytes == 4 * sum(p.numel() for p in trainable)  # the frozen base has no gradient
    report = callback.verify(model, time_rounds=0)
    assert report.grads_equal and report.independent_judged, str(report)
    assert report.independent_peak_bytes <= (1 + BUDGET_SLACK) * plan.budget_bytes, str(report)
    assert report.ok, str(report)


def test_a_checkpointed_first_block_whose_input_needs_no_grad_gives_the_adapters_their_gradients():
    """The frozen embedding's output needs no grad.  A reentrant checkpoint of the first block would give its
    adapters none (Hugging Face calls `enable_input_require_grads` for that); remat's are not reentrant."""
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(2))

    def gradients(model):
        model.train()
        torch.manual_seed(5)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    plain = gradients(lora(n_layer=2))
    model = lora(n_layer=2)
    assert not model.get_input_embeddings()(ids).requires_grad
    remat.apply(model, "every-block")  # h.0 and h.1 checkpointed, the first on an input that needs no grad
    planned = gradients(model)
    assert planned.keys() == plain.keys() and len(planned) == 4
    assert all(torch.equal(planned[n], plain[n]) and planned[n].abs().sum() > 0 for n in plain)


def test_the_cache_is_off_in_the_model_inside_the_peft_wrapper():
    """PeftModel's forward does not name use_cache, the GPT-2 inside builds its cache by its config: remat turns it
    off there (NOTE [The key/value cache in training], Rule 2).  Before, the profile measured a step with the cache,
    and a plan's recomputation appended to it again (measured 51.0 MiB for 48.5 MiB predicted)."""
    model = lora(n_layer=2)
    ids = torch.randint(0, 512, (2, 32))
    model.train()
    assert model(input_ids=ids).past_key_values is not None
    prof = remat.profile(model, {"input_ids": ids, "labels": ids})
    assert CACHE_NOTE in prof.notes
    remat.apply(model, "every-block")
    assert model(input_ids=ids).past_key_values is None
    remat.remove(model)
    assert model(input_ids=ids).past_key_values is not None
