"""The benchmark models, by name, built from `remat.zoo` (random weights, nothing downloaded),
and checkpoints applied to them by hand with torch's own tools.

`build(name, kwargs, segments=0)` returns `(model, inputs, loss_fn)`; `plain_step` runs the
training step exactly as `remat.profile` runs it (forward, loss, backward, optimizer step,
output and loss held through backward), without any tracking.  `apply_by_hand(model, how)`
checkpoints a model as a user would without remat (a JSON-able `how`, so that a fresh
interpreter can rebuild it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from remat import zoo
from remat._torch_compat import FakeTensorMode
from remat.ops import SAVE_OPS

HETERO_WIDTHS = (64, 256, 1024, 2048, 1024, 256, 512, 64, 1024, 2048, 128, 512, 256, 1024, 64)


def hetero_chain(batch: int = 8192, widths=HETERO_WIDTHS):
    """An nn.Sequential of [Linear(a, b), GELU] whose widths vary 64..2048: stages that differ."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers), torch.randn(batch, widths[0])


def chain100(batch: int = 4096, seed: int = 0):
    """100 stages: 50 x [Linear(a, b), GELU], widths drawn from 64..2048."""
    rng = random.Random(seed)
    widths = [rng.choice((64, 128, 256, 512, 1024, 2048)) for _ in range(51)]
    return hetero_chain(batch, widths)


# name -> (factory, default kwargs)
MODELS = {
    "chain": (zoo.chain_report001, {"width": 1024, "blocks": 32, "batch": 8192}),
    "ff000": (zoo.mlp_report000, {"hidden": 512, "intermediate": 2048, "layers": 8, "seq": 512, "batch": 8}),
    "gpt2": (zoo.gpt2, {"n_layer": 4, "n_embd": 512, "n_head": 8, "seq": 512, "batch": 2, "vocab": 8192}),
    "bert": (zoo.bert, {"n_layer": 4, "hidden": 512, "heads": 8, "seq": 256, "batch": 4, "vocab": 8192}),
    "cnn_bn": (zoo.cnn_bn, {"batch": 64, "size": 64}),
    "skipnet": (zoo.skipnet, {"width": 1024, "depth": 4, "batch": 4096}),
    "cnn002": (zoo.cnn_report002, {"batch": 100}),
    "hetero": (hetero_chain, {}),
    "chain100": (chain100, {}),
    "gpt2_medium": (zoo.gpt2_medium, {}),
}


class CheckpointedSequential(nn.Module):
    """`checkpoint_sequential(seq, segments, x)` as a module, so the whole step is `model(x)`."""

    def __init__(self, seq: nn.Sequential, segments: int, use_reentrant: bool = False):
        super().__init__()
        self.seq, self.segments, self.use_reentrant = seq, segments, use_reentrant

    def forward(self, x):
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=self.use_reentrant)


class Autocast(nn.Module):
    """`inner` run under `torch.autocast(device_type, bfloat16)` in its forward, as a bf16 training step writes it.
    The autocast is part of the model, so `remat.profile` runs it (a simulated CUDA step enters CPU autocast
    with CUDA's casts, NOTE [A CUDA step simulated on CPU]) and so does the loop on the GPU."""

    def __init__(self, inner: nn.Module, device_type: str):
        super().__init__()
        self.inner, self.device_type = inner, device_type

    def forward(self, **batch):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.inner(**batch)


def build(name: str, kwargs: dict | None = None, segments: int = 0, use_reentrant: bool = False, *, fake: bool = False):
    """`(model, inputs, loss_fn)`; `segments` wraps an nn.Sequential in checkpoint_sequential; `fake`
    builds it under FakeTensorMode (nothing allocated)."""
    factory, defaults = MODELS[name]
    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True):
            out = factory(**{**defaults, **(kwargs or {})})
    else:
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


@dataclass(frozen=True)
class Switch:
    """A strategy put on and taken off the same model, so that one process can interleave several."""

    name: str
    on: Callable[[], object]
    off: Callable[[], object]


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


# -- checkpoints applied by hand -------------------------------------------------------------------


class Segmented(nn.Module):
    """An nn.Sequential with the runs (first, last) each wrapped in one non-reentrant checkpoint."""

    def __init__(self, seq: nn.Sequential, runs: list[tuple[int, int]]):
        super().__init__()
        self.seq, self.runs = seq, {a: b for a, b in runs}

    def forward(self, x):
        i, n = 0, len(self.seq)
        while i < n:
            if i in self.runs:
                j = self.runs[i]
                x = checkpoint(self._run(i, j), x, use_reentrant=False)
                i = j + 1
            else:
                x = self.seq[i](x)
                i += 1
        return x

    def _run(self, i: int, j: int):
        def run(x):
            for m in self.seq[i : j + 1]:
                x = m(x)
            return x

        return run


def apply_by_hand(model: nn.Module, how: dict) -> nn.Module:
    """{"kind": "none"}, {"kind": "sequential", "k": k} (torch's checkpoint_sequential), or
    {"kind": "plan", "segments": [[module, ...]], "selective": [module]}: the plan written by hand
    with torch's own tools, not with remat.apply."""
    kind = how.get("kind", "none")
    if kind == "sequential":
        return CheckpointedSequential(model, how["k"])
    if kind != "plan":
        return model
    for name in how.get("selective", []):
        replace_submodule(model, name, checkpoint_wrapper(model.get_submodule(name), context_fn=selective_context))
    runs = []
    for seg in how["segments"]:
        if len(seg) == 1:
            replace_submodule(model, seg[0], checkpoint_wrapper(model.get_submodule(seg[0])))
        else:  # a run of children of the top-level nn.Sequential
            assert isinstance(model, nn.Sequential) and all("." not in n for n in seg), seg
            runs.append((int(seg[0]), int(seg[-1])))
    return Segmented(model, runs) if runs else model


def replace_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` is, in its parent."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def unwrap_checkpoints(root: nn.Module) -> None:
    """Undo checkpoint_wrapper / apply_activation_checkpointing: put each wrapped module back in its parent."""
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, CheckpointWrapper):
                setattr(parent, name, child._checkpoint_wrapped_module)


def _keep_matmuls(ctx, op, *args, **kwargs):
    """Selective checkpointing as remat defines it (NOTE [The memory model of a plan], Rule 4):
    outputs of matmul, convolution and attention ops are kept, everything else is recomputed."""
    return CheckpointPolicy.MUST_SAVE if op._overloadpacket.__name__ in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    return create_selective_checkpoint_contexts(_keep_matmuls)
