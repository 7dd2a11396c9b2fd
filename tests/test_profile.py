"""remat.profile: exact bytes on hand-checked models, real vs fake, user checkpoints, errors."""

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import remat
from remat import zoo
from remat._torch_compat import FakeTensorMode
from remat.types import PROFILE_VERSION

F32 = 4


def _mlp(d=64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))


# -- exact bytes ---------------------------------------------------------------------


def test_breakdown_of_a_two_layer_mlp_is_exact():
    d, b = 64, 32
    model, x = _mlp(d), torch.randn(b, d)
    prof = remat.profile(model, x)
    params = 2 * (d * d + d) * F32
    assert prof.param_bytes == params
    assert prof.input_bytes == b * d * F32
    # relu saves its output (b, d); both Linears save x / relu-out and their weights (params)
    assert prof.end_of_forward.activations_bytes == b * d * F32
    # the output (b, d) is held by the step, the loss is a 4-byte scalar; the first Linear's output is freed
    assert prof.end_of_forward.temporaries_bytes == b * d * F32 + F32
    assert prof.activation_bytes == prof.end_of_forward.activations_bytes
    assert prof.grad_bytes == params
    assert prof.optimizer_bytes == 0
    assert prof.at_peak.total_bytes == prof.peak_bytes


def test_params_saved_for_backward_are_not_activations():
    d, b = 256, 4
    model, x = nn.Linear(d, d, bias=False), torch.randn(b, d, requires_grad=True)
    prof = remat.profile(model, x)
    # Linear saves its input (an input) and its weight (a parameter): no activation at all
    assert prof.end_of_forward.activations_bytes == 0
    assert prof.end_of_forward.params_bytes == d * d * F32


class _ViewTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        h = self.lin(x)  # (B, 64)
        v = h.view(-1, 8, 8)
        return (v * v.transpose(1, 2)).sum(-1)  # mul saves two views of h's storage


def test_views_of_one_storage_count_once():
    b = 16
    prof = remat.profile(_ViewTwice(), torch.randn(b, 64))
    # saved: h (through two views) once; the mul output is summed (sum saves nothing)
    assert prof.end_of_forward.activations_bytes == b * 64 * F32


SHARED_ACT = nn.SiLU()
"""One activation module for every block, registered in none, like the SiLU that Hugging Face's Mamba makes with
`ACT2FN[...]` inside its forward (its convolution's fallback without the CUDA kernels)."""


class _SharedActBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(SHARED_ACT(self.up(x)))


def _saved_inside(model: nn.Module, block: nn.Module, inputs) -> int:
    """Bytes of the storages autograd saves while `block` runs, less the parameters' and the block's input's."""
    saved, inside = {}, []
    block.register_forward_pre_hook(lambda m, a: inside.append(a[0].untyped_storage().data_ptr()))
    block.register_forward_hook(lambda m, a, o: inside.append(None))

    def pack(t):
        if len(inside) == 1:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs).sum().backward()
    mine = {p.untyped_storage().data_ptr() for p in model.parameters()} | {inside[0]}
    model.zero_grad(set_to_none=True)
    return sum(n for ptr, n in saved.items() if ptr not in mine)


def test_a_module_outside_the_model_called_inside_a_block_is_the_blocks():
    """An activation module the model never registered (one instance for all blocks) runs inside each block: what
    it makes and saves there is the block's, which a checkpoint of the block frees.  Seen on Mamba (Hugging Face,
    2026-11-29): its SiLU's input and output were counted as no block's, and a plan checkpointing the first
    layer was predicted 68,608 bytes (1.7%) above its tracked step."""
    torch.manual_seed(0)
    model, x = nn.Sequential(*[_SharedActBlock(32) for _ in range(4)]), torch.randn(64, 32)
    prof = remat.profile(model, x)
    block = next(b for b in prof.blocks if b.name == "0")
    assert block.internal_bytes == _saved_inside(model, model[0], x) == 2 * 64 * 128 * F32  # SiLU's input, down's
    plan = remat.plan(prof, prof.peak_bytes - block.internal_bytes // 2)
    report = remat.verify(model, x, plan, time_rounds=0)
    assert plan.segments and report.ok, report
    assert report.measured_peak_bytes == plan.peak_bytes < prof.peak_bytes  # the planned step, tracked


class _NoGradProbe(nn.Module):
    """Calls a module under `torch.no_grad()` on a view of a tensor that requires grad, as Hugging Face's Reformer
    runs its reversible layers inside a custom autograd Function's forward."""

    def __init__(self):
        super().__init__()
        self.lin, self.probe = nn.Linear(16, 16), nn.Linear(8, 1)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            self.seen.copy_(self.probe(h[:, :8]).mean())  # the view requires grad and has no node to hook
        return torch.relu(h)


def test_a_module_called_under_no_grad_on_a_view_that_requires_grad_is_profiled_and_verified():
    """torch 2.13's ModuleTracker, and FlopCounterMode through it, raise "Expected gradient function to be set" on
    such a call (Reformer, 2026-11-29); remat's tracker and `remat.verify`'s FLOP count hook no backward for it."""
    torch.manual_seed(0)
    model, x = nn.Sequential(*[_NoGradProbe() for _ in range(4)], nn.Linear(16, 4)), torch.randn(4096, 16)
    prof = remat.profile(model, x)
    assert prof.peak_bytes > 0 and {b.name for b in prof.blocks} >= {"0", "1"}
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    report = remat.verify(model, x, plan, time_rounds=0)
    assert plan.segments and report.ok, report
    assert report.measured_recompute_flops == plan.recompute_flops > 0


def test_tied_weights_count_once():
    model, inputs = zoo.gpt2(n_layer=1, n_embd=32, n_head=2, seq=16, batch=2, vocab=128)
    assert model.lm_head.weight is model.transformer.wte.weight
    unique = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    prof = remat.profile(model, inputs, mode="fake")
    assert prof.param_bytes == sum(unique.values())


def test_adam_state_is_optimizer_bytes_and_peak_includes_it():
    model, x = _mlp(128), torch.randn(8, 128)
    prof = remat.profile(model, x, optimizer=lambda ps: torch.optim.Adam(ps))
    params = sum(p.numel() * F32 for p in model.parameters())
    step_counters = 4 * len(list(model.parameters()))  # Adam keeps a float32 scalar `step` per parameter
    assert prof.optimizer_bytes == 2 * params + step_counters
    assert prof.peak_phase == "optimizer"
    assert prof.peak_bytes >= params * 4  # params + grads + exp_avg + exp_avg_sq


def test_forward_flops_equal_flop_counter_mode():
    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    prof = remat.profile(model, inputs)
    with FlopCounterMode(display=False) as fc:
        model(**inputs).loss
    assert prof.forward_flops == fc.get_total_flops()
    layers = sum(b.forward_flops for b in prof.blocks if not b.extra)
    assert layers < sum(b.forward_flops for b in prof.blocks) == prof.forward_flops  # lm_head is an extra


# -- real vs fake ------------------------------------------------------------------------

FIVE_MODELS = {
    "mlp": lambda: zoo.mlp_report000(),
    "cnn_bn": lambda: zoo.cnn_bn(),
    "gpt2": lambda: zoo.gpt2(n_layer=2, n_embd=128, n_head=4, seq=64, batch=4, vocab=1024),
    "bert": lambda: zoo.bert(n_layer=2, hidden=128, heads=4, seq=64, batch=4, vocab=1024),
    "skipnet": lambda: zoo.skipnet(),
}


@pytest.mark.parametrize("name", sorted(FIVE_MODELS))
def test_fake_mode_predicts_real_mode_within_2_percent(name):
    model, inputs, *rest = FIVE_MODELS[name]()
    loss_fn = rest[0] if rest else None
    opt = lambda ps: torch.optim.Adam(ps)  # noqa: E731
    real = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode="real")
    fake = remat.profile(model, inputs, loss_fn=loss_fn, optimizer=opt, mode="fake")
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.02)
    for when in ("at_peak", "end_of_forward"):
        r, f = getattr(real, when).as_dict(), getattr(fake, when).as_dict()
        for cat in r:
            assert f[cat] == pytest.approx(r[cat], rel=0.02, abs=4096), (when, cat)
    assert [b.name for b in fake.blocks] == [b.name for b in real.blocks]
    assert [b.saved_bytes for b in fake.blocks] == [b.saved_bytes for b in real.blocks]


def test_fake_mode_on_a_model_built_under_fake_tensors_allocates_nothing():
    with FakeTensorMode(allow_non_fake_inputs=True):
        model, x = zoo.mlp_report000(hidden=1024, intermediate=4096, layers=8, seq=1024, batch=128)
    prof = remat.profile(model, x, mode="fake")
    assert prof.param_bytes == 8 * (2 * 1024 * 4096 + 4096 + 1024) * F32
    assert prof.input_bytes == 128 * 1024 * 1024 * F32
    # Linear 2 of each layer saves its (B, T, 4096) input; layers 1..7 save their (B, T, 1024) input
    assert prof.activation_bytes == 8 * 2 * 2**30 + 7 * 2**29
    assert prof.peak_bytes > 22 * 2**30  # a step bigger than this machine, predicted on it


def test_simulated_cuda_rounds_every_storage_to_512_bytes():
    model, x = _mlp(10), torch.randn(3, 10)  # tiny tensors: rounding dominates
    cpu = remat.profile(model, x, mode="fake")
    cuda = remat.profile(model, x, mode="fake", device="cuda")
    assert cuda.simulated_device and cuda.allocation_rounding_bytes == 512 and cuda.device == "cuda"
    assert cuda.peak_bytes % 512 == 0 and cuda.peak_bytes > cpu.peak_bytes
    assert cuda.param_bytes == 4 * 512  # two weights (400 B) and two biases (40 B), each one block


# -- checkpointing already in the model ------------------------------------------------------


class _Layers(nn.Module):
    def __init__(self, n=4, d=128, mode=None):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(n)
        )
        self.mode = mode

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.mode == "checkpoint" else layer(x)
        return x


def test_user_checkpoint_is_detected_with_its_recompute_flops():
    x = torch.randn(32, 128, requires_grad=True)
    plain = remat.profile(_Layers(), x)
    ckpt = remat.profile(_Layers(mode="checkpoint"), x)
    for p, c in zip(plain.blocks, ckpt.blocks):
        if c.depth == 0:
            assert c.checkpointed and c.checkpoint_kind == "recomputed"
            # torch re-runs the block up to its last saved tensor (GELU's output): the second Linear is skipped
            assert c.recompute_flops == p.checkpoint_recompute_flops == p.forward_flops // 2
            # nothing inside is kept; its output is, as the next checkpoint's input (not the last's: sum saves nothing)
            assert c.saved_bytes == c.output_saved_bytes == (32 * 128 * F32 if c.name != "layers.3" else 0)
    assert not any(b.checkpointed for b in plain.blocks)
    assert ckpt.recompute_flops == sum(b.checkpoint_recompute_flops for b in plain.blocks if b.depth == 0)
    assert ckpt.activation_bytes < plain.activation_bytes


def test_checkpoint_wrapper_blocks_are_candidates_and_marked():
    model = _Layers()
    for i, layer in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(layer)
    prof = remat.profile(model, torch.randn(8, 128, requires_grad=True))
    top = [b for b in prof.blocks if b.depth == 0]
    assert [b.name for b in top] == [f"layers.{i}" for i in range(4)]
    assert all(b.checkpoint_kind == "checkpoint_wrapper" and b.recompute_flops > 0 for b in top)


def test_candidates_of_hugging_face_models_are_their_layers():
    model, inputs = zoo.gpt2(n_layer=3, n_embd=32, n_head=2, seq=16, batch=2, vocab=128)
    prof = remat.profile(model, inputs, mode="fake")
    layers = [b for b in prof.blocks if not b.extra]
    assert [b.name for b in layers] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert all(b.has_dropout for b in layers)  # GPT-2's dropout defaults to 0.1
    assert all(b.saved_bytes > 0 and b.output_bytes == 2 * 16 * 32 * F32 for b in layers)
    # beside them, what a user could checkpoint too: embeddings, their dropout, the final norm, the head
    extras = [b.name for b in prof.blocks if b.extra]
    assert extras == ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.ln_f", "lm_head"]
    assert all(b.depth == 0 and b.parent is None for b in prof.blocks)


def test_named_blocks_are_added_and_batchnorm_is_flagged():
    model, x, loss_fn = zoo.cnn_bn(batch=4, size=16)
    prof = remat.profile(model, x, loss_fn=loss_fn, blocks=["head"], mode="fake")
    names = [b.name for b in prof.blocks]
    assert "head" in names and "stages.0" in names and "stages.0.1" in names
    assert prof.block("stages.0").has_batchnorm and not prof.block("head").has_batchnorm
    assert prof.block("stages.0.1").parent == "stages.0" and prof.block("stages.0.1").depth == 1


# -- the user's model is left as it was ----------------------------------------------------------


def _hooks_are_clean(model):
    from torch.nn.modules import module as m

    return not (m._global_forward_hooks or m._global_forward_pre_hooks) and all(
        not (mod._forward_hooks or mod._forward_pre_hooks) for mod in model.modules()
    )


def test_real_profile_restores_params_buffers_optimizer_and_rng():
    model, x, loss_fn = zoo.cnn_bn(batch=4, size=16)
    opt = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    remat.profile(model, x, loss_fn=loss_fn, optimizer=opt)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # incl. BN running stats
    assert all(p.grad is None for p in model.parameters())
    assert opt.state_dict()["state"] == {}
    assert torch.equal(torch.get_rng_state(), rng)
    assert _hooks_are_clean(model)


def test_fake_profile_puts_the_real_parameters_back():
    model, inputs = zoo.gpt2(n_layer=1, n_embd=32, n_head=2, seq=16, batch=2, vocab=128)
    params = [id(p) for p in model.parameters()]
    remat.profile(model, inputs, mode="fake", optimizer=torch.optim.AdamW(model.parameters()))
    assert [id(p) for p in model.parameters()] == params
    assert not any(type(p).__name__ == "FakeTensor" or p.grad is not None for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight


# -- JSON --------------------------------------------------------------------------------------


def test_json_round_trip_is_exact():
    model, inputs = zoo.gpt2(n_layer=2, n_embd=32, n_head=2, seq=16, batch=2, vocab=128)
    prof = remat.profile(model, inputs, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    again = remat.StepProfile.from_json(prof.to_json())
    assert again == prof
    assert prof.step_s > 0 and any(b.forward_s > 0 for b in prof.blocks)


def test_a_version_2_profile_file_loads_as_a_first_step():
    """Profile JSON version 3 added the loop (step, accumulate, first_step_peak_bytes); version 2 files,
    written before profile measured the steady step, measured the first step and load as such."""
    old = Path(__file__).parent / "golden" / "profile_version2.json"
    assert '"version": 2' in old.read_text() and '"step"' not in old.read_text()
    prof = remat.StepProfile.from_json(old.read_text())
    assert (prof.step, prof.accumulate, prof.first_step_peak_bytes) == ("first", 1, None)
    assert prof.peak_bytes == 2996 and prof.peak_phase == "optimizer"
    assert prof.timing == ("tracked" if prof.step_s else "")  # version 3 and before: op times of the tracked step
    again = remat.StepProfile.from_json(prof.to_json())
    assert again == prof and f'"version": {PROFILE_VERSION}' in prof.to_json()


def test_a_version_7_profile_reads_with_nothing_freed_before_a_blocks_first_ops():
    """Version 8 records what the step frees just before each block's first forward and backward op (the moment a
    checkpoint re-runs its forward, NOTE [The memory model of a plan], Rule 3); a version 7 file reads as 0 there."""
    model, inputs = zoo.chain_report001(width=64, blocks=4, batch=32)
    prof = remat.profile(model, inputs)
    assert any(b.freed_before_backward_bytes > 0 for b in prof.blocks)  # a ReLU's backward releases its output
    data = json.loads(prof.to_json())
    data["version"] = 7
    for b in data["blocks"]:
        del b["freed_before_forward_bytes"], b["freed_before_backward_bytes"]
    old = remat.StepProfile.from_json(json.dumps(data))
    assert all(b.freed_before_forward_bytes == b.freed_before_backward_bytes == 0 for b in old.blocks)
    assert old.peak_bytes == prof.peak_bytes and [b.name for b in old.blocks] == [b.name for b in prof.blocks]


def test_a_version_8_profile_reads_with_nothing_known_of_a_selective_cache():
    """Version 9 records what a selective checkpoint's cache gives its recomputation and holds past the unplanned
    step (NOTE [Which outputs a selective checkpoint keeps], Rule 5); a version 8 file reads with none of it."""
    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, seq=32, batch=2, vocab=512)
    prof = remat.profile(model, inputs)
    assert any(b.selective_kept_made and b.selective_variants for b in prof.blocks)
    data = json.loads(prof.to_json())
    data["version"] = 8
    for b in data["blocks"]:
        del b["selective_kept_made"], b["selective_kept_outside"]
        for v in b["selective_variants"]:
            del v["kept_made"], v["kept_outside"]
    old = remat.StepProfile.from_json(json.dumps(data))
    assert all(not b.selective_kept_made and not any(v.kept_made for v in b.selective_variants) for b in old.blocks)
    assert [b.selective_variants[0].keeps for b in old.blocks if b.selective_variants] == [
        b.selective_variants[0].keeps for b in prof.blocks if b.selective_variants
    ]


def test_from_json_rejects_other_documents():
    with pytest.raises(
        remat.RematError,
        match=rf"^remat: expected a remat.StepProfile version {PROFILE_VERSION} document, saw \('other', None\)",
    ):
        remat.StepProfile.from_json('{"format": "other"}')
    with pytest.raises(remat.RematError, match=r"saw \('remat.StepProfile', 1\)\. Fix: .* with this version of remat"):
        remat.StepProfile.from_json('{"format": "remat.StepProfile", "version": 1}')  # written before the fields grew
    doc = json.loads(remat.profile(*zoo.chain_report001(width=8, blocks=2, batch=2)).to_json())
    del doc["blocks"][0]["container"]
    doc["blocks"][0]["unknown"] = 1
    with pytest.raises(
        remat.RematError,
        match=rf"^remat: expected the fields of a remat.StepProfile version {PROFILE_VERSION} document",
    ):
        remat.StepProfile.from_json(json.dumps(doc))
    with pytest.raises(
        remat.RematError, match=r"^remat: expected a remat.StepProfile JSON document, but it does not parse"
    ):
        remat.StepProfile.from_json("not json")


# -- bad input -----------------------------------------------------------------------------


class _ReturnsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return {"y": self.lin(x)}


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h[h > 0].sum()  # boolean mask: output shape depends on values


class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) @ torch.ones(3, 3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: remat.profile(nn.Linear(4, 4), "x"), r"^remat: inputs must be a tensor, tuple or dict; saw str"),
        (lambda: remat.profile("model", torch.ones(1)), r"^remat: expected a torch.nn.Module, saw str"),
        (
            lambda: remat.profile(_ReturnsDict(), torch.ones(2, 4)),
            r"^remat: the model returned a dict.*Fix: pass loss_fn",
        ),
        (
            lambda: remat.profile(nn.Linear(4, 4), torch.ones(2, 4), loss_fn=lambda out: out),
            r"^remat: loss_fn\(output\) has shape \(2, 4\); expected a scalar",
        ),
        (
            lambda: remat.profile(nn.Linear(4, 4), torch.ones(2, 4), mode="fast"),
            r"^remat: mode must be 'real' or 'fake'",
        ),
        (
            lambda: remat.profile(nn.Linear(4, 4), torch.ones(2, 4), device="cuda"),
            r"^remat: mode='real' measures on the model's device \(cpu\).*mode='fake', device='cuda'",
        ),
        (lambda: remat.profile(_mlp(), torch.ones(2, 64), blocks=["9"]), r"^remat: blocks names a module '9'"),
        (lambda: remat.profile(nn.Linear(4, 4), torch.ones(2, 4), optimizer=3), r"^remat: optimizer must be None"),
        (
            lambda: remat.profile(_DataDependent(), torch.ones(2, 4), loss_fn=lambda o: o, mode="fake"),
            r"^remat: fake mode cannot run op aten.nonzero.default during the model's forward.*Fix: profile with mode='real'",
        ),
        (lambda: remat.profile(_Raises(), torch.ones(2, 4)), r"^remat: the model's forward raised RuntimeError"),
        (
            lambda: remat.profile(nn.Linear(4, 4).requires_grad_(False), torch.ones(2, 4)),
            r"^remat: Linear has no parameter that requires grad",
        ),
    ],
)
def test_bad_input_gets_a_remat_error(call, message):
    with pytest.raises(remat.RematError, match=message):
        call()


def test_an_error_mid_step_leaves_no_hook_and_no_fake_parameter():
    model = _DataDependent()
    with pytest.raises(remat.UnsupportedOp) as info:
        remat.profile(model, torch.ones(2, 4), loss_fn=lambda o: o, mode="fake")
    assert info.value.op == "aten.nonzero.default"
    assert _hooks_are_clean(model)
    assert type(model.lin.weight).__name__ == "Parameter"
    out = model(torch.ones(2, 4))  # still a working real model
    assert isinstance(out, torch.Tensor) and F.relu(out).item() >= 0


def test_profiling_leaves_no_global_module_hook_behind():
    """`torch.compile(module)` warns at every call while any global module hook is registered, as remat.profile's
    are while it runs: none may be left after it.  torch's handle for a with_kwargs hook left its flag behind, and
    the user's compiled model warned of hooks that were gone (`_torch_compat.global_forward_hook_with_kwargs`)."""
    model, x = zoo.bert(n_layer=1, hidden=32, heads=2, seq=16, batch=2, vocab=64)
    remat.profile(model, x)
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(**x)
    assert not [str(w.message) for w in seen if "global hooks" in str(w.message)]


class _DecidesOnItsInputs(nn.Module):
    """As Longformer's padding check and wav2vec2's CTC targets: a branch taken on the inputs' values, and a
    selection by a boolean mask of them (`nonzero`, whose output's shape is those values')."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.body = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 32))
        self.pad = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32))

    def forward(self, ids, mask):
        h = self.emb(ids)
        if not bool((mask == 1).all()):
            h = self.pad(h * mask[..., None])  # larger activations, only where there is padding
        return self.body(h)[ids >= 4].pow(2).mean()


@pytest.mark.parametrize("padded", [False, True])
def test_a_fake_step_runs_what_depends_on_the_inputs_values_and_peaks_as_the_real_one(padded):
    """NOTE [Values a fake step can know]: the inputs keep their values beside their fake copies, so a check and a
    boolean selection on them run in fake mode (both raised remat's UnsupportedOp before) and take the real step's
    branch: fake equals real to the byte, with padding and without."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (8, 512))
    mask = torch.ones(8, 512, dtype=torch.long)
    if padded:
        mask[:, 400:] = 0
    model = _DecidesOnItsInputs()
    real = remat.profile(model, (ids, mask), loss_fn=lambda out: out)
    fake = remat.profile(model, (ids, mask), loss_fn=lambda out: out, mode="fake")
    assert fake.peak_bytes == real.peak_bytes, (fake.peak_bytes, real.peak_bytes)
    unpadded = remat.profile(model, (ids, torch.ones_like(mask)), loss_fn=lambda out: out, mode="fake")
    assert (fake.peak_bytes > unpadded.peak_bytes) is padded  # the branch the values decide


class _CTC(nn.Module):
    """wav2vec2's CTC head and loss: targets selected by `labels >= 0`, their lengths counted from the labels."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)

    def forward(self, x, labels):
        log_probs = self.lin(x).log_softmax(-1).transpose(0, 1)
        mask = labels >= 0
        lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
        return F.ctc_loss(log_probs, labels.masked_select(mask), lengths, mask.sum(-1), blank=0)


def test_a_fake_ctc_loss_takes_its_shapes_from_the_target_lengths_and_peaks_as_the_real_one():
    """Rule 3 of NOTE [Values a fake step can know]: CTC's outputs are shaped by its target lengths (known: from the
    labels) while its input is an activation (no value); raised before."""
    torch.manual_seed(0)
    x, labels = torch.randn(16, 400, 16), torch.randint(1, 32, (16, 60))
    labels[:, 50:] = -100
    real = remat.profile(_CTC(), (x, labels), loss_fn=lambda out: out)
    fake = remat.profile(_CTC(), (x, labels), loss_fn=lambda out: out, mode="fake")
    assert fake.peak_bytes == real.peak_bytes, (fake.peak_bytes, real.peak_bytes)


class _DropsALayer(nn.Module):
    """LayerDrop (wav2vec2's, by default): a branch on a random draw, which the real step draws anew."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return x if bool(torch.rand([]) < 0.1) else self.lin(x)


def test_a_branch_on_a_random_draw_still_stops_a_fake_step_and_says_which_draw_and_the_fix():
    """Rule 7 of NOTE [Values a fake step can know]: a value computed from a random draw is not known."""
    with pytest.raises(remat.UnsupportedOp) as info:
        remat.profile(_DropsALayer(), torch.ones(2, 4), loss_fn=lambda o: o.sum(), mode="fake")
    message = str(info.value)
    assert message.startswith("remat: fake mode cannot run op aten._local_scalar_dense.default: the step branches on")
    assert "Fix: turn that choice off for the prediction (wav2vec2, HuBERT: config.layerdrop=0.0" in message
