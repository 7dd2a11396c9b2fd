"""The private parts of torch.compile that remat sets, in one place (see `remat._torch_compat`)."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator

import torch

from remat._torch_compat import replaced
from remat._torch_compat.distributed import compiled_module


@contextlib.contextmanager
def activation_memory_budget(budget: float) -> Iterator[None]:
    """Inductor's min-cut partitioner, for what compiles meanwhile, saves `budget` of the activations it would
    (`torch._functorch.config.activation_memory_budget`, private: read when a joint graph is partitioned)."""
    import torch._functorch.config as functorch_config

    with replaced(functorch_config, "activation_memory_budget", budget):
        yield


def set_activation_memory_budget(budget: float) -> None:
    """torch.compile's activation memory budget set to `budget` for the rest of this process, as a training script
    sets it by hand (remat itself sets it only around a compilation: `activation_memory_budget`)."""
    import torch._functorch.config as functorch_config

    functorch_config.activation_memory_budget = budget


def activation_memory_budget_set() -> float:
    """torch.compile's activation memory budget as this process has it set (1.0, torch's default, when unset)."""
    import torch._functorch.config as functorch_config

    return float(functorch_config.activation_memory_budget)


@contextlib.contextmanager
def random_numbers_kept() -> Iterator[None]:
    """What compiles meanwhile draws each random number once: Inductor's partitioner is told to save, never recompute,
    the random ops of every joint graph (`torch._inductor.config.joint_custom_pre_pass`, private: read when a joint
    graph is made; the tag `node.meta["recompute"]` that `torch.utils.checkpoint`'s selective policies set, which
    the partitioner's memory budget honours).  A pass the user set runs first."""
    import torch._inductor.config as inductor_config

    own = inductor_config.joint_custom_pre_pass
    if isinstance(own, (list, tuple)):  # torch 2.13 takes several; older releases one
        own = _Chain(own) if own else None
    with replaced(inductor_config, "joint_custom_pre_pass", _keep_random_class()(own)):
        yield


class _Chain:
    def __init__(self, passes) -> None:
        self.passes = tuple(passes)

    def __call__(self, graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self):
        return tuple(getattr(p, "uuid", lambda: None)() for p in self.passes)


@functools.cache
def _keep_random_class() -> type:
    """The pass `random_numbers_kept` sets: a `CustomGraphPass` (private; a callable on a graph, with a `uuid` that
    Inductor's caches key on), made at first use (its module takes seconds to import), after the user's own."""
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch.utils.checkpoint import CheckpointPolicy

    class KeepRandom(CustomGraphPass):
        def __init__(self, before) -> None:
            self.before = before

        def __call__(self, graph) -> None:
            if self.before is not None:
                self.before(graph)
            for node in kept_random_nodes(graph):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE

        def uuid(self):
            before = None if self.before is None else getattr(self.before, "uuid", lambda: repr(self.before))()
            return (KEEP_RANDOM_VERSION, before)

    return KeepRandom


KEEP_RANDOM_VERSION = "remat-keep-random-1"
"""In the pass's `uuid`: a new one when `kept_random_nodes` chooses otherwise, so no cached graph outlives it."""


def kept_random_nodes(graph) -> list:
    """The nodes of a joint graph to save so that no random op runs again in backward: each random op's own output,
    or, where the forward only compares it (dropout's mask, a bool 1/4 the size of the float it is drawn as), the
    nodes that use it, when they are all in the forward and smaller together.  Inside a checkpoint too: under a
    memory budget its own replay of the random numbers does not hold (a 2-layer GPT-2, remat's least-memory plan
    compiled at budget 0.5: the gradient 120% off with those left to the checkpoint, to 1e-8 with them kept,
    `python benchmarks/compile_rng.py --quick`, 2026-12-06)."""
    backward = _after_tangents(graph)
    kept = []
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
            continue
        users = list(node.users)
        if users and not any(u in backward for u in users) and sum(map(_bytes, users)) < _bytes(node):
            kept += [u for u in users if u not in kept]
        else:
            kept.append(node)
    return kept


def _after_tangents(graph) -> set:
    """The backward's nodes of a joint graph: those that use a tangent, however indirectly."""
    after: set = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or any(
            a in after for a in node.all_input_nodes
        ):
            after.add(node)
    return after


def _bytes(node) -> int:
    """A node's output bytes; a huge number for one that is not a tensor of a known size (never the smaller)."""
    val = node.meta.get("val")
    size = val.numel() * val.element_size() if isinstance(val, torch.Tensor) else None
    return size if isinstance(size, int) else 1 << 62


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


def inductor_cache_dir() -> str:
    """Where Inductor writes the code it generates (`torch._inductor.runtime.cache_dir_utils.cache_dir`, private):
    `TORCHINDUCTOR_CACHE_DIR`, else `torchinductor_<user>` in the temporary directory (torch sets the variable and
    makes the directory when asked)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()
