"""What an aten op's schema says about its arguments (`OpOverload._schema`, private)."""

from __future__ import annotations

import functools

import torch


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """The tensor arguments `func` writes in place: those its schema marks written (`add_`'s self, `out=`)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    named = named_arguments(func, args, kwargs)
    writes = (arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write)
    return [value for value in map(named.get, writes) if isinstance(value, torch.Tensor)]


@functools.cache
def runs_no_kernel(func) -> bool:
    """`func` only answers a question about its arguments' metadata (`prim.device`, `aten.sym_size`,
    `prim.layout`): everything it returns is metadata and it writes nothing.  Such ops reach a dispatch
    mode because fake tensors ask for them; an eager step runs no kernel for them."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable or not schema.returns:
        return False
    return all(str(r.type) in _METADATA for r in schema.returns)


_METADATA = frozenset({"Device", "Layout", "ScalarType", "MemoryFormat", "int", "SymInt", "List[int]"})


def named_arguments(func, args, kwargs) -> dict:
    """`func`'s arguments by their schema names (`dropout_p`, `attn_bias`, ...); defaults left out."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return dict(kwargs)
    named = {a.name: v for a, v in zip((a for a in schema.arguments if not a.kwarg_only), args)}
    return {**named, **kwargs}
