"""Each peer strategy applied to a Bench the way its users apply it, reversibly (on/off), so
that one process can interleave them for timing.  A strategy is described by a JSON-able
spec (`{"kind": ..., ...}`) so that the worker processes can rebuild it.

kinds:
  none                 no checkpointing
  every_block          HF models: `model.activation_checkpointing_enable(...)` (transformers 5.x);
                       others: `apply_activation_checkpointing(model, checkpoint_wrapper_fn=..., check_fn=...)`
                       on each of `bench.blocks`
  ckpt_seq, k          `torch.utils.checkpoint.checkpoint_sequential(bench.sequence, k, x)` as the forward
  chen                 Chen et al.'s sqrt(n): the sequence cut into segments of round(sqrt(n)), each one
                       `torch.utils.checkpoint.checkpoint` (all segments checkpointed)
  sac                  torchtitan-style selective op checkpointing per block: `checkpoint_wrapper(block,
                       context_fn=partial(create_selective_checkpoint_contexts, policy),
                       preserve_rng_state=False)` where the policy saves matmul-like outputs (mm, addmm,
                       bmm, baddbmm, convolution, scaled-dot-product attention) and recomputes the rest
  remat, plan          `remat.apply(model, plan)` / `remat.remove(model)`
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

import remat

from _models import unwrap_checkpoints

aten = torch.ops.aten

# torchtitan's `_save_list` idea ("save matmul outputs, recompute the rest"), for CPU kernels too.
SAC_SAVE = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
}


def _sac_policy(ctx, func, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if func in SAC_SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def sac_context_fn():
    return create_selective_checkpoint_contexts(_sac_policy)


LABELS = {
    "none": "no checkpointing",
    "every_block": "every block",
    "chen": "Chen sqrt(n)",
    "sac": "selective (SAC, save matmuls)",
}


def label(spec: dict) -> str:
    k = spec["kind"]
    if k in LABELS:
        return LABELS[k]
    if k == "ckpt_seq":
        return f"checkpoint_sequential({spec['k']})"
    if k == "remat":
        return spec["label"]
    if k == "compile":
        return f"torch.compile budget {spec['budget']:g}"
    raise ValueError(k)


def family(spec: dict) -> str:
    k = spec["kind"]
    if k == "remat":
        return "remat"
    if k == "ckpt_seq":
        return "checkpoint_sequential"
    return k


def applicable(bench, spec: dict) -> str | None:
    """None if the strategy applies to this model as its users apply it, else why not."""
    k = spec["kind"]
    if k in ("ckpt_seq", "chen") and bench.sequence is None:
        return bench.no_sequence_why
    if k == "ckpt_seq" and spec["k"] > len(bench.sequence(bench.model)):
        return "more segments than modules"
    return None


HOW = {
    "ckpt_seq": "forward = checkpoint_sequential(layers, k, x, use_reentrant=False)",
    "chen": "forward = checkpoint(segment, x, use_reentrant=False) per round(sqrt(n)) layers",
    "sac": "checkpoint_wrapper(block, context_fn=create_selective_checkpoint_contexts(policy), preserve_rng_state=False)",
    "remat": "remat.apply(model, remat.plan(profile, budget, solver))",
}


def how(bench, spec: dict) -> str:
    """One line: the API call used."""
    k = spec["kind"]
    if k == "every_block":
        if bench.hf:
            return "model.activation_checkpointing_enable(activation_checkpointing_kwargs={'use_reentrant': False})"
        return "apply_activation_checkpointing(model, checkpoint_wrapper (NO_REENTRANT), check_fn=block)"
    return HOW.get(k, "")


def rebuilt_plan(prof, **fields) -> remat.Plan:
    """An earlier run's plan rebuilt from what its results keep (`fields`: segments, selective, selective_keeps,
    offload, compiler_budget), on `prof`'s keep-everything plan: the same plan, not planned again."""
    return dataclasses.replace(remat.plan(prof, prof.peak_bytes), solver="recheck", **fields)


class Applied:
    """on()/off() for one spec on one Bench."""

    def __init__(self, bench, spec: dict):
        self.bench, self.spec = bench, spec
        self._plan = remat.Plan.from_json(spec["plan"]) if spec["kind"] == "remat" else None

    def on(self) -> None:
        b, k = self.bench, self.spec["kind"]
        m = b.model
        if k == "every_block" and b.hf:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif k == "every_block":
            _wrap_blocks(m, b.blocks, partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
        elif k == "sac":
            _wrap_blocks(
                m,
                b.blocks,
                partial(
                    checkpoint_wrapper,
                    checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                    context_fn=sac_context_fn,
                    preserve_rng_state=False,
                ),
            )
        elif k == "ckpt_seq":
            layers, segs = b.sequence(m), self.spec["k"]
            m.forward = lambda x: checkpoint_sequential(layers, segs, x, use_reentrant=False)
        elif k == "chen":
            m.forward = _chen_forward(b.sequence(m))
        elif k == "remat":
            remat.apply(m, self._plan)
        elif k != "none":
            raise ValueError(k)

    def off(self) -> None:
        b, k = self.bench, self.spec["kind"]
        m = b.model
        if k == "every_block" and b.hf:
            m.activation_checkpointing_disable()
        elif k in ("every_block", "sac"):
            unwrap_checkpoints(m)
        elif k in ("ckpt_seq", "chen"):
            del m.forward
        elif k == "remat":
            remat.remove(m)
        elif k != "none":
            raise ValueError(k)


def _wrap_blocks(model: nn.Module, blocks: list[str], wrapper) -> None:
    """apply_activation_checkpointing with `wrapper` on the modules named `blocks`."""
    targets = _targets(model, blocks)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda mod: id(mod) in targets)


def _chen_forward(layers: list[nn.Module]):
    """Chen et al.'s sqrt(n): the layers cut into segments of round(sqrt(n)), each one checkpoint."""
    size = max(1, round(math.sqrt(len(layers))))
    chunks = [layers[i : i + size] for i in range(0, len(layers), size)]

    def run(chunk, x):
        for layer in chunk:
            x = layer(x)
        return x

    def forward(x):
        for c in chunks:
            x = checkpoint(partial(run, c), x, use_reentrant=False)
        return x

    return forward


def _targets(model: nn.Module, names: list[str]) -> set[int]:
    found = {n: id(mod) for n, mod in model.named_modules() if n in set(names)}
    if len(found) != len(names):
        raise ValueError(f"blocks not in the model: {sorted(set(names) - set(found))[:3]}")
    return set(found.values())
