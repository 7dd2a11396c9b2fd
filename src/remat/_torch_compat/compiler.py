"""The private parts of torch.compile that remat sets, in one place (see `remat._torch_compat`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator

from remat._torch_compat.distributed import compiled_module


@contextlib.contextmanager
def activation_memory_budget(budget: float) -> Iterator[None]:
    """Inductor's min-cut partitioner, for what compiles meanwhile, saves `budget` of the activations it would
    (`torch._functorch.config.activation_memory_budget`, private: read when a joint graph is partitioned)."""
    import torch._functorch.config as functorch_config

    with functorch_config.patch(activation_memory_budget=budget):
        yield


RECOMPILES_IN_A_MEASUREMENT = 10_000
"""Dynamo's recompile limits while remat measures a compiled step: no count a process reaches in practice."""


@contextlib.contextmanager
def compiled_as_compiled() -> Iterator[None]:
    """What runs meanwhile compiles however often this process compiled its code before, and fails rather than run
    uncompiled (`torch._dynamo.config.recompile_limit`, `accumulated_recompile_limit` and
    `fail_on_recompile_limit_hit`, private: read at each compilation).  Dynamo keeps its compiled code per code
    object, a model's `forward` or a library's wrapper around it (transformers' `generic.wrapper` is one code object
    for every Hugging Face model), and past `recompile_limit` (8) compilations of one it runs that code uncompiled,
    with a warning: a compiled step measured so is the eager step (seen: a compiled GPT-2 measured at its eager
    peak, 97.4 MB for 62.0 MB, and the peers' search for a compiled plan chose a plan 1.3x slower).  Nothing is
    imported when Dynamo is not loaded yet: nothing has been compiled to count."""
    import sys

    config = sys.modules.get("torch._dynamo.config")
    if config is None:
        yield
        return
    with config.patch(
        recompile_limit=RECOMPILES_IN_A_MEASUREMENT,
        accumulated_recompile_limit=RECOMPILES_IN_A_MEASUREMENT,
        fail_on_recompile_limit_hit=True,
    ):
        yield


def _call(model, *args, **kwargs):
    return model(*args, **kwargs)


def fresh_compiled_call(optimized, name: str) -> Callable:
    """A function of its own that calls the model it is given, compiled with `optimized`'s settings (a
    `torch.compile(model)`'s `OptimizedModule.dynamo_ctx`, private): Dynamo keeps compiled code per code object, so
    calling it with the model compiles anew, whatever the model's own code has cached, and keeps what it compiles
    apart.  It holds no model: the caller passes it, so a store of these calls keeps no model alive."""
    code = _call.__code__.replace(co_name=name, co_qualname=name)
    return optimized.dynamo_ctx(types.FunctionType(code, _call.__globals__, name))


def is_optimized_module(model) -> bool:
    """`model` is what `torch.compile(module)` returns (`OptimizedModule`, a private class)."""
    return compiled_module(model) is not None and "forward" in model.__dict__
