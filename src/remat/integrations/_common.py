"""What the integrations share: the trainer's own step as `remat.profile` takes it, planned and applied.

NOTE [Planning the step a trainer runs]
  Rule 1. The step profiled is the trainer's: the first batch of its train dataloader (or the `batch=`
          given), on the model's device; its loss; its optimizer's class and hyperparameters, over the
          same parameter groups (a factory: `remat.profile` never steps the trainer's own optimizer);
          its gradient accumulation; and what its loop keeps through backward.
  Rule 2. Nothing of the run changes but the plan: the first batch is drawn from a fresh iterator of the
          dataloader with every random generator it may draw from saved before and put back after
          (torch's, CUDA's, Python's, NumPy's, the loader's and its samplers'), so the run shuffles,
          drops out and initialises as it would without the callback; `remat.profile` leaves the model,
          the optimizer and the RNG as they were.  On CPU the planned run's parameters are bit-equal to
          the unplanned run's (tests/test_integrations_*.py).
  Rule 3. The model is planned as written: a remat plan applied before is off while it is profiled (as
          `remat.auto` does) and replaced after; Hugging Face's own checkpointing is refused by each
          integration in its own words, since two checkpointings of one layer plan a step that never runs.
  Rule 4. `target=None` measures the step on the model's device; `target="H100"` (any GPU name
          `remat.profile` knows as `hardware=`) predicts it in fake mode for that GPU (`device="cuda"`),
          and `target="cpu"` for a CPU, nothing allocated.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

import remat
from remat.applier import taken_off
from remat.errors import InfeasibleBudget, RematError, listing
from remat.hf import checkpointed_by_hf

log = logging.getLogger("remat")


class PlanSettings:
    """What a callback is given (the budget, the GPU it plans for, a batch, whether to print) and what it keeps
    (the step it profiled, its profile and the plan applied): `RematCallback` and `RematLightningCallback`."""

    def __init__(self, budget, target: str | None = None, *, batch: Any = None, show: bool = True, **plan_options):
        self.budget = budget
        self.target = target
        self.batch = batch
        self.show = show
        self.plan_options = plan_options
        self.profile: remat.StepProfile | None = None
        """The `remat.StepProfile` of the trainer's step, unplanned (None until training starts)."""
        self.plan: remat.Plan | None = None
        """The `remat.Plan` applied to the model (None until training starts)."""
        self.step: TrainerStep | None = None
        """The step profiled (`TrainerStep`: inputs, loss, optimizer factory, accumulation), for `verify`."""


@dataclass(frozen=True)
class TrainerStep:
    """The step a trainer runs, as `remat.profile` takes it (Rule 1)."""

    inputs: Any
    loss_fn: Callable | None
    optimizer: Callable | None
    accumulate: int = 1
    keep_output: bool = True


def profile_options(target: str | None) -> dict:
    """Rule 4: how `remat.profile` measures or predicts the step for `target`."""
    if target is None:
        return {}
    if not isinstance(target, str):
        raise RematError(
            f"remat: target names the device to plan for, a GPU such as 'H100' or 'cpu', or None for "
            f"the model's own device; saw {type(target).__name__}. Fix: pass target='H100' or leave it "
            "out."
        )
    return {"mode": "fake", "device": "cpu" if target.lower() == "cpu" else "cuda", "hardware": target}


def plan_trainer_step(
    model: nn.Module, step: TrainerStep, budget, target: str | None, plan_options: dict, smaller_batch: str
) -> tuple[remat.StepProfile, remat.Plan]:
    """Profile `step` of `model` (Rules 1-4), plan it for `budget` and apply the plan; (profile, plan).
    `smaller_batch` says, in the trainer's words, how to make the batch smaller when no plan fits."""
    with taken_off(model), train_mode(model):  # Rule 3: the model as written
        prof = remat.profile(
            model,
            step.inputs,
            loss_fn=step.loss_fn,
            optimizer=step.optimizer,
            accumulate=step.accumulate,
            keep_output=step.keep_output,
            **profile_options(target),
        )
    try:
        plan = remat.plan(prof, budget, **plan_options)
    except InfeasibleBudget as e:
        raise InfeasibleBudget(f"{e} {smaller_batch}", e.min_bytes, e.budget_bytes) from e
    remat.apply(model, plan)
    return prof, plan


def report(who: str, prof: remat.StepProfile, plan: remat.Plan, show: bool) -> str:
    """The plan as the callback logs it (the logger "remat", INFO) and, when `show`, prints it."""
    where = f"{prof.mode} mode on {prof.device}"
    micro = f", {prof.accumulate} micro-batches per step" if prof.accumulate > 1 else ""
    text = (
        f"remat: {who} planned {prof.model}'s training step for a budget of {fmt_mib(plan.budget_bytes)} "
        f"(unplanned {fmt_mib(prof.peak_bytes)}, {where}{micro}):\n{plan}"
    )
    log.info(text)
    if show:
        print(text, flush=True)
    return text


def verify_step(
    model: nn.Module, step: TrainerStep | None, plan: remat.Plan | None, options: dict
) -> remat.VerifyReport:
    """`remat.verify` of `plan` on the step a callback profiled (`options` go to it)."""
    if plan is None or step is None:
        raise RematError(
            "remat: verify checks the plan the callback applied, and it has applied none yet. Fix: call "
            "it after training has begun (after trainer.train() or trainer.fit())."
        )
    return remat.verify(
        model,
        step.inputs,
        plan,
        loss_fn=step.loss_fn,
        optimizer=step.optimizer,
        accumulate=step.accumulate,
        keep_output=step.keep_output,
        **options,
    )


def fmt_mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:,.1f} MiB"


@contextlib.contextmanager
def train_mode(model: nn.Module) -> Iterator[None]:
    """`model` in training mode meanwhile (a trainer puts it there before each step), its modes put back after."""
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def refuse_hf_checkpointing(model: nn.Module, fix: str) -> None:
    """Rule 3: a model that Hugging Face gradient checkpointing checkpoints is refused, `fix` saying how to stop it."""
    on = [name or type(model).__name__ for name, m in model.named_modules() if checkpointed_by_hf(m)]
    if on:
        raise RematError(
            f"remat: a remat plan is for a model without other activation checkpointing; saw Hugging Face gradient "
            f"checkpointing on in {type(model).__name__} ({listing(on, 3)}), which would checkpoint its layers a "
            f"second time, in a step the plan never measured. Fix: {fix}."
        )


def optimizer_factory(optimizer: torch.optim.Optimizer | None, model: nn.Module) -> Callable | None:
    """Rule 1: a factory `params -> optimizer` that builds `optimizer`'s class with its hyperparameters over the same
    parameter groups of the model it is given (the model's parameters in order, as `remat.profile` passes them;
    fake copies too).  The optimizer inside a wrapper (Accelerate's `AcceleratedOptimizer`) is the one copied."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    cls = type(optimizer)
    accepted = inspect.signature(cls).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}  # AdamW's defaults name more
    where = {id(p): i for i, p in enumerate(model.parameters())}
    groups = [
        ([where.get(id(p)) for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
        for g in optimizer.param_groups
    ]
    if any(i is None for indices, _ in groups for i in indices):  # not all of this model's: its class only
        return lambda params: cls(params, **defaults)

    def build(params) -> torch.optim.Optimizer:
        params = list(params)
        return cls([{**hyper, "params": [params[i] for i in indices]} for indices, hyper in groups], **defaults)

    return build


def on_device(batch: Any, device: torch.device) -> Any:
    """`batch` with its tensors on `device`; a mapping (a `BatchEncoding`) becomes a dict, as `remat.profile` takes."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: on_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(on_device(v, device) for v in batch)
    return batch


def model_device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def first_batch(loader: Any, what: str) -> Any:
    """Rule 2: the first batch of a fresh iterator of `loader`, every random generator it may draw from put back.
    Of an Accelerate loader, the loader inside (`base_dataloader`): the shard's own iterator registers itself with
    Accelerate's gradient state and unregisters only at its end, which a first batch never reaches."""
    if loader is None:
        raise RematError(
            f"remat: the callback profiles the first batch of {what}, and saw none. Fix: give the "
            "trainer a train dataset, or pass the callback batch= (one batch as the model takes it)."
        )
    with generators_kept(loader):
        iterator = iter(getattr(loader, "base_dataloader", loader))
        try:
            batch = next(iterator)
        except StopIteration:
            raise RematError(
                f"remat: {what} is empty, so there is no step to profile. Fix: give it data, or pass "
                "the callback batch= (one batch as the model takes it)."
            ) from None
        finally:
            close = getattr(iterator, "close", None)  # a generator's (Accelerate's loaders): its finally runs now
            if close is not None:
                close()
    return batch


@contextlib.contextmanager
def generators_kept(loader: Any) -> Iterator[None]:
    """Every random generator `loader` may draw from, put back as it was afterwards."""
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    own = [(g, g.get_state()) for g in loader_generators(loader)]
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)
        for g, state in own:
            g.set_state(state)


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The `torch.Generator`s of a loader, its sampler, its batch sampler and theirs (Accelerate's shards too)."""
    found, seen, todo = [], set(), [loader]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator):
            found.append(generator)
        todo += [getattr(obj, name, None) for name in ("sampler", "batch_sampler", "base_dataloader")]
    return found
