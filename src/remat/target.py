"""TARGET specs: how the command line finds the model to profile.

A TARGET is `path/to/file.py:factory` or `package.module:factory`.  The factory is
called with no arguments and returns `(model, inputs)` or `(model, inputs, loss_fn)`,
the arguments `remat.profile` takes.  Every way a TARGET can be wrong raises a
`RematError` that says what was expected, what was seen, and the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from remat._torch_compat import FakeTensorMode
from remat.errors import RematError
from remat.measure.device.known import KnownValues, realized

log = logging.getLogger(__name__)

FORMS = "`path/to/file.py:factory` or `package.module:factory`"
SHAPE = "(model, inputs) or (model, inputs, loss_fn)"


class Target(NamedTuple):
    """What a factory built; unpacks as `model, inputs, loss_fn = load_target(spec)`."""

    model: nn.Module
    inputs: Any
    loss_fn: Callable | None


def load_target(spec: str, fake: bool = False, *, device: str | None = None) -> Target:
    """Import the factory a TARGET spec names, call it, and check what it returns.

    Example:
        >>> model, inputs, loss_fn = load_target("remat.zoo:mlp_report000")
        >>> model, inputs, loss_fn = load_target("train.py:make", fake=True)  # nothing allocated

    With `fake=True` the factory runs inside a `FakeTensorMode`, so a model too large
    for this machine can still be built and profiled with `mode="fake"`; the inputs'
    tensors of whole numbers and booleans (ids, masks, labels) come back real, with the
    values the factory gave them, for the ops of the step that read them.  If the
    factory fails under fake tensors it is built for real instead, with a warning
    logged on `remat.target`.  With `device` (e.g. "cuda") the factory runs under
    `torch.device(device)`, so tensors it makes without naming a device land there.

    Known limitations: the factory takes no arguments; a factory that places tensors
    on an explicit device ignores `device`; a file target runs with its folder first
    on `sys.path` and stays imported under a private module name.
    """
    where, name = _split(spec)
    module = _import_file(where) if _is_file(where) else _import_module(where)
    factory = _factory(module, where, name)
    built = _build(factory, spec, fake, device)
    return _check(built, spec)


# -- parsing and importing ------------------------------------------------------------


def _split(spec: str) -> tuple[str, str]:
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name:
        raise RematError(
            f"remat: TARGET must be {FORMS}; saw {spec!r}, which has "
            f"{'no colon' if not colon else 'nothing on one side of the colon'}. "
            f"Fix: name the factory after a colon, e.g. `{spec.rstrip(':') or 'model.py'}:make_model`."
        )
    return where, name


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def _import_file(where: str) -> ModuleType:
    path = Path(where)
    if not path.is_file():
        raise RematError(
            f"remat: TARGET names the file {where!r}, which does not exist "
            f"(looked in {Path.cwd()}). Expected a Python file that defines the factory. "
            f"Fix: check the path, or use `package.module:factory` for an importable module."
        )
    module_name = f"_remat_target_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RematError(f"remat: cannot load {where!r} as Python source. Fix: give a .py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickle look their module up here
    with _on_sys_path(str(path.resolve().parent)):
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(module_name, None)
            raise RematError(
                f"remat: importing {where!r} raised {_one_line(e)}{_where_raised(e, path)}. "
                "Expected the file to import cleanly. Fix: run `python "
                f"{where}` to see the full error, and correct it."
            ) from e
    return module


def _import_module(where: str) -> ModuleType:
    with _on_sys_path(os.getcwd()):  # as `python -m` would; the `remat` script does not add it
        try:
            return importlib.import_module(where)
        except ImportError as e:
            raise RematError(
                f"remat: TARGET names the module {where!r}, which cannot be imported: {_one_line(e)}. "
                "Expected an importable module (or a path to a .py file). "
                f"Fix: check the spelling and that it is installed, or write the file path, "
                f"e.g. `{where.replace('.', '/')}.py:factory`."
            ) from e
        except Exception as e:
            raise RematError(
                f"remat: importing the module {where!r} raised {_one_line(e)}. "
                f"Expected it to import cleanly. Fix: run `python -c 'import {where}'` to see the full error."
            ) from e


@contextlib.contextmanager
def _on_sys_path(folder: str) -> Iterator[None]:
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _factory(module: ModuleType, where: str, name: str) -> Callable:
    if not hasattr(module, name):
        raise RematError(
            f"remat: {where!r} has no attribute {name!r}; expected a factory function there. "
            f"Callables it defines: {_callables(module)}. Fix: name one of them after the colon."
        )
    factory = getattr(module, name)
    if not callable(factory):
        raise RematError(
            f"remat: {where}:{name} is not callable (its type is {type(factory).__name__}); expected a factory "
            f"function returning {SHAPE}. Callables it defines: {_callables(module)}. "
            "Fix: point TARGET at a function."
        )
    _check_no_required_args(factory, f"{where}:{name}")
    return factory


def _check_no_required_args(factory: Callable, label: str) -> None:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): let the call decide
        return
    required = [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if required:
        raise RematError(
            f"remat: the factory {label} requires arguments ({', '.join(required)}); expected a function "
            "that remat can call with none. Fix: give them defaults, or add a wrapper such as "
            f"`def make(): return {label.rpartition(':')[2]}(...)` and point TARGET at it."
        )


def _callables(module: ModuleType, limit: int = 8) -> str:
    """Public functions, then classes, defined in `module` itself (not imported into it)."""
    own = [
        (n, obj)
        for n, obj in vars(module).items()
        if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__
    ]
    names = [n for n, obj in own if inspect.isfunction(obj)] + [n for n, obj in own if inspect.isclass(obj)]
    if not names:
        return "none"
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# -- building ---------------------------------------------------------------------------


def _build(factory: Callable, spec: str, fake: bool, device: str | None) -> Any:
    if fake:
        known = KnownValues(building=True)  # NOTE [Values a fake step can know], Rule 8
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), known, _device_ctx(device):
                built = factory()
            return _inputs_realized(built, known)
        except RematError:
            raise
        except Exception as e:
            log.warning(
                "remat: building %s under fake tensors raised %s; built it for real instead "
                "(this allocates its parameters and inputs; the profile is still predicted in fake mode).",
                spec,
                _one_line(e),
            )
    try:
        with _device_ctx(device):
            return factory()
    except RematError:
        raise
    except Exception as e:
        raise RematError(
            f"remat: the factory {spec} raised {_one_line(e)}{_where_raised(e, _source_of(factory))}. "
            f"Expected it to take no arguments and return {SHAPE}. "
            "Fix: call it yourself in Python to see the full traceback, and correct it."
        ) from e


def _inputs_realized(built: Any, known: KnownValues) -> Any:
    """What a factory built under fake tensors, its inputs' whole-number and boolean tensors real
    (NOTE [Values a fake step can know], Rule 8); anything but `(model, inputs[, loss_fn])` is left for `_check`."""
    if not isinstance(built, (tuple, list)) or len(built) not in (2, 3):
        return built
    return (built[0], realized(built[1], known), *built[2:])


def _device_ctx(device: str | None):
    return torch.device(device) if device is not None else contextlib.nullcontext()


def _check(built: Any, spec: str) -> Target:
    if not isinstance(built, (tuple, list)) or len(built) not in (2, 3):
        seen = f"a {len(built)}-tuple" if isinstance(built, (tuple, list)) else _describe(built)
        raise RematError(
            f"remat: the factory {spec} returned {seen}; expected {SHAPE}. "
            "Fix: end it with `return model, inputs` (inputs: a tensor, a tuple of arguments or a dict)."
        )
    model, inputs, loss_fn = (*built, None)[:3]
    if not isinstance(model, nn.Module):
        raise RematError(
            f"remat: the factory {spec} returned {_describe(model)} as its first element; expected "
            "a torch.nn.Module. Fix: return the model first: `return model, inputs`."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise RematError(
            f"remat: the factory {spec} returned {_describe(loss_fn)} as loss_fn; expected a callable "
            "output -> scalar tensor, or None. Fix: return e.g. `lambda out: out.mean()` third."
        )
    return Target(model, inputs, loss_fn)


# -- message helpers --------------------------------------------------------------------


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, nn.Module):
        return f"a bare model ({type(x).__name__})"
    return f"a {type(x).__name__}"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _source_of(fn: Callable) -> Path | None:
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:  # a builtin or a callable object without source
        return None
    return Path(source) if source else None


def _where_raised(e: BaseException, path: Path | None) -> str:
    """' (at file.py:12)': the innermost frame of the traceback that is in the user's file `path`."""
    if path is None:
        return ""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {Path(f.filename).name}:{f.lineno})"
