"""The names, titles and sizes of the peers benchmark's zoo (no torch: the report reads them too).

Sizes: "default" (the small zoo, < 30 min on 2 cores), "quick" (the CI smoke test) and "large"
(issue 15: models whose unplanned step is >= 1 GiB on the process counter; LARGE_ORDER, about 20 min
a model on 2 cores).  models.py builds each one.
"""

from __future__ import annotations

ORDER = ["mlp000", "chain001", "cnn002", "gpt2", "bert", "llama", "vit", "skipnet", "unet"]
LARGE_ORDER = ["bert", "llama", "gpt2", "unet", "vit"]

TITLES = {
    "mlp000": "report 000's MLP (FeedForward, scaled)",
    "chain001": "report 001's chain of Linear+ReLU blocks",
    "cnn002": "report 002's CNN (own size)",
    "gpt2": "Hugging Face GPT-2 (from a config)",
    "bert": "Hugging Face BERT (from a config)",
    "llama": "Hugging Face Llama (from a config)",
    "vit": "Hugging Face ViT (from a config)",
    "skipnet": "MLP with long skip connections (U-Net-like)",
    "unet": "convolutional U-Net (GroupNorm, SiLU, skip concatenations)",
}

_SIZES = {  # model: (default, quick)
    "mlp000": (
        dict(hidden=128, intermediate=512, layers=8, seq=256, batch=4),
        dict(hidden=32, intermediate=128, layers=4, seq=64, batch=4),
    ),
    "chain001": (dict(width=128, blocks=32, batch=2048), dict(width=32, blocks=8, batch=512)),
    "cnn002": (dict(batch=100), dict(batch=10)),
    "gpt2": (
        dict(n_layer=6, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048),
        dict(n_layer=3, n_embd=32, n_head=2, seq=64, batch=2, vocab=128),
    ),
    "bert": (
        dict(n_layer=6, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
        dict(n_layer=3, hidden=32, heads=2, seq=64, batch=2, vocab=128),
    ),
    "llama": (
        dict(n_layer=6, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
        dict(n_layer=3, hidden=32, heads=2, seq=64, batch=2, vocab=128),
    ),
    "vit": (
        dict(n_layer=6, hidden=128, heads=4, image=64, patch=8, batch=16),
        dict(n_layer=3, hidden=32, heads=2, image=32, patch=8, batch=4),
    ),
    "skipnet": (dict(width=256, depth=4, batch=2048), dict(width=64, depth=2, batch=256)),
    "unet": (dict(ch=16, depth=3, image=64, batch=8), dict(ch=8, depth=2, image=32, batch=2)),
}
_LARGE = {  # unplanned step >= 1 GiB by the process counter (measured 2026-11-24), 3-5 s a step on 2 cores
    "gpt2": dict(n_layer=12, n_embd=256, n_head=4, seq=256, batch=8, vocab=8192),
    "bert": dict(n_layer=12, hidden=256, heads=4, seq=256, batch=8, vocab=8192),
    "llama": dict(n_layer=12, hidden=256, heads=4, seq=256, batch=12, vocab=8192),
    "vit": dict(n_layer=12, hidden=384, heads=6, image=224, patch=16, batch=16),
    "unet": dict(ch=32, depth=3, image=128, batch=20),
}
SIZES: dict[str, dict[str, dict]] = {
    size: {m: kw[i] for m, kw in _SIZES.items()} for i, size in enumerate(("default", "quick"))
}
SIZES["large"] = _LARGE
"""size ("default", "quick" or "large") -> model -> the keyword arguments of its factory."""
