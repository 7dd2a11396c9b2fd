"""Every checkpoint remat builds replays the RNG of every device its tensors live on (GitHub issue 34).

torch's non-reentrant checkpoint stashes the GPU RNG state only of the devices of its *positional* tensor
arguments (`get_device_states(*args)`, `_infer_device_type(*args)`); seen on an H100: BERT's embeddings,
called with keywords only, replayed dropout with another mask.  No CPU run shows the wrong gradient (the
CPU generator is always forked), so these tests watch what torch's stash is given: a spy on
`_infer_device_type`, which receives exactly the positional arguments that `get_device_states` does, records
the tensors in them.  A tensor passed as a keyword, nested in a list or dict, or bound by functools.partial
must be among them, through remat.apply (recipe and plan), remat.checkpoint and a run of nn.ModuleList
entries.  And `remat.explain` says where a model's own checkpoint misses them.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils._pytree import tree_flatten

import remat
from remat.applier.rng import seen_by_torch, unseen_tensors
from remat.applier.wrapping import is_own_checkpoint
from remat.module_tree import OWN_CHECKPOINT_MARK


class Block(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(0.5)

    def forward(self, x=None, pair=None, scale=None):
        h = self.drop(torch.tanh(self.fc(x)))
        if pair is not None:
            h = h + pair["a"][0] * pair["b"]
        return h * scale if scale is not None else h


class Net(nn.Module):
    """Blocks in an nn.ModuleList that the loop calls with keyword tensors only, some nested."""

    def __init__(self, n: int = 4, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(width) for _ in range(n))

    def forward(self, x, a, b):
        for block in self.blocks:
            x = block(x=x, pair={"a": [a], "b": b})
        return x


def _inputs():
    torch.manual_seed(1)
    return torch.randn(8, 16, requires_grad=True), torch.randn(8, 16), torch.randn(16)


@pytest.fixture
def stash(monkeypatch):
    """ids of the tensors among the positional arguments torch's checkpoint looks at for device states."""
    seen: set[int] = set()
    calls = [0]

    def spying(original):
        def spy(*args):
            calls[0] += 1
            seen.update(id(t) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor))
            return original(*args)

        return spy

    monkeypatch.setattr(tuc, "_infer_device_type", spying(tuc._infer_device_type))
    monkeypatch.setattr(tuc, "get_device_states", spying(tuc.get_device_states))
    return types.SimpleNamespace(seen=seen, calls=calls)


def _plan(model, inputs):
    prof = remat.profile(model, inputs)
    plan = remat.plan(prof, prof.peak_bytes - 1, solver="chen")
    assert plan.segments
    return plan


@pytest.mark.parametrize("how", ["every-block", "chen", "plan"])
def test_keyword_and_nested_tensors_reach_torchs_device_stash(stash, how):
    """every-block: one wrapped forward per block (wrapping.py); chen: runs of two entries (runs.py)."""
    model, (x, a, b) = Net(), _inputs()
    remat.apply(model, _plan(model, (x, a, b)) if how == "plan" else how)
    stash.seen.clear()
    model(x, a, b).sum().backward()
    assert stash.calls[0] > 0
    assert {id(x), id(a), id(b)} <= stash.seen  # x as a keyword, a in a list in a dict, b in a dict
    remat.remove(model)


def test_partial_bound_and_keyword_tensors_reach_it_through_remat_checkpoint(stash):
    block, (x, _, b) = Block(), _inputs()
    block.forward = functools.partial(Block.forward, block, scale=b)  # an instance forward binding a tensor
    remat.checkpoint(block)
    block(x=x).sum().backward()
    assert {id(x), id(b)} <= stash.seen
    remat.remove(block)
    assert isinstance(block.forward, functools.partial)  # the instance forward it had


def test_positional_calls_are_made_as_before(stash, monkeypatch):
    """Nothing to add: torch gets exactly the positional arguments, and the function remat checkpoints."""
    given = []
    original = tuc._checkpoint_without_reentrant_generator

    def generator(fn, *fixed_and_args, **kwargs):  # fn, preserve_rng_state, context_fn, ..., early_stop, *args
        given.append((fn, fixed_and_args[5:], kwargs))
        yield from original(fn, *fixed_and_args, **kwargs)

    monkeypatch.setattr(tuc, "_checkpoint_without_reentrant_generator", generator)
    block, (x, _, _) = Block(), _inputs()
    remat.checkpoint(block)
    block(x).sum().backward()
    fn, args, kwargs = given[0]
    assert is_own_checkpoint(fn) and len(args) == 1 and args[0] is x and kwargs == {}


def test_the_tuple_torch_gets_is_dropped_before_the_function_runs():
    calls = []

    def run(*args, **kwargs):
        calls.append((args, kwargs))
        return args

    setattr(run, OWN_CHECKPOINT_MARK, True)
    x, y = torch.ones(1), torch.zeros(1)
    call, positional = seen_by_torch(run, [run], [], (x,), {"y": y})
    assert positional[0] is x and positional[1] == (y,) and len(positional) == 2
    call(*positional, y=y)
    assert calls == [((x,), {"y": y})] and is_own_checkpoint(call)
    assert seen_by_torch(run, [run], [], (x, y), {}) == (run, (x, y))  # nothing unseen: as given


class _Reports(torch.Tensor):
    """A CPU tensor that says it lives on `where` (this machine has no GPU); only remat's own code asks."""

    where = "cpu"

    @property
    def device(self):
        return torch.device(self.where)


def _on(device: str) -> torch.Tensor:
    t = torch.zeros(1).as_subclass(_Reports)
    t.where = device
    return t


def test_a_parameter_anchors_each_gpu_no_argument_is_on():
    """One parameter or buffer per device that the arguments do not cover, none for CPU."""
    on = {d: _on(d) for d in ("cuda:0", "cuda:1", "cpu")}
    module = types.SimpleNamespace(
        parameters=lambda: [on["cuda:0"], on["cpu"], on["cuda:1"]], buffers=lambda: [on["cuda:1"]]
    )
    assert _same(unseen_tensors([], [module], (), {}), [on["cuda:0"], on["cuda:1"]])
    mask, x = _on("cuda:0"), _on("cuda:1")
    assert _same(unseen_tensors([], [module], (), {"mask": [mask]}), [mask, on["cuda:1"]])
    assert _same(unseen_tensors([], [module], ((x,),), {"mask": [mask]}), [mask])
    assert _same(unseen_tensors([], [module], (x, _on("meta")), {"m": _on("meta")}), [on["cuda:0"]])


def _same(got, expected) -> bool:
    return len(got) == len(expected) and all(g is e for g, e in zip(got, expected))


def _grads(model, inputs) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    model(*inputs).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("how", ["every-block", "chen"])
def test_dropout_with_keyword_tensors_gives_the_unplanned_gradients(how):
    model, inputs = Net(), _inputs()
    plain = _grads(model, inputs)
    remat.apply(model, how)
    planned = _grads(model, inputs)
    remat.remove(model)
    assert plain.keys() == planned.keys() and all(torch.equal(plain[n], planned[n]) for n in plain)


# -- remat.explain: the model's own checkpoints that cannot replay dropout on a GPU ---------------------------


class Checkpointed(nn.Module):
    """A Block checkpointed by the model's own code: `how` passes its tensor as checkpoint's keyword, bound by
    functools.partial, positionally, or (wrapper) calls a checkpoint_wrapper with a keyword."""

    def __init__(self, how: str, preserve_rng_state: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.head = nn.Linear(32, 16), nn.Linear(16, 8)
        self.block = Block()
        if how == "wrapper":
            self.block = checkpoint_wrapper(self.block, preserve_rng_state=preserve_rng_state)
        self.how, self.preserve = how, preserve_rng_state

    def forward(self, x):
        x, options = self.stem(x), dict(use_reentrant=False, preserve_rng_state=self.preserve)
        if self.how == "keyword":
            x = tuc.checkpoint(self.block, x=x, **options)
        elif self.how == "partial":
            x = tuc.checkpoint(functools.partial(self.block, x=x), **options)
        elif self.how == "positional":
            x = tuc.checkpoint(self.block, x, **options)
        else:
            x = self.block(x=x)
        return self.head(x)


def _explain(model, mode="real"):
    return remat.explain(model, torch.randn(64, 32), mode=mode)


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_explain_finds_a_checkpoint_whose_tensors_come_as_keywords_around_dropout(mode):
    expl = _explain(Checkpointed("keyword"), mode)
    [f] = expl
    assert (f.code, f.module, f.severity) == ("rng-keyword-tensors", "block", "correctness")
    assert expl.checkpoints[0].keyword_tensors == ("x",)
    assert f.message.startswith("checkpoint(block) gets its tensors only as keyword argument x, none positional")
    assert "(dropout: block.drop)" in f.message and "on a GPU" in f.message and "On CPU it is right" in f.message
    assert "checkpoint(lambda x: block(x=x), x, use_reentrant=False)" in f.fix and "remat.apply" in f.fix
    assert "rng-keyword-tensors in block [correctness]" in str(expl)


def test_explain_finds_tensors_bound_by_partial_and_keyword_calls_of_a_checkpoint_wrapper():
    [f] = _explain(Checkpointed("partial"))
    assert (f.code, f.module) == ("rng-keyword-tensors", "block")
    assert "only as tensors bound by functools.partial" in f.message
    [f] = _explain(Checkpointed("wrapper"))
    assert (f.code, f.module) == ("rng-keyword-tensors", "block")
    assert f.message.startswith("checkpoint_wrapper(block) gets its tensors only as keyword argument x")
    assert "block(x) where the model calls it" in f.fix


def test_explain_finds_nothing_when_the_tensors_are_positional():
    assert list(_explain(Checkpointed("positional"))) == []
    assert _explain(Checkpointed("positional")).checkpoints[0].keyword_tensors == ()


def test_a_checkpoint_without_rng_state_is_one_finding_not_two():
    assert _explain(Checkpointed("keyword", preserve_rng_state=False)).codes() == ["rng-not-preserved"]


class Layers(nn.Module):
    def __init__(self, n: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(32, 64)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 64)) for _ in range(n)
        )

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("style", ["checkpoint_wrapper", "apply_activation_checkpointing", "checkpoint_fn"])
def test_explain_finds_fsdp2_style_activation_checkpointing_without_rng_state(style):
    """Accelerate's FSDP2 activation checkpointing wraps layers with torch.distributed's checkpoint_wrapper;
    preserve_rng_state=False given to it (directly, through apply_activation_checkpointing, or bound in a
    checkpoint_fn) reaches torch's checkpoint, and explain names each layer."""
    model = Layers()
    if style == "checkpoint_wrapper":
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    else:
        fn = (
            dict(checkpoint_fn=functools.partial(tuc.checkpoint, use_reentrant=False))
            if style == "checkpoint_fn"
            else {}
        )
        wrap = functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **fn, preserve_rng_state=False
        )
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=lambda m: m in set(model.layers))
    expl = _explain(model)
    assert expl.codes() == ["rng-not-preserved"] * 3
    assert [f.module for f in expl] == ["layers.0", "layers.1", "layers.2"]
    assert all(f.message.startswith(f"checkpoint_wrapper({f.module}) runs with preserve_rng_state=False") for f in expl)
