"""Values a fake step can know: what the training step computes from its inputs alone.

NOTE [Values a fake step can know]
  A fake step has no data, so an op whose output depends on values (`.item()`, `nonzero`, boolean masking, a check
  such as `if (labels >= 0).all()`) cannot run on fake tensors: Hugging Face's wav2vec2 selects its CTC targets
  with `labels >= 0`, Longformer checks its inputs' padding, and remat's fake mode stopped there ("fake mode cannot
  run op aten._local_scalar_dense"), where the real step runs.  But those values come from the step's inputs,
  which are real.
  Rule 1. Each input tensor of a fake step, and each buffer of the model that has data (position ids, masks), keeps
          its real value beside its fake copy, on the CPU (`KnownValues.know`).  Parameters do not: a value
          computed from them is the real step itself.
  Rule 2. An op whose tensor arguments all have a value (a real tensor has its own; a fake constant, its constant)
          runs on those values too, beneath every mode, and its outputs keep theirs: so what the step computes from
          its inputs alone has values.  An op without tensor arguments (`arange`, `ones`) has them too.  A random
          op (`bernoulli_`, `rand`) gives none (the real step draws other numbers), nor does an output over
          KNOWN_MAX_BYTES, nor an op the CPU cannot run (a CUDA kernel of a simulated step).
  Rule 3. An op fake tensors cannot run for want of values (DATA_DEPENDENT_ERRORS) returns, where its arguments
          have values, what the real op returns: the number, or a fake tensor of the real output's shape, with its
          value beside it.  Indexing by a boolean mask that has a value (`h[ids >= 4]`, the tensor indexed without
          one) runs with the positions the mask selects, as the kernels read it (`_INDEXING`).  An op whose
          outputs' shapes follow from some arguments' values alone (CTC's from its target lengths:
          `_SHAPED_BY_KNOWN`) runs for real on those values and zeros for the rest, and its fake outputs take the
          shapes (no values).  Otherwise it raises as before.
  Rule 4. An op that writes into a tensor without computing its new value (an argument without one, a random op)
          takes the value away from it and every tensor that shares its storage.
  Rule 5. Values cost the step nothing: they are CPU tensors the tracker never sees, and the fake tensors beside
          them are counted as before.
  Rule 6. They cost time: another dispatch mode on every op (a quarter more for GPT-2 small's fake step), so a
          fake step runs without them first, and again with them only where an op stopped it (UnsupportedOp).
  Rule 7. A small tensor computed from a random draw is marked so, and an op that cannot run on it says so with
          the fix (`DRAWN`): LayerDrop's `torch.rand([]) < p` decides whether a layer runs at all.
  Rule 8. A factory the command line builds under fake tensors (`--mode fake`) makes its inputs fake as well, with
          no value to keep (Rule 1).  So it runs under `KnownValues(building=True)`: there a tensor of whole numbers
          or booleans (token ids, masks, labels) gets a value, random draws included (`torch.randint` draws on the
          CPU), and no other does (the parameters stay without data).  The step is then given those inputs as real
          CPU tensors (`realized`), tensors that share a fake storage sharing a real one of its size.  The model's
          buffers stay fake, without values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from remat._torch_compat import DATA_DEPENDENT_ERRORS, FakeTensor, TorchDispatchMode, beneath_modes, tensor_leaves
from remat._torch_compat import tree_flatten, tree_map
from remat._torch_compat.schema import written_tensors
from remat.errors import UnsupportedOp

DRAWN = (
    "remat: fake mode cannot run op {op}: the step branches on a random draw (torch.rand: LayerDrop, as wav2vec2 "
    "and HuBERT do by default in training), which a fake step cannot know, and a real step draws anew each time. "
    "Expected a step whose ops do not depend on random values. Fix: turn that choice off for the prediction "
    "(wav2vec2, HuBERT: config.layerdrop=0.0, the step with every layer), or profile with mode='real'."
)

UNTOLD = (
    "remat: Hugging Face asks whether a tensor of shape {shape} is traced, to read its values (an attention mask), "
    "and this fake step keeps no values. Expected a fake step with its inputs' values. Fix: none needed; remat runs "
    "the step again with them (this message is shown only if it could not)."
)

KNOWN_MAX_BYTES = 16 << 20
"""Rule 2: a tensor over this many bytes keeps no value (inputs, masks and ids are far smaller)."""

_FAILED = object()
_aten = torch.ops.aten
_SHAPED_BY_KNOWN = {_aten._ctc_loss.Tensor: lambda args: args[2:4]}
"""Rule 3: ops whose outputs' shapes follow from the values of some arguments alone (CTC's target lengths decide
its `log_alpha`'s), where those have values: {op: the arguments that decide}."""
_INDEXING = frozenset({_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default})
"""Rule 3: the ops whose second argument is a list of indices, of which a boolean one is read as positions."""


class KnownValues(TorchDispatchMode):
    """Rules 2-4, entered above the fake mode and beneath remat's tracker."""

    def __init__(self, *, building: bool = False) -> None:
        super().__init__()
        self.building = building  # Rule 8: the mode a factory runs under
        self.values: Any = WeakTensorKeyDictionary()
        self._storages: set[int] = set()  # of tensors given a value (some may be gone): Rule 4's quick test
        self._drawn: Any = WeakTensorKeyDictionary()  # Rule 7: small tensors computed from random draws

    def know(self, fake: Any, real: Any) -> None:
        """Rule 1: `real`'s value beside `fake` (tensors of one shape; anything else is left)."""
        if isinstance(fake, FakeTensor) and _real(real) and real.shape == fake.shape and _small(real):
            self._set(fake, real.detach().cpu().clone())

    def know_step(self, faked_inputs: tuple, table: dict[int, torch.Tensor], buffers: list[torch.Tensor]) -> None:
        """Rule 1 for a step: `faked_inputs` = (the fake inputs, the real ones), of one structure; `table` =
        {id(real): fake} of the model's swapped tensors, of which `buffers` (the real ones) keep their values."""
        fakes, reals = faked_inputs
        for f, real in zip(tree_flatten(fakes)[0], tree_flatten(reals)[0]):
            self.know(f, real)
        for b in buffers:
            if id(b) in table:
                self.know(table[id(b)], b)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tensor_leaves((args, kwargs))
        values = self._values_of(func, leaves, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except DATA_DEPENDENT_ERRORS:
            answer = self._answer(func, args, kwargs, leaves, values)
            if answer is _FAILED and any(t in self._drawn for t in leaves):
                raise UnsupportedOp(DRAWN.format(op=func), str(func)) from None
            if answer is _FAILED:
                raise
            return answer
        outs = tree_flatten(out)[0]
        real = _FAILED
        if values is not None and all(_small(t) and self._keeps(t) for t in tensor_leaves(out)):
            real = _run(func, args, kwargs, values)
        if real is not _FAILED:
            for f, r in zip(outs, tree_flatten(real)[0]):
                if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor) and r.shape == f.shape:
                    self._set(f, r)
        else:
            self._forget(written_tensors(func, args, kwargs))  # Rule 4
        if self._drawn_from(func, leaves):
            for f in outs:
                if isinstance(f, FakeTensor) and _small(f):
                    self._drawn[f] = True
        return out

    def _drawn_from(self, func, leaves: list[torch.Tensor]) -> bool:
        """Rule 7: a random op, or one on a random draw, whose other arguments have values (not activations)."""
        drawn = [t in self._drawn for t in leaves]
        if self.building or not (_random(func) or any(drawn)):  # Rule 8: a factory's draws have values
            return False
        return all(d or self._value(t) is not None for t, d in zip(leaves, drawn))

    def _answer(self, func, args, kwargs, leaves: list[torch.Tensor], values) -> Any:
        """Rule 3: what an op fake tensors cannot run returns, from the values; _FAILED where they do not tell."""
        device = next((t.device for t in leaves if isinstance(t, FakeTensor)), torch.device("cpu"))
        if values is None and func in _INDEXING:  # a known boolean index, as the positions it selects
            positions = self._positions(args[1], device)
            return _FAILED if positions is None else func(args[0], positions, *args[2:], **kwargs)
        if values is None and func in _SHAPED_BY_KNOWN:
            return self._shaped(func, args, kwargs, device)
        real = _FAILED if values is None else _run(func, args, kwargs, values)
        return real if real is _FAILED else tree_map(lambda r: self._faked(r, device), real)

    def _values_of(self, func, leaves: list[torch.Tensor], args, kwargs) -> dict[int, torch.Tensor] | None:
        """{id(tensor): its value} for every tensor argument, or None where one has none, or the op draws random
        numbers or writes into a real tensor (Rule 2)."""
        if _random(func) and not self.building:
            return None
        if not all(isinstance(t, FakeTensor) for t in written_tensors(func, args, kwargs)):
            return None
        values = {}
        for t in leaves:
            value = self._value(t)
            if value is None:
                return None
            values[id(t)] = value
        return values

    def has_value(self, t: torch.Tensor) -> bool:
        """Whether the step knows `t`'s value (Rules 1-3)."""
        return self._value(t) is not None

    def _keeps(self, t: torch.Tensor) -> bool:
        """Rule 8: while a factory runs, only tensors of whole numbers and booleans keep values."""
        return not (self.building and (t.is_floating_point() or t.is_complex()))

    def _set(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        self.values[fake] = real
        self._storages.add(fake.untyped_storage()._cdata)

    def _value(self, t: torch.Tensor) -> torch.Tensor | None:
        if isinstance(t, FakeTensor):
            value = self.values.get(t)
            constant = getattr(t, "constant", None)
            return value if value is not None else constant
        if not _real(t):
            return None
        with beneath_modes():  # else the fake mode beneath makes the copy fake
            return t.detach().cpu()

    def _positions(self, indices: list, device: torch.device) -> list | None:
        """`indices` with each boolean index that has a value replaced by the positions it selects (fake long
        tensors with their values), as the kernels read it; None where a boolean one has no value."""
        out: list = []
        for index in indices:
            if index is None or index.dtype not in (torch.bool, torch.uint8):
                out.append(index)
                continue
            value = self._value(index)
            if value is None:
                return None
            with beneath_modes():
                positions = value.nonzero().unbind(1)
            out.extend(self._faked(p, device) for p in positions)
        return out

    def _shaped(self, func, args, kwargs, device: torch.device) -> Any:
        """Rule 3 for `_SHAPED_BY_KNOWN`: fake outputs (without values) of the shapes the real op gives, run on the
        known arguments' values and zeros for the others; _FAILED where an argument that decides has no value."""
        if any(self._value(t) is None for t in _SHAPED_BY_KNOWN[func](args)):
            return _FAILED
        values = {}
        for t in tensor_leaves((args, kwargs)):
            value = self._value(t)
            with beneath_modes():
                values[id(t)] = value if value is not None else torch.zeros(t.shape, dtype=t.dtype)
        real = _run(func, args, kwargs, values)
        if real is _FAILED:
            return _FAILED
        return tree_map(lambda r: _fake_like(r, device) if isinstance(r, torch.Tensor) else r, real)

    def _faked(self, real: Any, device: torch.device) -> Any:
        """A fake tensor like `real`, with `real` as its value (fake mode is beneath: `empty_strided` is fake)."""
        if not isinstance(real, torch.Tensor):
            return real
        fake = _fake_like(real, device)
        self._set(fake, real)
        return fake

    def _forget(self, written: list[torch.Tensor]) -> None:
        storages = {t.untyped_storage()._cdata for t in written if isinstance(t, FakeTensor)} & self._storages
        if storages:
            for t in [t for t in self.values.keys() if t.untyped_storage()._cdata in storages]:
                del self.values[t]


def traced_unless_known(known: KnownValues | None) -> Callable[[torch.Tensor], bool]:
    """Whether Hugging Face should take fake `t` for a traced tensor: where it has no value
    (NOTE [A mask Hugging Face reads, under fake tensors]); a step without values cannot tell, and stops to run
    again with them."""

    def traced(t: torch.Tensor) -> bool:
        if known is None:
            raise UnsupportedOp(UNTOLD.format(shape=tuple(t.shape)), "is_tracing")
        return not known.has_value(t)

    return traced


def realized(obj: Any, known: KnownValues) -> Any:
    """Rule 8: `obj` with each fake tensor that has a value in `known` replaced by a real CPU tensor holding it; the
    tensors that share a fake storage share a real one of its size (a storage one of them has no value for stays
    fake, all its tensors with it)."""
    groups: dict[int, list[FakeTensor]] = {}
    for t in tree_flatten(obj)[0]:
        if isinstance(t, FakeTensor):
            groups.setdefault(t.untyped_storage()._cdata, []).append(t)
    real: dict[int, torch.Tensor] = {}
    for group in groups.values():
        values = [known.values.get(t) for t in group]
        if any(v is None for v in values):
            continue
        storage = torch.zeros(group[0].untyped_storage().nbytes(), dtype=torch.uint8).untyped_storage()
        for t, value in zip(group, values):
            view = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())
            real[id(t)] = view.copy_(value)
    return tree_map(lambda x: real.get(id(x), x) if isinstance(x, torch.Tensor) else x, obj)


def _run(func, args, kwargs, values: dict[int, torch.Tensor]) -> Any:
    """`func` on the arguments' values, on the CPU, beneath every mode; _FAILED if it cannot run there."""

    def value(x):
        if isinstance(x, torch.Tensor):
            return values[id(x)]
        return torch.device("cpu") if isinstance(x, torch.device) else x

    real_args, real_kwargs = tree_map(value, (args, kwargs))
    try:
        with beneath_modes(), torch.autocast("cpu", enabled=False):
            return func(*real_args, **real_kwargs)
    except Exception:  # a kernel the CPU has not (a simulated CUDA step's), a dtype it refuses: no value
        return _FAILED


def _random(func) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def _fake_like(real: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor like `real` on `device`: fake, where the fake mode is the mode beneath (in `__torch_dispatch__`)."""
    return torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=device)


def _real(t: Any) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and not t.is_meta


def _small(t: torch.Tensor) -> bool:
    return t.numel() * t.element_size() <= KNOWN_MAX_BYTES
