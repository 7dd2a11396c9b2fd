"""A layer Hugging Face runs with its reference PyTorch code where a package's fused CUDA kernel is not installed
(NOTE [A kernel Hugging Face runs as its reference] in `remat.hf`).  Mamba's selective scan without `mamba_ssm`
is a loop over the tokens that saves each token's state: a CUDA step predicted with it is the step of a GPU
without `mamba_ssm`, and the profile and `remat fit` say so, naming the functions and packages."""

from __future__ import annotations

import pytest
import torch

import remat
from remat.fit import will_it_fit
from remat.hf import REFERENCE_NOTE

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(p) for p in ("mamba_ssm", "causal_conv1d")),
    reason="the fused kernels are installed: Hugging Face does not fall back",
)


def _config():
    return transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=4)


def _mamba():
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(_config())
    ids = torch.randint(0, 64, (1, 8))
    return model, {"input_ids": ids, "labels": ids}


def _reference_notes(prof) -> list[str]:
    return [n for n in prof.notes if n.startswith(REFERENCE_NOTE)]


def test_a_cuda_prediction_names_the_kernels_run_as_their_reference_each_time():
    model, inputs = _mamba()
    for _ in range(2):  # Hugging Face warns once per process; the note is in every profile
        (note,) = _reference_notes(remat.profile(model, inputs, mode="fake", device="cuda"))
        assert "`selective_scan_fn`" in note and "`causal_conv1d_fn`" in note, note
        assert "as `mamba_ssm` and `causal_conv1d` are not installed here" in note, note
        assert "than the step predicted here" in note, note


def test_a_cpu_step_has_no_such_note():
    model, inputs = _mamba()
    assert _reference_notes(remat.profile(model, inputs)) == []
    assert _reference_notes(remat.profile(model, inputs, mode="fake")) == []


def test_remat_fit_repeats_the_note_in_its_answer():
    answer = will_it_fit(_config(), "H100", seq=16, changes=())
    (note,) = [n for n in answer.notes if n.startswith(REFERENCE_NOTE)]
    assert f"note: {note}" in str(answer)
    assert "`selective_scan_fn`" in note
