"""remat.integrations.RematLightningCallback in a real Lightning fit (issue 37): the LightningModule's training
step planned when training starts, the fit unchanged but for memory (bit-equal parameters on CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import remat
from remat.applier import applied

L = pytest.importorskip("lightning")

from remat.integrations import RematLightningCallback  # noqa: E402


class Regressor(L.LightningModule):
    """A small transformer encoder (dropout 0.1) with a linear head, trained on (x, y) batches by MSE."""

    def __init__(self, manual: bool = False):
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True) for _ in range(4)]
        )
        self.head = nn.Linear(64, 1)
        self.automatic_optimization = not manual

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(callbacks=(), manual: bool = False) -> Regressor:
    """A Regressor after 3 steps of Lightning on CPU (shuffled data, dropout on, seed 0)."""
    L.seed_everything(0, verbose=False)
    module = Regressor(manual)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 64, 16, generator=g), torch.randn(32, 64, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, loader)
    return module, trainer


def test_a_fit_with_the_callback_trains_as_without_it(capsys):
    without, _ = fit()
    callback = RematLightningCallback(budget=0.6)
    module, trainer = fit([callback])
    L.seed_everything(0, verbose=False)
    start = list(Regressor().parameters())  # as fit() starts
    assert all(torch.equal(p, q) for p, q in zip(without.parameters(), module.parameters()))  # bit-equal
    assert not any(torch.equal(p, q) for p, q in zip(start, module.parameters()))  # and every parameter trained
    prof, plan = callback.profile, callback.plan
    assert applied(module) is plan and (plan.segments or plan.selective)
    assert plan.peak_bytes <= plan.budget_bytes < prof.peak_bytes
    assert (prof.model, prof.optimizer, prof.accumulate) == ("Regressor", "AdamW", 1)
    assert {b.name for b in prof.blocks} >= {f"layers.{i}" for i in range(4)}  # the module's own names
    assert capsys.readouterr().out.count("remat: RematLightningCallback planned Regressor's training step") == 1
    assert "forward" not in module.__dict__ and "log" not in module.__dict__  # the module's own again
    report = callback.verify(trainer, module, time_rounds=0)
    assert report.grads_equal and report.measured_recompute_flops == plan.recompute_flops, str(report)


def test_manual_optimization_is_refused():
    with pytest.raises(
        remat.RematError,
        match=r"^remat: RematLightningCallback profiles a training step whose loss "
        r"Lightning backpropagates .* Regressor sets automatic_optimization = False.* Fix: ",
    ):
        fit([RematLightningCallback(budget=0.6)], manual=True)
