"""A Hugging Face config, built on the meta device as the model `remat fit` asks about, with a batch of tokens.

NOTE [A model from its config]
  Rule 1. CONFIG is a `config.json`, a folder holding one, or a model name `transformers.AutoConfig` resolves
          (which needs the network, or the name in the Hugging Face cache).
  Rule 2. The head is `--task`'s where given (the training script's AutoModelFor... class, in kebab case: a pretrained
          checkpoint's config names the head it was pretrained with, BertForMaskedLM, and a script fine-tuning it for
          multiple choice builds another model), refused where transformers has no class of it for the model type.
          Else it is the one `architectures` names where it is a causal LM, sequence-to-sequence LM (Whisper's speech
          one too), masked LM, sequence or token classification, question answering, multiple choice or image
          classification head.  A head of another task (object detection, another speech model) is refused: another
          head in its place is another model.  Otherwise (a base class such as BartModel or ViTModel, a pretraining
          class, or no architectures), for an encoder-decoder config (BART, T5, Whisper), a sequence-to-sequence LM,
          never its decoder alone as a causal LM; else a masked LM for a model type that has one (BERT and other
          encoders), else a causal LM, else an image classifier (ViT, DINOv2, Swin, ConvNeXt).  The model is built
          with `from_config` on the meta device: no weights exist, and the fake step materialises them as fake
          tensors.
  Rule 3. `--dtype` bf16/fp16/fp32 builds the weights in that dtype, so the gradients and AdamW's two moments
          are in it too (8 bytes per parameter in bf16); amp-bf16/amp-fp16 keeps fp32 weights and runs the
          model's forward under `torch.autocast` (16 bytes per parameter).
  Rule 4. `--lora R` wraps the model with peft's `get_peft_model(model, LoraConfig(r=R, lora_alpha=2R,
          target_modules="all-linear"))`: adapters on every linear layer but the output head, the base frozen.
          peft keeps the adapters in fp32 whatever the base's dtype (its `autocast_adapter_dtype`).  An image
          classifier's `classifier` is trained in full (peft's `modules_to_save`, as its image classification
          guide does: the new head has no pretrained weights to adapt), and so is a multiple choice model's
          (XLNet's `logits_proj`), a head peft has no task for; a model with no other linear layer (ResNet) has
          nothing to adapt, and is refused.  The modules a head trains in full (a classifier's, a question
          answering head's `qa_outputs`, chosen by peft by the end of their names) get no adapters.
  Rule 5. The batch is `batch x world_size` rows of `seq` token ids (each rank gets `batch`), with labels of the
          head's shape (a question answering head: one answer span per row; a multiple choice head: the right answer's
          index, each row being `--choices` sequences of `seq` tokens, its question with each answer, 4 by default as
          in SWAG); the loss is the model's own (`output.loss`).  A classifier of more than one label whose config
          leaves `problem_type` unset is set to single-label classification, the cross entropy most models infer from
          class labels: DeBERTa-v2's own path for an unset one picks the labelled rows with `nonzero`, which a fake
          step cannot run.  A sequence-to-sequence LM shifts its labels into the decoder's input: its decoder takes
          `seq` tokens too (the answer notes it).  Whisper's encoder takes 30 s of log-mel frames a row (2 x
          max_source_positions, in the weights' dtype), however long the clip: its feature extractor pads every clip
          to that; `seq` is the labels' tokens, at most max_target_positions.  An image classifier takes square images
          of `--image-size` pixels, by default the config's `image_size` (its vision_config's for CLIP),
          `num_channels` deep, in the weights' dtype, and one class label a row: its image processor resizes every
          image to one size.  The config's size is not always the one trained at (DINOv2's says 518, its processor
          crops 224): `--image-size` says it, and a model that interpolates its position embeddings to another size is
          asked to (`interpolate_pos_encoding=True`, as for ViT at 384).  There are no tokens: `--seq` is refused, and
          no shorter sequence is suggested (nor for a Reformer, which trains on sequences of exactly its
          `axial_pos_shape`'s product).
  Rule 6. The config's `use_cache` is turned off: training never reads the key/value cache
          (NOTE [The key/value cache in training] in `remat.hf`, whose hook does the same for the step
          remat.profile runs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from remat.fit.lora import with_lora
from remat.fit.rows import CHOICE, IMAGE, batch_for
from remat.fit.setup import FitError, Setup

HEADS = {  # head -> (Auto class, the mapping of model types to that head's classes), in the order Rule 2 asks
    "causal": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "seq2seq": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),  # before masked: BART's
    "masked": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),  # ForConditionalGeneration is in both
    "seq-cls": ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "token-cls": ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    "qa": ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    CHOICE: ("AutoModelForMultipleChoice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES"),
    "speech-seq2seq": ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    IMAGE: ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
}
SPEECH = ("whisper",)
"""Model types whose audio input Rule 5 knows (log-mel frames): other speech heads are refused (Rule 2)."""
HEAD_WORDS = (
    "causal LM, sequence-to-sequence LM (Whisper's speech one too), masked LM, sequence or token classification, "
    "question answering, multiple choice and image classification"
)
NOT_A_HEAD = (
    "MODEL_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_MAPPING_NAMES",  # the base vision models (Dinov2Model)
    "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES",
)
"""Mappings of classes that name no task of their own (base models, pretraining's): Rule 2 falls back for them."""
FALLBACK = ("masked", "causal", "seq2seq", IMAGE)
FALLBACK_SEQ2SEQ_FIRST = ("seq2seq", "speech-seq2seq", "masked")
"""Rule 2's order where `architectures` names no head: an encoder-decoder config (BART, T5) is a seq2seq LM first,
and never a causal LM (Whisper's is its decoder alone)."""
FALLBACK_WORDS = {
    "masked": "a masked LM",
    "causal": "a causal LM",
    "seq2seq": "a sequence-to-sequence LM",
    "speech-seq2seq": "a speech sequence-to-sequence model",
    IMAGE: "an image classifier",
}
CONFIG_FIX = "Fix: pass the path of the model's config.json (or the folder holding it)"


def adamw(params, fused: bool = True) -> torch.optim.Optimizer:
    """The optimizer `remat fit` assumes: torch's AdamW (two moments per trained parameter, in its dtype), fused as
    Hugging Face's Trainer makes it by default, else with the foreach kernels torch picks for CUDA parameters."""
    return torch.optim.AdamW(params, fused=True) if fused else torch.optim.AdamW(params)


# -- Rule 1: the config ------------------------------------------------------------------------------------------


def load_config(source: Any):
    """The `transformers` config CONFIG names, and the words that say where it came from."""
    from transformers import PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source, f"a {type(source).__name__}"
    path = Path(str(source)).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise FitError(
                f"remat: CONFIG {str(source)!r} is a folder without a config.json; expected a Hugging Face "
                f"model's config.json in it. {CONFIG_FIX}."
            )
    if path.is_file():
        return _from_file(path), str(source)
    if str(source).endswith(".json") or str(source).startswith((".", "/", "~")) or "\\" in str(source):
        raise FitError(
            f"remat: CONFIG {str(source)!r} does not exist (looked in {Path.cwd()}); expected a Hugging "
            f"Face config.json, a folder holding one, or a model name. {CONFIG_FIX}."
        )
    return _from_hub(str(source)), str(source)


def _from_file(path: Path):
    from transformers import CONFIG_MAPPING

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FitError(
            f"remat: could not read {str(path)!r} as JSON ({e}); expected a Hugging Face config.json. {CONFIG_FIX}."
        ) from e
    kind = data.get("model_type") if isinstance(data, dict) else None
    if not kind:
        raise FitError(
            f'remat: {str(path)!r} has no "model_type"; expected a Hugging Face config.json, which names '
            f'its model type ("llama", "bert", ...). {CONFIG_FIX}, or add "model_type" to it.'
        )
    if kind not in CONFIG_MAPPING:
        raise FitError(
            f"remat: {str(path)!r} has model_type {kind!r}, which this transformers ({_version()}) does "
            "not know. Fix: upgrade transformers (pip install -U transformers), or pass another config."
        )
    return CONFIG_MAPPING[kind].from_dict(data)


def _from_hub(name: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FitError(
            f"remat: could not resolve the model name {name!r} to a config ({first}); a name needs the network or the "
            f"Hugging Face cache, and none had it (offline?). {CONFIG_FIX} (download it where there is a network, "
            "e.g. from https://huggingface.co/<name>/blob/main/config.json)."
        ) from e


def _version() -> str:
    import transformers

    return transformers.__version__


# -- Rule 2: the head and the model -------------------------------------------------------------------------------


TASKS = {  # --task, AutoModelFor<Task> in kebab case -> head
    "causal-lm": "causal",
    "seq2seq-lm": "seq2seq",
    "masked-lm": "masked",
    "sequence-classification": "seq-cls",
    "token-classification": "token-cls",
    "question-answering": "qa",
    CHOICE: CHOICE,
    "speech-seq2seq": "speech-seq2seq",
    "image-classification": IMAGE,
}


def parse_task(task: str | None) -> str | None:
    """Rule 2's head for `--task`: an `AutoModelFor...` class as the training script names it, in kebab case
    ("multiple-choice") or as written ("AutoModelForMultipleChoice", "MultipleChoice"); None for none."""
    if task is None:
        return None
    squashed = {name.replace("-", ""): head for name, head in TASKS.items()}
    key = task.strip().lower().removeprefix("automodelfor").replace("-", "").replace("_", "")
    if key in squashed:
        return squashed[key]
    raise FitError(
        f"remat: --task is the head the training script builds, as its AutoModelFor... class: one of "
        f"{', '.join(TASKS)}; saw {task!r}. Fix: e.g. --task multiple-choice for AutoModelForMultipleChoice, or "
        "leave --task out for the head the config's architectures name."
    )


def head_of(config, task: str | None = None) -> tuple[str, str]:
    """(head, note): `task`'s head (`parse_task`) where given, else the head `architectures` names, else the model
    type's (Rule 2)."""
    if task is not None:
        return _head_for_task(config, task), ""
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        for head, (_, mapping) in HEADS.items():
            if arch in _classes(mapping) and _builds(head, config.model_type):
                return head, ""
    for arch in archs:
        _refuse_other_task(arch)
    kind = config.model_type
    for head in FALLBACK_SEQ2SEQ_FIRST if getattr(config, "is_encoder_decoder", False) else FALLBACK:
        if _has(head, kind):
            named = f"architectures names {', '.join(archs)}" if archs else "the config names no architectures"
            return head, f"{named}: trained as {FALLBACK_WORDS[head]}"
    raise FitError(
        f"remat: the config's model type {kind!r} (architectures: {', '.join(archs) or 'none'}) has no causal LM, "
        f"masked LM, sequence-to-sequence LM or image classification head in transformers {_version()}; expected a "
        "text model (LlamaForCausalLM, BertForMaskedLM, T5ForConditionalGeneration, ...) or an image classifier "
        "(ViTForImageClassification, ...). Fix: pass the config.json of such a model, or profile your own model and "
        "batch with `remat profile file.py:factory --mode fake --device cuda`."
    )


def _head_for_task(config, head: str) -> str:
    """Rule 2 with `--task`: its head, where transformers has a class of it for the config's model type."""
    kind = config.model_type
    if _has(head, kind):
        return head
    has = [name for name, other in TASKS.items() if _has(other, kind)]
    task = next(name for name, other in TASKS.items() if other == head)
    raise FitError(
        f"remat: --task {task} builds {HEADS[head][0]}, and transformers {_version()} has no such class for the "
        f"config's model type {kind!r}; expected a task it has: {', '.join(has) or 'none that remat fit builds'}. "
        f"Fix: {f'--task {has[0]}, or ' if has else ''}leave --task out for the head the config's architectures name."
    )


def _has(head: str, kind: str) -> bool:
    """Whether transformers has a `head` class for model type `kind` whose batch Rule 5 knows."""
    return kind in _mapping(HEADS[head][1]) and _builds(head, kind)


def _builds(head: str, kind: str) -> bool:
    """Whether Rule 5 knows the batch of `head` for model type `kind` (of speech models, Whisper's alone)."""
    return head != "speech-seq2seq" or kind in SPEECH


def _refuse_other_task(arch: str) -> None:
    """Rule 2: a head of a task `remat fit` does not build is refused, never replaced by another head (a masked LM's
    logits in place of a QA head's two numbers, or Whisper's decoder alone in place of the speech model)."""
    from transformers.models.auto import modeling_auto

    for mapping in sorted(vars(modeling_auto)):
        if mapping.startswith("MODEL_") and mapping.endswith("_MAPPING_NAMES") and mapping not in NOT_A_HEAD:
            if arch in _classes(mapping):
                task = mapping.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES")
                task = task.replace("SEQ_2_SEQ", "SEQUENCE_TO_SEQUENCE").replace("_", " ").lower()
                raise FitError(
                    f"remat: the config's architectures name {arch}, which transformers {_version()} lists among "
                    f"its {task} models; remat fit builds {HEAD_WORDS} heads, and another head in its place would "
                    "predict the memory of another model. Fix: profile your own model and batch with "
                    "`remat profile file.py:factory --mode fake --device cuda`."
                )


def _mapping(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name)


def _classes(mapping: str) -> set[str]:
    """The class names a `transformers` auto mapping holds."""
    names: set[str] = set()
    for value in _mapping(mapping).values():
        names.update(value if isinstance(value, (list, tuple)) else [value])
    return names


@dataclass
class Built:
    """The model on the meta device, its batch, and what the answer says about it."""

    model: nn.Module
    inputs: dict[str, Any]
    params: int
    trainable: int
    name: str


def build(config, head: str, setup: Setup) -> Built:
    """Rules 2-5: the model of `config` with `head`, as `setup` trains it, and its batch."""
    import transformers

    precision = setup.precision
    if getattr(config, "use_cache", False):
        config.use_cache = False  # Rule 6: training builds no key/value cache
    if head == "seq-cls":  # decoder classifiers find each row's last token by it (Qwen3.5: its text config's)
        for part in (config, config.get_text_config()):
            if getattr(part, "pad_token_id", None) is None:
                part.pad_token_id = 0
    if head in ("seq-cls", IMAGE) and getattr(config, "problem_type", None) is None and config.num_labels > 1:
        config.problem_type = "single_label_classification"  # Rule 5: as the model infers it from class labels
    auto = getattr(transformers, HEADS[head][0])
    with torch.device("meta"):
        model = _from_config(auto, config, head, precision.weights)
        name = type(model).__name__
        if setup.lora:
            model = with_lora(model, setup.lora, head)
    model.train()
    if precision.autocast is not None:
        _Autocast(precision.autocast).register(model)
    unique = {id(p): p for p in model.parameters()}.values()
    trainable = [p for p in unique if p.requires_grad]
    batch = batch_for(model, config, head, setup)
    return Built(model, batch, sum(p.numel() for p in unique), sum(p.numel() for p in trainable), name)


def _from_config(auto, config, head: str, dtype: torch.dtype) -> nn.Module:
    """`auto.from_config`, where transformers' own code fails in remat fit's words: a package the model's code
    imports and this environment lacks, or a config its code cannot read (a field missing, null or unknown)."""
    try:
        return auto.from_config(config, dtype=dtype)
    except Exception as e:  # noqa: BLE001 -- transformers' constructors raise what they raise
        cls = _mapping(HEADS[head][1]).get(config.model_type, HEADS[head][0])
        said = " ".join(str(e).split())[:300] or repr(e)
        if isinstance(e, ImportError):
            raise FitError(
                f"remat: transformers builds {cls} only with a package this environment lacks; expected it "
                f"installed, saw ImportError: {said}. Fix: install that package (pip), then run remat fit again."
            ) from e
        raise FitError(
            f"remat: transformers {_version()} could not build {cls} from this config; expected a config its code "
            f"reads (as saved with a checkpoint of it), saw {type(e).__name__}: {said}. Fix: compare the config "
            "with the checkpoint's own config.json: a field its code needs is missing, null or unknown."
        ) from e


class _Autocast:
    """Rule 3's autocast around the model's forward, by hooks (the module tree, and so the plan's names, stay)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.open: list[torch.autocast] = []

    def register(self, model: nn.Module) -> None:
        model.register_forward_pre_hook(self.enter, with_kwargs=True)
        model.register_forward_hook(self.leave, with_kwargs=True, always_call=True)

    def enter(self, module, args, kwargs) -> None:
        context = torch.autocast("cuda", dtype=self.dtype)
        context.__enter__()
        self.open.append(context)

    def leave(self, module, args, kwargs, output) -> None:
        if self.open:
            self.open.pop().__exit__(None, None, None)
