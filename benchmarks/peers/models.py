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

ORDER = ["mlp000", "chain001", "cnn002", "gpt2", "bert", "llama", "vit", "skipnet"]

TITLES = {
    "mlp000": "report 000's MLP (FeedForward, scaled)",
    "chain001": "report 001's chain of Linear+ReLU blocks",
    "cnn002": "report 002's CNN (own size)",
    "gpt2": "Hugging Face GPT-2 (small config)",
    "bert": "Hugging Face BERT (small config)",
    "llama": "Hugging Face Llama (small config)",
    "vit": "Hugging Face ViT (small config)",
    "skipnet": "MLP with long skip connections (U-Net-like)",
}

SIZES: dict[str, dict[str, dict]] = {
    "default": {
        "mlp000": dict(hidden=128, intermediate=512, layers=8, seq=256, batch=4),
        "chain001": dict(width=128, blocks=32, batch=2048),
        "cnn002": dict(batch=100),
        "gpt2": dict(n_layer=6, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048),
        "bert": dict(n_layer=6, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
        "llama": dict(n_layer=6, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
        "vit": dict(n_layer=6, hidden=128, heads=4, image=64, patch=8, batch=16),
        "skipnet": dict(width=256, depth=4, batch=2048),
    },
    "quick": {
        "mlp000": dict(hidden=32, intermediate=128, layers=4, seq=64, batch=4),
        "chain001": dict(width=32, blocks=8, batch=512),
        "cnn002": dict(batch=10),
        "gpt2": dict(n_layer=3, n_embd=32, n_head=2, seq=64, batch=2, vocab=128),
        "bert": dict(n_layer=3, hidden=32, heads=2, seq=64, batch=2, vocab=128),
        "llama": dict(n_layer=3, hidden=32, heads=2, seq=64, batch=2, vocab=128),
        "vit": dict(n_layer=3, hidden=32, heads=2, image=32, patch=8, batch=4),
        "skipnet": dict(width=64, depth=2, batch=256),
    },
}


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
        m = self.model if model is None else model
        if isinstance(self.inputs, dict):
            return m(**self.inputs)
        return m(self.inputs)

    def loss(self, out) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(out)
        if isinstance(out, torch.Tensor):
            return out.sum()
        return out.loss

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


def build(name: str, size: str = "default") -> Bench:
    kw = dict(SIZES[size][name])
    torch.manual_seed(0)
    not_a_loop = "the forward is not a plain loop over one list of modules"
    if name == "mlp000":
        model, x = zoo.mlp_report000(**kw)
        return Bench(name, model, x, None, False, [f"layers.{i}" for i in range(kw["layers"])],
                     sequence=lambda m: list(m.layers), size=kw)
    if name == "chain001":
        model = chain(kw["width"], kw["blocks"])
        x = torch.randn(kw["batch"], kw["width"])
        return Bench(name, model, x, None, False, [str(i) for i in range(kw["blocks"])],
                     sequence=lambda m: list(m), size=kw)
    if name == "cnn002":
        model, x, loss_fn = zoo.cnn_report002(**kw)
        return Bench(name, model, x, loss_fn, False, ["conv1", "conv2", "conv3", "fc1"],
                     no_sequence_why=not_a_loop + " (F.relu and flatten between the layers)", size=kw)
    if name == "gpt2":
        model, inputs = zoo.gpt2(**kw)
        return Bench(name, model, inputs, None, True, _hf_layers(model),
                     no_sequence_why="HF layers take masks and caches besides the hidden states", size=kw)
    if name == "bert":
        model, inputs = zoo.bert(**kw)
        return Bench(name, model, inputs, None, True, _hf_layers(model),
                     no_sequence_why="HF layers take masks besides the hidden states", size=kw)
    if name == "llama":
        tf = zoo._hf()
        cfg = tf.LlamaConfig(
            hidden_size=kw["hidden"], intermediate_size=int(kw["hidden"] * 8 / 3 // 16 * 16),
            num_hidden_layers=kw["n_layer"], num_attention_heads=kw["heads"], num_key_value_heads=kw["heads"],
            vocab_size=kw["vocab"], max_position_embeddings=kw["seq"], use_cache=False,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg)
        return Bench(name, model, _hf_inputs(kw["vocab"], kw["batch"], kw["seq"]), None, True,
                     _hf_layers(model),
                     no_sequence_why="HF layers take position embeddings and masks", size=kw)
    if name == "vit":
        tf = zoo._hf()
        cfg = tf.ViTConfig(
            image_size=kw["image"], patch_size=kw["patch"], hidden_size=kw["hidden"], num_hidden_layers=kw["n_layer"],
            num_attention_heads=kw["heads"], intermediate_size=4 * kw["hidden"], num_labels=10,
        )
        torch.manual_seed(0)
        model = tf.ViTForImageClassification(cfg)
        inputs = {"pixel_values": torch.randn(kw["batch"], 3, kw["image"], kw["image"]),
                  "labels": torch.randint(0, 10, (kw["batch"],))}
        return Bench(name, model, inputs, None, True, _hf_layers(model),
                     no_sequence_why="HF layers are called with extra arguments", size=kw)
    if name == "skipnet":
        model, x = zoo.skipnet(**kw)
        blocks = [f"down.{i}" for i in range(kw["depth"])] + [f"up.{i}" for i in range(kw["depth"])]
        return Bench(name, model, x, None, False, blocks,
                     no_sequence_why="long skip connections: the encoder's outputs are used again by the decoder",
                     size=kw)
    raise KeyError(name)
