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
import sys
from collections.abc import Iterator

import torch
import torch.nn as nn

from remat._torch_compat import fake_mode_of

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
