"""Small real architectures built from Hugging Face configs (random weights, nothing downloaded), for the
tests that every kind of model plans, applies, verifies and trains."""

from __future__ import annotations

import torch
import torch.nn as nn

import remat
from remat import zoo


def least_plan(prof: remat.StepProfile) -> remat.Plan:
    """The least-memory plan, as `remat.frontier(prof)[-1]` but without the points above it: a frontier cut short
    still ends with it (test_plan's test_frontier_runs_down_to_the_least_peak_even_when_cut_short).  On T5, whose
    plans the ilp solver makes, the whole frontier took 16 s of each test that only wanted its last point."""
    return remat.frontier(prof, max_points=2)[-1]


def _tf():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _ids(vocab: int, batch: int = 2, seq: int = 32) -> dict:
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": ids}


def bert():
    """Encoder."""
    model, inputs = zoo.bert(n_layer=3, hidden=64, heads=2, seq=32, batch=2, vocab=256)
    return model, inputs


def gpt2():
    """Decoder with tied input and output embeddings, its default use_cache=True."""
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    model.config.use_cache = True
    return model, inputs


def llama():
    """Llama-like decoder (RMSNorm, rotary, SwiGLU)."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return tf.LlamaForCausalLM(cfg), _ids(256)


def t5():
    """Encoder-decoder, use_cache=True by default."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_heads=4, decoder_start_token_id=0
    )
    return tf.T5ForConditionalGeneration(cfg), _ids(512, batch=4)


def bart():
    """Encoder-decoder with learned positions; its ids avoid the special tokens 0-3 (pad is 1)."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.BartConfig(
        vocab_size=256,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
    )
    ids = torch.randint(4, 256, (2, 32))
    return tf.BartForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}


def moe():
    """Mixture of experts (Mixtral)."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return tf.MixtralForCausalLM(cfg), _ids(256)


def resnet():
    """Vision CNN with BatchNorm (Hugging Face ResNet)."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 2, 1], num_labels=10)
    inputs = {"pixel_values": torch.randn(4, 3, 64, 64), "labels": torch.randint(0, 10, (4,))}
    return tf.ResNetForImageClassification(cfg), inputs


def resnet_stem():
    """A ResNet whose stem (7x7 convolution, BatchNorm, ReLU, max pool on 160x160 images) holds more than
    any stage: checkpointing the stem by hand beat remat's stated least until stems were candidates."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.ResNetConfig(
        embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="basic", num_labels=10
    )
    inputs = {"pixel_values": torch.randn(8, 3, 160, 160), "labels": torch.randint(0, 10, (8,))}
    return tf.ResNetForImageClassification(cfg), inputs


def vit():
    """Vision transformer."""
    tf = _tf()
    torch.manual_seed(0)
    cfg = tf.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )
    inputs = {"pixel_values": torch.randn(4, 3, 32, 32), "labels": torch.randint(0, 10, (4,))}
    return tf.ViTForImageClassification(cfg), inputs


class Stages(nn.Module):
    """Blocks kept in an nn.ModuleDict by name, each an nn.Sequential, run in order."""

    def __init__(self, width: int = 128):
        super().__init__()
        block = lambda: nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))  # noqa: E731
        self.stages = nn.ModuleDict({name: block() for name in ("stem", "body", "neck", "head")})

    def forward(self, x):  # (B, width)
        for stage in self.stages.values():
            x = stage(x)
        return x


def stages():
    torch.manual_seed(0)
    return Stages(), torch.randn(256, 128)


class Encoder(nn.Module):
    """The Lightning example's model (docs/integrations.md): torch's own encoder layers in an nn.ModuleList."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 128)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(128, 4, 256, dropout=0.1, batch_first=True) for _ in range(4)
        )
        self.head = nn.Linear(128, 1)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).sum()


def encoder():
    torch.manual_seed(0)
    return Encoder(), torch.randn(16, 128, 16)


ALL = {f.__name__: f for f in (bert, gpt2, llama, t5, moe, resnet, vit, stages)}
HAND = {f.__name__: f for f in (bert, gpt2, t5, resnet_stem, vit)}
"""Models with an embedder, stem or head beside their layers, for the hand recipes."""
