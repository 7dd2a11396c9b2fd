"""Built-in models for the demo, the docs and the tests: built from code or configs,
random weights, nothing downloaded.  Each factory returns `(model, inputs)` or
`(model, inputs, loss_fn)`, the shape `remat profile TARGET` expects, so
`remat profile remat.zoo:gpt2` works.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from remat.errors import RematError


def _hf():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without transformers
        raise RematError(
            "remat: this built-in model needs the `transformers` package, which is not installed. "
            "Fix: pip install 'remat[hf]' (or pip install transformers)."
        ) from e
    transformers.logging.set_verbosity_error()
    return transformers


def gpt2(n_layer: int = 4, n_embd: int = 256, n_head: int = 4, seq: int = 256, batch: int = 8, vocab: int = 8192):
    """A GPT-2-style language model (Hugging Face GPT2LMHeadModel) with labels, so `out.loss` is the loss."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=seq,
        vocab_size=vocab,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,  # training: no KV cache
    )
    model = tf.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}


def gpt2_medium(seq: int = 1024, batch: int = 8):
    """GPT-2 medium's shape: 24 layers, 1024 wide, 16 heads, 50257 tokens (355M parameters)."""
    return gpt2(n_layer=24, n_embd=1024, n_head=16, seq=seq, batch=batch, vocab=50257)


def bert(n_layer: int = 4, hidden: int = 256, heads: int = 4, seq: int = 128, batch: int = 8, vocab: int = 8192):
    """A BERT encoder with a masked-LM head (Hugging Face BertForMaskedLM) and labels."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.BertConfig(
        num_hidden_layers=n_layer,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        vocab_size=vocab,
        max_position_embeddings=seq,
    )
    model = tf.BertForMaskedLM(cfg)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}


class FeedForward(nn.Module):
    """User report 000's model: `num_layers` blocks of Linear(h, i) -> Linear(i, h)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden_size, intermediate_size), nn.Linear(intermediate_size, hidden_size))
            for _ in range(num_layers)
        )

    def forward(self, x):  # (B, T, h)
        for layer in self.layers:
            x = layer(x)
        return x


def mlp_report000(hidden: int = 256, intermediate: int = 1024, layers: int = 8, seq: int = 64, batch: int = 8):
    """Report 000's feed-forward network (full size: 1024, 4096, 8, seq 1024, batch 128), input requires grad."""
    torch.manual_seed(0)
    model = FeedForward(hidden, intermediate, layers)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    return model, x


def chain_report001(width: int = 1024, blocks: int = 32, batch: int = 1024):
    """Report 001's chain: `blocks` x [Linear(width, width), ReLU] ending in a Sigmoid (an nn.Sequential)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Sigmoid())
    return nn.Sequential(*layers), torch.randn(batch, width)


class ReportCNN(nn.Module):
    """Report 002's CNN: three 3x3 convolutions with ReLU, flatten, one large Linear."""

    def __init__(self, h: int = 19, w: int = 22, out: int = 3258):
        super().__init__()
        self.conv1 = nn.Conv2d(20, 50, 3, padding=1)
        self.conv2 = nn.Conv2d(50, 25, 3, padding=1)
        self.conv3 = nn.Conv2d(25, 10, 3, padding=1)
        self.fc1 = nn.Linear(h * w * 10, out)

    def forward(self, x):  # (B, 20, h, w)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.fc1(torch.flatten(x, 1))


def cnn_report002(batch: int = 100):
    """Report 002's first CNN at its own size (input 20x19x22, batch 100), MSE loss against a random target."""
    torch.manual_seed(0)
    model = ReportCNN()
    x, y = torch.randn(batch, 20, 19, 22), torch.randn(batch, 3258)
    return model, x, lambda out: F.mse_loss(out, y)


class ConvBNNet(nn.Module):
    """A small VGG-style CNN with BatchNorm: stages of [Conv, BN, ReLU] x 2 + pooling."""

    def __init__(self, widths=(32, 64, 128), classes: int = 10):
        super().__init__()
        stages, c = [], 3
        for w in widths:
            stages.append(
                nn.Sequential(
                    nn.Conv2d(c, w, 3, padding=1),
                    nn.BatchNorm2d(w),
                    nn.ReLU(),
                    nn.Conv2d(w, w, 3, padding=1),
                    nn.BatchNorm2d(w),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                )
            )
            c = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(c, classes)

    def forward(self, x):  # (B, 3, H, W)
        return self.head(self.stages(x).mean(dim=(2, 3)))


def cnn_bn(batch: int = 16, size: int = 32):
    """ConvBNNet with cross-entropy on random labels."""
    torch.manual_seed(0)
    model = ConvBNNet()
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    return model, x, lambda out: F.cross_entropy(out, y)


class SkipNet(nn.Module):
    """A U-Net-like MLP: encoder blocks whose outputs are added back to the mirrored decoder blocks."""

    def __init__(self, width: int = 512, depth: int = 4):
        super().__init__()
        self.down = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.up = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))

    def forward(self, x):  # (B, width)
        skips = []
        for blk in self.down:
            x = blk(x)
            skips.append(x)
        for blk in self.up:
            x = blk(x) + skips.pop()  # long skip connection
        return x


def skipnet(width: int = 512, depth: int = 4, batch: int = 256):
    """SkipNet with sum loss: activations of the encoder live until the decoder uses them."""
    torch.manual_seed(0)
    return SkipNet(width, depth), torch.randn(batch, width)


def demo():
    """The model `remat demo` runs: `gpt2` at batch 4 (its default, 8, took the demo past 50 s on a 2-core machine,
    most of it in `remat.verify`'s steps)."""
    return gpt2(batch=4)
