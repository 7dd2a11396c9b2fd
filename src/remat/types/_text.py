"""How remat's data prints: `str(profile)` is the text report of `remat.report`.

The data never imports its renderers (reports read data, not the other way round):
`remat.report` registers one renderer per type on `render` when it is imported, which
`import remat` always does.
"""

from __future__ import annotations

from functools import singledispatch


@singledispatch
def render(obj: object) -> str:
    """The text report of `obj`; registered per type by `remat.report`."""
    raise TypeError(f"remat: no text report is registered for {type(obj).__name__}; import remat.report first")
