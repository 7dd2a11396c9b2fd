"""remat in Hugging Face's `Trainer`: a callback that plans the Trainer's own step at the start of training.

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[RematCallback(budget="6GiB")])
    trainer.train()

At `on_train_begin` (the optimizer made, the model on its device) it profiles one training step as the Trainer
runs it (NOTE [Planning the step a trainer runs] in `remat.integrations._common`): the first batch of the
Trainer's train dataloader on the model's device, the model's `output.loss`, the Trainer's optimizer class and
hyperparameters over its parameter groups, `gradient_accumulation_steps` micro-batches, only the loss kept
through backward (`keep_output=False`).  Then `remat.plan(profile, budget)`, `remat.apply(model, plan)`, and the
plan logged (the logger "remat") and printed.  `callback.profile` and `callback.plan` keep both.
"""

from __future__ import annotations


import transformers

import remat
from remat.errors import RematError
from remat.integrations._common import (
    PlanSettings,
    TrainerStep,
    first_batch,
    model_device,
    on_device,
    optimizer_factory,
    plan_trainer_step,
    refuse_hf_checkpointing,
    report,
    verify_step,
)


class RematCallback(PlanSettings, transformers.TrainerCallback):
    """Plan the Trainer's step for `budget` and apply the plan when training begins.

    Example:
        >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[RematCallback(budget=0.6)])
        >>> trainer.train()              # prints the plan, then trains with it

    `budget` is what `remat.plan` takes: bytes, "6GiB", or a share of the unplanned peak (0.6, "60%").
    `target=None` measures the step on the model's device; a GPU name (`target="H100"`) predicts it for that
    GPU in fake mode, nothing allocated.  `batch=` profiles that batch instead of the dataloader's first.
    `show=False` only logs the plan.  Other keywords go to `remat.plan` (`solver=`, `max_segment=`, ...).

    Refused with a `remat:` error: the Trainer's own activation checkpointing (`TrainingArguments(
    activation_checkpointing=True)`, `gradient_checkpointing` in transformers 4), a model whose Hugging Face
    gradient checkpointing is on, and FSDP's `activation_checkpointing` in `fsdp_config`.  A budget no plan
    reaches raises `remat.InfeasibleBudget`.

    Known limitations: the loss profiled is the model's `output.loss`; a `compute_loss_func` or label smoothing
    is not seen.  Under DDP or FSDP every rank profiles the bare model the Trainer holds: DDP's gradient buckets
    are not in the profile (docs/integrations.md).
    """

    def on_train_begin(self, args, state, control, **kwargs):
        model = kwargs["model"]
        refuse_trainer_checkpointing(args, model)
        batch = (
            self.batch
            if self.batch is not None
            else first_batch(kwargs.get("train_dataloader"), "the Trainer's train dataloader")
        )
        self.step = step = TrainerStep(
            inputs=on_device(batch, model_device(model)),
            loss_fn=None,  # output.loss, as the Trainer's compute_loss takes it
            optimizer=optimizer_factory(kwargs.get("optimizer"), model),
            accumulate=max(1, int(args.gradient_accumulation_steps)),
            keep_output=False,  # the Trainer lets the output go before backward
        )
        smaller = (
            "With the Trainer: RematCallback(budget=...) at least that, or a smaller TrainingArguments("
            "per_device_train_batch_size=...), with a larger gradient_accumulation_steps to keep the batch."
        )
        self.profile, self.plan = plan_trainer_step(model, step, self.budget, self.target, self.plan_options, smaller)
        report("RematCallback", self.profile, self.plan, self.show and state.is_world_process_zero)

    def verify(self, model, **options) -> remat.VerifyReport:
        """`remat.verify` of the plan on the step profiled: gradients with and without it, and the planned step's
        peak by the process's own counter (`report.independent_peak_bytes`).  `model` is `trainer.model`;
        `options` go to `remat.verify` (`time_rounds=0`, ...)."""
        return verify_step(model, self.step, self.plan, options)


def refuse_trainer_checkpointing(args, model) -> None:
    """NOTE [Planning the step a trainer runs], Rule 3, in the Trainer's words."""
    name = "activation_checkpointing" if hasattr(args, "activation_checkpointing") else "gradient_checkpointing"
    if getattr(args, name, False) or getattr(args, "gradient_checkpointing", False):
        also = " (or its old name gradient_checkpointing=True)" if name != "gradient_checkpointing" else ""
        raise RematError(
            f"remat: RematCallback expects the Trainer's own activation checkpointing off, and saw TrainingArguments("
            f"{name}=True){also}: Hugging Face's checkpoints would run beside remat's plan, which is made for the step "
            f"without them. Fix: set TrainingArguments({name}=False) and let the callback's plan checkpoint what the "
            "budget needs (or drop RematCallback to keep Hugging Face's checkpointing)."
        )
    fsdp_ac = (getattr(args, "fsdp_config", None) or {}).get("activation_checkpointing", False)
    if str(fsdp_ac).lower() in ("true", "1", "yes"):
        raise RematError(
            "remat: RematCallback expects no other activation checkpointing, and saw TrainingArguments(fsdp_config="
            "{'activation_checkpointing': True}): FSDP's checkpoints would run beside remat's plan, which is made "
            "for the step without them. Fix: set fsdp_config['activation_checkpointing'] to False and let the callback's "
            "plan checkpoint what the budget needs."
        )
    disable = (
        "activation_checkpointing_disable"
        if hasattr(model, "activation_checkpointing_disable")
        else ("gradient_checkpointing_disable")
    )
    refuse_hf_checkpointing(
        model,
        f"call model.{disable}() before trainer.train() (the Trainer does not turn it "
        f"on unless TrainingArguments({name}=True))",
    )
