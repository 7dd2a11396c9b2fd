"""How a `StepProfile` written by an older remat reads: each version's JSON upgraded to the next (`UPGRADES`,
for `remat.types._json.load`).  What each version added:

2: BlockProfile gained the selective, op-count, offload and container fields.
3: the step measured (`step`, steady by default), `accumulate` and `first_step_peak_bytes`.
4: seconds measured after a warm-up or predicted by a roofline (`timing`, `step_time_s`,
   `checkpoint_op_s`, `selective_op_s`, `BlockProfile.checkpoint_recompute_s`).
5: `BlockProfile.selective_variants` (selective checkpoints that keep chosen ops' outputs).
6: `keep_output`, the loop measured (earlier profiles kept the output through backward), `optimizer`, and
   `Breakdown.workspaces_bytes` (cuBLAS's workspaces of a CUDA step).
7: `gpu_reserve`, `BlockProfile.foreign_grad_inputs`.
8: what is freed before a block's first forward and backward op (`BlockProfile.freed_before_forward_bytes`,
   `freed_before_backward_bytes`).
9: what a selective checkpoint's cache gives its recomputation and holds past the unplanned step
   (`SelectiveVariant.kept_made`, `kept_outside`; `BlockProfile.selective_kept_made`, `selective_kept_outside`).
10: the inputs a checkpoint holds that autograd keeps for ops outside it, and the tensors a block outputs
   (`BlockProfile.kept_inputs`, `output_keys`).
11: each call of a module called more than once, as its own block (`StepProfile.call_blocks`, `BlockProfile.call`).
12: the saved outputs only a block's own ops save and read (`BlockProfile.output_own_bytes`, `output_own_free_op`),
   and the live bytes before the first op (`Timeline.start_bytes`).
13: the parameters' casts autocast's cache holds (`BlockProfile.autocast_casts`, `SelectiveVariant.cast_bytes`).
14: where a checkpoint re-runs its block's forward (`BlockProfile.rerun_op`, `freed_before_rerun_bytes`).
15: whether torch's selective checkpoint replays a block under autocast (`BlockProfile.selective_replays`).
16: `BlockProfile.output_kept_by` names the keepers of a block's saved outputs but those only its own ops keep;
   `BlockProfile.batchnorm_stats_bytes`.
17: whether a block writes in place an output the matmul policy keeps (`BlockProfile.selective_matmul_written`).
"""

from __future__ import annotations

from collections.abc import Callable


def _from_version_2(data: dict) -> dict:
    """Version 2 profiles measured the first step of the optimizer as given."""
    return _from_version_3({**data, "step": "first"})


def _from_version_3(data: dict) -> dict:
    """Version 3 profiles timed ops on the tracked step only (real mode), and fake ones not at all."""
    return _from_version_4({**data, "timing": "tracked" if data.get("step_s") else ""})


def _from_version_4(data: dict) -> dict:
    """Version 4 profiles had no selective variants: their plans keep matmul-like outputs only."""
    return _from_version_5(data)


def _from_version_5(data: dict) -> dict:
    """Version 5 profiles measured a loop that keeps the output through backward."""
    return {**data, "keep_output": True}


UPGRADES: dict[int, Callable[[dict], dict]] = {
    2: _from_version_2,
    3: _from_version_3,
    4: _from_version_4,
    5: _from_version_5,
    6: dict,
    7: dict,
    8: dict,
    9: dict,
    10: dict,
    11: dict,
    12: dict,
    13: dict,
    14: dict,
    15: dict,
    16: dict,
}
"""Version -> what makes it the next one's JSON (version 6 reads as 7 as it is; version 7 as 8, without what is
freed before a block's first forward and backward op: read as 0, a checkpoint's recomputation counts from the
timeline's figure there; version 8 as 9, without what a selective checkpoint's cache gives and holds: read as
none, its recomputation's moment is not predicted; version 9 as 10, without kept inputs: read as none, a
checkpoint holding an output another one frees is not predicted; version 10 as 11, without the calls of a module
called more than once: such a module is planned from all its calls at once, as before; version 11 as 12, without
the outputs only a block's own ops keep: read as none, a checkpoint frees its saved output only where the run holds
all its keepers, as before; and without the bytes before the first op: a run from it has no re-run moment; version 12 as 13, without
autocast's casts: read as none, a checkpoint frees a cast at its block's end, as before; version 13 as 14, without
where a checkpoint re-runs: read as not recorded, at its last block's first backward op, as before; version 14 as
15, without whether torch's selective checkpoint replays a block under autocast: read as it does, and its variants
keeping a cast as they are; version 15 as 16, its `output_kept_by` naming the block itself for outputs only its own
ops keep: planned as before, a checkpoint's re-run taking such a block's other outputs as its own ops' too, and
without the BatchNorm statistics its re-run copies: read as none, not counted, as before; version 16 as 17,
without whether a block writes a matmul's output in place: read as not, the matmul policy offered as before)."""
