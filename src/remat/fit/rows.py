"""The rows of the batch `remat fit` builds, and what the answer says they are (NOTE [A model from its config],
Rule 5, in `remat.fit.build`): token ids (a multiple choice model's: a sequence per answer), Whisper's log-mel
frames, or an image classifier's images."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import nn

from remat.fit.setup import FitError, Setup

IMAGE = "image-cls"
"""The image classification head (`remat.fit.build.HEADS`): its rows are images, not tokens."""
CHOICE = "multiple-choice"
"""The multiple choice head (`remat.fit.build.HEADS`): each row is `--choices` sequences, one per answer."""
DEFAULT_CHOICES = 4
"""`--choices` where it is not given: SWAG's four endings, the data transformers' multiple choice guide trains on."""
FRAMES_PER_SECOND = 100  # Whisper's feature extractor: a frame every 160 samples at 16 kHz


def batch_for(model: nn.Module, config, head: str, setup: Setup) -> dict[str, Any]:
    """The model's batch (`batch_of`), with `interpolate_pos_encoding=True` for an image classifier that
    interpolates its position embeddings, asked for images of another size than its config's (ViT at 384)."""
    batch: dict[str, Any] = batch_of(config, head, setup)
    if head == IMAGE and _interpolates(model) and image_shape(config, setup) != image_shape(config):
        batch["interpolate_pos_encoding"] = True  # as Hugging Face's models read images of another size
    return batch


def _interpolates(model: nn.Module) -> bool:
    """Whether the model's forward interpolates its position embeddings to another image size when asked (ViT)."""
    base = getattr(model, "get_base_model", None)  # peft's PeftModel passes the argument on to it
    inner = base() if callable(base) else model
    return "interpolate_pos_encoding" in inspect.signature(type(inner).forward).parameters


def batch_of(config, head: str, setup: Setup) -> dict[str, torch.Tensor]:
    """Rule 5: the global batch of token ids (Whisper: log-mel frames) and labels, on the meta device."""
    rows = setup.batch * setup.world_size
    if head == "speech-seq2seq":  # the 30 s of audio Whisper's encoder takes, whatever the clip's length
        frames = (config.num_mel_bins, audio_frames(config))
        features = torch.zeros(rows, *frames, dtype=setup.precision.weights, device="meta")
        return {"input_features": features, "labels": torch.zeros(rows, setup.seq, dtype=torch.long, device="meta")}
    if head == IMAGE:  # images of --image-size pixels (by default the config's), one class label each
        pixels = torch.zeros(rows, *image_shape(config, setup), dtype=setup.precision.weights, device="meta")
        return {"pixel_values": pixels, "labels": torch.zeros(rows, dtype=torch.long, device="meta")}
    if head == CHOICE:  # each row: its question with each of its answers, a sequence each; the right answer's index
        ids = torch.zeros(rows, choices_of(setup), setup.seq, dtype=torch.long, device="meta")
        return {"input_ids": ids, "labels": torch.zeros(rows, dtype=torch.long, device="meta")}
    ids = torch.zeros(rows, setup.seq, dtype=torch.long, device="meta")
    if head == "qa":  # each row's answer span: its first and last token
        span = torch.zeros(rows, dtype=torch.long, device="meta")
        return {"input_ids": ids, "start_positions": span, "end_positions": span.clone()}
    labels = torch.zeros(rows, *(() if head == "seq-cls" else (setup.seq,)), dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": labels}


def choices_of(setup: Setup) -> int:
    """How many answers a multiple choice row holds: `--choices`, else `DEFAULT_CHOICES`."""
    return DEFAULT_CHOICES if setup.choices is None else setup.choices


def one_length(config) -> int | None:
    """The one sequence length a model trains on, where it has one: a Reformer's, the product of its axial position
    embeddings' shape (`axial_pos_shape`); None for the others."""
    axial = getattr(config, "axial_pos_shape", None)
    return math.prod(axial) if axial else None


def audio_frames(config) -> int:
    """The log-mel frames a row of Whisper's batch holds: its encoder's positions after the stride-2 convolution."""
    return 2 * config.max_source_positions


def image_shape(config, setup: Setup | None = None) -> tuple[int, int, int]:
    """(channels, height, width) of an image classifier's images (Rule 5): `setup.image_size` square where it is
    given, else the config's image_size, else its vision tower's (CLIP's); channels the config's, else 3."""
    sources = [c for c in (config, getattr(config, "vision_config", None)) if c is not None]
    channels = next((c.num_channels for c in sources if isinstance(getattr(c, "num_channels", None), int)), 3)
    if setup is not None and setup.image_size is not None:
        return channels, setup.image_size, setup.image_size
    for source in sources:
        size = getattr(source, "image_size", None)
        size = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else ()
        if len(size) == 2 and all(isinstance(n, int) and n > 0 for n in size):
            return channels, size[0], size[1]
    raise FitError(
        f"remat: an image classifier's rows are images of --image-size pixels, by default the config's image_size, "
        f"and this {type(config).__name__} has none (nor a vision_config with one). Fix: --image-size 224 (the side "
        'its image processor resizes images to), or add "image_size" to the config.json.'
    )


def row_words(config, head: str, setup: Setup) -> str:
    """What one row of the batch is, in the answer's words: "2048 tokens", Whisper's audio and labels, an image."""
    seq = setup.seq
    if head == IMAGE:
        own = "" if setup.image_size is not None else " (the config's image_size; --image-size for another)"
        return "{} x {} x {} pixels".format(*image_shape(config, setup)) + own
    if head == CHOICE:
        own = "" if setup.choices is not None else " (--choices for another number)"
        return f"{choices_of(setup)} choices of {seq} tokens{own}"
    if head == "speech-seq2seq":
        frames = audio_frames(config)
        return f"{frames // FRAMES_PER_SECOND} s of audio ({frames} log-mel frames) and {seq} label tokens"
    return f"{seq} tokens"
