"""remat and Hugging Face's own gradient checkpointing, in either order (issue 13).

HF first: the profile sees the layers recomputed, plans around them, and says that a budget given
as a share is of the peak with them.  remat first: a layer that HF checkpointing later takes over is
left to it, once, with a warning that the plan no longer describes the step.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import architectures
import remat

ALREADY = "the model checkpoints transformer.h.0, transformer.h.1, transformer.h.2 itself"


def _hf_checkpointing(model) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames the method
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _step(model, inputs) -> tuple[int, dict[str, torch.Tensor]]:
    """FLOPs of one forward and backward, and the gradients."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks
    with FlopCounterMode(display=False) as fc:
        model(**inputs).loss.backward()
    return fc.get_total_flops(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_hf_checkpointing_first_remat_plans_around_it_and_says_what_the_budget_is_of():
    model, inputs = architectures.gpt2()
    _hf_checkpointing(model)
    prof = remat.profile(model, inputs)
    layers = [b for b in prof.blocks if b.name.startswith("transformer.h.")]
    assert layers and all(b.checkpointed for b in layers)

    with pytest.raises(remat.InfeasibleBudget, match=ALREADY):
        remat.plan(prof, "10%")
    least = remat.frontier(prof)[-1]
    assert any(ALREADY in n for n in least.notes)
    assert not any(n.startswith("transformer.h.") for seg in least.segments for n in seg)
    assert not any(n.startswith("transformer.h.") for n in least.selective)
    report = remat.verify(model, inputs, remat.plan(prof, (least.peak_bytes + prof.peak_bytes) // 2))
    assert report.ok, str(report)


def test_hf_checkpointing_turned_on_after_apply_takes_the_layers_once_and_warns():
    model, inputs = architectures.gpt2()
    model.config.use_cache = False
    _hf_checkpointing(model)
    hf_flops, hf_grads = _step(model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_disable()

    remat.apply(model, "every-block")
    _hf_checkpointing(model)
    with pytest.warns(UserWarning, match="Hugging Face gradient checkpointing now checkpoints a GPT2Block"):
        flops, grads = _step(model, inputs)
    assert flops == hf_flops  # one recomputation per layer, not two
    assert grads.keys() == hf_grads.keys()
    assert all(torch.equal(grads[n], hf_grads[n]) for n in grads)
    remat.remove(model)


def test_explain_runs_the_plan_it_shows_also_when_hf_checkpointing_is_on():
    model, inputs = architectures.gpt2()
    _hf_checkpointing(model)
    expl = remat.explain(model, inputs)
    seen = [n for n in expl.plan.notes if n.startswith("seen run: the step with this plan measured")]
    assert seen and expl.plan.selective + [n for seg in expl.plan.segments for n in seg]
    assert any("turn Hugging Face gradient checkpointing off" in n for n in expl.plan.notes)
    assert all(m.gradient_checkpointing for m in model.transformer.h)  # as it was
    assert not any(getattr(m, "_remat_forward", None) for m in model.modules())  # the plan is removed again


class BreaksWhenRecomputed(torch.nn.Module):
    """A layer whose forward saves one more tensor when it runs in backward (as a layer that appends to a
    cache each call does): every checkpoint around it fails in backward."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if torch._C._current_graph_task_id() != -1:  # recomputed in backward
            h = h * torch.sigmoid(h)
        return self.b(h)


def test_explain_does_not_recommend_a_plan_that_breaks_the_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[BreaksWhenRecomputed() for _ in range(4)])
    x = torch.randn(512, 64)
    expl = remat.explain(model, x)
    assert expl.plan.solver == "keep" and not expl.plan.segments and not expl.plan.selective
    assert expl.plan.notes[0].startswith(remat.types.PLAN_FAILED), expl.plan.notes
    assert "nothing it has seen run" in str(expl)
    assert "broke this step when run" in next(f for f in expl if f.code == "no-checkpointing").fix


def test_explain_runs_its_plan_on_layers_that_checkpoint_themselves():
    """remat's checkpoint around a layer wrapped in checkpoint_wrapper: in the plan's run the wrapper's own
    checkpoint is off, in forward and in the recomputation alike (NOTE [Recording the user's checkpoints],
    Rule 7); before, the recomputation saved other tensors and the plan was not recommended."""
    from remat.explainer import examples

    expl = remat.explain(*examples.per_layer_gpt2(n_layer=3, seq=32, batch=2))
    assert expl.plan.segments or expl.plan.selective
    assert any(n.startswith("seen run: the step with this plan measured") for n in expl.plan.notes), expl.plan.notes
