"""The findings of `remat.explain`, one function per finding code, in the order the report lists them.

Each rule reads the `Evidence` (measured profiles, the model's checkpoint calls and what
each does alone, the planner's predictions) and returns zero or more `Finding`s.  A rule
only states numbers it was given: "measured" ones come from profiled steps, "predicted"
ones from the memory model of `remat.plan` (NOTE [How explain gets its numbers]).

The rules live by severity: `memory_rules`, `correctness_rules`, `advice_rules`.
"""

from __future__ import annotations

from remat.explainer.advice_rules import compiler_fuses_it, measured_with_reserved_memory, no_checkpointing, remat_plan
from remat.explainer.correctness_rules import (
    batchnorm_recomputed,
    compile_budget_redraws_dropout,
    reentrant_no_grad_input,
    rng_keyword_tensors,
    rng_not_preserved,
)
from remat.explainer.evidence import Evidence
from remat.explainer.memory_rules import (
    activations_not_dominant,
    checkpoint_too_small,
    kv_cache_in_training,
    too_many_segments,
    whole_model_checkpoint,
)

__all__ = ["RULES", "Evidence"]

RULES = (
    whole_model_checkpoint,
    checkpoint_too_small,
    too_many_segments,
    activations_not_dominant,
    reentrant_no_grad_input,
    rng_not_preserved,
    rng_keyword_tensors,
    batchnorm_recomputed,
    compile_budget_redraws_dropout,
    measured_with_reserved_memory,
    kv_cache_in_training,
    remat_plan,
    no_checkpointing,
    compiler_fuses_it,
)
