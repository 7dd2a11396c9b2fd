"""Hugging Face models with their default `use_cache=True` plan, apply, verify and train
(NOTE [The key/value cache in training] in remat.hf).

Before: a checkpointed T5 decoder layer raised "different number of tensors saved", and a
selective plan on GPT-2 "aten.slice.Tensor encountered during backward but not found in
storage", because a recomputed layer appended to the cache again.
"""

from __future__ import annotations

import pytest
import torch

import remat
from remat import zoo
from remat.hf import CACHE_NOTE


def _t5():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_heads=4,
                                decoder_start_token_id=0)
    ids = torch.randint(0, 512, (4, 32))
    return transformers.T5ForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}


def _gpt2():
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=64, batch=2, vocab=256)
    model.config.use_cache = True  # the Hugging Face default (remat's zoo turns it off)
    return model, inputs


def _train(model, inputs, steps: int = 2) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(**inputs).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("build", [_gpt2, _t5], ids=["gpt2", "t5"])
def test_a_model_with_the_cache_on_plans_applies_verifies_and_trains(build):
    model, inputs = build()
    prof = remat.profile(model, inputs)
    assert CACHE_NOTE in prof.notes
    least = remat.frontier(prof)[-1].peak_bytes
    for budget in (least, (least + prof.peak_bytes) // 2):
        plan = remat.plan(prof, budget)
        assert plan.segments or plan.selective
        report = remat.verify(model, inputs, plan)
        assert report.ok, str(report)
        remat.apply(model, plan)
        _train(model, inputs)
        remat.remove(model)


def test_a_selective_plan_on_gpt2_with_the_cache_on_trains():
    model, inputs = _gpt2()
    prof = remat.profile(model, inputs)
    selective = [b.name for b in prof.blocks]
    plan = remat.plan(prof, prof.peak_bytes - 1)
    plan = type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "segments": [],
                         "selective": selective})
    remat.apply(model, plan)
    _train(model, inputs)


def test_the_cache_is_off_only_while_a_plan_is_applied_and_only_in_training():
    model, inputs = _gpt2()
    assert model(**inputs).past_key_values is not None
    remat.apply(model, "every-block")
    assert model(**inputs).past_key_values is None  # training forward: no cache
    model.eval()
    with torch.no_grad():
        assert model(**inputs).past_key_values is not None  # eval keeps it
    model.train()
    remat.remove(model)
    assert model(**inputs).past_key_values is not None
