"""The benchmark models, by name (`_catalog.py` has their titles and sizes), built from `remat.zoo` (random
weights, nothing downloaded), and checkpoints applied to them by hand with torch's own tools.

`build(name, kwargs, segments=0)` returns `(model, inputs, loss_fn)` at the model's "worker" size (`kwargs` over
it); `build_sized(name, size, device)` at a named size on a device; `make_bench(name, size)` a `Bench` (what the peers
benchmark checkpoints "per block" and which list its forward loops over).  `plain_step` runs the training step
exactly as `remat.profile` runs it (forward, loss, backward, optimizer step, output and loss held through
backward), without any tracking.  `apply_by_hand(model, how)` checkpoints a model as a user would without remat
(a JSON-able `how`, so that a fresh interpreter can rebuild it).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from _catalog import SIZES
from remat import zoo
from remat._torch_compat import FakeTensorMode
from remat.ops import SAVE_OPS

HETERO_WIDTHS = (64, 256, 1024, 2048, 1024, 256, 512, 64, 1024, 2048, 128, 512, 256, 1024, 64)
NOT_A_LOOP = "the forward is not a plain loop over one list of modules"


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


def paired_chain(width: int, blocks: int, batch: int):
    """Report 001's chain: `blocks` x [Linear(w, w), ReLU] then a Sigmoid, in a plain nn.Sequential whose
    children are the Linear+ReLU pairs (same ops as the report's flat Sequential).  A plain
    nn.Sequential, not a subclass: remat plans segments only when the container's class name is
    "Sequential" (see docs/peers.md, "Bugs found")."""
    torch.manual_seed(0)
    pairs = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(*pairs, nn.Sigmoid()), torch.randn(batch, width)


def resmlp(width: int, depth: int, batch: int):
    """remat.zoo.skipnet (the encoder's outputs added back to the mirrored decoder blocks) with
    nn.Dropout(0.1) at the end of every block; sum loss."""
    model, x = zoo.skipnet(width=width, depth=depth, batch=batch)
    for block in (*model.down, *model.up):
        block.append(nn.Dropout(0.1))
    return model, x


@dataclass(frozen=True)
class Recipe:
    """How a named model is built, and what a user would checkpoint in it."""

    make: Callable[..., tuple]
    """The factory: keyword arguments -> (model, inputs) or (model, inputs, loss_fn)."""
    blocks: Callable[[dict], list[str]] | None = None
    """Modules a user checkpoints one by one (for the peers benchmark; `hf`: Hugging Face's own layers)."""
    sequence: Callable[[nn.Module], list[nn.Module]] | None = None
    """The list the forward loops over (checkpoint_sequential / Chen), or None."""
    why: str = NOT_A_LOOP
    """Why there is no such list."""
    autocast: bool = False
    """Its forward runs under bf16 autocast (`Autocast`)."""
    hf: bool = False
    """A Hugging Face model: its blocks are the layers its own checkpointing wraps (GradientCheckpointingLayer)."""


def _down_up(kw: dict) -> list[str]:
    return [f"{part}.{i}" for part in ("down", "up") for i in range(kw["depth"])]


def _sdpa(factory: Callable[..., tuple]) -> Callable[..., tuple]:
    """The Hugging Face factory with PyTorch's fused attention (`scaled_dot_product_attention`) asked for."""
    return lambda **kw: factory(**kw, attn="sdpa")


_SKIPS = "long skip connections: the encoder's outputs are used again by the decoder"
MODELS: dict[str, Recipe] = {
    "chain": Recipe(zoo.chain_report001),
    "ff000": Recipe(zoo.mlp_report000),
    "mlp000": Recipe(
        zoo.mlp_report000, lambda kw: [f"layers.{i}" for i in range(kw["layers"])], lambda m: list(m.layers)
    ),
    "chain001": Recipe(paired_chain, lambda kw: [str(i) for i in range(kw["blocks"])], lambda m: list(m)),
    "cnn002": Recipe(
        zoo.cnn_report002,
        lambda kw: ["conv1", "conv2", "conv3", "fc1"],
        why=NOT_A_LOOP + " (F.relu and flatten between the layers)",
    ),
    "cnn_bn": Recipe(zoo.cnn_bn),
    "gpt2": Recipe(zoo.gpt2, why="HF layers take masks and caches besides the hidden states", hf=True),
    "gpt2_medium": Recipe(zoo.gpt2_medium),
    "bert": Recipe(zoo.bert, why="HF layers take masks besides the hidden states", hf=True),
    "bert_base": Recipe(zoo.bert),
    "bert_base_mlm": Recipe(_sdpa(zoo.bert)),
    "llama": Recipe(zoo.llama, why="HF layers take position embeddings and masks", hf=True),
    "llama_gqa": Recipe(_sdpa(zoo.llama), autocast=True),
    "llama_style_decoder": Recipe(_sdpa(zoo.llama), autocast=True),
    "t5": Recipe(zoo.t5),
    "vit": Recipe(zoo.vit, why="HF layers are called with extra arguments", hf=True),
    "skipnet": Recipe(zoo.skipnet, _down_up, why=_SKIPS),
    "resmlp": Recipe(resmlp),
    "unet": Recipe(
        zoo.unet,
        lambda kw: ["stem", *_down_up(kw)],
        why="long skip connections: each down stage's output is concatenated into an up stage",
    ),
    "unet_bn": Recipe(lambda **kw: zoo.unet(**kw, batchnorm=True)),
    "hetero": Recipe(hetero_chain),
    "chain100": Recipe(chain100),
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


def _made(name: str, kw: dict, autocast_device: str) -> tuple:
    """(model, inputs, loss_fn) of the factory, the model in `Autocast` where its recipe says so."""
    recipe = MODELS[name]
    torch.manual_seed(0)
    out = recipe.make(**kw)
    model, inputs, loss_fn = out if len(out) == 3 else (*out, None)
    return (Autocast(model, autocast_device) if recipe.autocast else model), inputs, loss_fn


def build(name: str, kwargs: dict | None = None, segments: int = 0, use_reentrant: bool = False, *, fake: bool = False):
    """`(model, inputs, loss_fn)` at the model's "worker" size, `kwargs` over it; `segments` wraps an
    nn.Sequential in checkpoint_sequential; `fake` builds it under FakeTensorMode (nothing allocated)."""
    kw = {**SIZES["worker"].get(name, {}), **(kwargs or {})}
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        model, inputs, loss_fn = _made(name, kw, "cpu")
    if segments:
        if not isinstance(model, nn.Sequential):
            raise ValueError(f"segments= needs an nn.Sequential model, {name} is {type(model).__name__}")
        model = CheckpointedSequential(model, segments, use_reentrant)
    return model, inputs, loss_fn


def build_sized(name: str, size: str, device: str = "cpu", autocast_device: str | None = None) -> tuple:
    """`(model, inputs, loss_fn)` at `SIZES[size]`, built on `device` from the seed (inputs and loss targets too):
    the same module names on every machine.  `autocast_device`: the device type a bf16 model's autocast names
    ("cuda" for a plan made on the CPU for a GPU)."""
    with torch.device(device):
        model, inputs, loss_fn = _made(name, dict(SIZES[size][name]), autocast_device or device)
    return model.train(), inputs, loss_fn


@dataclass
class Bench:
    """A model of the peers benchmark, with what its users checkpoint."""

    name: str
    model: nn.Module
    inputs: Any  # a tensor or a dict of keyword arguments
    loss_fn: Callable | None
    hf: bool
    blocks: list[str]
    """Modules a user checkpoints one by one ("every block", selective per block)."""
    sequence: Callable[[nn.Module], list[nn.Module]] | None = None
    """The list the forward loops over (checkpoint_sequential / Chen), or None."""
    no_sequence_why: str = ""
    size: dict = field(default_factory=dict)
    param_names: dict = field(default_factory=dict)

    def __post_init__(self):
        self.param_names = {id(p): n for n, p in self.model.named_parameters()}

    def call(self, model: nn.Module | Callable | None = None):
        return call(self.model if model is None else model, self.inputs)

    def loss(self, out) -> torch.Tensor:
        return loss_of(out, self.loss_fn)

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.size.items())


def hf_layers(model: nn.Module) -> list[str]:
    """The layers Hugging Face's own activation checkpointing wraps (GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = [n for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    if not names:
        raise RuntimeError(f"{type(model).__name__}: no GradientCheckpointingLayer found")
    return names


def make_bench(name: str, size: str = "default") -> Bench:
    """The peers benchmark's `name` at `SIZES[size]`."""
    recipe, kw = MODELS[name], dict(SIZES[size][name])
    if recipe.blocks is None and not recipe.hf:
        raise ValueError(f"{name} names no blocks to checkpoint: not a model of the peers benchmark")
    model, inputs, loss_fn = _made(name, kw, "cpu")
    blocks = hf_layers(model) if recipe.blocks is None else recipe.blocks(kw)
    why = "" if recipe.sequence else recipe.why
    return Bench(
        name, model, inputs, loss_fn, recipe.hf, blocks, sequence=recipe.sequence, no_sequence_why=why, size=kw
    )


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
