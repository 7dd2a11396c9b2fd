"""What an aten op's schema says about its arguments (`OpOverload._schema`, private)."""

from __future__ import annotations

import torch


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """The tensor arguments `func` writes in place: those its schema marks written (`add_`'s self, `out=`)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if isinstance(value, torch.Tensor):
            written.append(value)
    return written
