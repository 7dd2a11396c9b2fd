"""remat.explain: each user report's situation rebuilt, the right finding with exact bytes; no false alarms.

Byte figures are asserted exactly against tensor sizes computed here, or against a
separate measurement of the alternative (per-layer checkpoints, another segment count).
The step runs on one thread: on two shared cores, two threads make every step ~10x slower.
"""

from __future__ import annotations

import argparse
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import remat
from remat import zoo
from remat._torch_compat import FakeTensorMode, intercept_checkpoints
from remat.errors import RematError
from remat.explainer import examples, explain
from remat.types import Explanation, Finding, Severity

F32 = 4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _adam(params):
    return torch.optim.Adam(params)


# -- report 000: one checkpoint around the whole model -------------------------------------------------

B000, T000, H000 = 4, 32, 32  # batch, sequence, hidden


@pytest.fixture(scope="module")
def report000():
    model, x = examples.report000(hidden=H000, intermediate=4 * H000, layers=6, seq=T000, batch=B000)
    return model, x, explain(model, x)


def test_report000_whole_model_checkpoint_with_measured_peaks(report000):
    _, x, expl = report000
    [f] = expl
    assert isinstance(expl, Explanation) and isinstance(f, Finding)
    assert (f.code, f.module) == ("whole-model-checkpoint", "")
    fig, written, plain = f.figures, expl.written_profile, expl.profile
    assert (fig["peak_with_bytes"], fig["peak_without_bytes"]) == (written.peak_bytes, plain.peak_bytes)
    # reentrant: the recomputed output lives beside the one the forward returned (the report's +512 MB)
    assert written.peak_bytes - plain.peak_bytes == B000 * T000 * H000 * F32
    # forward does drop: nothing is saved inside the checkpoint at the end of forward
    assert written.activation_bytes == 0 and plain.activation_bytes > 0
    assert fig["forward_live_with_bytes"] == written.end_of_forward.total_bytes
    assert fig["forward_live_without_bytes"] == plain.end_of_forward.total_bytes
    assert f.bytes_at_stake == fig["peak_with_bytes"] - fig["peak_per_layer_bytes"] > 0
    assert x.grad is None  # the runs leave the input as they found it


def test_report000_per_layer_peak_is_what_per_layer_checkpoints_measure(report000):
    _, _, expl = report000
    model, x = zoo.mlp_report000(H000, 4 * H000, 6, T000, B000)
    for i, layer in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(layer)
    measured = remat.profile(model, x)
    assert expl[0].figures["peak_per_layer_bytes"] == pytest.approx(measured.peak_bytes, rel=0.02)
    assert measured.peak_bytes < expl.profile.peak_bytes


def test_report000_at_its_own_size_in_fake_mode():
    """hidden 1024, intermediate 4096, 8 layers, seq 1024, batch 128: predicted without allocating."""
    with FakeTensorMode():
        model, x = examples.report000_full()
    expl = explain(model, x, mode="fake", device="cuda")
    [f] = expl
    assert f.code == "whole-model-checkpoint"
    # the report: 40736 MB with the checkpoint, 40224 MB without: exactly the 512 MiB output more
    assert f.figures["peak_with_bytes"] - f.figures["peak_without_bytes"] == 128 * 1024 * 1024 * F32
    assert f.figures["peak_per_layer_bytes"] < 0.5 * f.figures["peak_without_bytes"]


# -- report 001: checkpoint_sequential past the sweet spot ----------------------------------------------

W001, BATCH001 = 64, 512


@pytest.fixture(scope="module")
def report001():
    model, x = examples.report001(segments=16, width=W001, blocks=16, batch=BATCH001)
    return model, x, explain(model, x)


def test_report001_too_many_segments(report001):
    model, x, expl = report001
    [f] = expl
    assert (f.code, f.module) == ("too-many-segments", "seq")
    fig = f.figures
    # checkpoint_sequential(seq, 16) over 33 modules: 15 checkpoints of 2, the last 3 modules without
    assert fig["checkpoints"] == 15 and "15 checkpoints of 2 blocks, and the last 3 blocks without one" in f.message
    assert fig["boundaries_bytes"] == 15 * BATCH001 * W001 * F32  # each keeps its input: one activation
    assert fig["peak_measured_bytes"] == expl.written_profile.peak_bytes
    assert fig["peak_predicted_bytes"] == pytest.approx(fig["peak_measured_bytes"], rel=0.05)
    assert fig["best_segments"] < 16 and fig["best_peak_bytes"] < fig["peak_predicted_bytes"]
    assert f.bytes_at_stake == fig["peak_predicted_bytes"] - fig["best_peak_bytes"]


def test_report001_sweet_spot_is_what_checkpoint_sequential_measures(report001):
    model, x, expl = report001
    best = expl[0].figures["best_segments"]
    measured = remat.profile(examples.SequentialCheckpoints(model.seq, best), x)
    assert expl[0].figures["best_peak_bytes"] == pytest.approx(measured.peak_bytes, rel=0.05)
    assert measured.peak_bytes < expl.written_profile.peak_bytes


def test_recording_the_checkpoints_does_not_change_the_measurement(report001):
    model, x, expl = report001
    assert expl.written_profile.timeline.live_bytes == remat.profile(model, x).timeline.live_bytes


# -- report 002: a checkpoint around each op; weights and Adam dominate ----------------------------------

B002, OUT002 = 10, 512
C2, C3 = B002 * 25 * 19 * 22 * F32, B002 * 10 * 19 * 22 * F32  # outputs of conv2 and conv3


@pytest.fixture(scope="module")
def report002():
    model, x, loss_fn = examples.report002(batch=B002, out=OUT002)
    return model, explain(model, x, loss_fn, optimizer=_adam)


def test_report002_single_op_checkpoints_free_nothing(report002):
    _, expl = report002
    labels = [r.label for r in expl.checkpoints]
    assert labels == [
        "checkpoint(conv2)",
        "checkpoint(F.relu)",
        "checkpoint(conv3)",
        "checkpoint(F.relu)",
        "checkpoint(self.flat)",
        "checkpoint(fc1)",
    ]
    # a conv saves its input, kept anyway; a ReLU saves its output, so a checkpoint around it keeps
    # the conv output that nothing else would have kept
    assert [r.freed_bytes for r in expl.checkpoints] == [0, -C2, 0, -C3, 0, 0]
    assert [r.source for r in expl.checkpoints] == [
        "predicted",
        "measured",
        "predicted",
        "measured",
        "measured",
        "predicted",
    ]
    small = [f for f in expl if f.code == "checkpoint-too-small"]
    assert sorted(f.bytes_at_stake for f in small) == [0, 0, 0, 0, C3, C2]
    # together, as written: exactly those two tensors more saved than without any checkpoint
    assert expl.written_profile.activation_bytes - expl.profile.activation_bytes == C2 + C3


def test_report002_reentrant_recomputation_costs_the_whole_forward(report002):
    _, expl = report002
    flops = [r.recompute_flops for r in expl.checkpoints]
    conv2 = 2 * (B002 * 25 * 19 * 22) * (50 * 3 * 3)  # 2 * output elements * (in channels * kernel)
    conv3 = 2 * (B002 * 10 * 19 * 22) * (25 * 3 * 3)
    fc1 = 2 * B002 * (10 * 19 * 22) * OUT002
    assert flops == [conv2, 0, conv3, 0, 0, fc1]
    assert expl.written_profile.recompute_flops == conv2 + conv3 + fc1


def test_report002_weights_and_optimizer_state_dominate(report002):
    model, expl = report002
    assert expl[0].code == "activations-not-dominant"  # the most bytes at stake comes first
    fig = expl[0].figures
    params = sum(p.numel() for p in model.parameters()) * F32
    assert fig["params_bytes"] == fig["grads_bytes"] == params
    assert fig["optimizer_bytes"] == 2 * params + 8 * F32  # exp_avg, exp_avg_sq, and a step count per tensor
    assert fig["fixed_bytes"] == 4 * params + 8 * F32 >= 0.5 * fig["peak_bytes"]
    assert fig["most_saved_bytes"] == fig["peak_bytes"] - fig["least_peak_bytes"]


# -- no checkpointing; good checkpointing -----------------------------------------------------------------


def test_model_without_checkpointing_gets_the_summary_and_the_plan():
    model, x = zoo.skipnet(width=64, depth=3, batch=256)
    expl = explain(model, x)
    assert expl.codes() == ["no-checkpointing"] and expl.checkpoints == []
    f = expl[0]
    assert f.bytes_at_stake == expl.profile.peak_bytes - expl.plan.peak_bytes > 0
    assert "The step peaks at" in f.message  # the profile in plain words
    assert "What remat would do instead (predicted):" in str(expl)


@pytest.mark.parametrize(
    "factory",
    [
        lambda: examples.per_layer_gpt2(n_layer=3, seq=64, batch=2),
        lambda: examples.hf_checkpointing(n_layer=3, seq=64, batch=2),
        lambda: examples.dropout_no_rng(True),
    ],
    ids=["gpt2-checkpoint_wrapper", "gpt2-hugging-face", "loop-of-checkpoint"],
)
def test_good_per_layer_checkpointing_raises_no_alarm(factory):
    expl = explain(*factory())
    assert list(expl) == []
    assert all(r.source == "predicted" and r.freed_bytes > 0 for r in expl.checkpoints)
    assert expl.written_profile.peak_bytes < expl.profile.peak_bytes
    assert "Findings: none" in str(expl)


# -- correctness findings ----------------------------------------------------------------------------------


def test_rng_not_preserved_around_dropout():
    expl = explain(*examples.dropout_no_rng())
    assert expl.codes() == ["rng-not-preserved"] * 4
    assert [f.module for f in expl] == [f"layers.{i}" for i in range(4)]
    assert all(f.severity == "correctness" for f in expl)
    assert all(r.draws_random for r in expl.checkpoints)  # seen by the generator moving, in real mode


def test_rng_not_preserved_is_found_in_fake_mode_through_dropout_modules():
    expl = explain(*examples.dropout_no_rng(), mode="fake")
    assert expl.codes() == ["rng-not-preserved"] * 4
    assert not any(r.draws_random for r in expl.checkpoints)


NO_GRAD_WARNING = "ignore:None of the inputs have requires_grad=True"


@pytest.mark.filterwarnings(NO_GRAD_WARNING)
def test_reentrant_checkpoint_without_grad_input_loses_the_gradients():
    model, x = examples.frozen_stem()
    [f] = explain(model, x)
    assert (f.code, f.module, f.severity) == ("reentrant-no-grad-input", "layers.0", "correctness")
    params = sum(p.numel() for p in model.layers[0].parameters()) * F32
    assert f.bytes_at_stake == f.figures["params_bytes"] == params and f.figures["params"] == 4
    model(x).sum().backward()  # and it is so
    assert all(p.grad is None for p in model.layers[0].parameters())
    assert all(p.grad is not None for p in model.layers[1].parameters())


def test_non_reentrant_checkpoint_without_grad_input_is_fine():
    assert "reentrant-no-grad-input" not in explain(*examples.frozen_stem(use_reentrant=False)).codes()


@pytest.mark.filterwarnings(NO_GRAD_WARNING)
def test_step_that_fails_because_a_reentrant_checkpoint_cut_every_gradient_is_explained():
    model, x = examples.report000(hidden=16, intermediate=64, layers=2, seq=64, batch=8)
    expl = explain(model, x.detach())  # the input no longer requires grad
    [f] = expl
    assert f.code == "reentrant-no-grad-input" and "does not require grad" in f.message
    assert expl.written_profile is None and expl.checkpoints[0].source == ""
    assert "the step as written does not run" in str(expl)


def test_batchnorm_recomputed_updates_running_statistics_twice():
    model, x, loss_fn = examples.batchnorm_stages()
    expl = explain(model, x, loss_fn)
    assert expl.codes() == ["batchnorm-recomputed"] * 3
    assert all(f.figures["batchnorms"] == 2 for f in expl)
    # per BatchNorm of width w: running mean and variance (w floats each) and num_batches_tracked (int64)
    assert {f.module: f.bytes_at_stake for f in expl} == {
        f"stages.{i}": 2 * (2 * w * F32 + 8) for i, w in enumerate((32, 64, 128))
    }
    loss_fn(model(x)).backward()  # and it is so: one step counts two batches
    assert model.stages[0][1].num_batches_tracked.item() == 2


# -- the KV cache of Hugging Face models ------------------------------------------------------------------


def test_kv_cache_in_training_costs_measured_bytes():
    model, inputs = examples.per_layer_gpt2(use_cache=True, n_layer=2, seq=64, batch=2)
    expl = explain(model, inputs)
    [f] = expl
    assert f.code == "kv-cache-in-training" and model.config.use_cache is True  # restored
    assert f.figures["peak_with_cache_bytes"] == expl.written_profile.peak_bytes
    model.config.use_cache = False
    assert f.figures["peak_without_cache_bytes"] == remat.profile(model, inputs).peak_bytes
    assert f.bytes_at_stake == f.figures["peak_with_cache_bytes"] - f.figures["peak_without_cache_bytes"] > 0
    model.config.use_cache = True  # and the recomputation appends to the cache again
    out = model(**inputs)
    out.loss.backward()
    assert out.past_key_values.get_seq_length() == 2 * 64


# -- measurement advice -------------------------------------------------------------------------------------


def test_a_figure_far_above_the_tensors_peak_gets_reserved_memory_advice():
    model, x = examples.frozen_stem(use_reentrant=False)
    expl = explain(model, x, observed="1GiB")
    [f] = [f for f in expl if f.code == "measured-with-reserved-memory"]
    assert f.figures == {"seen_bytes": 2**30, "peak_bytes": expl.written_profile.peak_bytes}
    assert f.bytes_at_stake == 2**30 - expl.written_profile.peak_bytes and f.severity == "advice"
    # a CPU step: the process's memory, no GPU allocator advice (issue 37, words for where the user is)
    assert "VmHWM" in f.fix and "caching allocator" not in f.message + f.fix and "nvidia-smi" not in f.message


def test_observed_must_be_bytes():
    model, x = examples.frozen_stem()
    with pytest.raises(RematError, match="remat: observed must be bytes"):
        explain(model, x, observed=0.5)


# -- bad input: the same errors as remat.profile -------------------------------------------------------------


class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return checkpoint(self.lin, x.view(3, 5), use_reentrant=False)


@pytest.mark.parametrize(
    "model, inputs",
    [
        (lambda x: x, torch.randn(2, 4)),
        (_Broken(), torch.randn(2, 4)),
        (nn.Linear(4, 4).requires_grad_(False), torch.randn(2, 4)),
        (nn.Linear(4, 4), "text"),
    ],
    ids=["not-a-module", "forward-raises", "nothing-trains", "bad-inputs"],
)
def test_bad_input_gets_the_same_error_as_profile(model, inputs):
    with pytest.raises(RematError) as expected:
        remat.profile(model, inputs)
    with pytest.raises(RematError) as seen:
        explain(model, inputs)
    assert str(seen.value) == str(expected.value) and str(seen.value).startswith("remat:")
    assert tuc.CheckpointFunction.__name__ == "CheckpointFunction"  # torch restored after the error


# -- the interception of torch.utils.checkpoint ---------------------------------------------------------------


def _every_kind_of_call(lin: nn.Linear, x: torch.Tensor) -> None:
    checkpoint(lin, x, use_reentrant=True).sum().backward()  # a name bound before the patch
    tuc.checkpoint(lin, x, use_reentrant=False, preserve_rng_state=False).sum().backward()
    checkpoint_wrapper(lin)(x).sum().backward()
    checkpoint_sequential(nn.Sequential(lin, nn.ReLU()), 2, x, use_reentrant=False).sum().backward()


@pytest.mark.parametrize("keep", [True, False])
def test_every_checkpoint_call_is_seen_and_torch_is_restored(keep):
    originals = (tuc.CheckpointFunction, tuc._checkpoint_without_reentrant_generator)
    seen, forwards = [], []
    lin, x = nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    lin.register_forward_hook(lambda *_: forwards.append(1))

    def on_call(call):
        seen.append((call.reentrant, call.preserve_rng_state))
        return keep, contextlib.nullcontext()

    with pytest.raises(ValueError, match="boom"), intercept_checkpoints(on_call):
        _every_kind_of_call(lin, x)
        raise ValueError("boom")
    assert seen == [(True, True), (False, False), (False, True), (False, True)]
    # kept, the reentrant checkpoint re-runs lin in backward (non-reentrant ones stop before re-running a
    # Linear: it saves only its input and weight, packed before it computes); not kept, nothing re-runs
    assert len(forwards) == (5 if keep else 4)
    assert (tuc.CheckpointFunction, tuc._checkpoint_without_reentrant_generator) == originals


# -- the report and the command line ----------------------------------------------------------------------------


def test_report_text_lists_findings_checkpoints_and_plan(report002):
    _, expl = report002
    text = str(expl)
    assert text.startswith("remat explain of OpByOpCNN: real mode on cpu\n6 checkpoint calls; peak as written")
    assert " 1. activations-not-dominant in <OpByOpCNN> [memory]" in text
    assert " 2. checkpoint-too-small [memory], 6 places" in text
    assert text.count("Fix: Remove this checkpoint.") == 1  # one fix for the six places
    assert "The model's checkpoints, each alone" in text and "checkpoint(self.flat)" in text
    assert "What remat would do instead" in text
    assert all(len(line) <= 100 for line in text.splitlines())


def test_remat_exports_explain():
    if not hasattr(remat, "explain"):
        pytest.skip("remat/__init__.py does not export explain yet")
    assert remat.explain is explain and remat.Finding is Finding


@pytest.mark.filterwarnings(NO_GRAD_WARNING)
def test_cli_explain_prints_the_report(capsys):
    from remat import cli

    verbs = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if "explain" not in verbs.choices:
        pytest.skip("the `remat explain` command is not registered in remat.cli yet")
    assert cli.main(["explain", "remat.explainer.examples:frozen_stem", "--optimizer", "none"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("remat explain of FrozenStem") and "reentrant-no-grad-input in layers.0" in out
    assert cli.main(["explain", "remat.explainer.examples:no_such_factory"]) == 2
    assert capsys.readouterr().err.startswith("remat: ")


# -- compiler-fuses-it ---------------------------------------------------------------------------------


def test_pointwise_outputs_that_eager_recomputation_pays_for_point_to_torch_compile():
    """A GPT-2 with no checkpoint: much of its peak is GELU, softmax, LayerNorm and dropout outputs, cheap in FLOPs
    and dear in eager seconds; the advice names the bytes and the seconds, and the peak without them is one
    remat can plan: its plan measures within it with the gradients unchanged."""
    model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=64, batch=4, vocab=256)
    expl = explain(model, x)
    f = next(f for f in expl if f.code == "compiler-fuses-it")
    fig = f.figures
    assert fig["freed_bytes"] == f.bytes_at_stake >= 0.2 * fig["peak_bytes"]
    assert fig["peak_bytes"] == expl.profile.peak_bytes and fig["recompute_us"] >= 0.1 * fig["step_us"] > 0
    assert f"{fig['freed_bytes'] / fig['peak_bytes']:.0%}" in f.message and "torch.compile" in f.fix
    plan = remat.plan(expl.profile, expl.profile.peak_bytes - fig["freed_bytes"])
    report = remat.verify(model, x, plan, time_rounds=0)
    assert report.ok and report.grads_equal, str(report)


def test_the_advice_to_compile_says_not_to_set_the_budget_by_hand_on_a_model_with_dropout():
    """GPT-2 trains with dropout: torch's own budget below 1.0 would re-draw it (NOTE [The compiler's budget as a
    plan], Rule 5), so the advice points to remat.auto on the compiled model and warns off the config; with its
    dropout at 0 the warning goes."""
    model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=64, batch=4, vocab=256)
    fix = next(f for f in explain(model, x) if f.code == "compiler-fuses-it").fix
    assert "remat.auto(torch.compile(model), inputs, budget)" in fix
    assert fix.endswith(
        "Not torch._functorch.config.activation_memory_budget by hand: this model trains with dropout "
        "(transformer.drop, transformer.h.0.attn.attn_dropout, transformer.h.0.attn.resid_dropout ...), which "
        "below 1.0 torch re-draws in backward, so the gradients come out silently wrong (pytorch/pytorch#190758)."
    ), fix
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    fix = next(f for f in explain(model, x) if f.code == "compiler-fuses-it").fix
    assert "by hand" not in fix and "remat.auto(torch.compile(model)" in fix, fix


def test_torchs_budget_set_by_hand_on_a_model_with_dropout_is_a_correctness_finding():
    """torch._functorch.config.activation_memory_budget below 1.0 and dropout in training: the gradients of the
    compiled step are not the loss's (tests/test_compile_rng.py measures it); at 1.0, or without dropout, nothing."""
    import torch._functorch.config as functorch_config

    model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=64, batch=4, vocab=256)
    assert "compile-budget-redraws-dropout" not in explain(model, x).codes()
    with functorch_config.patch(activation_memory_budget=0.5):
        expl = explain(model, x)
    f = next(f for f in expl if f.code == "compile-budget-redraws-dropout")
    assert f.severity == Severity.CORRECTNESS and f.figures == {"dropouts": 7}
    assert f.message.startswith(
        "torch._functorch.config.activation_memory_budget is 0.5 in this process and the model trains with random "
        "numbers (dropout: transformer.drop, transformer.h.0.attn.attn_dropout, transformer.h.0.attn.resid_dropout "
        "...). Below 1.0"
    ), f.message
    assert f.message.endswith("It acts once the model runs under torch.compile."), f.message
    assert f.fix.startswith("Set the budget back to 1.0 and let remat set it: remat.auto(torch.compile(model)")
    assert expl.codes()[0] == "compile-budget-redraws-dropout"  # correctness first
    model.eval()  # no random numbers: the budget is safe
    with functorch_config.patch(activation_memory_budget=0.5):
        assert "compile-budget-redraws-dropout" not in explain(model, x).codes()


def test_a_compiled_model_gets_no_advice_to_compile():
    torch._dynamo.reset()
    model, x = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, seq=64, batch=4, vocab=256)
    assert "compiler-fuses-it" in explain(model, x).codes()
    model.compile(backend="aot_eager")
    assert "compiler-fuses-it" not in explain(model, x).codes()
