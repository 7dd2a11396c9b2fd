"""What a checkpoint around a module frees (NOTE [The memory model of a plan], Rule 1), where the planner once
took more or less than the step frees.

- A saved output that only the module's own ops keep (`BlockProfile.output_own_bytes`).  wav2vec2's feature
  projection returns its projected states and its normalised input; only its own Linear saves the second, which
  the model drops.  A checkpoint of the projection frees that tensor, though a later module keeps the first output;
  the planner counted the outputs as one and predicted the projection's checkpoint to free nothing of them (found
  2026-12-02: wav2vec2's least plan 102,144 bytes high, the normalised input of 2 clips x 399 frames x 32
  channels in float32).
- An output the model returns, which the step holds to its end.
- A tensor an op saved that the module's own forward let go of (`BlockProfile.internal_bytes`): Qwen3.5's gated
  delta rule.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import remat
from test_random_trees import _compatible_sets, assert_predicted_to_the_byte
from remat.measure import scratch
from remat.planner import dp
from remat.planner.problem import Problem
from remat.types import Action


class Projection(nn.Module):
    """As wav2vec2's: the projected states, and the normalised input beside them."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, hidden)

    def forward(self, x):
        normed = self.norm(x)
        return self.proj(normed), normed


class Model(nn.Module):
    def __init__(self, width: int = 32, hidden: int = 64, returns_features: bool = False) -> None:
        super().__init__()
        self.projection = Projection(width, hidden)
        self.body = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 8))
        self.returns_features = returns_features

    def forward(self, x):
        states, features = self.projection(x)
        out = self.body(states)
        return SimpleNamespace(loss=out.sum(), features=features) if self.returns_features else out


def _setup(returns_features: bool = False):
    torch.manual_seed(0)
    model, x = Model(returns_features=returns_features), torch.randn(2, 400, 32)
    prof = remat.profile(model, x, mode="fake")
    return model, x, prof, Problem.from_profile(prof)


def test_a_checkpoint_frees_the_output_only_its_own_ops_keep_as_its_step_does():
    model, x, prof, problem = _setup()
    (projection,) = [b for b in prof.blocks if b.name == "projection"]
    assert projection.output_own_bytes == 2 * 400 * 32 * 4  # the normalised input, saved by its Linear alone
    assert projection.output_kept_by == ["body.0"]  # of the states; the normalised input is output_own_bytes
    alone = problem.unit("projection")
    assert prof.peak_bytes - problem.peak([alone]) == projection.internal_bytes + projection.output_own_bytes
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))
    plan = remat.plan(prof, problem.peak([alone]))
    assert plan.segments == [["projection"]]
    report = remat.verify(model, x, plan, time_rounds=0)  # real mode: gradients, and FLOPs by FlopCounterMode
    assert report.grad_max_abs_diff and all(d == 0 for d in report.grad_max_abs_diff.values()), str(report)
    assert report.measured_recompute_flops == report.predicted_recompute_flops  # 0: the LayerNorm alone re-runs


def test_an_output_the_model_returns_is_not_freed_by_a_checkpoint():
    model, x, prof, problem = _setup(returns_features=True)
    (projection,) = [b for b in prof.blocks if b.name == "projection"]
    assert projection.output_own_bytes == 0  # the loop holds the model's output through backward
    assert prof.peak_bytes - problem.peak([problem.unit("projection")]) == projection.internal_bytes
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))


class Returns(nn.Module):
    """A loop over layers that returns every layer's output with its loss (`output_hidden_states=True`)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(3)])

    def forward(self, x):
        states = []
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return SimpleNamespace(loss=x.sum(), hidden_states=states)


def test_a_run_that_keeps_the_first_layers_returned_output_is_not_predicted_to_free_it():
    """Without an optimizer, the first layer's backward is the step's last op, and the returned output the loop
    lets go of after the step counted as freed by it: a checkpoint over the first two layers was predicted at
    1,115,144 bytes and peaked at 1,246,216 (found 2026-12-02).  Every plan now errs high by at most the bytes of
    a Linear's bias (NOTE [The memory model of a plan]: a recomputed node's reduced gradient), never low."""
    torch.manual_seed(0)
    model, x = Returns(), torch.randn(512, 64)
    prof = remat.profile(model, x, mode="fake")
    problem = Problem.from_profile(prof)
    (first,) = [b for b in prof.blocks if b.name == "layers.0"]
    assert first.output_free_op > first.backward_end_op + 1 == len(prof.timeline.live_bytes)
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units), high=64 * 4)


class DeadBranch(nn.Module):
    """A layer whose forward saves a tensor for a branch it then drops: the branch's node goes, and the tensor with it."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        h = self.lin(x)
        dropped = h.clone()
        unused = dropped * dropped  # saves `dropped` twice, for a result nobody keeps
        out = nn.functional.gelu(h)  # saves `h`
        del unused  # its node goes, and `dropped` with it
        return out


def test_a_tensor_saved_for_a_dropped_branch_is_not_counted_as_freed_by_a_checkpoint():
    """Qwen3.5's reference gated delta rule saves a clone for a node its forward drops: a checkpoint of a
    linear-attention layer was predicted to free it too, 32,768 bytes more than the step did (2 x 64 tokens, 64 wide,
    float32), and plans were predicted that much low (found 2026-12-02).  The dropped branch also runs in a
    recomputation, which goes on to the last op that had run when the layer's last tensor was packed (NOTE
    [Recomputation]), and a run of checkpointed layers from the step's first op holds its moment over the bytes
    before that op (`Timeline.start_bytes`): both were 131,072 bytes low, one product of the branch."""
    torch.manual_seed(0)
    model, x = nn.Sequential(DeadBranch(), DeadBranch(), DeadBranch()), torch.randn(512, 64)
    prof = remat.profile(model, x, mode="fake")
    problem = Problem.from_profile(prof)
    (first,) = [b for b in prof.blocks if b.name == "0"]
    assert first.saved_bytes == 3 * 512 * 64 * 4  # the GELU's input, the clone, its output (the next Linear saves it)
    assert first.internal_bytes == 512 * 64 * 4  # the GELU's input: the clone is gone before the forward ends
    assert first.checkpoint_recompute_ops == 4  # t, addmm, clone, mul: torch stops at the GELU's pack of its input
    params, previous = 3 * (64 * 64 + 64) * 4, 512 * 64 * 4 + 4  # the last step's output and loss, let go in forward
    assert prof.timeline.start_bytes == 512 * 64 * 4 + params + previous  # the input too
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))


class Bottleneck(nn.Module):
    """Reads its input once, in its first op, and makes a wide output after: its caller's variable holds the input
    until it returns."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, width // 8), nn.Linear(width // 8, 4 * width)

    def forward(self, x):
        return self.down(self.up(x))


class EndsInABottleneck(nn.Module):
    """Two Linears, then a bottleneck, in an nn.Sequential; a tensor held through the forward (as autocast's cache
    holds its casts) puts the peak at the bottleneck's wide output."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width), Bottleneck(width))

    def forward(self, x):
        held = x.repeat(4, 1)
        return self.layers(x).sum() + held.mean()


def _no_scratch_measured_before(monkeypatch) -> None:
    """A real profile takes an op's scratch from an earlier measurement in this process (NOTE [Kernel scratch],
    Rule 5), its fake-mode steps do not: a test measuring 1 MiB on one of these backward matmuls, run before in the
    same worker, made 1.mlp's checkpoint 1,047,552 bytes high against its fake step."""
    monkeypatch.setattr(scratch, "MEASURED", {})


def test_a_run_frees_an_output_its_next_block_reads_only_when_that_block_returns(monkeypatch):
    """Rule 1: a checkpoint over a run drops the output of one block that the next one reads, but nn.Sequential's
    variable (or a layer loop's) holds it until the reader returns, not only until its last read.  Freed at the read,
    every run ending in the bottleneck was predicted 1,048,576 bytes (the second Linear's output) under its step."""
    torch.manual_seed(0)
    model, x = EndsInABottleneck(), torch.randn(1024, 256)
    _no_scratch_measured_before(monkeypatch)
    prof = remat.profile(model, x)
    problem = Problem.from_profile(prof)
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE and u.group.container == "layers"]
    assert len(_compatible_sets(units)) == 13
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units), 0)


class Widening(nn.Module):
    """A Linear, a GELU and a Linear back: it saves four times its input's width inside."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Probe(nn.Module):
    """A Linear, then a wide temporary that nothing saves (a statistic of its output, as a router's or a logger's):
    its forward's last ops, which a checkpoint's re-run does not repeat (torch stops at the last saved tensor)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        y = self.proj(x)
        return y + y.detach().repeat(8, 1).square().mean()


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp, self.probe = Widening(width), Probe(width)

    def forward(self, x):
        return self.probe(self.mlp(x))


def test_inside_a_checkpointed_layer_each_child_lets_go_of_its_activations_when_it_returns(monkeypatch):
    """Rule 1: a checkpointed layer's forward saves nothing, so its MLP's activations are gone when the MLP returns,
    before the probe's temporary (the peak of the planned step).  Freed only at the layer's end, as before, a plan
    checkpointing the last layer alone was predicted 2,096,124 bytes (about the MLP's 4x-wide activations) high;
    now every plan is exact or 1,024 bytes high (a backward detail of every plan that re-runs inside layer 1,
    checkpoint of its MLP alone included, as before this rule)."""
    torch.manual_seed(0)
    model, x = nn.Sequential(Layer(256), Layer(256)), torch.randn(256, 256)
    _no_scratch_measured_before(monkeypatch)
    prof = remat.profile(model, x, blocks=["0", "1", *(f"{i}.{c}" for i in "01" for c in ("mlp", "probe"))])
    problem = Problem.from_profile(prof)
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    sets = _compatible_sets(units)
    assert len(sets) == 26 and [problem.unit("1")] in sets
    assert_predicted_to_the_byte(model, x, prof, problem, sets, 1024)  # the layer's checkpoint: 2,096,124 high before


class Attends(nn.Module):
    """A layer that returns its attention weights beside its states, as BLOOM's and MPT's do: only its own matmul
    saves them."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.qk, self.out = nn.Linear(width, 2 * width), nn.Linear(width, width)

    def forward(self, x):
        q, k = self.qk(x).chunk(2, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # (batch, tokens, tokens): the large tensor
        return self.out(weights @ x) + x, weights


class AttentionStack(nn.Module):
    """Three such layers, called as Hugging Face's loops call them (`outputs = layer(...)`); `keep` collects the
    weights in a list the model holds to its end (`output_attentions=True` without returning them)."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Attends() for _ in range(3)])
        self.norm = nn.LayerNorm(32)  # a final norm, as a decoder has: the last layer's weights go as it starts
        self.keep = keep

    def forward(self, x):
        kept = []
        for layer in self.layers:
            outputs = layer(x)
            x = outputs[0]
            if self.keep:
                kept.append(outputs[1])
        return self.norm(x).square().mean() + 0 * len(kept)


def _attention_step(keep: bool):
    torch.manual_seed(0)
    model, x = AttentionStack(keep), torch.randn(2, 256, 32)
    prof = remat.profile(model, x, mode="fake")
    return model, x, prof, Problem.from_profile(prof)


def test_a_checkpoint_frees_attention_weights_when_the_callers_loop_lets_go_of_them(monkeypatch):
    """NOTE [When the caller lets go of an output]: under a checkpoint nothing saves a layer's attention weights, so
    they go when the loop's `outputs` moves on to the next layer's; remat counted them until the step's backward,
    and a BLOOM of 4 layers at 512 tokens had a checkpoint of its first layer predicted 16.8% above its step.
    Here every plan of the layers is predicted to the byte (a real one verified too), and the first layer's
    weights go as the third layer starts."""
    _no_scratch_measured_before(monkeypatch)
    model, x, prof, problem = _attention_step(keep=False)
    blocks = {b.name: b for b in prof.blocks}
    assert blocks["layers.0"].output_own_bytes == 2 * 256 * 256 * 4
    assert blocks["layers.0"].output_own_free_op == blocks["layers.2"].forward_start_op
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))
    real = remat.profile(model, x)
    plan = remat.plan(real, Problem.from_profile(real).peak([Problem.from_profile(real).unit("layers.0")]))
    report = remat.verify(model, x, plan, time_rounds=0)
    assert plan.segments and report.ok and report.measured_peak_bytes == plan.peak_bytes


def test_attention_weights_the_model_keeps_in_a_list_are_not_freed_by_a_checkpoint():
    """The same layers with the loop keeping every layer's weights in a list to its end: the list lets go of them
    only when the model returns, and a checkpoint frees them from there."""
    model, x, prof, problem = _attention_step(keep=True)
    blocks = {b.name: b for b in prof.blocks}
    returned = max(k for k, m in enumerate(prof.timeline.modules) if prof.timeline.phases[k] == "forward") + 1
    assert [blocks[f"layers.{i}"].output_own_free_op for i in range(3)] == [returned] * 3
    units = [u for u in problem.units if u.appliable and u.action == Action.RECOMPUTE]
    assert_predicted_to_the_byte(model, x, prof, problem, _compatible_sets(units))


def test_outputs_that_require_no_grad_are_not_searched_for(monkeypatch):
    """A Llama's rotary embedding returns its cosines and sines, which the whole forward holds: watched, they were
    searched for with `gc.get_referrers` at every later candidate's start, 123 s of the 266 s fake profile of
    Mistral-7B with LoRA at 4096 tokens (NOTE [When the caller lets go of an output], Rule 4).  The attention
    weights of the layers above are still searched for."""
    import gc

    from remat import zoo
    from remat.measure import block_io

    searches, search = [], gc.get_referrers
    monkeypatch.setattr(block_io.gc, "get_referrers", lambda *objects: searches.append(objects) or search(*objects))
    model, inputs = zoo.llama(n_layer=2, hidden=64, heads=2, seq=16, batch=1, vocab=128)
    prof = remat.profile(model, inputs, mode="fake")
    assert "model.rotary_emb" in [b.name for b in prof.blocks] and searches == []
    _attention_step(keep=False)
    assert searches


def test_a_bloom_at_512_tokens_plans_down_to_the_least_its_checkpoints_reach():
    """BLOOM's layers return their attention weights (8 MiB a layer here); with them freed where the loop lets go,
    a plan of two one-layer checkpoints peaks at 79,067,140 bytes, where dp, counting the alibi and mask each
    checkpoint holds once per checkpoint, put its own least at 79,262,728, and `remat.plan` at the frontier's last
    point said no plan fits (remat.planner.chain: dp's plans above its least, checked exactly).  Fake mode: the
    real step's bytes to the byte (docs/validation.md section 2.4)."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=256, hidden_size=64, n_layer=4, n_head=8))
    ids = torch.randint(0, 256, (2, 512))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    prof = remat.profile(model, inputs, mode="fake")
    assert prof.peak_bytes == 120_518_660
    with pytest.raises(remat.InfeasibleBudget) as least:
        remat.plan(prof, 1)
    assert least.value.min_bytes == 79_067_140
    problem = Problem.from_profile(prof)
    assert dp.min_peak(problem, dp.planned_groups(problem)) == 79_262_728  # dp's own, its shared holds counted twice
    plan = remat.plan(prof, least.value.min_bytes)
    assert plan.segments == [["transformer.h.0"], ["transformer.h.1"]] and plan.peak_bytes == 79_067_140
    assert remat.frontier(prof)[-1].peak_bytes == 79_067_140
    remat.apply(model, plan)
    try:
        assert remat.profile(model, inputs, mode="fake").peak_bytes == plan.peak_bytes
    finally:
        remat.remove(model)
