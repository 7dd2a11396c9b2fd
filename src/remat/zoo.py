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


def bert(
    n_layer: int = 4,
    hidden: int = 256,
    heads: int = 4,
    seq: int = 128,
    batch: int = 8,
    vocab: int = 8192,
    *,
    attn: str | None = None,
):
    """A BERT encoder with a masked-LM head (Hugging Face BertForMaskedLM) and labels; `attn` the attention
    implementation ("sdpa", "eager"; default: transformers' own choice)."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.BertConfig(
        num_hidden_layers=n_layer,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        vocab_size=vocab,
        max_position_embeddings=seq,
        **({"attn_implementation": attn} if attn else {}),
    )
    model = tf.BertForMaskedLM(cfg)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}


def albert(
    n_layer: int = 6,
    hidden: int = 128,
    heads: int = 4,
    seq: int = 128,
    batch: int = 8,
    vocab: int = 2000,
    *,
    embedding: int = 64,
):
    """ALBERT for masked LM (Hugging Face AlbertForMaskedLM) and labels: one layer whose weights all `n_layer` calls
    share, its forward run `n_layer` times a step (NOTE [A module called more than once])."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.AlbertConfig(
        vocab_size=vocab,
        embedding_size=embedding,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
    )
    model = tf.AlbertForMaskedLM(cfg)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}


def llama(
    n_layer: int = 4,
    hidden: int = 256,
    heads: int = 4,
    seq: int = 256,
    batch: int = 8,
    vocab: int = 8192,
    *,
    kv_heads: int | None = None,
    mlp: int | None = None,
    attn: str | None = None,
):
    """A Llama-style decoder (Hugging Face LlamaForCausalLM: RMSNorm, rotary positions, SwiGLU MLP) with labels.
    `kv_heads` below `heads` is grouped-query attention (default: one K/V head per head); `mlp` the MLP's width
    (default 8/3 of `hidden`, a multiple of 16); `attn` the attention implementation ("sdpa", "eager"; default:
    transformers' own choice)."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=mlp or int(hidden * 8 / 3 // 16 * 16),
        num_hidden_layers=n_layer,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        vocab_size=vocab,
        max_position_embeddings=seq,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        **({"attn_implementation": attn} if attn else {}),
    )
    model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}


def t5(
    n_layer: int = 4,
    d_model: int = 256,
    heads: int = 8,
    seq: int = 128,
    batch: int = 8,
    vocab: int = 8192,
    *,
    d_kv: int = 32,
    d_ff: int = 1024,
    target: int = 32,
):
    """An encoder-decoder (Hugging Face T5ForConditionalGeneration, dropout 0.1): `seq` input tokens, `target`
    label tokens (the decoder's input is the labels shifted)."""
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.T5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=d_kv,
        d_ff=d_ff,
        num_layers=n_layer,
        num_heads=heads,
        dropout_rate=0.1,
        use_cache=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = tf.T5ForConditionalGeneration(cfg)
    ids = torch.randint(2, vocab, (batch, seq))
    return model, {"input_ids": ids, "labels": torch.randint(2, vocab, (batch, target))}


def vit(n_layer: int = 4, hidden: int = 128, heads: int = 4, image: int = 64, patch: int = 8, batch: int = 16):
    """A vision transformer (Hugging Face ViTForImageClassification, 10 classes) on random images and labels."""
    tf = _hf()
    cfg = tf.ViTConfig(
        image_size=image,
        patch_size=patch,
        hidden_size=hidden,
        num_hidden_layers=n_layer,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        num_labels=10,
    )
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(cfg)
    pixels = torch.randn(batch, 3, image, image)
    return model, {"pixel_values": pixels, "labels": torch.randint(0, 10, (batch,))}


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


class _DoubleConv(nn.Sequential):
    """Two 3x3 convolutions, each followed by a normalisation (`norm(channels)`) and SiLU: one U-Net stage."""

    def __init__(self, cin: int, cout: int, norm):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1),
            norm(cout),
            nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            norm(cout),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """A convolutional U-Net (a denoiser's shape): `depth` down stages (max-pool, double conv), as many up stages
    (transposed conv, concatenation with the mirrored down stage's output, double conv)."""

    def __init__(self, ch: int, depth: int, norm=lambda c: nn.GroupNorm(8, c)):
        super().__init__()
        widths = [ch * 2**i for i in range(depth + 1)]
        self.stem = _DoubleConv(3, ch, norm)
        self.down = nn.ModuleList(_DoubleConv(widths[i], widths[i + 1], norm) for i in range(depth))
        self.upsample = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(depth))
        self.up = nn.ModuleList(_DoubleConv(2 * widths[i], widths[i], norm) for i in range(depth))
        self.head = nn.Conv2d(ch, 3, 1)

    def forward(self, x):  # (B, 3, H, W)
        x = self.stem(x)
        skips = []
        for blk in self.down:
            skips.append(x)
            x = blk(F.max_pool2d(x, 2))
        for i in reversed(range(len(self.up))):
            x = self.up[i](torch.cat([self.upsample[i](x), skips.pop()], dim=1))
        return self.head(x)


def unet(ch: int = 16, depth: int = 3, image: int = 64, batch: int = 8, *, batchnorm: bool = False):
    """UNet (GroupNorm, or BatchNorm2d with `batchnorm`) with MSE loss against a random target image."""
    torch.manual_seed(0)
    model = UNet(ch, depth, nn.BatchNorm2d if batchnorm else (lambda c: nn.GroupNorm(8, c)))
    x = torch.randn(batch, 3, image, image)
    target = torch.randn_like(x)
    return model, x, lambda out: F.mse_loss(out, target)


def demo():
    """The model `remat demo` runs: `gpt2` at batch 4 (its default, 8, took the demo past 50 s on a 2-core machine,
    most of it in `remat.verify`'s steps)."""
    return gpt2(batch=4)
