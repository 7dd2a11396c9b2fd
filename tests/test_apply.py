"""remat.apply / remove / auto / checkpoint / verify on every model kind: nothing but memory changes."""

import copy
import gc
import dataclasses
import importlib
import math
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import architectures
import remat
from remat import zoo
from remat.applier.apply import applied
from remat.module_tree import WRAPPED_MARK
from remat.planner.budget import parse_budget


def _hf():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def llama():
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=128,
        use_cache=False,
    )
    ids = torch.randint(0, 1024, (4, 64))
    return tf.LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}


def vit():
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=256,
        num_labels=10,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    return tf.ViTForImageClassification(cfg), {"pixel_values": torch.randn(8, 3, 64, 64), "labels": torch.arange(8)}


MODELS = {
    "gpt2 (dropout)": lambda: zoo.gpt2(n_layer=4, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048),
    "bert (dropout)": lambda: zoo.bert(n_layer=3, hidden=128, heads=4, seq=128, batch=4, vocab=2048),
    "llama": llama,
    "vit (dropout)": vit,
    "chain (segments)": lambda: zoo.chain_report001(width=256, blocks=16, batch=2048),
    "mlp (nested)": lambda: zoo.mlp_report000(batch=32),
    "cnn with batchnorm": lambda: zoo.cnn_bn(batch=32, size=32),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_plan_changes_nothing_but_memory(name):
    model, inputs, *rest = MODELS[name]()
    loss_fn = rest[0] if rest else None
    prof = remat.profile(model, inputs, loss_fn=loss_fn)
    plan = remat.plan(prof, (prof.peak_bytes + remat.frontier(prof)[-1].peak_bytes) // 2)
    assert plan.segments or plan.selective, "the budget should need some recomputation"
    report = remat.verify(model, inputs, plan, loss_fn=loss_fn)
    assert report.grads_equal, report.grad_max_abs_diff  # bit-exact: deterministic CPU kernels
    assert report.buffers_equal  # BatchNorm running statistics updated once
    assert report.measured_recompute_flops == plan.recompute_flops
    assert abs(report.peak_error) <= 0.05
    assert report.measured_peak_bytes <= plan.budget_bytes * 1.05
    assert report.ok and "MISMATCH" not in str(report)


def test_apply_keeps_state_dict_keys_and_remove_restores_the_forwards():
    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    keys = list(model.state_dict())
    forwards = {n: m.forward for n, m in model.named_modules()}
    remat.apply(model, "every-block")
    assert list(model.state_dict()) == keys
    assert "forward" in model.transformer.h[0].__dict__
    remat.remove(model)
    assert list(model.state_dict()) == keys
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert {n: m.forward for n, m in model.named_modules()} == forwards


def test_a_checkpoint_saved_from_a_planned_model_loads_into_an_unplanned_one(tmp_path):
    model, _ = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    remat.apply(model, "every-block")
    torch.save(model.state_dict(), tmp_path / "w.pt")
    fresh, _ = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    fresh.load_state_dict(torch.load(tmp_path / "w.pt"))  # strict: same keys


def test_every_block_recomputes_each_layer_once_measured_with_flop_counter():
    """The extra FLOPs of the planned step by torch's FlopCounterMode (not remat's tracker) are the recomputation
    the unplanned profile predicted for the three blocks; remat's own count of the planned step agrees."""
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=64, batch=2, vocab=512)
    prof = remat.profile(model, inputs)
    _, unplanned_flops = _step(model, inputs)
    remat.apply(model, "every-block")
    _, planned_flops = _step(model, inputs)
    predicted = sum(b.checkpoint_recompute_flops for b in prof.blocks if b.name.startswith("transformer.h."))
    assert planned_flops - unplanned_flops == predicted > 0
    planned = remat.profile(model, inputs)
    assert [b.name for b in planned.blocks if b.checkpointed] == [
        "transformer.h.0",
        "transformer.h.1",
        "transformer.h.2",
    ]
    assert planned.recompute_flops == predicted
    assert planned.activation_bytes < prof.activation_bytes


def test_chen_recipe_segments_a_sequential_and_a_module_list_and_refuses_a_module_dict():
    model, x = zoo.chain_report001(width=64, blocks=8, batch=16)
    remat.apply(model, "chen")
    assert sum("forward" in m.__dict__ for m in model) == 17  # every child of the chain is in a segment
    gpt, _ = zoo.gpt2(n_layer=4, n_embd=32, n_head=2, seq=16, batch=2, vocab=64)
    remat.apply(gpt, "chen")  # NOTE [A run of nn.ModuleList entries as one checkpoint]
    assert all("forward" in layer.__dict__ for layer in gpt.transformer.h)
    stages, _ = architectures.stages()
    with pytest.raises(
        remat.RematError,
        match=r"^remat: the 'chen' recipe .* inside an nn.Sequential or an "
        r"nn.ModuleList; stages is a ModuleDict",
    ):
        remat.apply(stages, "chen")


class _Twice(nn.Module):
    """One block used twice per step, keyword arguments, a tuple and a dataclass as outputs."""

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        aux: torch.Tensor

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(64, 256)
        self.block = nn.Sequential(nn.Linear(256, 256), nn.Dropout(0.2), nn.GELU())
        self.pair = _Pair()
        self.head = nn.Linear(256, 8)

    def forward(self, x, *, scale=1.0):
        h = self.embed(x)
        h = self.block(h) * scale
        h = self.block(h)  # the same module again
        a, b = self.pair(h, bias=0.5)
        return _Twice.Out(self.head(a + b), b.mean())


class _Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(256, 256)

    def forward(self, h, bias=0.0):
        z = torch.tanh(self.lin(h)) + bias
        return z, z * 2


def test_kwargs_tuples_dataclasses_and_a_module_called_twice():
    torch.manual_seed(0)
    model = _Twice()
    inputs = {"x": torch.randn(4096, 64), "scale": 2.0}
    loss_fn = lambda out: out.y.square().mean() + out.aux  # noqa: E731
    prof = remat.profile(model, inputs, loss_fn=loss_fn, blocks=["block", "pair"])
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    assert plan.segments or plan.selective
    report = remat.verify(model, inputs, plan, loss_fn=loss_fn)
    assert report.grads_equal and report.measured_recompute_flops == plan.recompute_flops


def test_frozen_parameters_and_inputs_without_grad_still_get_gradients():
    """The reentrant pitfall: no input requires grad. Non-reentrant checkpoint has none."""
    model, x = zoo.chain_report001(width=64, blocks=6, batch=64)
    model[0].requires_grad_(False)  # frozen first layer: the checkpointed blocks' inputs need no grad
    remat.apply(model, "every-block")
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_eval_mode_and_no_grad_run_the_original_forward():
    model, x = zoo.chain_report001(width=64, blocks=4, batch=8)
    expected = model(x)
    remat.apply(model, "every-block")
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_batchnorm_running_stats_equal_after_a_planned_step():
    model, x, loss_fn = zoo.cnn_bn(batch=16, size=16)
    ref = [b.clone() for b in model.buffers()]
    torch.manual_seed(1)
    loss_fn(model(x)).backward()
    expected = [b.clone() for b in model.buffers()]
    with torch.no_grad():
        for b, r in zip(model.buffers(), ref):
            b.copy_(r)
    remat.apply(model, "every-block")  # the stages: Conv, BN, ReLU x2 each, all recomputed
    torch.manual_seed(1)
    loss_fn(model(x)).backward()
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), expected))


def test_hugging_face_gradient_checkpointing_is_not_doubled():
    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with pytest.warns(
        UserWarning, match=r"remat: transformer.h.0, transformer.h.1 already checkpointed by Hugging Face"
    ):
        remat.apply(model, "every-block")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_auto_profiles_plans_and_applies():
    model, x = zoo.chain_report001(width=256, blocks=8, batch=1024)
    before = remat.profile(model, x)
    plan = remat.auto(model, x, budget=0.8)
    after = remat.profile(model, x)
    assert plan.solver == "dp" and after.peak_bytes <= int(0.8 * before.peak_bytes)
    assert after.peak_bytes == pytest.approx(plan.peak_bytes, rel=0.05)


def test_remat_checkpoint_marks_one_module():
    model, x = zoo.chain_report001(width=128, blocks=4, batch=64)
    block = nn.Sequential(*list(model)[:4])
    wrapped = nn.Sequential(block, *list(model)[4:])
    remat.checkpoint(block)
    prof = remat.profile(wrapped, x, blocks=["0"])
    assert prof.block("0").checkpointed and prof.recompute_flops == prof.block("0").recompute_flops > 0
    assert prof.block("0").checkpoint_kind == "remat"  # remat's own, not the model's
    info = block.__dict__[WRAPPED_MARK]
    assert remat.checkpoint(block) is block and block.__dict__[WRAPPED_MARK] is info  # a flag: set twice is set
    remat.remove(wrapped)
    assert "forward" not in block.__dict__


# -- bad input: a remat error naming the modules, and the model as it was ------------------------


def _forwards(model):
    return {n: m.__dict__.get("forward") for n, m in model.named_modules()}


def test_a_plan_for_another_model_is_refused_and_nothing_changes():
    chain, x = zoo.chain_report001(width=64, blocks=4, batch=4096)
    plan = remat.plan(remat.profile(chain, x), 0.9)
    gpt, _ = zoo.gpt2(n_layer=2, n_embd=32, n_head=2, seq=16, batch=2, vocab=64)
    before = _forwards(gpt)
    with pytest.raises(
        remat.RematError, match=r"^remat: the plan names modules this GPT2LMHeadModel does not have: 0, 1"
    ):
        remat.apply(gpt, plan)
    assert _forwards(gpt) == before


def test_a_plan_whose_module_types_differ_is_refused():
    chain, x = zoo.chain_report001(width=64, blocks=4, batch=4096)
    plan = remat.plan(remat.profile(chain, x), 0.9)
    other = nn.Sequential(*[nn.Tanh() for _ in range(9)])
    with pytest.raises(
        remat.RematError, match=r"^remat: the plan was made for a different model: 0 \(Linear in the plan, Tanh here\)"
    ):
        remat.apply(other, plan)
    assert all("forward" not in m.__dict__ for m in other.modules())


def test_applying_twice_and_removing_from_an_unplanned_model():
    model, _ = zoo.chain_report001(width=64, blocks=4, batch=8)
    before = _forwards(model)
    assert remat.remove(model) is model and _forwards(model) == before  # nothing to undo: a no-op (issue 13)
    with pytest.raises(remat.RematError, match=r"^remat: remove expects a torch.nn.Module, saw str"):
        remat.remove("model")
    remat.apply(model, "every-block")
    before = _forwards(model)
    with pytest.raises(remat.RematError, match=r"^remat: unknown recipe 'all'"):
        remat.apply(model, "all")
    assert _forwards(model) == before and applied(model) == "every-block"  # refused: the plan in force stays


# -- a model remat planned already: apply replaces, auto plans the model as written, checkpoint adds ---------
# (issue 37: the README's example applies, then auto, then a recipe, then marks a block, on one model)

HF_BLAME = "Hugging Face gradient checkpointing, or torch.utils.checkpoint"


def _small_gpt2():
    return zoo.gpt2(n_layer=4, n_embd=64, n_head=2, seq=64, batch=2, vocab=256)


def _wrapped(model) -> dict:
    """{name: its WrapInfo} of every module remat wrapped."""
    return {n: m.__dict__[WRAPPED_MARK] for n, m in model.named_modules() if WRAPPED_MARK in m.__dict__}


def _step(model, inputs) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of one forward and backward from a fixed RNG state, and its FLOPs."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with FlopCounterMode(display=False) as fc:
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        (out.loss if isinstance(inputs, dict) else out.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, fc.get_total_flops()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_applying_a_second_plan_replaces_the_first_and_says_what_it_replaced():
    model, inputs = _small_gpt2()
    unplanned, _ = _step(model, inputs)
    fresh, _ = _small_gpt2()
    _, every_block_flops = _step(remat.apply(fresh, "every-block"), inputs)
    remat.apply(model, "chen")  # two runs of two layers
    assert sorted(len(info.segment) for info in _wrapped(model).values()) == [2, 2, 2, 2]
    remat.checkpoint(model.transformer.h[1].mlp)
    with pytest.warns(
        UserWarning,
        match=r"^remat: GPT2LMHeadModel followed recipe 'chen' and remat.checkpoint on "
        r"transformer.h.1.mlp; replaced by recipe 'every-block', not added to it \(one plan at a time; "
        r"remat.remove\(model\) undoes it\)\.$",
    ):
        remat.apply(model, "every-block")
    wrapped = _wrapped(model)
    assert sorted(wrapped) == [f"transformer.h.{i}" for i in range(4)] and applied(model) == "every-block"
    assert all(info.segment == [model.get_submodule(n)] and info.role == "head" for n, info in wrapped.items())
    grads, flops = _step(model, inputs)
    assert _same(grads, unplanned) and flops == every_block_flops  # each layer recomputed once, nothing left over
    remat.remove(model)
    assert _wrapped(model) == {} and applied(model) is None
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_auto_on_a_planned_model_plans_the_model_as_written_and_replaces_the_plan():
    model, x = zoo.gpt2(n_layer=4, n_embd=64, n_head=2, seq=128, batch=4, vocab=256)
    unplanned, _ = _step(model, x)
    before = remat.profile(model, x)
    remat.apply(model, "every-block")
    planned = remat.profile(model, x)  # the planned step: remat's checkpoints, said to be remat's
    assert planned.peak_bytes < before.peak_bytes  # a share of it would be another budget
    assert {b.checkpoint_kind for b in planned.blocks if b.checkpointed} == {"remat"}
    assert any(n.startswith("remat's own checkpoints (remat.apply, remat.checkpoint) recompute") for n in planned.notes)
    with pytest.raises(remat.InfeasibleBudget) as refused:
        remat.plan(planned, 0.05)
    assert HF_BLAME not in str(refused.value)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = remat.auto(model, x, budget=0.7)
    said = [str(w.message) for w in caught]
    assert [
        m for m in said if m.startswith("remat: GPT2LMHeadModel followed recipe 'every-block'; replaced by a plan by ")
    ]
    assert not any(HF_BLAME in m for m in said + plan.notes)
    assert plan.unplanned_peak_bytes == before.peak_bytes  # planned as written: a share of the unplanned peak
    assert plan.budget_bytes == parse_budget(0.7, before.peak_bytes)
    assert applied(model) is plan
    assert sorted(_wrapped(model)) == sorted({n for seg in plan.segments for n in seg} | set(plan.selective))
    assert remat.profile(model, x).peak_bytes <= plan.budget_bytes
    assert _same(_step(model, x)[0], unplanned)

    wrapped = _wrapped(model)
    with pytest.raises(remat.InfeasibleBudget) as refused:  # nothing fits: the plan in force stays
        remat.auto(model, x, budget=0.05)
    assert HF_BLAME not in str(refused.value)
    assert applied(model) is plan and _wrapped(model) == wrapped


def test_checkpoint_inside_a_planned_model_adds_a_flag_and_is_a_no_op_where_the_plan_checkpoints():
    model, inputs = _small_gpt2()
    unplanned, _ = _step(model, inputs)
    remat.apply(model, "chen")
    wrapped = _wrapped(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no error, no warning
        for i in range(4):  # heads and members of the plan's runs: checkpointed already
            assert remat.checkpoint(model.transformer.h[i]) is model.transformer.h[i]
    assert all(_wrapped(model)[n] is info for n, info in wrapped.items()) and len(_wrapped(model)) == len(wrapped)
    remat.checkpoint(model.transformer.ln_f)  # outside the plan: added
    remat.checkpoint(model.transformer.h[1].mlp)  # inside a run the plan checkpoints: nested in it
    assert set(_wrapped(model)) == set(wrapped) | {"transformer.ln_f", "transformer.h.1.mlp"}
    assert applied(model) == "chen"
    with pytest.raises(remat.InfeasibleBudget):  # measured as written; nothing fits: the plan and marks put back
        remat.auto(model, inputs, budget=0.01)
    assert set(_wrapped(model)) == set(wrapped) | {"transformer.ln_f", "transformer.h.1.mlp"}
    assert applied(model) == "chen"
    assert _same(_step(model, inputs)[0], unplanned)
    remat.remove(model)
    assert _wrapped(model) == {} and applied(model) is None
    remat.checkpoint(model.transformer.h[1].mlp)  # inside a block: the block re-runs ops too, by remat's checkpoint
    prof = remat.profile(model, inputs)
    assert [(b.name, b.checkpoint_kind) for b in prof.blocks if b.checkpointed] == [("transformer.h.1", "remat")]
    assert not any(HF_BLAME in n for n in remat.plan(prof, 0.9).notes)
    remat.remove(model)


def test_checkpoint_of_a_module_the_plan_offloads_recomputes_it_instead():
    model, inputs = _small_gpt2()
    unplanned, _ = _step(model, inputs)
    prof = remat.profile(model, inputs)
    offload = dataclasses.replace(remat.plan(prof, prof.peak_bytes), offload=["transformer.h.2"])
    with pytest.warns(UserWarning, match="is not on a GPU"):
        remat.apply(model, offload)
    assert _wrapped(model)["transformer.h.2"].role == "offload"
    with pytest.warns(UserWarning, match=r"^remat: the plan offloaded this GPT2Block; remat.checkpoint recomputes it"):
        remat.checkpoint(model.transformer.h[2])
    assert _wrapped(model)["transformer.h.2"].role == "head"
    assert _same(_step(model, inputs)[0], unplanned)
    remat.remove(model)
    assert _wrapped(model) == {}


def test_a_plan_for_a_shallower_model_is_refused_naming_the_first_layer_it_never_saw():
    small, inputs = zoo.gpt2(n_layer=4, n_embd=32, n_head=2, seq=16, batch=2, vocab=64)
    prof = remat.profile(small, inputs, mode="fake")
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)  # the least-memory plan: every layer planned
    assert plan.segments or plan.selective
    deep, _ = zoo.gpt2(n_layer=8, n_embd=32, n_head=2, seq=16, batch=2, vocab=64)
    before = _forwards(deep)
    with pytest.raises(
        remat.RematError,
        match=r"^remat: the plan was made for a different model: transformer\.h\.4 "
        r"\(here, not in the plan\), transformer\.h\.5 .*Fix: profile and plan this model",
    ):
        remat.apply(deep, plan)
    assert _forwards(deep) == before
    remat.apply(small, plan)  # the model it was made for takes it


def test_selective_checkpointing_keeps_matmuls_and_costs_no_flops():
    model, inputs = zoo.gpt2(n_layer=4, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048)
    prof = dataclasses.replace(remat.profile(model, inputs), timing="")  # untimed: FLOPs are the cost
    plan = remat.plan(prof, 0.9)
    assert plan.selective and not plan.segments and plan.recompute_flops == 0
    assert all(plan.decisions[n] == "selective" for n in plan.selective)
    report = remat.verify(model, inputs, plan)
    assert report.ok, str(report)
    assert report.measured_recompute_flops == 0  # softmax, GELU, layer norms and dropout are re-run: 0 FLOPs
    assert report.measured_peak_bytes < prof.peak_bytes


# -- offload --------------------------------------------------------------------------------------


def _offload_plan(prof: remat.StepProfile, names: list[str]) -> remat.Plan:
    """A keep-everything plan of `prof` with `names` offloaded (on the CPU the planner offers no offload)."""
    keep = remat.plan(prof, 1.0)
    return dataclasses.replace(
        keep,
        decisions={**keep.decisions, **{n: "offload" for n in names}},
        offload=names,
        offload_bytes=sum(prof.block(n).offload_bytes for n in names),
    )


def test_offload_moves_each_saved_storage_once_and_changes_no_gradient():
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=4, seq=64, batch=2, vocab=512)  # dropout on
    prof = remat.profile(model, inputs)
    plan = _offload_plan(prof, ["transformer.h.0", "transformer.h.2"])
    keys = list(model.state_dict())
    with pytest.warns(
        UserWarning,
        match=r"^remat: the plan offloads transformer.h.0, transformer.h.2, but GPT2LMHeadModel is not on a GPU",
    ):
        report = remat.verify(model, inputs, plan)
    assert report.grads_equal and report.buffers_equal, str(report)
    assert report.measured_recompute_flops == 0
    # parameters (and linear's saved weight.t()) stay put; every other saved storage goes once
    assert report.measured_offload_bytes == plan.offload_bytes > 0
    with pytest.warns(UserWarning):
        remat.apply(model, plan)
    assert list(model.state_dict()) == keys
    model.eval()
    with torch.no_grad():
        model(**inputs)  # eval: offload is off, nothing is copied
    from remat.applier.wrapping import offloaded_bytes

    assert offloaded_bytes(model) == 0
    remat.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: offload saves device memory only there")
def test_offload_on_a_gpu_lowers_the_measured_peak_as_planned():
    model, inputs = zoo.gpt2(n_layer=4, n_embd=256, n_head=4, seq=256, batch=8, vocab=4096)
    model = model.cuda()
    inputs = {k: v.cuda() for k, v in inputs.items()}
    prof = remat.profile(model, inputs)
    assert prof.host_bandwidth_bytes_s > 0
    plan = remat.plan(prof, 0.6, offload_bandwidth=1e15)  # copies nearly free: offload wherever it helps
    assert plan.offload
    report = remat.verify(model, inputs, plan, tolerance=1e-5)
    assert report.grads_equal and abs(report.peak_error) <= 0.05, str(report)
    assert report.measured_offload_bytes == plan.offload_bytes


def test_a_keep_everything_plan_installs_nothing_so_the_step_is_the_unplanned_one():
    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    plan = remat.plan(remat.profile(model, inputs), 1.0)
    assert set(plan.decisions.values()) == {"keep"}
    remat.apply(model, plan)
    # no module has an instance forward, so each call runs the class's own code: no per-step overhead
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert applied(model) is plan
    remat.remove(model)


def test_blocks_in_a_module_dict_are_the_chain_every_block_checkpoints():
    model, x = architectures.stages()
    unplanned = remat.profile(model, x)
    remat.apply(model, "every-block")
    wrapped = [n for n, m in model.named_modules() if "forward" in m.__dict__]
    assert wrapped == [f"stages.{s}" for s in ("stem", "body", "neck", "head")]
    planned = remat.profile(model, x)
    assert planned.peak_bytes < unplanned.peak_bytes and planned.recompute_flops > 0
    remat.remove(model)
    plan = remat.plan(unplanned, remat.frontier(unplanned)[-1].peak_bytes)
    assert set(plan.decisions) >= {"stages.stem", "stages.head"}
    assert remat.verify(model, x, plan).ok


class _DictLayers(nn.Module):
    """Layers kept as an nn.ModuleDict each, called entry by entry from the model's own loop: a ModuleDict has no
    forward, so the layers are no candidates, their entries are."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict(dict(up=nn.Linear(64, 256), act=nn.GELU(), down=nn.Linear(256, 64))) for _ in range(2)
        )

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["down"](layer["act"](layer["up"](x)))
        return x


def test_a_plan_for_layers_kept_in_module_dicts_applies_to_the_model_it_was_made_for():
    """It was refused: "the plan was made for a different model: layers.0 (here, not in the plan)" (found
    2026-11-28 on a gated MLP whose layers are ModuleDicts)."""
    model, x = _DictLayers(), torch.randn(512, 64)
    prof = remat.profile(model, x)
    assert [b.name for b in prof.blocks][:3] == ["layers.0.up", "layers.0.act", "layers.0.down"]
    for budget in (1.0, remat.frontier(prof)[-1].peak_bytes):
        plan = remat.plan(prof, budget)
        remat.apply(model, plan)
        assert applied(model) is plan
        assert remat.verify(model, x, plan).ok
        remat.remove(model)


def test_verify_needs_bit_equal_gradients_on_cpu_and_allows_a_cuda_steps_own_noise():
    """On CPU the unplanned step is not run twice: no noise, the bound is the tolerance (0: bit-equal).  A report
    with a run-to-run difference (measured on CUDA, whose attention backward is not deterministic) accepts
    GRAD_NOISE_FACTOR times it and says so; a difference far beyond it is still a mismatch."""
    from remat.types.verification import GRAD_NOISE_FACTOR

    model, inputs = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    prof = remat.profile(model, inputs)
    report = remat.verify(model, inputs, architectures.least_plan(prof), time_rounds=0)
    assert report.grad_noise == 0.0 and report.grad_tolerance == 0.0 and report.grads_equal, str(report)
    zeros = {n: 0.0 for n in report.grad_max_abs_diff}
    first = next(iter(zeros))
    noisy = dataclasses.replace(report, grad_max_abs_diff={**zeros, first: 1.5e-7}, grad_noise=2e-8)
    assert noisy.grad_tolerance == pytest.approx(GRAD_NOISE_FACTOR * 2e-8) and noisy.grads_equal
    assert f"<= 2e-07 ({GRAD_NOISE_FACTOR}x run to run)" in str(noisy), str(noisy)
    beyond = dataclasses.replace(noisy, grad_max_abs_diff={**zeros, first: 4.7e-3})
    assert not beyond.grads_equal and not beyond.ok
    assert dataclasses.replace(beyond, tolerance=1e-2).grads_equal


class _Reseeds(nn.Module):
    """As Hugging Face's Reformer does in training: a seed from the OS in every forward, then dropout (and a tanh,
    whose saved output makes the module worth recomputing)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        torch.seed()
        return nn.functional.dropout(x, self.p, training=True).tanh()


class _Counts(nn.Module):
    """A forward that changes state outside its tensors: a recomputation scales its output once more."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x * float(self.calls)


@pytest.mark.parametrize(
    "middle, replays, verdict_starts",
    [
        (_Reseeds(0.5), False, "Verdict: NOT proved: the step without the plan does not replay itself"),
        (_Reseeds(0.0), True, "Verdict: the plan holds"),
        (_Counts(), True, "Verdict: the plan does NOT hold"),
    ],
    ids=["reseeds and draws", "reseeds, draws nothing", "counts its calls"],
)
def test_verify_runs_a_step_again_when_gradients_differ_and_judges_none_that_does_not_replay_itself(
    middle, replays, verdict_starts
):
    """NOTE [A step that does not replay itself]: a step whose random draws a seed does not replay leaves the
    gradients unjudged, with why and the fix, not a MISMATCH blamed on the plan; a reseed that changes no draw
    replays; a plan that does change the gradients is still a MISMATCH."""
    from remat.report.plan_text import verdict

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 64), copy.deepcopy(middle), nn.Linear(64, 64), nn.Tanh()) for _ in range(4)]
    model, x = nn.Sequential(*blocks, nn.Linear(64, 8)), torch.randn(2048, 64)
    plan = architectures.least_plan(remat.profile(model, x))
    assert ["0.0", "0.1", "0.2"] in plan.segments, plan.segments  # the middle module recomputed
    report = remat.verify(model, x, plan, time_rounds=0)
    assert report.unplanned_reproducible is replays and report.grad_tolerance == 0.0, str(report)
    assert verdict(report).startswith(verdict_starts), verdict(report)
    text = str(report)
    if not replays:
        assert not report.ok and report.grad_noise > 0 and "not judged" in text and "MISMATCH" not in text
        assert f"its gradients differ by {report.grad_noise:.3g}, so they cannot show what the plan changes" in text
        assert "Fix: verify with that randomness fixed (dropout 0," in text.replace("\n", " ")
    else:
        assert "does not replay itself" not in text and report.grad_noise == 0.0
        assert report.ok is (verdict_starts == "Verdict: the plan holds"), text
        changed = verdict_starts == "Verdict: the plan does NOT hold"  # judged again with deterministic kernels
        assert (report.grad_deterministic_diff or 0.0) > 0 if changed else report.grad_deterministic_diff is None
        assert ("so the plan changes the gradients" in " ".join(text.split())) is changed
        assert report.ok is verdict(report).endswith("; the plan has no budget).")  # a frontier's plan


class _SumsInAnyOrder(nn.Module):
    """An identity whose backward moves its gradient's first row by a last bit while `noisy`, as a CPU kernel that
    sums in the order its threads reach each element does now and then (the backward of an index with repeated
    indices); never with torch's deterministic kernels."""

    noisy = False

    def forward(self, x):
        return _LastBit.apply(x).tanh()


class _LastBit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if _SumsInAnyOrder.noisy and not torch.are_deterministic_algorithms_enabled():
            grad = grad.clone()
            grad[0] = torch.nextafter(grad[0], torch.full_like(grad[0], math.inf))
        return grad


class _NoDeterministicRun(nn.Module):
    """A forward that cannot run with torch's deterministic kernels (as a user's code may refuse to)."""

    def forward(self, x):
        if torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("this step is not meant to run deterministically")
        return x


@pytest.mark.parametrize("refuses", [False, True], ids=["runs deterministically", "refuses to"])
def test_gradients_a_kernels_sum_order_moved_are_judged_again_with_deterministic_kernels(monkeypatch, refuses):
    """Rule 3 of NOTE [A step that does not replay itself]: on CPU a planned step whose gradients moved by a last bit
    while the unplanned step, run again, replayed itself bit for bit, is judged by both steps run again with torch's
    deterministic kernels: equal there, the plan holds (before: MISMATCH).  A step that cannot run so is judged as
    first measured.  A plan that changes the gradients stays a MISMATCH there (the parametrized test above,
    `_Counts`)."""
    verifying = importlib.import_module("remat.verifier.verify")  # the module (the package exports its function)
    torch.manual_seed(0)
    middle = nn.Sequential(_SumsInAnyOrder(), _NoDeterministicRun()) if refuses else _SumsInAnyOrder()
    blocks = [nn.Sequential(nn.Linear(64, 64), copy.deepcopy(middle), nn.Linear(64, 64), nn.Tanh()) for _ in range(4)]
    model, x = nn.Sequential(*blocks, nn.Linear(64, 8)), torch.randn(2048, 64)
    plan = architectures.least_plan(remat.profile(model, x))
    runs, run = [], verifying._run

    def the_planned_run_meets_the_noise(*args):
        _SumsInAnyOrder.noisy = len(runs) == 1  # without the plan, with it, without again, then both deterministic
        runs.append(torch.are_deterministic_algorithms_enabled())
        try:
            return run(*args)
        finally:
            _SumsInAnyOrder.noisy = False

    monkeypatch.setattr(verifying, "_run", the_planned_run_meets_the_noise)
    report = remat.verify(model, x, plan, time_rounds=0)
    assert not torch.are_deterministic_algorithms_enabled()  # put back
    assert runs == [False, False, False, True] + [True] * (not refuses), runs
    assert max(report.grad_max_abs_diff.values()) > 0 and report.grad_noise == 0.0 and report.unplanned_reproducible
    if refuses:
        assert report.grad_deterministic_diff is None and not report.grads_equal and "ran again" not in str(report)
        return
    assert report.grad_deterministic_diff == 0.0 and report.grads_equal and report.ok, str(report)
    text = " ".join(str(report).split())
    assert "<= 0 (deterministic: 0)" in text, text
    assert "Both steps ran again with torch.use_deterministic_algorithms(True): their gradients are equal" in text
    assert "so the first difference was a kernel that sums in another order from run to run" in text


def test_a_step_replays_itself_within_bfloat16_rounding_judged_over_all_parameters_together():
    """Rule 1 of NOTE [A step that does not replay itself]: a second run whose gradients moved by a bfloat16
    gradient's last bit, or by rounding at the others' scale on a parameter whose gradients are all tiny, replayed
    the first; one whose dropout mask was drawn again did not."""
    from remat.verifier.replay import replayed

    torch.manual_seed(0)
    first = {"w": torch.randn(256, 256), "tiny": torch.full((8,), 1e-9)}
    rounded = {n: g.bfloat16().float() for n, g in first.items()}
    tiny_moved = {**first, "tiny": first["tiny"] + 1e-8}  # ten times its own size: per parameter, not replayed
    redrawn = {**first, "w": first["w"] * (torch.rand(256, 256) > 0.1) / 0.9}
    assert replayed(first, rounded) and replayed(first, tiny_moved) and not replayed(first, redrawn)


# -- a planned model, dropped, frees its memory at once ------------------------------------------------


def _planned(kind: str) -> tuple:
    """(model, inputs, how remat plans it) for one of the ways remat wraps a module."""
    if kind in ("none", "every-block"):
        return (*architectures.ALL["llama"](), lambda m, _: kind == "none" or remat.apply(m, "every-block"))
    if kind == "sequential-segments":
        return (*zoo.chain_report001(width=64, blocks=8, batch=16), lambda m, _: remat.apply(m, "chen"))
    if kind == "module-list-runs":
        return (*architectures.ALL["bert"](), lambda m, _: remat.apply(m, "chen"))
    if kind == "checkpoint":
        return (*architectures.ALL["llama"](), lambda m, _: remat.checkpoint(m.model.layers[1]))

    def with_decision(model, inputs):
        names = ["model.layers.0", "model.layers.2"]
        keep = remat.plan(remat.profile(model, inputs), 1.0)
        plan = dataclasses.replace(keep, decisions={**keep.decisions, **dict.fromkeys(names, kind)}, **{kind: names})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # offload on a CPU: said, and done
            remat.apply(model, plan)

    return (*architectures.ALL["llama"](), with_decision)


@pytest.mark.parametrize(
    "kind", ["none", "every-block", "sequential-segments", "module-list-runs", "checkpoint", "selective", "offload"]
)
def test_a_planned_model_dropped_frees_its_parameters_without_the_cycle_collector(kind):
    """NOTE [How a module is checkpointed in place], Rule 8: what remat installs holds the modules weakly.  On an
    H200 (2026-12-04) a plan's Llama layers stayed allocated after the model was dropped, until a collection that
    had not come when the next variant trained.  With the collector off, each parameter goes with the last
    reference to the model; "none" is the unplanned model, the premise that the model itself makes no cycle."""
    gc.collect()
    gc.disable()
    try:
        model, inputs, plan_it = _planned(kind)
        plan_it(model, inputs)
        assert kind == "none" or any(WRAPPED_MARK in m.__dict__ for m in model.modules())
        params = [weakref.ref(p) for p in model.parameters()]
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        (out.loss if hasattr(out, "loss") else out.sum()).backward()
        del model, out, plan_it
        assert [r() is None for r in params] == [True] * len(params)
    finally:
        gc.enable()


def test_a_copy_of_a_planned_model_says_so_instead_of_running_the_originals_weights():
    """Rule 8's other side: `copy.deepcopy` copies the forwards remat installed as they are, still the original's
    checkpoints (before, a copy silently ran the original's modules, weights and all).  The copy says so, with the
    original alive or gone; `remat.apply` to the copy makes it train on its own weights."""
    model, inputs = architectures.ALL["llama"]()
    remat.apply(model, "every-block")
    copied = copy.deepcopy(model)
    message = r"^remat: this LlamaDecoderLayer is a copy \(copy.deepcopy\) of a module that remat.apply checkpoints"
    with pytest.raises(remat.RematError, match=message):
        copied(**inputs)
    with pytest.warns(UserWarning, match=r"^remat: LlamaForCausalLM followed recipe 'every-block'; replaced"):
        remat.apply(copied, "every-block")
    with torch.no_grad():
        next(copied.parameters()).add_(1.0)  # the copy's weights differ from the original's now
    expected, _ = _step(model, inputs)
    grads, _ = _step(copied, inputs)
    assert grads.keys() == expected.keys() and not _same(grads, expected)  # its own weights, its own gradients
    remat.remove(model)
    assert all(not m._forward_pre_hooks for m in model.modules())  # the guards go with the plan
    again = copy.deepcopy(copied)
    del model, copied
    gc.collect()
    with pytest.raises(remat.RematError, match=message):
        again(**inputs)
