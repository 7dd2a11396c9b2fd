"""One rank of a 2-rank gloo run for tests/test_distributed.py (issue 14): a GPT-2 trained under
DistributedDataParallel without a plan, and with a plan each rank makes on the bare model, applied before
wrapping and after.  Writes what the test checks as JSON: usage `dist_worker.py OUT.json` with RANK,
WORLD_SIZE and either REMAT_RENDEZVOUS_FILE (the tests: a file no rank has opened yet) or MASTER_ADDR and
MASTER_PORT (torchrun) set; `dist_worker.py OUT.json profile fsdp|ddp PLAN.json` profiles each rank of a wrapped
model and trains it with a plan (`main_profile`)."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import faulthandler
import hashlib
import json
import warnings
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import remat
from remat import zoo
from remat.applier.apply import applied
from remat.planner.problem import MAX_SEGMENT, Problem
from remat.planner.result import make_plan


HANG_S = 240
"""A rank still running after this long prints every thread's stack and exits (the test waits a little longer),
so a hang shows where it is instead of a bare timeout (CI once saw rank 1 of the DDP test never finish)."""


def _start() -> None:
    """Join the gloo group with a timeout shorter than HANG_S: a collective the other rank never joins raises.
    The tests meet through a file, not a TCP port: a port the test found free can be taken before rank 0 listens
    on it (by any process, or by rank 1's own socket connecting to it: a TCP self-connect), and then rank 0
    fails and rank 1 waits for a store that never answers.  That is one way to what CI saw twice, a rank that
    never finished; the port race is gone either way."""
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    timeout = datetime.timedelta(seconds=HANG_S // 2)
    if "REMAT_RENDEZVOUS_FILE" in os.environ:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{os.environ['REMAT_RENDEZVOUS_FILE']}",
            timeout=timeout,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    else:
        dist.init_process_group("gloo", timeout=timeout)


def _finish(out: str, result: dict) -> None:
    """Write this rank's result, then leave the group together: a barrier first (torch's advice against
    destroy_process_group hanging when one rank tears down while the other is still in a collective)."""
    with open(out, "w") as f:
        json.dump(result, f)
    print(f"rank {result['rank']}: result written", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {result['rank']}: group destroyed", flush=True)


def _grads(ddp, inputs) -> dict[str, torch.Tensor]:
    ddp.module.zero_grad(set_to_none=True)
    torch.manual_seed(dist.get_rank())  # the same dropout masks in every run of this rank
    ddp(**inputs).loss.backward()
    return {n: p.grad.clone() for n, p in ddp.module.named_parameters()}


def _untimed(prof):
    """The profile with FLOPs as the cost: each rank measures its own seconds, and among plans of equal peak
    two ranks' clocks could pick two plans (seen: a rank waiting forever in DDP's allreduce for the other's
    buckets).  A job plans once and gives every rank the plan, or plans a rank of it (NOTE [A rank's step])."""
    return dataclasses.replace(prof, timing="")


def _diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def main(out: str) -> None:
    _start()
    rank = dist.get_rank()
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    inputs = {k: (v + rank) % 256 for k, v in inputs.items()}  # each rank its own batch
    prof = _untimed(remat.profile(copy.deepcopy(model), inputs))  # the bare model, as a user plans on one machine
    plan = remat.plan(prof, remat.frontier(prof)[-1].peak_bytes)
    reference = _grads(DistributedDataParallel(copy.deepcopy(model)), inputs)
    before = copy.deepcopy(model)
    remat.apply(before, plan)  # plan, then wrap
    planned_before = _grads(DistributedDataParallel(before), inputs)
    after = DistributedDataParallel(copy.deepcopy(model))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        remat.apply(after, plan)  # wrap, then plan: the names are `module.…` here
    buckets_warned = [str(w.message) for w in seen if "gradient buckets" in str(w.message)]
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
        "buckets_warned": buckets_warned,
    }
    _finish(out, result)


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

    _start()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank = dist.get_rank()
    model, inputs = zoo.gpt2(n_layer=3, n_embd=64, n_head=2, seq=32, batch=2, vocab=256)
    inputs = {k: (v + rank) % 256 for k, v in inputs.items()}
    prof = _untimed(remat.profile(copy.deepcopy(model), inputs))
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
    try:  # the chen recipe's runs over FSDP units: refused too (it used to fail inside the step, DTensor mixed)
        remat.apply(after, "chen")
        recipe_refused = ""
    except remat.RematError as e:
        recipe_refused = str(e)
    result = {
        "rank": rank,
        "segments": [list(s) for s in plan.segments] + [[n] for n in plan.selective],
        "classes": sorted({type(m).__name__ for m in after.transformer.h}),
        "before": _diff(reference, planned_before),
        "after": _diff(reference, planned_after),
        "run_refused": run_refused,
        "recipe_refused": recipe_refused,
    }
    _finish(out, result)


def profiled_model():
    """The model and global batch of the per-rank profile runs (`main_profile`); tests predict it too."""
    return zoo.gpt2(n_layer=4, n_embd=256, n_head=4, seq=128, batch=4, vocab=2048)


def adamw(params):
    return torch.optim.AdamW(params)


def _wrapped(kind: str, model, mesh):
    return _sharded(model, mesh) if kind == "fsdp" else DistributedDataParallel(model)


def _process_peak(wrapped, inputs) -> int:
    from remat.measure.loop import Loop
    from remat.verifier.process import loop_peak_bytes

    bare = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
    return loop_peak_bytes(wrapped, inputs, None, adamw(bare.parameters()), Loop()).peak_bytes


def _rank_grads(wrapped, inputs) -> dict[str, torch.Tensor]:
    bare = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
    bare.zero_grad(set_to_none=True)
    wrapped(**inputs).loss.backward()
    grads = {n: p.grad for n, p in bare.named_parameters()}
    return {n: (g.full_tensor() if hasattr(g, "full_tensor") else g).clone() for n, g in grads.items()}


def main_profile(out: str, kind: str, plan_path: str) -> None:
    """Each rank profiles its own step of the wrapped model, measures it by the process (VmHWM), and trains with
    the plan the test predicted from one process: measured again, and its gradients against the unplanned run's."""
    from torch.distributed.device_mesh import init_device_mesh

    _start()
    rank, mesh = dist.get_rank(), init_device_mesh("cpu", (dist.get_world_size(),))
    model, inputs = profiled_model()
    inputs = {k: v.chunk(dist.get_world_size())[rank] for k, v in inputs.items()}  # this rank's share
    plain = _wrapped(kind, copy.deepcopy(model), mesh)
    prof = remat.profile(plain, inputs, optimizer=adamw)
    result = {
        "rank": rank,
        "peak": prof.peak_bytes,
        "param_bytes": prof.param_bytes,
        "grad_bytes": prof.grad_bytes,
        "optimizer_bytes": prof.optimizer_bytes,
        "gathered": prof.at_peak.gathered_bytes,
        "parallel": [prof.parallel, prof.world_size, prof.rank],
        "names": [b.name for b in prof.blocks],
        "process_peak": _process_peak(plain, inputs),
    }
    planned = _wrapped(kind, copy.deepcopy(model), mesh)
    remat.apply(planned, remat.load_plan(plan_path))
    torch.manual_seed(0)
    reference = _rank_grads(_wrapped(kind, copy.deepcopy(model), mesh), inputs)
    torch.manual_seed(0)
    result["planned_diff"] = _diff(reference, _rank_grads(planned, inputs))
    result["planned_process_peak"] = _process_peak(planned, inputs)
    _finish(out.format(rank=rank), result)  # OUT may hold {rank}: one path for every rank (torchrun)


if __name__ == "__main__":
    if sys.argv[2:3] == ["profile"]:
        main_profile(sys.argv[1], *sys.argv[3:5])
    else:
        (main_fsdp if sys.argv[2:] == ["fsdp"] else main)(sys.argv[1])
