"""The zoo of the peers benchmark: every model built from code or configs, random weights,
nothing downloaded.  `build(name, size)` returns a `Bench`.

Sizes: "default" (the published run, < 30 min on 2 cores for the whole zoo) and "quick"
(the CI smoke test).  Each Bench names the modules a user would checkpoint "per block"
(`blocks`) and, where the model's forward is a plain loop over a list of modules, that
list (`sequence`), which is what `checkpoint_sequential` and Chen's sqrt(n) segments need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from remat import zoo

from _models import call, loss_of
from catalog import SIZES


@dataclass
class Bench:
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


def chain(width: int, blocks: int) -> nn.Sequential:
    """Report 001's chain: `blocks` x [Linear(w, w), ReLU] then a Sigmoid, in a plain nn.Sequential whose
    children are the Linear+ReLU pairs (same ops as the report's flat Sequential).  A plain
    nn.Sequential, not a subclass: remat plans segments only when the container's class name is
    "Sequential" (see docs/peers.md, "Bugs found")."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)], nn.Sigmoid())


def _hf_layers(model: nn.Module) -> list[str]:
    """The layers Hugging Face's own activation checkpointing wraps (GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = [n for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    if not names:
        raise RuntimeError(f"{type(model).__name__}: no GradientCheckpointingLayer found")
    return names


def _hf_inputs(vocab, batch, seq):
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": ids}


NOT_A_LOOP = "the forward is not a plain loop over one list of modules"


def _mlp000(kw: dict) -> Bench:
    model, x = zoo.mlp_report000(**kw)
    return Bench(
        "mlp000",
        model,
        x,
        None,
        False,
        [f"layers.{i}" for i in range(kw["layers"])],
        sequence=lambda m: list(m.layers),
        size=kw,
    )


def _chain001(kw: dict) -> Bench:
    model = chain(kw["width"], kw["blocks"])
    x = torch.randn(kw["batch"], kw["width"])
    return Bench(
        "chain001", model, x, None, False, [str(i) for i in range(kw["blocks"])], sequence=lambda m: list(m), size=kw
    )


def _cnn002(kw: dict) -> Bench:
    model, x, loss_fn = zoo.cnn_report002(**kw)
    return Bench(
        "cnn002",
        model,
        x,
        loss_fn,
        False,
        ["conv1", "conv2", "conv3", "fc1"],
        no_sequence_why=NOT_A_LOOP + " (F.relu and flatten between the layers)",
        size=kw,
    )


def _hf_bench(name: str, built: tuple, why: str, kw: dict) -> Bench:
    model, inputs = built
    return Bench(name, model, inputs, None, True, _hf_layers(model), no_sequence_why=why, size=kw)


def _llama(kw: dict) -> tuple:
    tf = zoo._hf()
    cfg = tf.LlamaConfig(
        hidden_size=kw["hidden"],
        intermediate_size=int(kw["hidden"] * 8 / 3 // 16 * 16),
        num_hidden_layers=kw["n_layer"],
        num_attention_heads=kw["heads"],
        num_key_value_heads=kw["heads"],
        vocab_size=kw["vocab"],
        max_position_embeddings=kw["seq"],
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg), _hf_inputs(kw["vocab"], kw["batch"], kw["seq"])


def _vit(kw: dict) -> tuple:
    tf = zoo._hf()
    cfg = tf.ViTConfig(
        image_size=kw["image"],
        patch_size=kw["patch"],
        hidden_size=kw["hidden"],
        num_hidden_layers=kw["n_layer"],
        num_attention_heads=kw["heads"],
        intermediate_size=4 * kw["hidden"],
        num_labels=10,
    )
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(cfg)
    inputs = {
        "pixel_values": torch.randn(kw["batch"], 3, kw["image"], kw["image"]),
        "labels": torch.randint(0, 10, (kw["batch"],)),
    }
    return model, inputs


class _DoubleConv(nn.Sequential):
    """Two 3x3 convolutions, each followed by GroupNorm and SiLU: one U-Net stage."""

    def __init__(self, cin: int, cout: int):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.GroupNorm(8, cout),
            nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.GroupNorm(8, cout),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """A convolutional U-Net (denoiser shape): `depth` down stages (max-pool, double conv), as many up
    stages (transposed conv, concatenation with the mirrored down stage's output, double conv)."""

    def __init__(self, ch: int, depth: int):
        super().__init__()
        widths = [ch * 2**i for i in range(depth + 1)]
        self.stem = _DoubleConv(3, ch)
        self.down = nn.ModuleList(_DoubleConv(widths[i], widths[i + 1]) for i in range(depth))
        self.upsample = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(depth))
        self.up = nn.ModuleList(_DoubleConv(2 * widths[i], widths[i]) for i in range(depth))
        self.head = nn.Conv2d(ch, 3, 1)

    def forward(self, x):
        x = self.stem(x)
        skips = []
        for blk in self.down:
            skips.append(x)
            x = blk(nn.functional.max_pool2d(x, 2))
        for i in reversed(range(len(self.up))):
            x = self.up[i](torch.cat([self.upsample[i](x), skips.pop()], dim=1))
        return self.head(x)


def _unet(kw: dict) -> Bench:
    torch.manual_seed(0)
    model = UNet(kw["ch"], kw["depth"])
    x = torch.randn(kw["batch"], 3, kw["image"], kw["image"])
    target = torch.randn_like(x)
    blocks = ["stem"] + [f"down.{i}" for i in range(kw["depth"])] + [f"up.{i}" for i in range(kw["depth"])]
    return Bench(
        "unet",
        model,
        x,
        lambda out: nn.functional.mse_loss(out, target),
        False,
        blocks,
        no_sequence_why="long skip connections: each down stage's output is concatenated into an up stage",
        size=kw,
    )


def _skipnet(kw: dict) -> Bench:
    model, x = zoo.skipnet(**kw)
    blocks = [f"down.{i}" for i in range(kw["depth"])] + [f"up.{i}" for i in range(kw["depth"])]
    return Bench(
        "skipnet",
        model,
        x,
        None,
        False,
        blocks,
        no_sequence_why="long skip connections: the encoder's outputs are used again by the decoder",
        size=kw,
    )


BUILDERS = {
    "mlp000": _mlp000,
    "chain001": _chain001,
    "cnn002": _cnn002,
    "gpt2": lambda kw: _hf_bench(
        "gpt2", zoo.gpt2(**kw), "HF layers take masks and caches besides the hidden states", kw
    ),
    "bert": lambda kw: _hf_bench("bert", zoo.bert(**kw), "HF layers take masks besides the hidden states", kw),
    "llama": lambda kw: _hf_bench("llama", _llama(kw), "HF layers take position embeddings and masks", kw),
    "vit": lambda kw: _hf_bench("vit", _vit(kw), "HF layers are called with extra arguments", kw),
    "skipnet": _skipnet,
    "unet": _unet,
}


def build(name: str, size: str = "default") -> Bench:
    if name not in BUILDERS:
        raise KeyError(name)
    kw = dict(SIZES[size][name])
    torch.manual_seed(0)
    return BUILDERS[name](kw)
