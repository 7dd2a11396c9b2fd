"""Running a step on fake tensors: same shapes, dtypes and storages, no data.

The model's own parameters and buffers are swapped for fake ones for the length of
the step and put back afterwards (also on error), so the user's model is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from remat._torch_compat import FakeTensor, FakeTensorMode, fake_mode_of, tree_map
from remat._torch_compat.distributed import local_tensor


def existing_fake_mode(model: nn.Module) -> FakeTensorMode | None:
    """The fake mode a model was built under (its parameters, or their local shards, are fake), if any."""
    for t in list(model.parameters()) + list(model.buffers()):
        mode = fake_mode_of(local_tensor(t))
        if mode is not None:
            return mode
    return None


def _fake_like(t: torch.Tensor, mode: FakeTensorMode, device: torch.device) -> torch.Tensor:
    with mode:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)


@contextlib.contextmanager
def swapped_tensors(
    model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor], keep_fake: bool = True
) -> Iterator[dict[int, torch.Tensor]]:
    """Swap every parameter and buffer of `model` for `make(detached tensor)` (a parameter stays one, tied
    weights stay tied); yields {id(original): replacement}, and puts the originals back after.  With
    `keep_fake`, a tensor that is fake already (a DTensor whose shard is fake too) is kept."""
    swapped: list[tuple[dict, str, object]] = []
    table: dict[int, torch.Tensor] = {}
    try:
        for mod in model.modules():
            stores: tuple[tuple[dict[str, Any], bool], ...] = ((mod._parameters, True), (mod._buffers, False))
            for store, is_param in stores:
                for name, t in list(store.items()):
                    if t is None or (keep_fake and isinstance(local_tensor(t), FakeTensor)):
                        continue
                    new = table.get(id(t))
                    if new is None:
                        new = make(t.detach())
                        if is_param:
                            new = nn.Parameter(new, requires_grad=t.requires_grad)
                        table[id(t)] = new
                    swapped.append((store, name, t))
                    store[name] = new
        yield table
    finally:
        for store, name, t in reversed(swapped):
            store[name] = t


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of `t`'s shape, strides and dtype on the meta device (no data; `t` may be fake)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def fake_model(model: nn.Module, mode: FakeTensorMode, device: torch.device):
    """Swap every parameter and buffer of `model` for a fake one meanwhile; yields {id(real): fake}."""
    return swapped_tensors(model, lambda t: _fake_like(t, mode, device))


def fake_inputs(obj, mode: FakeTensorMode, device: torch.device):
    """Fake copies of every tensor in a nest of tuples / lists / dicts (one per real storage)."""
    storages: dict[int, torch.Tensor] = {}
    made: dict[tuple, torch.Tensor] = {}

    def conv(t):
        if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor):
            return t
        st = t.untyped_storage()
        key = (id(st), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)
        if key not in made:
            base = storages.get(id(st))
            if base is None:  # the whole storage once, then views of it, so sharing is kept
                with mode:
                    base = torch.empty(st.nbytes(), dtype=torch.uint8, device=device)
                storages[id(st)] = base
            with mode:
                f = torch.empty(0, dtype=t.dtype, device=device).set_(
                    base.untyped_storage(), t.storage_offset(), t.shape, t.stride()
                )
            made[key] = f.requires_grad_(t.requires_grad) if t.is_floating_point() else f
        return made[key]

    return tree_map(conv, obj)


def fake_optimizer(opt: torch.optim.Optimizer, table: dict[int, torch.Tensor], mode, device):
    """A new optimizer of the same class and settings over the fake parameters, state faked too."""
    groups = []
    for g in opt.param_groups:
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": [table[id(p)] for p in g["params"]]})
    make: Any = type(opt)  # an optimizer class: its own defaults, if it takes none by keyword
    try:
        new = make(groups, **opt.defaults)
    except TypeError:
        new = make(groups)
    for p, st in opt.state.items():
        if id(p) in table:
            new.state[table[id(p)]] = {k: _fake_state(v, mode, device) for k, v in st.items()}
    return new


def _fake_state(v, mode: FakeTensorMode, device: torch.device):
    """A fake copy of one optimizer state value.  A step counter (a scalar tensor that has stepped) keeps
    its value as a fake constant: the optimizer reads it with `.item()`, which fake tensors otherwise refuse."""
    if not isinstance(v, torch.Tensor) or isinstance(v, FakeTensor):
        return v
    if v.dim() == 0:
        value = v.item()
        with mode:
            return torch.tensor(value, dtype=v.dtype, device=v.device)
    return _fake_like(v, mode, device)


FOREACH_NOTE = (
    "optimizer: its multi-tensor (foreach) kernels simulated, as torch picks them for CUDA parameters by default."
)


def multi_tensor_as_on_cuda(opt: torch.optim.Optimizer) -> bool:
    """Give the (fake) optimizer the kernels torch picks for CUDA parameters: foreach where the user left the
    choice to torch (it picks single-tensor kernels for fake tensors).  True if a group was changed."""
    changed = False
    for g in opt.param_groups:
        if "foreach" in g and g["foreach"] is None and not g.get("fused") and not g.get("differentiable"):
            g["foreach"] = True
            changed = True
    return changed


def host_step_counters(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The step counters an optimizer of CUDA parameters keeps in host memory: Adam(W)'s `step` scalars
    where the group is neither `capturable` nor `fused` (torch makes them CPU tensors then).  On a CUDA step
    simulated on CPU every fake tensor is a CPU one, so these are named here: no GPU memory holds them."""
    if opt is None:
        return []
    found = []
    for g in opt.param_groups:
        if g.get("capturable") or g.get("fused"):
            continue
        for p in g["params"]:
            step = opt.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.dim() == 0:
                found.append(step)
    return found
