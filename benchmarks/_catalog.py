"""The benchmarks' models by name: titles and sizes (no torch, so that reports read them too).  `_models.py` builds
each one from `remat.zoo` (random weights, nothing downloaded).

`SIZES[size][model]` is the keyword arguments of the model's factory.  Each harness picks its size by name:
  worker                  `_worker.py`'s default (truth, validation and planning benchmarks); `{}` where absent
  default, quick, large   the peers benchmark (`peers/run.py`): the small zoo (< 30 min on 2 cores), the CI smoke
                          test, issue 15's realistic sizes (LARGE_ORDER; unplanned step >= 1 GiB by the process)
  full, smoke             the prepared GPU check (`gpu_check.py`), and its CPU test
  issue, smoke            issue 36's two models (`gpu_seconds.py`), as the issue ran them
  truth                   the CUDA truth check (`cuda_truth.py`)
"""

from __future__ import annotations

ORDER = ["mlp000", "chain001", "cnn002", "gpt2", "bert", "llama", "vit", "skipnet", "unet"]
"""The peers benchmark's zoo, in its report's order."""
LARGE_ORDER = ["bert", "llama", "gpt2", "unet", "vit"]
GPU_CHECK = ["bert", "llama_gqa", "t5", "unet_bn", "resmlp"]
ISSUE36 = ["llama_style_decoder", "bert_base_mlm"]

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
    "llama_gqa": "LlamaForCausalLM, GQA 16/4 heads, SDPA, bf16 autocast",
    "t5": "T5ForConditionalGeneration, dropout 0.1, fp32",
    "unet_bn": "U-Net, BatchNorm, skip concatenations, fp32",
    "resmlp": "MLP with skips (zoo.skipnet), dropout 0.1, fp32",
    "llama_style_decoder": "issue 36's Llama-style decoder: 16 x 1024, 16 heads over 4 KV heads, SDPA, bf16 autocast",
    "bert_base_mlm": "issue 36's BERT-base for masked LM (user report 004's model), fp32, SDPA",
}
GPU_CHECK_TITLES = {**TITLES, "bert": "BertForMaskedLM, dropout 0.1, fp32"}
"""The GPU check's table names the Hugging Face class of its BERT."""

_PEERS = {  # model: (default, quick)
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
_GPU = {  # model: (full, smoke)
    "bert": (
        dict(n_layer=6, hidden=768, heads=12, seq=512, batch=8, vocab=8192),
        dict(n_layer=2, hidden=32, heads=2, seq=64, batch=8, vocab=64),
    ),
    "llama_gqa": (
        dict(n_layer=8, hidden=1024, mlp=2816, heads=16, kv_heads=4, seq=1024, batch=4, vocab=8192),
        dict(n_layer=2, hidden=32, mlp=64, heads=4, kv_heads=2, seq=64, batch=8, vocab=64),
    ),
    "t5": (
        dict(n_layer=6, d_model=512, d_kv=64, d_ff=2048, heads=8, seq=512, target=128, batch=8, vocab=32128),
        dict(n_layer=2, d_model=32, d_kv=8, d_ff=64, heads=4, seq=64, target=32, batch=8, vocab=64),
    ),
    "unet_bn": (dict(ch=32, depth=3, image=128, batch=16), dict(ch=8, depth=2, image=32, batch=8)),
    "resmlp": (dict(width=1024, depth=4, batch=16384), dict(width=32, depth=4, batch=1024)),
    "llama_style_decoder": (  # issue 36's sizes: "issue" and "smoke"
        dict(n_layer=16, hidden=1024, mlp=2816, heads=16, kv_heads=4, vocab=32000, batch=4, seq=2048),
        dict(n_layer=2, hidden=64, mlp=128, heads=4, kv_heads=2, vocab=128, batch=4, seq=64),
    ),
    "bert_base_mlm": (
        dict(n_layer=12, hidden=768, heads=12, vocab=30522, batch=32, seq=512),
        dict(n_layer=2, hidden=64, heads=4, vocab=128, batch=4, seq=64),
    ),
}
SIZES: dict[str, dict[str, dict]] = {
    "worker": {
        "chain": dict(width=1024, blocks=32, batch=8192),
        "ff000": dict(hidden=512, intermediate=2048, layers=8, seq=512, batch=8),
        "gpt2": dict(n_layer=4, n_embd=512, n_head=8, seq=512, batch=2, vocab=8192),
        "bert": dict(n_layer=4, hidden=512, heads=8, seq=256, batch=4, vocab=8192),
        "cnn_bn": dict(batch=64, size=64),
        "skipnet": dict(width=1024, depth=4, batch=4096),
        "cnn002": dict(batch=100),
    },
    "default": {m: kw[0] for m, kw in _PEERS.items()},
    "quick": {m: kw[1] for m, kw in _PEERS.items()},
    "large": {  # unplanned step >= 1 GiB by the process counter (measured 2026-11-24), 3-5 s a step on 2 cores
        "gpt2": dict(n_layer=12, n_embd=256, n_head=4, seq=256, batch=8, vocab=8192),
        "bert": dict(n_layer=12, hidden=256, heads=4, seq=256, batch=8, vocab=8192),
        "llama": dict(n_layer=12, hidden=256, heads=4, seq=256, batch=12, vocab=8192),
        "vit": dict(n_layer=12, hidden=384, heads=6, image=224, patch=16, batch=16),
        "unet": dict(ch=32, depth=3, image=128, batch=20),
    },
    "full": {m: kw[0] for m, kw in _GPU.items() if m in GPU_CHECK},
    "issue": {m: kw[0] for m, kw in _GPU.items() if m in ISSUE36},
    "smoke": {m: kw[1] for m, kw in _GPU.items()},
    "truth": {
        "gpt2_medium": dict(seq=1024, batch=4),
        "bert_base": dict(n_layer=12, hidden=768, heads=12, seq=512, batch=16, vocab=30522),
        "llama": dict(n_layer=8, hidden=1024, mlp=2816, heads=16, seq=1024, batch=4, vocab=32000),
    },
}
"""size -> model -> the keyword arguments of its factory (`_models.build`)."""
