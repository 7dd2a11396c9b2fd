"""The Hugging Face convention remat follows in training: no key/value cache.

NOTE [The key/value cache in training]
  Rule 1. Hugging Face models build a key/value cache in forward when `use_cache` is
          True (the default of most configs, or an argument).  Training never reads it,
          and a checkpointed layer that appends to it appends again when it is
          recomputed, so the recomputation sees other tensors than the forward saw:
          torch raises "different number of tensors saved" (T5) or "aten.slice.Tensor
          encountered during backward but not found in storage" (GPT-2, selective).
  Rule 2. Hugging Face's own gradient checkpointing turns the cache off for training
          forwards; remat does the same with a forward pre-hook on the model that
          passes use_cache=False when the model is in training mode with grad enabled
          and its forward takes `use_cache`: `remat.profile` for the step it measures
          (so the plan predicts the step that will run) and `remat.apply` for as long
          as the plan is applied.  Eval mode and `generate` keep the cache.  The hook goes on the
          outermost modules whose forward takes `use_cache`: the model itself, or the model inside a
          wrapper whose forward does not name it (a peft `PeftModel`, a LightningModule, a user's
          `nn.Module`; before, such a wrapper got no hook, its LoRA GPT-2 built the cache in training,
          and a checkpointed block appended its keys and values again when recomputed: 51.0 MiB
          measured for a plan predicted at 48.5 MiB).
  Rule 3. `remat.explain` judges the step as written, cache included (its
          `kv-cache-in-training` finding measures what the cache costs): it runs under
          `cache_as_configured()`, where the hook does nothing.  That switch is a plain
          module-level flag, not a ContextVar: torch.compile traces the hook, and Dynamo
          breaks the graph on `ContextVar.get`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from remat._torch_compat import fake_mode_of, replaced

CACHE_NOTE = (
    "use_cache=True turned off for the training step, as Hugging Face does under gradient checkpointing "
    "(training never reads the key/value cache); remat.apply does the same while a plan is applied"
)
_AS_CONFIGURED = [0]  # Rule 3: how many cache_as_configured() blocks are open


class NoCacheInTraining:
    """Rule 2 on one model, until `remove()`; `turned_off` says whether a forward had the cache on."""

    def __init__(self, model: nn.Module):
        self.turned_off = False
        self._handles = [
            module.register_forward_pre_hook(functools.partial(self._pre, position), with_kwargs=True)
            for module, position in _outermost_taking_use_cache(model)
        ]

    def _pre(self, position: int, module: nn.Module, args: tuple, kwargs: dict):
        """`position`: index of `use_cache` among the forward's parameters (an argument may pass it by position)."""
        if _AS_CONFIGURED[0] or not (module.training and torch.is_grad_enabled()):
            return None
        positional = len(args) > position
        if not builds_cache(module, args[position] if positional else kwargs.get("use_cache")):
            return None
        self.turned_off = True
        if positional:
            return (*args[:position], False, *args[position + 1 :]), kwargs
        return args, {**kwargs, "use_cache": False}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def builds_cache(model: nn.Module, asked: bool | None) -> bool:
    """Whether a forward of `model` builds the cache (Rule 1): `use_cache` as passed, else as its config says."""
    return bool(asked if asked is not None else getattr(getattr(model, "config", None), "use_cache", False))


@contextlib.contextmanager
def no_cache_in_training(model: nn.Module) -> Iterator[NoCacheInTraining]:
    """Rule 2 for the length of a `with` block."""
    hook = NoCacheInTraining(model)
    try:
        yield hook
    finally:
        hook.remove()


@contextlib.contextmanager
def cache_as_configured() -> Iterator[None]:
    """Rule 3: inside, the model's cache is as its config and arguments say."""
    _AS_CONFIGURED[0] += 1
    try:
        yield
    finally:
        _AS_CONFIGURED[0] -= 1


def checkpointed_by_hf(module: nn.Module) -> bool:
    """Hugging Face gradient checkpointing checkpoints `module` now (its `gradient_checkpointing` is True)."""
    return getattr(module, "gradient_checkpointing", False) is True


@contextlib.contextmanager
def hf_checkpointing_off(model: nn.Module) -> Iterator[bool]:
    """Hugging Face gradient checkpointing turned off meanwhile (on the same modules after); yields whether it was on."""
    on = [m for m in model.modules() if checkpointed_by_hf(m)]
    for m in on:
        setattr(m, "gradient_checkpointing", False)  # HF's flag, a plain attribute (not a submodule or tensor)
    try:
        yield bool(on)
    finally:
        for m in on:
            setattr(m, "gradient_checkpointing", True)


def _use_cache_position(model: nn.Module) -> int | None:
    """Where `use_cache` stands among the parameters of the model's forward; None if it takes none."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):  # no signature to read
        return None
    return names.index("use_cache") if "use_cache" in names else None


def _outermost_taking_use_cache(model: nn.Module) -> list[tuple[nn.Module, int]]:
    """(module, where `use_cache` stands in its forward) for `model` if its forward takes `use_cache`, else for the
    outermost such modules inside it (Rule 2: a wrapper's model)."""
    position = _use_cache_position(model)
    if position is not None:
        return [(model, position)]
    return [found for child in model.children() for found in _outermost_taking_use_cache(child)]


# NOTE [Packed sequences under fake tensors]
#   Hugging Face decoders look at `position_ids` for several sequences packed into one row
#   (`masking_utils.find_packed_sequence_indices`); a row of one sequence gets no mask and
#   attention runs with `is_causal`.  The look reads the ids' values, which fake tensors do
#   not have, so under them it answers "maybe packed" and builds a (B, 1, L, L) mask that
#   the real step never builds: attention then runs another kernel (on CUDA a mask rules
#   out flash attention, and the memory-efficient one saves a float copy of it per layer).
#   A fake step therefore gets the answer the real inputs give: "not packed" when the
#   inputs carry no `position_ids` (the model makes them, one sequence per row), else what
#   the look says on the real ids.  Inputs that are fake already (a model built under
#   FakeTensorMode) keep Hugging Face's own answer: nothing here can read their ids either.
PACKED_NOTE = "position_ids in the inputs pack several sequences per row: attention runs with a mask"


@contextlib.contextmanager
def unpacked_sequences_unless_given(inputs) -> Iterator[bool]:
    """NOTE [Packed sequences under fake tensors], for the length of a fake step of `inputs`
    (the real ones).  Yields whether the real position_ids pack sequences (the mask is kept then)."""
    masking = sys.modules.get("transformers.masking_utils")
    look = getattr(masking, "find_packed_sequence_indices", None)
    if masking is None or look is None:
        yield False
        return
    ids = inputs.get("position_ids") if isinstance(inputs, dict) else None
    if isinstance(ids, torch.Tensor) and fake_mode_of(ids) is not None:  # unreadable here too: HF's answer stands
        yield False
        return
    packed = isinstance(ids, torch.Tensor) and ids.dim() == 2 and look(ids) is not None
    if packed:
        yield True
        return
    setattr(masking, "find_packed_sequence_indices", _one_sequence_per_row)
    try:
        yield False
    finally:
        setattr(masking, "find_packed_sequence_indices", look)


def _one_sequence_per_row(position_ids):
    return None


# NOTE [A mask Hugging Face reads, under fake tensors]
#   Hugging Face skips work its inputs allow: a padding mask of all ones makes no (B, 1, L, L) mask, and
#   attention runs with `is_causal` (`masking_utils._ignore_causal_mask_sdpa` and its kin).  Reading the mask
#   would break a traced graph, so Hugging Face reads it only where it is not tracing (`is_tracing`), and a fake
#   tensor counts as tracing (`import_utils.is_fake_tensor`).  So a fake step built the mask the real step never
#   builds: a tokenizer's all-ones `attention_mask` put a 3-layer Mistral's fake peak 73,728 bytes (4.3%) over
#   its real one, and on CUDA a mask rules out flash attention (the memory-efficient kernel saves a float copy
#   of it per layer).
#   Rule 1. For the length of a fake step, a fake tensor is tracing to Hugging Face only where the step has no
#           value for it (`traced(t)`, NOTE [Values a fake step can know]): a mask made from the inputs is
#           read as the real step reads it.
#   Rule 2. A step that runs without values (the first try: that NOTE's Rule 6) cannot answer, and stops there
#           to run again with them; a tensor without a value keeps Hugging Face's own answer (tracing).
#   Rule 3. Hugging Face's warning of padding without a mask (`warn_if_padding_and_no_attention_mask`, GPT-2's
#           forward and 60-odd others) asks too, of the ids.  Its answer changes no tensor, so a fake step skips
#           the warning rather than run again for it (a quarter more time: Rule 6 of that NOTE).


@contextlib.contextmanager
def masks_read_where_known(traced: Callable[[torch.Tensor], bool]) -> Iterator[None]:
    """NOTE [A mask Hugging Face reads, under fake tensors]: while inside, Hugging Face takes a fake tensor `t`
    for a traced one only where `traced(t)`, and skips its warning of padding without a mask (Rule 3)."""
    utils = sys.modules.get("transformers.utils.import_utils")
    pretrained = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    asks = getattr(utils, "is_fake_tensor", None)
    with contextlib.ExitStack() as stack:
        if asks is not None:
            stack.enter_context(replaced(utils, "is_fake_tensor", lambda x: bool(asks(x)) and traced(x)))
        if hasattr(pretrained, "warn_if_padding_and_no_attention_mask"):
            no_warning = lambda self, input_ids, attention_mask: None  # noqa: E731
            stack.enter_context(replaced(pretrained, "warn_if_padding_and_no_attention_mask", no_warning))
        yield


# NOTE [A kernel Hugging Face runs as its reference]
#   Hugging Face runs some layers with another package's fused kernel where it is installed (mamba_ssm's selective
#   scan, causal_conv1d, flash-linear-attention's gated delta rule: `integrations.hub_kernels`), and else with its
#   own reference PyTorch code, which it says once per process (`logger.warning_once`: "... is falling back to its
#   reference PyTorch implementation ...").  The reference saves and runs other tensors than the kernel (Mamba-1's
#   scan loops over the tokens, saving each one's state), so a CUDA step measured or predicted with it is the step
#   of a GPU without the package.
#   Rule 1. For the length of a step on a CUDA target (measured, or predicted with fake tensors), remat listens to
#           that logger, and the profile's notes name each function and package heard (`REFERENCE_NOTE`).
#           `remat fit` repeats the note in its answer.  A CPU step says nothing: those kernels are CUDA's.
#   Rule 2. Only the warning is read, not how Hugging Face picks the code: a transformers that words it otherwise
#           gives no note, and `tests/test_hf_reference_kernels.py` fails on it.

REFERENCE_NOTE = "transformers ran its reference PyTorch code for"
_FALLBACK = re.compile(r"`([^`]+)` is falling back to its reference PyTorch implementation because `([^`]+)`")


@contextlib.contextmanager
def reference_kernels_heard(on: bool = True) -> Iterator[list[tuple[str, str]]]:
    """NOTE [A kernel Hugging Face runs as its reference]: while inside, each (function, package) Hugging Face runs
    its reference code for, in the order heard (nothing is heard where `on` is False)."""
    heard: list[tuple[str, str]] = []
    logger = getattr(sys.modules.get("transformers.integrations.hub_kernels"), "logger", None)
    if not on or logger is None or not hasattr(logger, "warning_once"):
        yield heard
        return
    own = "warning_once" in vars(logger)
    was = logger.warning_once

    def listen(message, *args, **kwargs):
        found = _FALLBACK.search(str(message))
        if found and found.groups() not in heard:
            heard.append(found.groups())
        return was(message, *args, **kwargs)

    logger.warning_once = listen
    try:
        yield heard
    finally:
        if own:
            logger.warning_once = was
        else:
            del logger.warning_once


def reference_note(heard: list[tuple[str, str]], predicted: bool) -> list[str]:
    """Rule 1's note of the functions and packages `heard` (none where nothing was)."""
    if not heard:
        return []
    functions = ", ".join(f"`{f}`" for f, _ in heard)
    packages = list(dict.fromkeys(f"`{p}`" for _, p in heard))
    named, step = " and ".join(packages), "predicted" if predicted else "measured"
    return [
        f"{REFERENCE_NOTE} {functions}, as {named} {'is' if len(packages) == 1 else 'are'} not installed here. "
        f"With {named}, a GPU runs fused kernels there instead, which save other tensors and take other seconds "
        f"than the step {step} here"
    ]
