"""The checkpointing attempts of the user reports, rebuilt on the models of `remat.zoo`.

Each factory returns `(model, inputs)` or `(model, inputs, loss_fn)`, so each is a TARGET:
`remat explain remat.explainer.examples:report000`.  Sizes are scaled down to run on a CPU in
seconds; `report000_full` is the report's own size, for `--mode fake`.  docs/explain.md
shows what `remat explain` prints for each, and tests/test_explain.py checks the figures.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from remat import zoo
from remat._torch_compat import fsdp_checkpoint_wrapper


def report000(hidden: int = 64, intermediate: int = 256, layers: int = 8, seq: int = 64, batch: int = 4):
    """Report 000: `model = checkpoint_wrapper(model)` around the whole feed-forward network.

    The report's torch made checkpoint_wrapper reentrant by default; so does this example.
    """
    model, x = zoo.mlp_report000(hidden, intermediate, layers, seq, batch)
    return fsdp_checkpoint_wrapper(model, reentrant=True), x


def report000_full():
    """Report 000 at its own size (hidden 1024, intermediate 4096, 8 layers, seq 1024, batch 128): use --mode fake."""
    return report000(1024, 4096, 8, 1024, 128)


class SequentialCheckpoints(nn.Module):
    """`checkpoint_sequential(seq, segments, x)` as the model's forward (report 001)."""

    def __init__(self, seq: nn.Sequential, segments: int):
        super().__init__()
        self.seq, self.segments = seq, segments

    def forward(self, x):
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)


def report001(segments: int = 16, width: int = 64, blocks: int = 32, batch: int = 512):
    """Report 001: the Linear/ReLU chain (ending in a Sigmoid) run through checkpoint_sequential(segments)."""
    model, x = zoo.chain_report001(width, blocks, batch)
    return SequentialCheckpoints(model, segments), x


class OpByOpCNN(zoo.ReportCNN):
    """Report 002's CNN with a checkpoint around each op, as the report wrote it (reentrant, its torch's only kind)."""

    def flat(self, x):
        return torch.flatten(x, 1)

    def forward(self, x):  # (B, 20, h, w)
        x = F.relu(self.conv1(x))
        x = checkpoint(self.conv2, x, use_reentrant=True)
        x = checkpoint(F.relu, x, use_reentrant=True)
        x = checkpoint(self.conv3, x, use_reentrant=True)
        x = checkpoint(F.relu, x, use_reentrant=True)
        x = checkpoint(self.flat, x, use_reentrant=True)
        return checkpoint(self.fc1, x, use_reentrant=True)


def report002(batch: int = 100, out: int = 3258):
    """Report 002: the CNN checkpointed op by op, MSE loss against a random target (use Adam, as the report)."""
    torch.manual_seed(0)
    model = OpByOpCNN(out=out)
    x, y = torch.randn(batch, 20, 19, 22), torch.randn(batch, out)
    return model, x, lambda out: F.mse_loss(out, y)


class TutorialModel(nn.Module):
    """Report 003's MyModel: Linear(1024, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 10), with the
    checkpoints the tutorial meant (layer2 and layer3), written so that they run."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(1024, 1024)
        self.relu = nn.ReLU()
        self.layer2 = nn.Linear(1024, 1024)
        self.layer3 = nn.Linear(1024, 10)

    def forward(self, x):  # (B, 1024)
        x = self.relu(self.layer1(x))
        x = self.relu(checkpoint(self.layer2, x, use_reentrant=False))
        return checkpoint(self.layer3, x, use_reentrant=False)


def report003(batch: int = 32):
    """Report 003: the tutorial's model at its batch of 32, layer2 and layer3 checkpointed."""
    torch.manual_seed(0)
    return TutorialModel(), torch.randn(batch, 1024)


def report004(n_layer: int = 4, seq: int = 128, batch: int = 8):
    """Report 004: a BERT with every layer checkpointed (OneFlow's experiment, here with Hugging Face's own)."""
    model, inputs = zoo.bert(n_layer=n_layer, hidden=128, heads=4, seq=seq, batch=batch, vocab=1024)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    return model, inputs


def per_layer_gpt2(use_cache: bool = False, n_layer: int = 4, seq: int = 128, batch: int = 4):
    """A GPT-2-style model with one checkpoint_wrapper per layer, done right (no finding expected)."""
    model, inputs = zoo.gpt2(n_layer=n_layer, n_embd=64, n_head=2, seq=seq, batch=batch, vocab=256)
    model.config.use_cache = use_cache
    for i, layer in enumerate(model.transformer.h):
        model.transformer.h[i] = fsdp_checkpoint_wrapper(layer)
    return model, inputs


def hf_checkpointing(n_layer: int = 3, seq: int = 64, batch: int = 2):
    """A GPT-2-style model checkpointed by Hugging Face itself (activation_checkpointing_enable): no finding."""
    model, inputs = zoo.gpt2(n_layer=n_layer, n_embd=64, n_head=2, seq=seq, batch=batch, vocab=256)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    return model, inputs


def gpt2_with_cache():
    """The same with use_cache=True, the Hugging Face default: the KV cache lives through the step."""
    return per_layer_gpt2(use_cache=True)


class DropoutLayers(nn.Module):
    """Layers with dropout, checkpointed with preserve_rng_state=False."""

    def __init__(self, width: int = 64, n: int = 4, preserve_rng_state: bool = False):
        super().__init__()
        self.stem = nn.Linear(32, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width))
            for _ in range(n)
        )
        self.preserve = preserve_rng_state

    def forward(self, x):  # (B, 32)
        x = self.stem(x)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=self.preserve)
        return x


def dropout_no_rng(preserve_rng_state: bool = False):
    torch.manual_seed(0)
    return DropoutLayers(preserve_rng_state=preserve_rng_state), torch.randn(512, 32)


class FrozenStem(nn.Module):
    """A frozen stem (think: frozen embeddings under LoRA) whose output feeds a reentrant checkpoint."""

    def __init__(self, width: int = 64, n: int = 4, use_reentrant: bool = True):
        super().__init__()
        self.stem = nn.Linear(32, width).requires_grad_(False)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)) for _ in range(n)
        )
        self.use_reentrant = use_reentrant

    def forward(self, x):  # (B, 32)
        x = checkpoint(self.layers[0], self.stem(x), use_reentrant=self.use_reentrant)
        for layer in self.layers[1:]:
            x = layer(x)
        return x


def frozen_stem(use_reentrant: bool = True):
    torch.manual_seed(0)
    return FrozenStem(use_reentrant=use_reentrant), torch.randn(512, 32)


class CheckpointedStages(zoo.ConvBNNet):
    """ConvBNNet with each [Conv, BN, ReLU] x 2 stage checkpointed: BatchNorm is recomputed."""

    def forward(self, x):  # (B, 3, H, W)
        for stage in self.stages:
            x = checkpoint(stage, x, use_reentrant=False)
        return self.head(x.mean(dim=(2, 3)))


def batchnorm_stages(batch: int = 8, size: int = 16):
    torch.manual_seed(0)
    model = CheckpointedStages()
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    return model, x, lambda out: F.cross_entropy(out, y)


def compile_budget_by_hand(budget: float = 0.5):
    """A training script's way to save memory under torch.compile: torch's activation memory budget set below 1.0
    by hand, on a GPT-2 that trains with dropout (torch may then re-draw the masks in backward).  Like such a
    script, this sets the budget for the rest of the process."""
    from remat._torch_compat.compiler import set_activation_memory_budget

    set_activation_memory_budget(budget)
    return zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=64, batch=4, vocab=256)
