"""remat.zoo's transformer, vision and convolutional builders (used by the benchmarks' one model registry) build
what their docstrings say, from the seed, and train."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from remat import zoo

pytest.importorskip("transformers")


def _step(model, inputs, loss_fn=None):
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    loss = loss_fn(out) if loss_fn else out.loss
    loss.backward()
    return loss


def test_llama_with_fewer_kv_heads_is_grouped_query_attention_and_trains():
    model, batch = zoo.llama(n_layer=1, hidden=64, heads=4, seq=16, batch=2, vocab=64, kv_heads=2, attn="sdpa")
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features) == (64, 32, 32)
    assert model.config._attn_implementation == "sdpa"
    assert model.model.layers[0].mlp.up_proj.out_features == 160  # 8/3 of 64, a multiple of 16
    assert torch.isfinite(_step(model, batch))
    assert all(p.grad is not None for p in model.parameters())


def test_the_same_arguments_build_the_same_weights_and_batch():
    a, batch_a = zoo.t5(n_layer=1, d_model=32, heads=2, seq=8, batch=2, vocab=64, d_kv=8, d_ff=64, target=4)
    b, batch_b = zoo.t5(n_layer=1, d_model=32, heads=2, seq=8, batch=2, vocab=64, d_kv=8, d_ff=64, target=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.equal(batch_a["input_ids"], batch_b["input_ids"]) and batch_a["labels"].shape == (2, 4)


def test_unet_with_batchnorm_has_the_same_modules_and_convolutions():
    group, x, loss_fn = zoo.unet(ch=8, depth=2, image=16, batch=2)
    batch, _, _ = zoo.unet(ch=8, depth=2, image=16, batch=2, batchnorm=True)
    assert [n for n, _ in group.named_modules()] == [n for n, _ in batch.named_modules()]
    norms = {type(m) for m in batch.modules() if isinstance(m, (nn.GroupNorm, nn.BatchNorm2d))}
    assert norms == {nn.BatchNorm2d}
    convs = [(n, p) for n, p in group.named_parameters() if p.dim() == 4]
    assert convs and all(torch.equal(p, batch.get_parameter(n)) for n, p in convs)
    assert group(x).shape == x.shape and torch.isfinite(_step(group, x, loss_fn))


def test_vit_classifies_its_images():
    model, batch = zoo.vit(n_layer=1, hidden=32, heads=2, image=16, patch=8, batch=3)
    assert model(**batch).logits.shape == (3, 10)
    assert torch.isfinite(_step(model, batch))
