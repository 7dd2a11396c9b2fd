"""One rank of a 2-rank gloo run for tests/test_distributed.py (issue 14): a GPT-2 trained under
DistributedDataParallel without a plan, and with a plan each rank makes on the bare model, applied before
wrapping and after.  Writes what the test checks as JSON: usage `dist_worker.py OUT.json` with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set."""

from __future__ import annotations

import copy
import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import remat
from remat import zoo
from remat.applier.apply import applied
from remat.planner.problem import MAX_SEGMENT, Problem
from remat.planner.result import make_plan


def _grads(ddp, inputs) -> dict[str, torch.Tensor]:
    ddp.module.zero_grad(set_to_none=True)
    torch.manual_seed(dist.get_rank())  # the same dropout masks in every run of this rank
    ddp(**inputs).loss.backward()
    return {n: p.grad.clone() for n, p in ddp.module.named_parameters()}


def _diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    inputs = {k: (v + rank) % 256 for k, v in inputs.items()}  # each rank its own batch
    prof = remat.profile(copy.deepcopy(model), inputs)  # the bare model, as a user plans on one machine
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    reference = _grads(DistributedDataParallel(copy.deepcopy(model)), inputs)
    before = copy.deepcopy(model)
    remat.apply(before, plan)  # plan, then wrap
    planned_before = _grads(DistributedDataParallel(before), inputs)
    after = DistributedDataParallel(copy.deepcopy(model))
    remat.apply(after, plan)  # wrap, then plan: the names are `module.…` here
    planned_after = _grads(after, inputs)
    applied_after = applied(after) is plan
    remat.remove(after)
    plain_again = _grads(after, inputs)
    plans, sums = [None, None], [None, None]
    what = json.dumps([plan.decisions, plan.segments, plan.selective, plan.peak_bytes])  # not its timings
    dist.all_gather_object(plans, hashlib.sha256(what.encode()).hexdigest())
    dist.all_gather_object(sums, sum(float(g.double().sum()) for g in reference.values()))
    result = {
        "rank": rank,
        "segments": [list(s) for s in plan.segments] + [[n] for n in plan.selective],
        "same_plan_on_every_rank": plans[0] == plans[1],
        "before": _diff(reference, planned_before),
        "after": _diff(reference, planned_after),
        "applied_after": applied_after,
        "removed": _diff(reference, plain_again),
        "synced": sums[0] == sums[1],  # DDP averaged the two ranks' gradients
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _full_grads(model, inputs) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(dist.get_rank())
    model(**inputs).loss.backward()
    return {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}


def _sharded(model, mesh):
    """FSDP2 as torchtitan wraps a decoder: each layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.transformer.h:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main_fsdp(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    inputs = {k: (v + rank) % 256 for k, v in inputs.items()}
    prof = remat.profile(copy.deepcopy(model), inputs)
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    reference = _full_grads(_sharded(copy.deepcopy(model), mesh), inputs)
    before = copy.deepcopy(model)
    remat.apply(before, plan)
    planned_before = _full_grads(_sharded(before, mesh), inputs)
    after = _sharded(copy.deepcopy(model), mesh)
    remat.apply(after, plan)  # the layers are FSDPGPT2Block here
    planned_after = _full_grads(after, inputs)
    remat.remove(after)
    problem = Problem.from_profile(prof, MAX_SEGMENT, None)
    layers = [f"transformer.h.{i}" for i in range(3)]
    try:  # one checkpoint over several FSDP units: refused before the step runs
        remat.apply(after, make_plan(prof, problem, [problem.unit(*layers)], "ilp", None))
        run_refused = ""
    except remat.RematError as e:
        run_refused = str(e)
    result = {
        "rank": rank,
        "segments": [list(s) for s in plan.segments] + [[n] for n in plan.selective],
        "classes": sorted({type(m).__name__ for m in after.transformer.h}),
        "before": _diff(reference, planned_before),
        "after": _diff(reference, planned_after),
        "run_refused": run_refused,
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    (main_fsdp if sys.argv[2:] == ["fsdp"] else main)(sys.argv[1])
