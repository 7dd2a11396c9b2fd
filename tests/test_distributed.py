"""remat under torch.distributed, 2 ranks on CPU with gloo, each in its own process (issue 14)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Path, tmp_path: Path, world_size: int = 2, timeout_s: int = 300, args=()) -> list[dict]:
    """Start `world_size` processes of `worker OUT.json *args`, wait for all, return what each wrote."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{r}.json" for r in range(world_size)]
    procs = [subprocess.Popen([sys.executable, str(worker), str(out), *args], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, out in enumerate(outs)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout_s)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank did not finish in {timeout_s} s")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def test_a_plan_made_on_the_bare_model_trains_under_ddp_before_or_after_wrapping(tmp_path):
    """Both ranks make the same plan on the bare model; applied before DistributedDataParallel wraps the model,
    or after (names `module.…`), the gradients equal the unplanned DDP run's to the bit, and remove restores it.
    Before, a plan was rejected on the DDP model ("the plan names modules this DistributedDataParallel does not
    have")."""
    ranks = run_ranks(WORKER, tmp_path)
    for r in ranks:
        assert r["segments"] and r["same_plan_on_every_rank"] and r["synced"]
        assert r["before"] == 0.0 and r["after"] == 0.0 and r["removed"] == 0.0
        assert r["applied_after"]


def test_a_plan_made_on_the_bare_model_trains_under_fsdp2_before_or_after_sharding(tmp_path):
    """FSDP2 (`fully_shard` on each layer, then the root, as torchtitan does): the plan made on the bare model
    applies before or after sharding, where the layers' class is FSDPGPT2Block (before: "GPT2Block in the plan,
    FSDPGPT2Block here"), with the unplanned sharded run's gradients to the bit.  One checkpoint over several
    FSDP units is refused at apply, with the fix."""
    for r in run_ranks(WORKER, tmp_path, args=["fsdp"]):
        assert r["segments"] and r["classes"] == ["FSDPGPT2Block"]
        assert r["before"] == 0.0 and r["after"] == 0.0
        assert r["run_refused"].startswith(
            "remat: the plan checkpoints transformer.h.0 .. transformer.h.2 as one run, but transformer.h.0, "
        ) and "Fix: plan with max_segment=1" in r["run_refused"]
