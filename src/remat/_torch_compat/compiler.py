"""The private parts of torch.compile that remat sets, in one place (see `remat._torch_compat`)."""

from __future__ import annotations

import contextlib
import functools
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


def _call(model, *args, **kwargs):
    return model(*args, **kwargs)


def fresh_compiled_call(optimized, name: str) -> Callable:
    """`optimized` (a `torch.compile(model)`) called through a function of its own, compiled with the same
    settings (`OptimizedModule.dynamo_ctx`, private): Dynamo keeps compiled code per code object, so this call
    compiles anew, whatever the model's own code has cached, and keeps what it compiles apart."""
    code = _call.__code__.replace(co_name=name, co_qualname=name)
    call = types.FunctionType(code, _call.__globals__, name)
    return optimized.dynamo_ctx(functools.partial(call, optimized._orig_mod))


def is_optimized_module(model) -> bool:
    """`model` is what `torch.compile(module)` returns (`OptimizedModule`, a private class)."""
    return compiled_module(model) is not None and "forward" in model.__dict__
