"""Will it fit? One training step of a Hugging Face model, from its config, on a GPU you name (`remat fit`).

The model is built on the meta device from its config (NOTE [A model from its config] in `remat.fit.build`), its
steady AdamW step predicted with fake tensors for the GPU (`remat.profile(mode="fake", device="cuda")`), and the
answer is one of: it fits as is, it fits with a checkpointing plan (and at what cost), or it does not, with the
least it needs and the single changes that would make it fit (NOTE [Does a step fit] in `remat.fit.outcome`,
NOTE [What to change] in `remat.fit.suggest`).  Nothing is downloaded but the config itself, for a model name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from remat.fit.answer import EXIT_DOES_NOT_FIT, EXIT_FITS, FitAnswer
from remat.fit.build import head_of, load_config, parse_task
from remat.fit.depth import layers_of, stacks_of
from remat.fit.rows import CHOICE, IMAGE, image_shape, one_length, row_words
from remat.fit.outcome import AS_IS, NO, WITH_PLAN, Outcome
from remat.fit.setup import (
    DEFAULT_OPTIM,
    DEFAULT_SEQ,
    DTYPES,
    GPUS_BY_NAME,
    OPTIMS,
    FitError,
    Gpu,
    Setup,
    check_setup,
    parse_gpu,
)
from remat.fit.step import judge, profile_step
from remat.fit.suggest import KINDS, Suggestion, check_kinds, try_changes
from remat.hf import REFERENCE_NOTE

__all__ = [
    "AS_IS",
    "DEFAULT_OPTIM",
    "DEFAULT_SEQ",
    "DTYPES",
    "EXIT_DOES_NOT_FIT",
    "EXIT_FITS",
    "GPUS_BY_NAME",
    "KINDS",
    "NO",
    "OPTIMS",
    "WITH_PLAN",
    "FitAnswer",
    "FitError",
    "Gpu",
    "Outcome",
    "Setup",
    "Suggestion",
    "will_it_fit",
]


def will_it_fit(
    config: Any,
    gpu: str | int | Gpu,
    *,
    seq: int | None = None,
    batch: int = 1,
    dtype: str = "bf16",
    lora: int | None = None,
    world_size: int = 1,
    optim: str = DEFAULT_OPTIM,
    image_size: int | None = None,
    choices: int | None = None,
    task: str | None = None,
    hardware: str | None = None,
    changes: tuple[str, ...] = KINDS,
    progress: Callable[[str, int], None] | None = None,
) -> FitAnswer:
    """Whether one training step of the model of `config` fits `gpu`, and if not, what to change.

    Example:
        >>> answer = will_it_fit("docs/configs/llama-3-8b", "24GiB", seq=8192, batch=1, dtype="bf16")
        >>> answer.outcome.verdict, answer.fits
        ('does not fit', False)

    `config`: a config.json, its folder, a model name (needs the network) or a `PretrainedConfig`; `gpu` a size
    ("24GiB", "80GB", bytes) or a GPU name ("H100"), `hardware` the roofline where it is a size (H100). `task`: the
    head the training script builds ("multiple-choice", `remat.fit.build.TASKS`), else the architectures'. `batch`
    rows of `seq` tokens per GPU (2048; a multiple choice row is `choices` such sequences, 4; an image classifier's an
    image of `image_size` pixels square, its config's); `dtype` bf16/fp16/fp32 (weights, gradients, AdamW state) or
    amp-bf16/amp-fp16 (fp32 weights, autocast forward); `lora=R` LoRA adapters of rank R (peft); `world_size=N` one
    GPU of N, FSDP2; `optim` "adamw_torch_fused" (the Trainer's) or "adamw_torch" (foreach).  `changes`: the changes
    tried where it does not fit, of "batch", "seq", "lora", "world-size" (() for none); `progress(phase, done)` is
    told each phase.  A `remat:` FitError for bad input.
    """
    setup = Setup(DEFAULT_SEQ if seq is None else seq, batch, dtype, lora, world_size, optim, image_size, choices)
    gpu, setup, changes, task, say = _prepared(gpu, hardware, setup, changes, task, progress)
    say("reading the config")
    config, source = load_config(config)
    head, head_note = head_of(config, task)
    changes = _check_rows(config, head, setup, seq, changes)
    say(f"predicting the step ({' + '.join(map(str, stacks_of(config))) or '?'} layers, fake tensors)")
    built, prof = profile_step(config, head, setup, gpu)
    say("planning")
    outcome = judge(built, prof, setup, gpu, progress=say)
    name, notes = built.name if not lora else f"{built.name} with LoRA", _notes(head, head_note, setup, built, prof)
    answer = FitAnswer(name, _source(source), built.params, built.trainable, gpu, outcome, notes=notes)
    answer.row = row_words(config, head, setup)
    if not outcome.fits and changes:
        answer.suggestions = try_changes(config, head, outcome, gpu, layers_of(config), progress=say, kinds=changes)
    return answer


def _prepared(
    gpu, hardware: str | None, setup: Setup, changes, task: str | None, progress
) -> tuple[Gpu, Setup, tuple[str, ...], str | None, Callable[[str], None]]:
    """will_it_fit's arguments, each checked before anything is read (a `remat:` FitError in the command line's
    words), and the announcer of its phases."""
    gpu = gpu if isinstance(gpu, Gpu) else parse_gpu(f"{gpu}B" if isinstance(gpu, int) else gpu, hardware)
    return gpu, check_setup(setup), check_kinds(tuple(changes)), parse_task(task), _announcer(progress)


SAVED = "ModulesToSaveWrapper"
"""peft's wrapper of a module `modules_to_save` trains in full (NOTE [A model from its config], Rule 4)."""


def _check_rows(config, head: str, setup: Setup, seq: int | None, changes: tuple[str, ...]) -> tuple[str, ...]:
    """NOTE [A model from its config], Rule 5: an image classifier's rows are images of `--image-size` pixels (by
    default its config's), and take no `--seq` (nor a shorter one among `changes`, which are returned); a text
    model's rows are tokens, and take no `--image-size` (a Reformer's exactly its axial_pos_shape's product, so no
    shorter sequence either); `--choices` is a multiple choice model's alone."""
    model = type(config).__name__.removesuffix("Config")
    if head != CHOICE and setup.choices is not None:
        raise FitError(
            f"remat: --choices is how many answers each row of a multiple choice model holds (one sequence each), "
            f"and this {model} is not trained as one; saw --choices {setup.choices}. Fix: leave --choices out, or "
            "pass --task multiple-choice (or the config of a ...ForMultipleChoice model: its "
            '"architectures" names the class).'
        )
    if head != IMAGE:
        if setup.image_size is not None:
            raise FitError(
                f"remat: --image-size is the side in pixels of an image classifier's images, and {model} reads "
                f"tokens; saw --image-size {setup.image_size}. Fix: leave --image-size out (--seq sets the tokens "
                "per sequence)."
            )
        if one_length(config) is not None:  # a Reformer trains on one length alone: none shorter to try
            return tuple(k for k in changes if k != "seq")
        return changes
    channels, height, width = image_shape(config, setup)
    if seq is not None:
        raise FitError(
            f"remat: {model} is an image classifier: each row of its batch is an image ({channels} x {height} x "
            f"{width} pixels), not tokens; saw --seq {seq}. Fix: leave --seq out, and pass --image-size N for images "
            "of N x N pixels."
        )
    return tuple(k for k in changes if k != "seq")


def _notes(head: str, head_note: str, setup: Setup, built, prof) -> list[str]:
    """The answer's notes: the head it was trained as, a seq2seq decoder's labels
    (NOTE [A model from its config], Rules 4 and 5), the modules LoRA leaves to train in full, and the layers
    predicted as Hugging Face's reference code (NOTE [A kernel Hugging Face runs as its reference])."""
    notes = [head_note] if head_note else []
    if head == "seq2seq":
        notes.append(f"the decoder is given labels of {setup.seq} tokens per sequence, as many as the encoder reads")
    whole = [n.removeprefix("base_model.model.") for n, m in built.model.named_modules() if type(m).__name__ == SAVED]
    if whole:
        dtype = str(setup.precision.weights).removeprefix("torch.").replace("bfloat", "bf").replace("float", "fp")
        notes.append(
            f"{', '.join(whole)} trained in full, not by adapters (peft's modules_to_save for this head): in {dtype}, "
            "with their gradients and AdamW state"
        )
    return notes + [n for n in prof.notes if n.startswith(REFERENCE_NOTE)]


def _announcer(progress: Callable[[str, int], None] | None) -> Callable[[str], None]:
    """`say(phase)`: tells `progress` a phase begins (nothing without one)."""

    def say(phase: str) -> None:
        if progress is not None:
            progress(phase, 0)

    return say


def _source(source: str) -> str:
    return os.path.relpath(source) if os.path.exists(source) and not os.path.isabs(str(source)) else source
