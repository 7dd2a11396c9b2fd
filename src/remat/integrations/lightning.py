"""remat in Lightning: a callback that plans the LightningModule's training step when training starts.

    trainer = L.Trainer(max_epochs=1, callbacks=[RematLightningCallback(budget="6GiB")])
    trainer.fit(module, train_loader)

At `on_train_start` (the optimizers made, the module on its device, the dataloaders set up) it profiles the
module's `training_step` as Lightning runs it (NOTE [Planning the step a trainer runs] in
`remat.integrations._common`): the first batch of the train dataloader moved by the strategy (the module's
batch-transfer hooks included), under the precision plugin's step context (autocast for "bf16-mixed"), the loss
it returns, the first optimizer's class and hyperparameters over its parameter groups, and
`accumulate_grad_batches` micro-batches.  Then `remat.plan`, `remat.apply` on the module, and the plan logged
(the logger "remat") and printed on global rank 0.  `callback.profile` and `callback.plan` keep both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
import torch

import remat
from remat.errors import RematError
from remat.integrations._common import (
    PlanSettings,
    TrainerStep,
    first_batch,
    optimizer_factory,
    plan_trainer_step,
    refuse_hf_checkpointing,
    report,
    verify_step,
)


class RematLightningCallback(PlanSettings, pl.Callback):
    """Plan the LightningModule's training step for `budget` and apply the plan when training starts.

    Example:
        >>> trainer = L.Trainer(max_steps=1000, callbacks=[RematLightningCallback(budget=0.6)])
        >>> trainer.fit(module, loader)          # prints the plan, then trains with it

    `budget`, `target`, `batch=`, `show=` and the keywords for `remat.plan` are as for
    `remat.integrations.RematCallback` (Hugging Face's Trainer).  The step is `training_step(batch, 0)` with
    `self.log` silenced while it is profiled; its loss is what it returns (a tensor, or the "loss" of a dict).

    Refused with a `remat:` error: manual optimization (`automatic_optimization = False`: the step's backward is
    the module's own), and Hugging Face gradient checkpointing on in a model the module holds.

    Known limitations: the first optimizer only; under DDP or FSDP each rank profiles the module it holds.
    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not pl_module.automatic_optimization:
            raise RematError(
                f"remat: RematLightningCallback profiles a training step whose loss Lightning backpropagates "
                f"(automatic optimization), and {type(pl_module).__name__} sets automatic_optimization = False: "
                "its training_step runs backward itself. Fix: profile and plan it by hand (remat.profile with a "
                "loss_fn, remat.plan, remat.apply before trainer.fit), or use automatic optimization."
            )
        refuse_hf_checkpointing(
            pl_module,
            "call gradient_checkpointing_disable() on the Hugging Face model inside "
            f"{type(pl_module).__name__} before trainer.fit",
        )
        batch = (
            self.batch
            if self.batch is not None
            else first_batch(trainer.train_dataloader, "the Trainer's train dataloader")
        )
        self.step = step = TrainerStep(
            inputs=(trainer.strategy.batch_to_device(batch),),
            loss_fn=step_loss,
            optimizer=optimizer_factory(trainer.optimizers[0] if trainer.optimizers else None, pl_module),
            accumulate=max(1, int(trainer.accumulate_grad_batches)),
        )
        smaller = "With Lightning: RematLightningCallback(budget=...) at least that, or a smaller batch_size in the "
        smaller += "DataLoader, with a larger Trainer(accumulate_grad_batches=...) to keep the batch."
        with training_step_as_forward(pl_module, trainer):
            self.profile, self.plan = prof, plan = plan_trainer_step(
                pl_module, step, self.budget, self.target, self.plan_options, smaller
            )
        report("RematLightningCallback", prof, plan, self.show and trainer.is_global_zero)

    def verify(self, trainer: pl.Trainer, pl_module: pl.LightningModule, **options) -> remat.VerifyReport:
        """`remat.verify` of the plan on the step profiled: gradients with and without it, and the planned step's
        peak by the process's own counter.  `options` go to `remat.verify` (`time_rounds=0`, ...)."""
        with training_step_as_forward(pl_module, trainer):
            return verify_step(pl_module, self.step, self.plan, options)


def step_loss(output: Any) -> torch.Tensor:
    """The loss of what `training_step` returned: the tensor, or a dict's "loss"."""
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise RematError(
                f"remat: training_step returned a dict with {sorted(output)}; expected a 'loss' in it, "
                "as Lightning does. Fix: return {'loss': loss, ...} or the loss tensor itself."
            )
        return output["loss"]
    if output is None:
        raise RematError(
            "remat: training_step returned None for the batch profiled (Lightning skips such a batch); "
            "expected a loss. Fix: pass the callback batch= with a batch the step trains on."
        )
    return output


@contextlib.contextmanager
def training_step_as_forward(pl_module: pl.LightningModule, trainer: pl.Trainer) -> Iterator[None]:
    """The module's forward is `training_step(batch, 0)` meanwhile, under the precision plugin's step context and
    with `self.log`/`self.log_dict` silenced (what the profile runs is not a step of the fit: nothing is logged).
    A call of the module inside its training step (`self(x)`) runs its own forward."""
    precision = trainer.strategy.precision_plugin
    own_forward = pl_module.forward
    inside = [0]

    def forward(*args, **kwargs):
        if inside[0]:  # training_step calling self(...)
            return own_forward(*args, **kwargs)
        inside[0] += 1
        try:
            with precision.train_step_context():
                return pl_module.training_step(*args, 0)
        finally:
            inside[0] -= 1

    def silent(*args, **kwargs):
        return None

    names = ("forward", "log", "log_dict")
    saved = {k: pl_module.__dict__[k] for k in names if k in pl_module.__dict__}
    for name, value in zip(names, (forward, silent, silent)):
        object.__setattr__(pl_module, name, value)
    try:
        yield
    finally:
        for name in names:
            pl_module.__dict__.pop(name, None)
        pl_module.__dict__.update(saved)
