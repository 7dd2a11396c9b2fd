"""Versioned JSON documents: the one place that writes and checks their header."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from remat.errors import RematError


def dump(obj, fmt: str, version: int, indent: int | None) -> str:
    """`obj` (a dataclass) as JSON headed by its format name and version."""
    return json.dumps({"format": fmt, "version": version, **dataclasses.asdict(obj)}, indent=indent)


def load(
    text: str, fmt: str, version: int, fix: str, upgrades: dict[int, Callable[[dict], dict]] | None = None
) -> dict:
    """The fields of a document written by `dump`, header removed; a `remat:` error otherwise.

    `upgrades` maps an older version still read to the function that turns its fields into this version's."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RematError(f"remat: expected a {fmt} JSON document, but it does not parse ({e}). Fix: {fix}.") from e
    seen = (data.get("format"), data.get("version")) if isinstance(data, dict) else None
    upgrade = None
    if seen != (fmt, version):
        upgrade = (upgrades or {}).get(seen[1]) if seen is not None and seen[0] == fmt and seen[1] is not None else None
        if upgrade is None:
            shown = seen if seen is not None else type(data).__name__
            raise RematError(
                f"remat: expected a {fmt} version {version} document, saw {shown!r}. "
                f"Fix: {fix} with this version of remat."
            )
    del data["format"], data["version"]
    return upgrade(data) if upgrade is not None else data


def build(fmt: str, version: int, make, what: str):
    """`make()`, the document's objects from its fields; a `remat:` error if the fields do not fit them."""
    try:
        return make()
    except (TypeError, KeyError, ValueError) as e:  # ValueError: a word no enum of remat's has
        raise RematError(
            f"remat: expected the fields of a {fmt} version {version} document, but they differ ({e}). "
            f"Fix: {what} again with this version of remat."
        ) from e
