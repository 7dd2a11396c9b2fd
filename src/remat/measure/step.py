"""One training step as remat runs it: forward, loss, backward, optimizer step.

The step holds the model output and the loss through backward, as a training
loop does (`out = model(x); loss = loss_fn(out); loss.backward(); opt.step()`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from remat._torch_compat import FAKE_OP_ERRORS, tensor_leaves
from remat.errors import NoLoss, RematError, UnsupportedOp

FIX_INPUTS = "Fix: pass a tensor, a tuple of positional arguments, or a dict of keyword arguments."


@dataclass(frozen=True)
class StepInputs:
    args: tuple
    kwargs: dict

    def tensors(self) -> list[torch.Tensor]:
        return tensor_leaves(list(self.args) + list(self.kwargs.values()))


def normalize_inputs(inputs: Any) -> StepInputs:
    """A tensor, a tuple/list of positional args, or a dict of keyword args."""
    if isinstance(inputs, torch.Tensor):
        return StepInputs((inputs,), {})
    if isinstance(inputs, (tuple, list)):
        return StepInputs(tuple(inputs), {})
    if isinstance(inputs, dict):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise RematError(f"remat: keyword inputs need string keys; saw {bad[:3]!r}. {FIX_INPUTS}")
        return StepInputs((), dict(inputs))
    raise RematError(f"remat: inputs must be a tensor, tuple or dict; saw {type(inputs).__name__}. {FIX_INPUTS}")


def check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise RematError(
            f"remat: expected a torch.nn.Module, saw {type(model).__name__}. "
            "Fix: pass the model object itself (not its class, output or state_dict)."
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise RematError(
            f"remat: {type(model).__name__} has no parameter that requires grad, so there is no "
            "training step to measure. Fix: unfreeze some parameters (p.requires_grad_(True))."
        )
    return model


OPTIMIZER_FIX = "Fix: pass e.g. torch.optim.Adam(model.parameters()), or a factory `lambda ps: torch.optim.Adam(ps)`."


def make_optimizer(optimizer: Any, model: nn.Module) -> torch.optim.Optimizer | None:
    """None, an optimizer instance, or a factory `params -> optimizer`."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        try:
            opt = optimizer(model.parameters())
        except Exception as e:
            raise RematError(
                f"remat: the optimizer factory raised {type(e).__name__}: {str(e).rstrip('.')}. Expected a callable "
                f"that takes the model's parameters and returns a torch.optim.Optimizer. {OPTIMIZER_FIX}"
            ) from e
        if not isinstance(opt, torch.optim.Optimizer):
            raise RematError(
                f"remat: the optimizer factory returned {type(opt).__name__}, expected a torch.optim.Optimizer. "
                "Fix: pass e.g. `lambda ps: torch.optim.Adam(ps)`."
            )
        return opt
    raise RematError(
        f"remat: optimizer must be None, a torch.optim.Optimizer or a factory params -> optimizer; "
        f"saw {type(optimizer).__name__}. {OPTIMIZER_FIX}"
    )


def check_optimizer(optimizer: Any, model: nn.Module) -> None:
    """An optimizer instance must update this model's parameters and no other tensors."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return
    ours = {id(p) for p in model.parameters()}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = sum(id(p) not in ours for p in held)
    if held and not foreign:
        return
    seen = f"{foreign} of the {len(held)} tensors it holds are not" if held else "it holds no tensor, so none is"
    raise RematError(
        f"remat: the optimizer does not hold the parameters of {type(model).__name__}: {seen} among the model's "
        f"{len(ours)} parameters (an optimizer built before a copy of the model, or for another model?). "
        f"Expected an optimizer over this model's parameters. {OPTIMIZER_FIX}"
    )


def compute_loss(out: Any, loss_fn: Callable | None) -> torch.Tensor:
    """loss_fn(out); by default `out.loss` (Hugging Face) or `out.sum()` for a tensor output."""
    if loss_fn is not None:
        loss = loss_fn(out)
        what = "loss_fn(output)"
    elif isinstance(out, torch.Tensor):
        loss = out.sum()
        what = "output.sum()"
    elif getattr(out, "loss", None) is not None:
        loss = out.loss
        what = "output.loss"
    else:
        raise NoLoss(
            f"remat: the model returned {_describe(out)}, and no loss_fn was given; expected a tensor "
            "or an object with a .loss (a Hugging Face output computed with labels). "
            "Fix: pass loss_fn=lambda out: <a scalar tensor from out>, or give the model labels."
        )
    if not isinstance(loss, torch.Tensor):
        raise RematError(f"remat: {what} returned {_describe(loss)}; expected a scalar tensor. Fix: return a tensor.")
    if loss.numel() != 1:
        raise RematError(
            f"remat: {what} has shape {tuple(loss.shape)}; expected a scalar (one element). "
            "Fix: reduce it, e.g. loss_fn=lambda out: out.mean()."
        )
    if not loss.requires_grad:
        raise RematError(
            f"remat: {what} does not require grad, so backward cannot run; expected a loss computed "
            "from parameters that require grad. Fix: do not compute it under torch.no_grad(), and keep "
            "model parameters trainable."
        )
    return loss


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


class StateSnapshot:
    """Parameters, buffers, grads, optimizer state and RNG, saved so a real step can be undone."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, inputs: list | None = None):
        self.model, self.optimizer = model, optimizer
        self.input_grads = [(t, t.grad) for t in inputs or [] if t.requires_grad]
        with torch.no_grad():
            self.params = [(p, p.detach().clone() if optimizer is not None else None) for p in model.parameters()]
            self.grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
            self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        self.opt_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self) -> None:
        with torch.no_grad():
            for p, v in self.params:
                if v is not None:
                    p.copy_(v)
            for p, g in self.grads:
                p.grad = g
            for b, v in self.buffers:
                b.copy_(v)
            for t, g in self.input_grads:
                t.grad = g
        if self.optimizer is not None and self.opt_state is not None:
            self.optimizer.load_state_dict(self.opt_state)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


RUN_FIX = "Fix: check that the inputs match what the model takes (try calling it yourself first)."


def run_user_code(what: str, fn: Callable[[], Any], fix: str = RUN_FIX) -> Any:
    """`fn()`, a part of the user's training step; what it raises becomes a `remat:` error saying which part."""
    try:
        return fn()
    except RematError:
        raise
    except FAKE_OP_ERRORS as e:
        op = str(getattr(e, "func", "") or e)
        raise UnsupportedOp(
            f"remat: fake mode cannot run op {op} during {what}: its output depends on tensor values "
            "that fake tensors do not have (a fake step knows those computed from the inputs alone, and from the "
            "buffers of a model built for real; not those from the parameters). Expected only shape-determined ops. "
            "Fix: profile with mode='real' (on a smaller batch if memory is short), or avoid the "
            "data-dependent op (.item(), nonzero, boolean masking) in the training step.",
            op,
        ) from e
    except Exception as e:
        raise RematError(
            f"remat: {what} raised {type(e).__name__}: {str(e).rstrip('.')}. Expected the training step to run on the given "
            f"inputs. {fix}"
        ) from e
