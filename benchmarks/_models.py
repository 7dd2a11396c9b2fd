"""The benchmark models, by name, built from `remat.zoo` (random weights, nothing downloaded).

`build(name, kwargs, segments=0)` returns `(model, inputs, loss_fn)`; `plain_step` runs the
training step exactly as `remat.profile` runs it (forward, loss, backward, optimizer step,
output and loss held through backward), without any tracking.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from remat import zoo

# name -> (zoo factory, default kwargs)
MODELS = {
    "chain": (zoo.chain_report001, {"width": 1024, "blocks": 32, "batch": 8192}),
    "ff000": (zoo.mlp_report000, {"hidden": 512, "intermediate": 2048, "layers": 8, "seq": 512, "batch": 8}),
    "gpt2": (zoo.gpt2, {"n_layer": 4, "n_embd": 512, "n_head": 8, "seq": 512, "batch": 2, "vocab": 8192}),
    "bert": (zoo.bert, {"n_layer": 4, "hidden": 512, "heads": 8, "seq": 256, "batch": 4, "vocab": 8192}),
    "cnn_bn": (zoo.cnn_bn, {"batch": 64, "size": 64}),
    "skipnet": (zoo.skipnet, {"width": 1024, "depth": 4, "batch": 4096}),
    "cnn002": (zoo.cnn_report002, {"batch": 100}),
}


class CheckpointedSequential(nn.Module):
    """`checkpoint_sequential(seq, segments, x)` as a module, so the whole step is `model(x)`."""

    def __init__(self, seq: nn.Sequential, segments: int, use_reentrant: bool = False):
        super().__init__()
        self.seq, self.segments, self.use_reentrant = seq, segments, use_reentrant

    def forward(self, x):
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=self.use_reentrant)


def build(name: str, kwargs: dict | None = None, segments: int = 0, use_reentrant: bool = False):
    factory, defaults = MODELS[name]
    out = factory(**{**defaults, **(kwargs or {})})
    model, inputs, loss_fn = (out + (None,))[:3] if len(out) == 2 else out
    if segments:
        if not isinstance(model, nn.Sequential):
            raise ValueError(f"segments= needs an nn.Sequential model, {name} is {type(model).__name__}")
        model = CheckpointedSequential(model, segments, use_reentrant)
    return model, inputs, loss_fn


def make_optimizer(kind: str, model: nn.Module):
    if kind == "adam":
        return torch.optim.Adam(model.parameters())
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01)
    if kind in ("none", "", None):
        return None
    raise ValueError(kind)


def call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def loss_of(out, loss_fn):
    if loss_fn is not None:
        return loss_fn(out)
    if isinstance(out, torch.Tensor):
        return out.sum()
    return out.loss


def input_tensors(inputs) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    vals = inputs.values() if isinstance(inputs, dict) else inputs
    return [t for t in vals if isinstance(t, torch.Tensor)]


def plain_step(model, inputs, loss_fn, opt) -> None:
    out = call(model, inputs)
    loss = loss_of(out, loss_fn)
    loss.backward()
    if opt is not None:
        opt.step()
    del out, loss
