"""One rank of a 2-rank gloo run of Hugging Face Accelerate for tests/test_integrations_accelerate.py (issue 37):
a GPT-2 trained 3 steps through `accelerator.prepare` without a plan, then again from the same weights with the plan
given (made in one process, for one rank of 2) applied before `prepare`.  Usage `accelerate_worker.py OUT.json
PLAN.json`, with RANK, WORLD_SIZE and REMAT_RENDEZVOUS_FILE set (tests/test_distributed.py's `run_ranks`).  On CPU
Accelerate runs the ranks as DistributedDataParallel (its FSDP needs GPUs); docs/integrations.md has FSDP2."""

from __future__ import annotations

import os
import sys

import torch

from dist_worker import _finish, _start  # the same rendezvous through a file, and the same teardown
from trainer_runs import gpt2

STEPS = 3
LOCAL_BATCH = 2
SEQ = 64


def _train(accelerator, plan) -> tuple[dict[str, torch.Tensor], bool]:
    """(parameters after STEPS steps, whether the prepared model follows `plan`) of a fresh `gpt2(2)`."""
    import remat
    from remat.applier import applied

    model = gpt2(n_layer=2)
    if plan is not None:
        remat.apply(model, plan)  # before prepare: Accelerate wraps the model the plan already runs in
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    rank = accelerator.process_index
    ids = torch.randint(0, 512, (STEPS, 2 * LOCAL_BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(100 + rank)  # each rank its own dropout masks, the same in both runs
    for step in range(STEPS):
        batch = ids[step, rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
        accelerator.backward(model(input_ids=batch, labels=batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    bare = accelerator.unwrap_model(model)
    return {n: p.detach().clone() for n, p in bare.named_parameters()}, plan is not None and applied(model) is plan


def main(out: str, plan_path: str) -> None:
    _start()
    os.environ["LOCAL_RANK"] = os.environ["RANK"]  # one machine: Accelerate reads these, the group is started
    os.environ["LOCAL_WORLD_SIZE"] = os.environ["WORLD_SIZE"]
    torch.set_num_threads(1)
    from accelerate import Accelerator

    import remat

    accelerator = Accelerator(cpu=True)
    unplanned, _ = _train(accelerator, None)
    planned, follows = _train(accelerator, remat.load_plan(plan_path))
    _finish(
        out,
        {
            "rank": accelerator.process_index,
            "distributed_type": str(accelerator.distributed_type),
            "follows_plan": follows,
            "differing": sorted(n for n in unplanned if not torch.equal(unplanned[n], planned[n])),
            "trained": sum(not torch.equal(p, q) for p, q in zip(unplanned.values(), gpt2(n_layer=2).parameters())),
            "parameters": len(unplanned),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
