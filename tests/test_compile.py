"""remat and torch.compile: a planned model compiles with no more graph breaks than the bare one, gives the
same gradients, and a compiled model is profiled, planned and verified by the names of the model inside."""

import dataclasses
import gc
import math
import os
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest
import torch

import remat
from remat import zoo
from remat.applier.apply import applied
from remat.applier.runs import wrap_run
from remat.applier.wrapping import is_wrapped, wrap_segment
import remat.compiled_plans as compiled_mod
from remat.compiled_plans import Measured, _fastest_fit, _hybrid_candidates
from remat.measure.loop import Loop
from remat.measure.outputs import COMPILED_NOTE, unread_outputs
from remat.report.text import fmt_bytes
from remat.types.profile import COMPILED_PEAK_MARGIN
from remat.verifier.process import ProcessPeak
from remat.verifier.verify import independent_peak


def _llama():
    """A Hugging Face Llama with its key/value cache on (so remat.apply hooks it off for training)."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    ids = torch.randint(0, 256, (2, 16))
    return transformers.LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}


def _breaks(model, inputs) -> int:
    """Graph breaks in the model's forward.  transformers 5.25 requires the `kernels` package, whose decorator on
    each Llama attention sets and resets a context variable in every forward: inside any checkpoint (Hugging Face's
    own too: 4 breaks on this model) Dynamo breaks the graph at that side effect unless told it need not replay it
    in backward (a set and a reset: nothing to replay).  Counted with that flag, the breaks are remat's own."""
    torch._dynamo.reset()
    with warnings.catch_warnings(), torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        warnings.simplefilter("ignore")  # torch's own advice about context_fn under compile
        explained = torch._dynamo.explain(lambda: model(**inputs).loss)()
    return explained.graph_break_count


def _grads(model, step) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    step().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_planned_llama_compiles_with_no_graph_break_and_the_same_gradients():
    """One checkpoint per layer, a run of nn.ModuleList entries (NOTE [A run of nn.ModuleList entries as one
    checkpoint], Rule 5), a selective checkpoint and the key/value cache hook: Dynamo traces them all."""
    model, inputs = _llama()
    assert _breaks(model, inputs) == 0
    expected = _grads(model, lambda: model(**inputs).loss)
    remat.apply(model, "every-block")  # and the key/value cache off in training (remat.hf, NOTE Rule 2)
    assert _breaks(model, inputs) == 0
    remat.remove(model)
    inputs = {**inputs, "use_cache": False}  # as remat.apply sets it: planners never choose these by hand
    layers = model.model.layers
    wrap_run(list(layers[:3]), [f"model.layers.{i}" for i in range(3)])
    wrap_segment([layers[3]], selective=True)
    try:
        assert _breaks(model, inputs) == 0
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager")
        got = _grads(model, lambda: compiled(**inputs).loss)
    finally:
        remat.remove(model)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_a_planned_model_compiles_with_the_same_gradients():
    torch._dynamo.reset()
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    expected = _grads(model, lambda: model(x).sum())
    remat.apply(model, "every-block")
    compiled = torch.compile(model, backend="aot_eager")
    for g, e in zip(_grads(model, lambda: compiled(x).sum()), expected):
        torch.testing.assert_close(g, e)
    remat.remove(model)


def test_a_compiled_model_is_profiled_by_the_names_of_the_model_inside():
    """Issue 15: `remat.profile(torch.compile(model), ...)` names blocks as the bare model does (not
    `_orig_mod.0`), says that the figures are the eager step's, and its plans apply to either."""
    torch._dynamo.reset()
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    bare = remat.profile(model, x)
    compiled = torch.compile(model, backend="aot_eager")
    prof = remat.profile(compiled, x)
    assert [b.name for b in prof.blocks] == [b.name for b in bare.blocks] and prof.blocks[0].name == "0"
    assert prof.peak_bytes == bare.peak_bytes and prof.forward_flops == bare.forward_flops
    assert COMPILED_NOTE in prof.notes and COMPILED_NOTE not in bare.notes
    assert not any("shares its weight" in n for n in prof.notes)  # no tied weights here
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    assert remat.apply(compiled, plan) is compiled and applied(model) is plan
    remat.remove(compiled)
    assert not any(is_wrapped(m) for m in model.modules())


def test_a_plan_made_on_the_bare_model_applies_to_the_compiled_model_and_removes():
    """Issue 14: `torch.compile(model)` names every module `_orig_mod.…`; apply and remove reach the model
    inside, so a plan made on the bare model applies after compiling too."""
    torch._dynamo.reset()
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    expected = _grads(model, lambda: model(x).sum())
    plan = remat.plan(remat.profile(model, x), remat.frontier(remat.profile(model, x))[-1].peak_bytes)
    compiled = torch.compile(model, backend="aot_eager")
    assert remat.apply(compiled, plan) is compiled and applied(compiled) is plan is applied(model)
    assert all(is_wrapped(dict(model.named_modules())[seg[0]]) for seg in plan.segments)
    for g, e in zip(_grads(model, lambda: compiled(x).sum()), expected):
        torch.testing.assert_close(g, e)
    wrapped = sum(is_wrapped(m) for m in model.modules())
    with pytest.warns(
        UserWarning, match=r"^remat: Sequential followed a plan by \w+ with \d+ checkpoints; replaced by"
    ):
        remat.apply(model, plan)  # the same model, unwrapped: one plan record, replaced, never checkpointed twice
    assert applied(compiled) is plan is applied(model) and sum(is_wrapped(m) for m in model.modules()) == wrapped
    remat.remove(compiled)
    assert applied(model) is None and not any(is_wrapped(m) for m in model.modules())


def test_profiling_and_verifying_a_compiled_model_leave_it_compiling():
    """Dynamo never compiles a frame again once it ran under a dispatch mode (remat's tracker, FlopCounterMode),
    until torch._dynamo.reset(): remat tracks with the compiler set aside, so the user's step still compiles."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    model[2].compile(backend="aot_eager")  # a module compiled in place, inside the compiled model
    compiled = torch.compile(model, backend="aot_eager")
    prof = remat.profile(compiled, x)
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    report = remat.verify(compiled, x, plan, time_rounds=0)  # its process counter runs in a forked copy
    assert report.compiled and report.independent_counter == "process's high-water mark (compiled)"
    assert report.grads_equal and report.measured_recompute_flops == plan.recompute_flops
    assert not counters["frames"]  # nothing compiled in this process yet
    compiled(x).sum().backward()
    assert counters["frames"]["ok"] >= 1


def test_the_compiled_planned_step_fits_the_budget_by_the_process_counter():
    """Inductor, as torch.compile runs by default: the planned step's peak by the process's high-water mark
    (a forked copy running the loop, third step) within the plan's budget."""
    torch._dynamo.reset()
    model, x = zoo.chain_report001(width=256, blocks=16, batch=8192)
    compiled = torch.compile(model)
    plan = remat.plan(remat.profile(compiled, x), 0.5)
    report = remat.verify(compiled, x, plan, time_rounds=0)
    assert report.independent_judged and report.ok, str(report)
    assert report.independent_peak_bytes <= plan.budget_bytes * 1.01


def test_a_model_compiled_in_place_is_verified_and_profiled_as_compiled():
    """`model.compile()` compiles the module's call in place (no `_orig_mod` wrapper): verify still runs its
    counter on the compiled step and says so, and the profile carries the compiled note."""
    torch._dynamo.reset()
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    bare = remat.profile(model, x)
    model.compile(backend="aot_eager")
    prof = remat.profile(model, x)
    assert COMPILED_NOTE in prof.notes and COMPILED_NOTE not in bare.notes
    assert not any("shares its weight" in n for n in prof.notes)  # no tied weights here
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    report = remat.verify(model, x, plan, time_rounds=0)
    assert report.compiled and report.independent_counter == "process's high-water mark (compiled)"
    assert report.grads_equal and report.measured_recompute_flops == plan.recompute_flops


def test_a_budget_the_compiled_step_meets_needs_no_checkpoint():
    """NOTE [A compiled step's peak]: `remat.profile` of a compiled model measures the compiled step by the process
    counter (a forked copy running the loop); a budget at or above that peak gets the keep-everything plan, a
    budget below it a real plan, and verify judges the compiled step the loop runs against the budget."""
    torch._dynamo.reset()
    model, x = zoo.gpt2(n_layer=2, n_embd=128, n_head=2, seq=128, batch=16, vocab=512)  # > COUNTER_RESOLVES_BYTES
    compiled = torch.compile(model)
    prof = remat.profile(compiled, x)
    assert 0 < prof.compiled_peak_bytes < prof.peak_bytes, (prof.compiled_peak_bytes, prof.peak_bytes)
    assert prof.compiled_counter == "process's high-water mark (compiled)"
    # GPT-2 ties `lm_head` to `wte`: the gradient of the logits, 16 x 128 x 512 float32, can live through the
    # compiled backward (docs/compile.md)
    assert any(
        n.startswith("compiled step: `lm_head` shares its weight with `transformer.wte`;")
        and "keeps the gradient of `lm_head`'s output (4.0 MiB) alive" in n
        for n in prof.notes
    ), prof.notes
    plan = remat.plan(prof, math.ceil(prof.compiled_peak_bytes * (1 + COMPILED_PEAK_MARGIN)))
    assert not plan.segments and not plan.selective and "the compiled step measured" in plan.notes[0]
    assert remat.plan(prof, prof.compiled_peak_bytes).segments  # within the counter's noise: planned
    report = remat.verify(compiled, x, plan, time_rounds=0)
    assert report.compiled and report.independent_judged and report.ok, str(report)
    assert remat.plan(remat.profile(model, x), plan.budget_bytes).segments  # the eager step needs a plan


def test_auto_plans_a_compiled_step_by_measuring_it_and_keeps_more_than_an_eager_plan_could():
    """NOTE [Plans for a compiled step]: below the compiled step's peak, `remat.auto` compiles and measures candidate
    plans; the plan it applies fits the budget by verify's process counter (not by remat's own figure) though its
    eager prediction is over the budget: no plan made for that budget on the eager step keeps as much."""
    torch._dynamo.reset()
    model, x = zoo.gpt2(n_layer=4, n_embd=128, n_head=2, seq=128, batch=16, vocab=512)
    compiled = torch.compile(model)
    prof = remat.profile(compiled, x)
    budget = int(prof.compiled_peak_bytes * 0.85)
    assert remat.plan(prof, budget).peak_bytes <= budget
    plan = remat.auto(compiled, x, budget, trials=2)  # 2 of each kind: the search's rules, half the compilations
    assert 0 < plan.measured_peak_bytes <= budget < plan.peak_bytes, (plan.measured_peak_bytes, budget, plan.peak_bytes)
    assert plan.measured_counter == "process's high-water mark (compiled)" and plan.budget_bytes == budget
    assert "chosen for the compiled step" in plan.notes[0] and "compiled step with this plan" in str(plan)
    assert applied(model) is plan
    report = remat.verify(compiled, x, plan, time_rounds=0)
    assert report.compiled and report.independent_judged and report.ok, str(report)
    assert report.independent_peak_bytes <= budget and report.grads_equal


def test_auto_says_which_compiled_peaks_it_measured_when_none_fits():
    """A budget below what any plan's compiled step reaches: `remat.InfeasibleBudget` with the measured peaks, and
    the model left without a plan."""
    torch._dynamo.reset()
    model, x = zoo.gpt2(n_layer=2, n_embd=128, n_head=2, seq=128, batch=16, vocab=512)
    compiled = torch.compile(model)
    held = 2 * sum(p.numel() * p.element_size() for p in model.parameters())  # the weights and their gradients
    with pytest.raises(
        remat.InfeasibleBudget,
        match=r"^remat: no plan tried fits the compiled step in .*peaked at .*"
        r"Fix: a budget of .* or more",
    ) as e:
        remat.auto(compiled, x, held + (1 << 20))
    assert e.value.min_bytes > held + (1 << 20) and e.value.budget_bytes == held + (1 << 20)
    assert applied(model) is None


def test_a_budget_under_what_every_step_holds_is_refused_before_any_candidate_compiles(monkeypatch):
    """NOTE [Plans for a compiled step], Rule 8: parameters, gradients and Adam's state are all live after backward
    whatever is recomputed, compiled or not; a budget under them is refused without a search (which compiled
    its candidates first).  The floor is the profile's own figures; the eager planner refuses the budget too."""
    model, x = zoo.chain_report001(width=128, blocks=8, batch=512)
    opt = torch.optim.Adam(model.parameters())
    prof = remat.profile(model, x, optimizer=opt, timed=False)
    prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes, compiled_step_s=1.0)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    held = prof.param_bytes + prof.grad_bytes + prof.optimizer_bytes + prof.buffer_bytes
    assert 0 <= held - 4 * params < 1024  # the weights, their gradients, Adam's two moments (and its step counts)
    monkeypatch.setattr(compiled_mod, "measure_compiled", lambda *a: pytest.fail("a candidate was compiled"))
    with pytest.raises(
        remat.InfeasibleBudget,
        match=rf"^remat: no plan fits the budget of .* \({held - 1} bytes\): parameters \+ gradients \+ optimizer "
        rf"state are .* \({held} bytes\), all live after backward .* Fix: give a budget of more than {held} bytes",
    ) as e:
        compiled_mod.plan_for(model, (x, None, opt), prof, held - 1)
    assert (e.value.min_bytes, e.value.budget_bytes) == (held, held - 1)
    with pytest.raises(remat.InfeasibleBudget) as eager:
        remat.plan(prof, held - 1)
    assert eager.value.min_bytes > held


def test_auto_says_the_uncompiled_step_fits_where_no_compiled_candidate_does(monkeypatch):
    """NOTE [Plans for a compiled step], Rule 8, on stubbed measurements (every compiled candidate 1 MiB over the
    budget): where remat's plan for the budget fits the eager step, the error says so with that plan's predicted
    peak and time; where the eager step cannot meet the budget either, only the compiled fixes are said."""
    model, x = zoo.chain_report001(width=128, blocks=8, batch=512)
    prof = remat.profile(model, x)
    least = remat.frontier(prof, max_points=2)[-1]  # the least-memory plan's eager peak
    budget = (least.peak_bytes + prof.peak_bytes) // 2
    prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes, compiled_step_s=1.0)

    def measured(_model, plan, _step):
        return ProcessPeak(budget + (1 << 20), 0, 1.0), "counter"

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    eager = remat.plan(prof, budget)
    with pytest.raises(remat.InfeasibleBudget, match=r"^remat: no plan tried fits the compiled step") as e:
        compiled_mod.plan_for(model, (x, None, None), prof, budget, trials=2)
    said = f"{fmt_bytes(eager.peak_bytes, 'auto')} at {eager.extra_fraction:+.0%} time"
    assert str(e.value).endswith(
        f"or {compiled_mod.MORE_TRIALS}, or {compiled_mod.UNCOMPILED}: its eager step with remat's plan for this "
        f"budget is predicted at {said} over the unplanned eager step."
    ), str(e.value)
    assert eager.peak_bytes <= budget and e.value.min_bytes == budget + (1 << 20)
    below = least.peak_bytes - (1 << 20)  # below the eager least too: nothing said of the uncompiled step
    with pytest.raises(remat.InfeasibleBudget) as e:
        compiled_mod.plan_for(model, (x, None, None), prof, below, trials=2)
    assert str(e.value).endswith(f"or {compiled_mod.MORE_TRIALS}.") and compiled_mod.UNCOMPILED not in str(e.value)


@pytest.mark.parametrize("trials", [0, 2.5, True])
def test_auto_refuses_a_count_of_trials_that_is_not_one_or_more(trials):
    model, x = zoo.chain_report001(width=16, blocks=2, batch=4)
    with pytest.raises(
        remat.RematError,
        match=rf"^remat: trials must be a whole number .* saw {trials!r}\. Fix: pass "
        r"trials=4",
    ):
        remat.auto(model, x, 0.5, trials=trials)
    assert applied(model) is None


@pytest.mark.parametrize(
    "keyword, fix",
    [
        ("progres", r"pass only solver, max_segment, time_limit_s, offload_bandwidth, device_flops \(remat\.plan's"),
        ("keep_output", r"profile the step with remat\.profile\(model, inputs, keep_output=\.\.\.\), then remat\.plan"),
    ],
)
def test_auto_refuses_a_keyword_it_does_not_take_before_it_profiles(monkeypatch, keyword, fix):
    """A keyword neither remat.auto's nor remat.plan's used to reach the planner as Python's TypeError, after the
    profile (minutes for a compiled model, whose compiled step is compiled and measured first)."""
    import remat.entry

    def profiled(*args, **kwargs):
        raise AssertionError("profiled before the keywords were checked")

    monkeypatch.setattr(remat.entry, "profile", profiled)
    model, x = zoo.chain_report001(width=16, blocks=2, batch=4)
    with pytest.raises(remat.RematError, match=rf"^remat: remat.auto takes .*; saw '{keyword}'\. Fix: {fix}"):
        remat.auto(model, x, 0.5, **{keyword: False})
    assert applied(model) is None


def test_the_search_of_a_compiled_step_tells_progress_each_candidate_before_it_compiles(monkeypatch):
    """`plan_for(..., progress=)` (remat.auto's `progress=`, the CLI's spinner): one phase per candidate measured,
    numbered, naming what it is, said before its measurement, on stubbed measurements (every candidate over the
    budget, so each kind runs its trials)."""
    model, x = zoo.chain_report001(width=128, blocks=8, batch=512)
    prof = remat.profile(model, x)
    budget = remat.frontier(prof, max_points=2)[-1].peak_bytes
    prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes, compiled_step_s=1.0)
    events = []

    def measured(_model, plan, _step):
        events.append(("measured", compiled_mod._kind(plan)))
        return ProcessPeak(budget + (1 << 20), 0, 0.5 if plan.compiler_budget < 1.0 else 1.0), "counter"

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    with pytest.raises(remat.InfeasibleBudget):
        compiled_mod.plan_for(
            model, (x, None, None), prof, budget, trials=2, progress=lambda phase, n: events.append((phase, n))
        )
    said, done = events[0::2], events[1::2]
    assert len(said) == len(done) >= 3 and all(d[0] == "measured" for d in done), events
    kinds = {d[1] for d in done}
    assert any(k.startswith("remat ") for k in kinds) and any(k.startswith("compiler budget") for k in kinds)
    assert said == [(f"candidate {n} of at most 6: {kind}", n) for n, (_, kind) in enumerate(done, 1)]


def test_auto_with_progress_says_the_phases_of_its_profile_on_stderr(capsys):
    model, x = zoo.chain_report001(width=16, blocks=2, batch=4)
    remat.auto(model, x, 1.0, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("remat: auto: ") for line in lines), lines
    assert any(line.startswith("remat: auto: backward (") for line in lines), lines


def test_a_compiled_step_is_measured_after_this_process_compiled_on_its_thread_pool(tmp_path):
    """The forked copy that measures a compiled step compiles it again.  Inductor's compile thread pool, once this
    process has used it, comes across the fork without its threads: the copy used to wait forever on its first kernel
    (the peers' BERT hung so).  In a subprocess with an empty kernel cache (the kernels must be compiled), and a limit."""
    script = textwrap.dedent("""
        import time, torch, torch._inductor.config, remat
        from remat import zoo
        from torch._inductor.async_compile import AsyncCompile
        torch._inductor.config.compile_threads = 2  # a pool, whatever this machine's cores
        model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
        [f.result() for f in [AsyncCompile.pool().submit(time.sleep, 0.5) for _ in range(2)]]  # two idle threads
        print("measured", remat.profile(torch.compile(model), x).compiled_peak_bytes > 0)
    """)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("measured True"), done.stderr[-3000:]


def test_a_compiled_step_is_measured_compiled_however_often_this_process_compiled_it():
    """Dynamo runs a code object uncompiled once this process compiled it `recompile_limit` times (8; transformers'
    `wrapper` is one code object for every Hugging Face model), and the copy that measures a compiled step compiles it
    once more: at the limit the copy measured the eager step as the compiled one (the peers' search chose a plan 1.3x
    slower so).  Here the limit is 1, after one compiled step in this process."""
    torch._dynamo.reset()
    model, x = zoo.gpt2(n_layer=2, n_embd=128, n_head=2, seq=128, batch=16, vocab=512)
    compiled = torch.compile(model)
    fresh = remat.profile(compiled, x).compiled_peak_bytes
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # a user's step, on more threads than the copy's one: the copy compiles again
    try:
        compiled(**x).logits.sum().backward()  # this process compiles the model's code: one entry in Dynamo's cache
    finally:
        torch.set_num_threads(threads)
    with torch._dynamo.config.patch(recompile_limit=1):
        prof = remat.profile(compiled, x)
    assert prof.compiled_peak_bytes == pytest.approx(fresh, rel=0.02), (prof.compiled_peak_bytes, fresh)
    assert fresh < 0.8 * prof.peak_bytes  # the compiled step, not the eager one (62.0 MB against 97.4 MB eager)
    assert torch._dynamo.config.recompile_limit == 8  # as it was


class _Wide(torch.nn.Module):
    """A residual block whose pointwise middle Inductor fuses and, under a budget, recomputes."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(512, 2048), torch.nn.Linear(2048, 512)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)).sin())


def _compiled_grads(compiled, model, x) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    compiled(x).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_compiler_budget_plan_lowers_the_compiled_steps_peak_and_removes():
    """NOTE [The compiler's budget as a plan]: a plan with `compiler_budget` recompiles the model with torch.compile's
    own activation memory budget; the compiled step's peak by the process counter falls, its gradients are the
    compiled step's without the plan, and `remat.remove` brings back the step compiled before."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(*[_Wide() for _ in range(4)]), torch.randn(1024, 512)
    compiled = torch.compile(model)
    prof = remat.profile(compiled, x)
    before = _compiled_grads(compiled, model, x)
    unplanned, counter = independent_peak(compiled, x, None, None, Loop())
    knob = dataclasses.replace(remat.plan(prof, prof.peak_bytes), compiler_budget=0.3)
    remat.apply(compiled, knob)
    assert "torch.compile's activation memory budget 0.3" in str(knob)
    lowered, _ = independent_peak(compiled, x, None, None, Loop())
    for got, want in zip(_compiled_grads(compiled, model, x), before):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    remat.remove(compiled)
    hybrid = dataclasses.replace(knob, segments=[["0"], ["2"]])  # Rule 6 of NOTE [Plans for a compiled step]
    remat.apply(compiled, hybrid)
    assert is_wrapped(model[0]) and "and torch.compile's activation memory budget 0.3" in str(hybrid)
    for got, want in zip(_compiled_grads(compiled, model, x), before):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    remat.remove(compiled)
    assert applied(model) is None and not is_wrapped(model[0])
    back, _ = independent_peak(compiled, x, None, None, Loop())
    assert counter == "process's high-water mark (compiled)"
    assert lowered < unplanned * 0.85, (lowered, unplanned)  # seen: 118 MiB against 160 MiB with 6 blocks
    # two copies of one step differ by a tensor or two (4 and 8 MiB seen; one (1024, 2048) float32 tensor is 8 MiB):
    # back is nearer the old peak than the new, and at most two such tensors above it
    assert lowered + (unplanned - lowered) / 2 < back <= unplanned + 2 * 1024 * 2048 * 4, (lowered, back, unplanned)


@pytest.mark.parametrize("removed", [False, True])
def test_a_model_that_followed_a_compiler_budget_plan_is_freed_when_dropped(removed):
    """NOTE [The compiler's budget as a plan], Rule 4: with the cycle collector off, a compiled model that follows
    (or followed, `removed`) a plan with a compiler budget frees its parameters with its last reference.  Before, the
    compiled call kept for the budget held the model: one that followed the plan kept all 4 parameters, gc.collect()
    or not."""
    torch._dynamo.reset()
    model, x = (
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64)),
        torch.randn(32, 64),
    )
    compiled = torch.compile(model)
    keep = remat.plan(remat.profile(compiled, x), 1.0)
    gc.collect()
    gc.disable()
    try:
        remat.apply(compiled, dataclasses.replace(keep, compiler_budget=0.5))
        compiled(x).sum().backward()
        if removed:
            remat.remove(compiled)
            compiled(x).sum().backward()  # the compiled forward it had, put back
        params = [weakref.ref(p) for p in model.parameters()]
        del model, compiled
        assert [r() is None for r in params] == [True] * len(params)
    finally:
        gc.enable()


def test_a_compiler_budget_plan_is_refused_where_it_cannot_act():
    """An eager model, a fraction outside 0..1, a model compiled in place: `remat:` errors, nothing applied."""
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    prof = remat.profile(model, x)
    keep = remat.plan(prof, prof.peak_bytes)
    with pytest.raises(
        remat.RematError,
        match=r"^remat: the plan sets torch.compile's activation memory budget "
        r"\(0\.5\), which acts only on a step compiled by torch.compile\(model\), and this "
        r"Sequential is not one\. Fix: ",
    ):
        remat.apply(model, dataclasses.replace(keep, compiler_budget=0.5))
    with pytest.raises(remat.RematError, match=r"^remat: a plan's compiler_budget is a fraction .* saw 1\.5\. Fix: "):
        remat.apply(torch.compile(model), dataclasses.replace(keep, compiler_budget=1.5))
    assert applied(model) is None
    with pytest.raises(
        remat.RematError,
        match=r"^remat: the plan sets torch.compile's .* Fix: apply the plan to "
        r"torch.compile\(model\) \(not model.compile\(\)\)",
    ):
        model.compile()
        remat.apply(model, dataclasses.replace(keep, compiler_budget=0.5))


def test_auto_applies_the_fastest_candidate_measured_to_fit_and_the_least_recomputation_among_equals():
    """NOTE [Plans for a compiled step], Rule 5, on measured figures: a candidate over the budget never, however
    fast; the fastest that fits; within TIME_NOISE of it, the one whose checkpoints are priced cheapest (the
    compiler's own budget at 0), then the lower measured peak; and the notes say what each candidate measured,
    and the chosen one against the unplanned compiled step."""
    model, x = zoo.chain_report001(width=64, blocks=4, batch=32)
    prof = dataclasses.replace(remat.profile(model, x), compiled_step_s=1.0)
    keep = remat.plan(prof, prof.peak_bytes)
    ckpt = dataclasses.replace(keep, segments=[["1"]])
    knob = dataclasses.replace(keep, solver="compiler", compiler_budget=0.4)
    lower = dataclasses.replace(keep, solver="compiler", compiler_budget=0.2)
    counter = "process's high-water mark (compiled)"

    def measured(plan, peak, seconds):
        return Measured(plan, ProcessPeak(peak, 0, seconds), counter)

    chosen = _fastest_fit(
        [measured(ckpt, 90 << 20, 1.30), measured(knob, 99 << 20, 1.10), measured(lower, 101 << 20, 1.00)],
        100 << 20,
        prof,
    )
    assert (chosen.compiler_budget, chosen.measured_peak_bytes, chosen.measured_step_s) == (0.4, 99 << 20, 1.10)
    assert chosen.budget_bytes == 100 << 20 and chosen.measured_counter == counter
    assert "3 plans compiled" in chosen.notes[0] and "+10.0% against the unplanned compiled step's" in chosen.notes[0]
    assert "compiler budget 0.4: 99.0 MiB, 1,100 ms" in chosen.notes[1], chosen.notes[1]
    assert "remat 1 checkpoints + 0 selective: 90.0 MiB, 1,300 ms" in chosen.notes[1]
    points = remat.frontier(remat.profile(*zoo.chain_report001(width=128, blocks=8, batch=512)), max_points=4)
    cheaper, priced = points[1], points[-1]  # fewer checkpoints, more
    assert 0 < cheaper.recompute_s < priced.recompute_s, [p.segments for p in points]
    near = [measured(priced, 90 << 20, 1.12), measured(knob, 99 << 20, 1.10), measured(cheaper, 95 << 20, 1.09)]
    assert _fastest_fit(near, 100 << 20, prof).compiler_budget == 0.4  # recomputes nothing of remat's: first
    chosen = _fastest_fit([near[0], near[2]], 100 << 20, prof)
    assert chosen.segments == cheaper.segments and chosen.measured_peak_bytes == 95 << 20  # the cheaper, not lower
    both = [measured(knob, 99 << 20, 1.10), measured(lower, 96 << 20, 1.12)]  # priced alike: the lower peak
    assert _fastest_fit(both, 100 << 20, prof).compiler_budget == 0.2


def test_a_fast_compiler_budget_over_the_budget_is_tried_again_over_remats_checkpoints(monkeypatch):
    """NOTE [Plans for a compiled step], Rule 6, on stubbed measurements (the compiled step saves a quarter of what
    the checkpoints save eagerly): the fastest fraction that missed is tried with checkpoints, sized again by what
    the first hybrid saved; the hybrid that fits is chosen over a slower plan of remat's alone, and named so."""
    model, x = zoo.chain_report001(width=128, blocks=8, batch=512)
    prof = remat.profile(model, x)
    prof = dataclasses.replace(prof, compiled_peak_bytes=prof.peak_bytes // 2, compiled_step_s=1.0)
    keep = remat.plan(prof, prof.peak_bytes)
    most = prof.peak_bytes - remat.frontier(prof, max_points=2)[-1].peak_bytes  # the most checkpoints save
    alone, counter = prof.peak_bytes // 2, "process's high-water mark (compiled)"
    budget = alone - most // 8  # the compiled step must save 1/8 of `most`: checkpoints saving half of it
    seen = []

    def measured(_model, plan, _step):
        seen.append(plan)
        saved = (prof.peak_bytes - plan.peak_bytes) // 4
        return ProcessPeak(alone - saved, 0, 1.0 + 0.01 * len(plan.segments)), counter

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    ours = Measured(dataclasses.replace(keep, segments=[["1"]]), ProcessPeak(budget - (1 << 20), 0, 1.30), counter)
    fast = Measured(
        dataclasses.replace(keep, solver="compiler", compiler_budget=0.6), ProcessPeak(alone, 0, 1.05), counter
    )
    slow = Measured(
        dataclasses.replace(keep, solver="compiler", compiler_budget=0.3), ProcessPeak(alone, 0, 1.25), counter
    )
    hybrids = _hybrid_candidates(model, (x, None, None), prof, budget, [ours, fast, slow], trials=4, plan_options={})
    assert [c for c, _, _ in hybrids] == seen and 2 <= len(seen) <= 4, [compiled_mod._kind(c) for c in seen]
    assert all(c.compiler_budget == 0.6 and c.segments for c in seen)
    assert hybrids[0][1].peak_bytes > budget and hybrids[-1][1].peak_bytes <= budget  # first too few, then enough
    chosen = _fastest_fit([ours, fast, slow, *hybrids], budget, prof)
    assert chosen.compiler_budget == 0.6 and chosen.segments and chosen.measured_peak_bytes <= budget
    assert f"{len(hybrids)} of both" in chosen.notes[0], chosen.notes[0]
    assert "compiler budget 0.6 + remat " in chosen.notes[1], chosen.notes[1]
    seen.clear()  # no fraction faster than what fits by TIME_NOISE: no hybrid, nothing compiled
    fast = Measured(fast.plan, ProcessPeak(alone, 0, 1.26), counter)
    assert not _hybrid_candidates(model, (x, None, None), prof, budget, [ours, fast, slow], trials=4, plan_options={})
    assert not seen


@pytest.mark.parametrize(
    "peaks, tried, chosen",
    [  # MiB by fraction (the first is the linear estimate); the budget is 100 MiB
        ({0.674: 103, 0.9: 99}, [0.674, 0.9], 0.9),  # the peers' ViT: a larger fraction fits where the estimate missed
        ({0.585: 108, 0.9: 106, 0.7: 106, 0.5: 101}, [0.585, 0.9, 0.7, 0.5], None),  # four compilations, none fits
        ({0.585: 108, 0.9: 106, 0.7: 106, 0.5: 99}, [0.585, 0.9, 0.7, 0.5], 0.5),
        ({0.3: 80, 0.9: 102, 0.7: 98}, [0.3, 0.9, 0.7], 0.7),  # fits far below: a larger fraction that fits too
        ({0.718: 96, 0.9: 99}, [0.718, 0.9], 0.9),  # the peers' ViT at 0.9's peak: the top fits where the estimate did
        ({0.3: 97, 0.9: 103}, [0.3, 0.9], 0.3),  # fits within CLOSE_ENOUGH: only the top of the grid tried above it
        ({0.95: 97}, [0.95], 0.95),  # no grid fraction above the estimate: nothing more compiled
    ],
)
def test_the_compilers_fractions_are_searched_from_the_top_where_the_estimate_missed(monkeypatch, peaks, tried, chosen):
    """NOTE [Plans for a compiled step], Rule 4, on stubbed measurements: the compiled step's peak is not monotone
    in torch.compile's fraction, so after the estimate the search measures GRID from the top, above any fraction
    that fitted, and stops at the first that fits (above a close fit, after the top one); never more than `trials`
    compilations."""
    model, x = zoo.chain_report001(width=32, blocks=4, batch=16)
    prof = remat.profile(model, x)
    resident = prof.param_bytes + prof.optimizer_bytes
    budget = 100 << 20
    first = next(iter(peaks))  # the estimate: the fraction of the compiled step's activations the budget leaves
    prof = dataclasses.replace(prof, compiled_peak_bytes=resident + round((budget - resident) / first))
    seen = []

    def measured(_model, plan, _step):
        seen.append(plan.compiler_budget)
        return ProcessPeak(peaks[plan.compiler_budget] << 20, 0, 1.0 - plan.compiler_budget / 10), "counter"

    monkeypatch.setattr(compiled_mod, "measure_compiled", measured)
    got = compiled_mod._compiler_candidates(model, (x, None, None), prof, budget, trials=4)
    assert seen == tried and [c.compiler_budget for c, _, _ in got] == tried
    fitting = [c.compiler_budget for c, m, _ in got if m.peak_bytes <= budget]
    assert (max(fitting) if fitting else None) == chosen


class _Scored(torch.nn.Module):
    """A head and its loss in one forward, returning both, as a Hugging Face model given labels does."""

    def __init__(self, as_tuple: bool = False) -> None:
        super().__init__()
        self.body, self.head, self.as_tuple = torch.nn.Linear(16, 16), torch.nn.Linear(16, 40), as_tuple

    def forward(self, x, labels=None):
        logits = self.head(torch.relu(self.body(x)))
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits.view(-1, 40), labels.view(-1))
        return (loss, logits) if self.as_tuple else {"loss": loss, "logits": logits}


def _zeros_made_in_backward(compiled, batch, loss_fn, shape) -> int:
    """How many `aten.zeros` of `shape` the compiled step's backward made (torch's own behaviour, counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        made = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Count.made += func is torch.ops.aten.zeros.default and tuple(out.shape) == shape
            return out

    loss = loss_fn(compiled(**batch))
    with Count():
        loss.backward()
    return Count.made


def test_a_compiled_models_profile_names_the_outputs_its_loss_does_not_read_which_torch_fills_with_zeros():
    """NOTE [An output the loss does not read]: a model that computes its loss inside and returns its logits beside
    it, compiled, gets a gradient of zeros of the logits' size in backward (counted from torch itself, so a torch
    that stops doing it fails here); its profile says so with the logits' bytes, in fake mode too.  A loss that
    reads the logits, and the bare model, get no such note; a tuple output is named by its position."""
    torch.manual_seed(0)
    x, labels = torch.randn(4, 8, 16), torch.randint(0, 40, (4, 8))
    logits_bytes = 4 * 8 * 40 * 4
    model = _Scored()
    compiled = torch.compile(model)
    assert _zeros_made_in_backward(compiled, {"x": x, "labels": labels}, lambda o: o["loss"], (4, 8, 40)) == 1
    reads = lambda o: torch.nn.functional.cross_entropy(o["logits"].view(-1, 40), labels.view(-1))  # noqa: E731
    assert _zeros_made_in_backward(compiled, {"x": x}, reads, (4, 8, 40)) == 0

    said = f"the model returns `logits` ({fmt_bytes(logits_bytes, 'auto')}) beside its loss, which does not read it"
    for mode in ("real", "fake"):
        prof = remat.profile(compiled, {"x": x, "labels": labels}, loss_fn=lambda o: o["loss"], mode=mode)
        assert sum(said in n for n in prof.notes) == 1, prof.notes
    bare = remat.profile(model, {"x": x, "labels": labels}, loss_fn=lambda o: o["loss"])
    read = remat.profile(compiled, {"x": x}, loss_fn=reads, mode="fake")
    assert not any("gradient of zeros" in n for n in bare.notes + read.notes)
    pair = remat.profile(torch.compile(_Scored(as_tuple=True)), {"x": x, "labels": labels}, loss_fn=lambda o: o[0])
    assert any(f"`output[1]` ({fmt_bytes(logits_bytes, 'auto')})" in n for n in pair.notes)
    w = torch.randn(3, 3, requires_grad=True)
    a, b, c = w * 2, w + 1, w - 1  # `a` returned twice: named once, by its first name, in the output's order
    assert unread_outputs({"a": a, "b": b, "again": a, "c": c}, b.sum()) == [("a", 36), ("c", 36)]
    assert unread_outputs({"a": a, "b": b, "again": a}, a.sum() + b.sum()) == []
