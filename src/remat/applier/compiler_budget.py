"""A plan's `compiler_budget`: torch.compile's own activation memory budget, set for one compiled model.

NOTE [The compiler's budget as a plan]
Inductor can trade memory for recomputation itself: its min-cut partitioner saves fewer activations when told
to keep a fraction of them (`torch._functorch.config.activation_memory_budget`, 1.0 by default), and it
recomputes fused pointwise ops almost for free inside the backward's kernels, where remat's units are whole
modules or whole ops.  A plan whose `compiler_budget` is below 1.0 asks for that:

  Rule 1. `torch.compile(model)`'s forward is replaced by a call of the model through a function of its own,
          compiled with the same settings and run with the config set to the budget, so what it compiles is
          partitioned under that budget.  Not the region API
          (`torch.autograd.graph.region_activation_memory_budget`): it refuses a graph with any op outside the
          region, and Inductor adds one to every graph with dropout (`inductor_seeds`).
  Rule 2. A function of its own, because Dynamo keeps compiled code per code object, and its guards do not
          see the config, nor, for a model whose forward Dynamo enters directly (Hugging Face's, decorated),
          a forward set on the instance: changing either left a compiled BERT on its old graph.  The function
          is made once per compiled model and budget and kept (`_CALLS`), so applying the plan again finds it
          compiled, and `remat.remove` puts back the compiled forward as it was, with its own graph.
  Rule 3. Only `torch.compile(model)` can follow such a plan (`remat.apply` refuses an eager model, and one
          compiled in place by `model.compile()`).  The plan may checkpoint modules too: the budget then acts on
          what remat's checkpoints leave in the graph (`remat.auto`'s hybrids, NOTE [Plans for a compiled step],
          Rule 6).
  Rule 4. Nothing set here keeps a dropped model alive (as NOTE [How a module is checkpointed in place], Rule 8):
          the kept functions are given the model at each call and hold none, the forward they replace is kept
          on the compiled model, and the bare model finds that one by a weak reference.  Before (2026-12-05),
          a kept function held the model, which held the compiled model, `_CALLS`' key: a model that had followed
          such a plan, its parameters on the GPU included, stayed allocated for the rest of the process.

  Rule 5. Random numbers are drawn once: below 1.0, torch's partitioner may recompute dropout (and every random
          op) in the backward graph, where it draws other numbers than the forward did, and the gradients come
          out silently wrong (pytorch/pytorch#190758, open; measured with torch 2.13 on CPU, 2026-12-06, by
          `python benchmarks/compile_rng.py`: the peers' GPT-2 with dropout, float64, the gradient along a random
          direction against the loss's finite difference: 32% off at budget 0.5 and 43% at 0.1, 2.3e-8 at 1.0).
          So the compiled call also tells the partitioner to save what each random op drew
          (`random_numbers_kept`: dropout's bool mask, a quarter of the float it is drawn as), the way
          `torch.utils.checkpoint`'s selective policies mark an op to save; the budget acts on the rest.  The same
          GPT-2 under remat's budget 0.5 and 0.1: the loss's gradients, to 1e-8; `remat.zoo.gpt2()` in float32 at
          0.5: 284 MiB with the masks kept, 288 MiB re-drawing them, at 0.1: 308 against 343 MiB and about 7%
          slower (`python benchmarks/compile_rng.py --peaks`, 2026-12-06).  Before (2026-12-06, earlier),
          `remat.apply` refused the budget on a model with dropout in training and `remat.auto` did not try it.

What it saves cannot be predicted from the eager step remat tracks; `remat.auto` measures it
(NOTE [Plans for a compiled step] in `remat.compiled_plans`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch.nn as nn

from remat._torch_compat import wrapped_module
from remat._torch_compat.compiler import (
    activation_memory_budget,
    fresh_compiled_call,
    is_optimized_module,
    random_numbers_kept,
)

BUDGET = "_remat_compiler_budget"  # on the compiled model: its forward, to put back; on the bare one: a weak ref to it
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # compiled model -> {budget: its call} (Rule 2)


def optimized_module(wrapper: nn.Module) -> nn.Module | None:
    """The `torch.compile(model)` that is `wrapper` or that it wraps (under DistributedDataParallel), or None."""
    m = wrapper
    while m is not None and not is_optimized_module(m):
        m = wrapped_module(m)
    return m


def set_compiler_budget(wrapper: nn.Module, model: nn.Module, budget: float) -> None:
    """Rules 1, 2 and 5: `model`'s compiled step, run through `wrapper`, saves activations within `budget` (0 to 1) of
    Inductor's, and every random number it draws; at 1.0, Inductor's default, nothing is set."""
    if budget >= 1.0:
        return
    optimized = optimized_module(wrapper)
    calls = _CALLS.setdefault(optimized, {})
    if budget not in calls:
        calls[budget] = fresh_compiled_call(optimized, f"remat_compiler_budget_{len(calls)}")
    call = calls[budget]

    def forward(*args, **kwargs):
        with compiling_under(budget):
            return call(model, *args, **kwargs)

    object.__setattr__(optimized, BUDGET, optimized.__dict__["forward"])  # Rule 4: no reference back to `optimized`
    object.__setattr__(model, BUDGET, weakref.ref(optimized))
    object.__setattr__(optimized, "forward", forward)


@contextlib.contextmanager
def compiling_under(budget: float) -> Iterator[None]:
    """What compiles meanwhile is partitioned under `budget` as a plan's `compiler_budget` sets it (Rules 1 and 5):
    below 1.0 with every random number kept."""
    with activation_memory_budget(budget), random_numbers_kept() if budget < 1.0 else contextlib.nullcontext():
        yield


def clear_compiler_budget(model: nn.Module) -> None:
    """Undo `set_compiler_budget`; nothing to do on a model without one, or whose compiled model is gone."""
    optimized = model.__dict__.pop(BUDGET, lambda: None)()
    if optimized is not None:
        object.__setattr__(optimized, "forward", optimized.__dict__.pop(BUDGET))
