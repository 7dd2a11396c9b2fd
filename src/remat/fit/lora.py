"""LoRA adapters on the model `remat fit` builds (NOTE [A model from its config], Rule 4, in `remat.fit.build`), and
the warnings peft and fake tensors print that the answer does not need."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from torch import nn

from remat.fit.rows import CHOICE, IMAGE
from remat.fit.setup import FitError

PEFT_TASKS = {
    "causal": "CAUSAL_LM",
    "seq2seq": "SEQ_2_SEQ_LM",
    "seq-cls": "SEQ_CLS",
    "token-cls": "TOKEN_CLS",
    "qa": "QUESTION_ANS",
}  # none for Whisper: the plain PeftModel passes its batch (`input_features`) on as it is


def with_lora(model: nn.Module, rank: int, head: str) -> nn.Module:
    """NOTE [A model from its config], Rule 4: `model` wrapped with peft's LoRA adapters of rank `rank`."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise FitError(
            f"remat: --lora {rank} adds LoRA adapters with peft, which is not installed here ({e}). "
            "Fix: pip install peft, or leave --lora out for full fine-tuning."
        ) from e
    saved = _trained_whole(model, head)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules="all-linear",
        exclude_modules=saved or None,
        task_type=PEFT_TASKS.get(head),
        modules_to_save=list(HEAD_MODULES[head]) if head in (IMAGE, CHOICE) else None,
    )
    linear = (nn.Linear, _conv1d())  # peft's "all-linear" takes transformers' Conv1D (GPT-2's) too
    if not [n for n, m in model.named_modules() if isinstance(m, linear) and n not in saved]:
        raise FitError(
            f"remat: --lora {rank} adds LoRA adapters to every linear layer, and {type(model).__name__} has none "
            "but its head (its layers are convolutions); expected a model with linear layers (a transformer). "
            "Fix: leave --lora out for full fine-tuning."
        )
    with quiet():
        return get_peft_model(model, config)


def _conv1d() -> type:
    from transformers.pytorch_utils import Conv1D

    return Conv1D


HEAD_MODULES = {"seq-cls": ("classifier", "score"), "token-cls": ("classifier", "score"), "qa": ("qa_outputs",)}
HEAD_MODULES[IMAGE] = ("classifier",)
HEAD_MODULES[CHOICE] = ("classifier", "logits_proj")  # XLNet's, XLM's
"""Rule 4: a head's modules peft trains in full (`modules_to_save`): the ones its task's PeftModel names, and an
image classifier's or a multiple choice model's, which peft has no task for."""


def _trained_whole(model: nn.Module, head: str) -> list[str]:
    """The modules peft's `modules_to_save` will train in full, and all they hold: peft picks them by the end of
    their name ("pre_classifier" too, for "classifier"), and cannot wrap one it has given adapters, so none get any."""
    ends = HEAD_MODULES.get(head, ())
    roots = [n for n, _ in model.named_modules() if n and n.endswith(ends)]
    return [n for n, _ in model.named_modules() if any(n == r or n.startswith(r + ".") for r in roots)]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """peft asks transformers a question it deprecated (`is_gradient_checkpointing`), on every forward; fake tensors
    log the traceback of a shape the model refuses."""
    fake = logging.getLogger("torch._subclasses.fake_tensor")  # logs a traceback for a shape the model refuses,
    level = fake.level  # which the `remat:` error says in a line
    fake.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*", category=UserWarning)  # GPT-2's Conv1D
            yield
    finally:
        fake.setLevel(level)
