"""A remat plan under Hugging Face Accelerate on 2 gloo ranks (issue 37): made in one process for one rank of 2
(`remat.profile(..., mode="fake", world_size=2, wrap="ddp")`), applied before `accelerator.prepare`, and the 3
steps each rank trains equal the unplanned run's to the bit (docs/integrations.md, Accelerate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import remat

from test_distributed import run_ranks  # tests/ is on the path
from trainer_runs import gpt2

pytest.importorskip("accelerate")

WORKER = Path(__file__).with_name("accelerate_worker.py")


def test_a_plan_for_one_rank_of_two_applied_before_prepare_trains_as_without_it(tmp_path):
    from accelerate_worker import LOCAL_BATCH, SEQ

    model = gpt2(n_layer=2)
    tokens = torch.zeros(2 * LOCAL_BATCH, SEQ, dtype=torch.long)  # the global batch of the 2 ranks
    prof = remat.profile(
        model,
        {"input_ids": tokens, "labels": tokens},
        optimizer=lambda ps: torch.optim.AdamW(ps),
        mode="fake",
        world_size=2,
        wrap="ddp",
    )
    assert prof.parallel == "ddp"
    least = remat.frontier(prof, max_points=2)[-1].peak_bytes
    plan = remat.plan(prof, (least + prof.peak_bytes) // 2)  # FLOPs its cost (a fake step is not timed)
    assert plan.segments or plan.selective
    plan.save(tmp_path / "plan.json")
    ranks = run_ranks(WORKER, tmp_path, args=[str(tmp_path / "plan.json")])
    for r in ranks:
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"  # Accelerate's DDP on CPU
        assert r["follows_plan"], r
        assert r["differing"] == [], r  # bit-equal parameters after 3 steps
        assert r["trained"] == r["parameters"] > 0, r


def test_why_not_accelerates_own_checkpointing_dropout_is_drawn_again_unless_remat_replays_it():
    """Accelerate's FSDP2 activation checkpointing (`fsdp2_apply_ac`, accelerate 1.15) wraps every layer in torch's
    `checkpoint_wrapper(layer, preserve_rng_state=False)`: the recomputation draws new dropout masks, so the
    gradients are not the unplanned step's.  remat's checkpoints replay the RNG: bit-equal."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(2))

    def gradients(model):
        model.train()
        torch.manual_seed(5)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}

    plain = gradients(gpt2(n_layer=2))
    wrapped = gpt2(n_layer=2)
    for i, layer in enumerate(wrapped.transformer.h):
        wrapped.transformer.h[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    planned = gpt2(n_layer=2)
    remat.apply(planned, "every-block")
    assert any(not torch.equal(g, plain[n]) for n, g in gradients(wrapped).items())
    assert all(torch.equal(g, plain[n]) for n, g in gradients(planned).items())
