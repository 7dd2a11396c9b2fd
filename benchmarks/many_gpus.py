"""Issue 14: remat on many GPUs.  One rank of N predicted from one process, held against real ranks, and
Llama 3 70B on 64 GPUs predicted from this laptop-sized machine.

1. For FSDP2 (per block, torchtitan's wrapping) and DDP: `remat.profile(..., mode="fake", world_size=2)` predicts
   one rank here, with no process group; a plan is made from the prediction (half-way between its least peak and
   the unplanned one); then 2 ranks train for real on CPU with gloo (tests/dist_worker.py under
   torch.distributed.run), each profiling its own step (remat's tracker), measuring it by its own process
   (VmHWM, NOTE [Measuring a step by the process]), and training again with the plan (measured, gradients
   compared with the unplanned run's).
2. Llama 3 70B (Hugging Face LlamaForCausalLM built on the meta device, no weights), FSDP2 per block with bf16
   parameters and fp32 gradient reduction as torchtitan trains it, 64 ranks, local batch 1 x 8192 tokens, AdamW,
   predicted for CUDA (simulated: 512-byte rounding).  Unplanned, the least-memory plan, and the cheapest plan
   for an 80 GB GPU.

    python benchmarks/many_gpus.py             # about 5 min on 2 cores
    python benchmarks/many_gpus.py --skip-70b  # part 1 only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat.procmem import PROCESS_ENV  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from dist_worker import adamw, profiled_model  # noqa: E402

MiB, GiB = 2**20, 2**30
WORKER = ROOT / "tests" / "dist_worker.py"
A100_BYTES = 80 * 10**9  # "80 GB" as sold: 74.5 GiB


def two_ranks(wrap: str, workdir: Path) -> dict:
    """Part 1 for one wrapping: the prediction, the plan, and what each real rank measured."""
    model, inputs = profiled_model()
    predicted = remat.profile(model, inputs, optimizer=adamw, mode="fake", world_size=2, wrap=wrap)
    budget = (remat.frontier(predicted)[-1].peak_bytes + predicted.peak_bytes) // 2
    plan = remat.plan(predicted, budget)
    plan.save(workdir / f"{wrap}_plan.json")
    out = workdir / f"{wrap}_rank{{rank}}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(WORKER),
        str(out),
        "profile",
        wrap,
        str(workdir / f"{wrap}_plan.json"),
    ]
    env = {**os.environ, **PROCESS_ENV, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise RuntimeError(f"the 2-rank run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    ranks = [json.loads(Path(str(out).format(rank=r)).read_text()) for r in range(2)]
    return {
        "wrap": wrap,
        "predicted": _figures(predicted),
        "budget_bytes": budget,
        "plan_peak_bytes": plan.peak_bytes,
        "plan": plan.segments + [[n] for n in plan.selective],
        "ranks": ranks,
    }


def _figures(prof) -> dict:
    return {
        "peak_bytes": prof.peak_bytes,
        "peak_phase": prof.peak_phase,
        "param_bytes": prof.param_bytes,
        "grad_bytes": prof.grad_bytes,
        "optimizer_bytes": prof.optimizer_bytes,
        "at_peak": prof.at_peak.as_dict(),
    }


def _torchtitan_fsdp(model, mesh):
    """FSDP2 as torchtitan wraps a Llama: bf16 compute, fp32 reduce-scatter, each layer a unit, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    return fully_shard(model, mesh=mesh, mp_policy=mp)


def _predict(model, world_size: int, seq: int, wrap=_torchtitan_fsdp):
    """The step on `world_size` simulated GPUs, one sequence a rank, AdamW, fake mode."""
    tokens = torch.zeros(world_size, seq, dtype=torch.long)  # the global batch: 1 sequence per rank
    return remat.profile(
        model,
        {"input_ids": tokens, "labels": tokens},
        optimizer=lambda ps: torch.optim.AdamW(ps),
        mode="fake",
        device="cuda",
        world_size=world_size,
        wrap=wrap,
    )


def llama3_70b(world_size: int = 64, seq: int = 8192) -> dict:
    """Part 2: Llama 3 70B on `world_size` GPUs, predicted here."""
    import transformers as tf

    cfg = tf.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=seq,
        rope_theta=500000.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    t0 = time.perf_counter()
    prof = _predict(model, world_size, seq)
    predict_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    least = remat.frontier(prof)[-1]
    fits = remat.plan(prof, A100_BYTES)
    plan_s = time.perf_counter() - t0
    # the planned step predicted again (its breakdown, its peak against the plan's): the plan applied to the copy
    # before sharding, as torchtitan applies its checkpointing
    planned = _predict(model, world_size, seq, lambda copy, mesh: _torchtitan_fsdp(remat.apply(copy, least), mesh))
    recomputed = lambda p: sum(len(s) for s in p.segments) + len(p.selective)  # noqa: E731
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "world_size": world_size,
        "seq": seq,
        "unplanned": _figures(prof),
        "least_planned": _figures(planned),
        "least_peak_bytes": least.peak_bytes,
        "least_blocks": recomputed(least),
        "least_recompute_flops": least.recompute_flops,
        "a100_plan_peak_bytes": fits.peak_bytes,
        "a100_plan_blocks": recomputed(fits),
        "a100_recompute_flops": fits.recompute_flops,
        "step_flops": prof.forward_flops + prof.backward_flops,
        "predict_s": predict_s,
        "plan_s": plan_s,
    }


def _rank_table(parts: list[dict]) -> str:
    rows = []
    for part in parts:
        pred = part["predicted"]["peak_bytes"]
        for r in part["ranks"]:
            rows.append(
                [
                    part["wrap"].upper(),
                    r["rank"],
                    f"{pred / MiB:,.2f}",
                    f"{r['peak'] / MiB:,.2f}",
                    f"{(pred - r['peak']) / r['peak']:+.2%}",
                    f"{r['process_peak'] / MiB:,.2f}",
                    f"{(pred - r['process_peak']) / r['process_peak']:+.2%}",
                    f"{part['budget_bytes'] / MiB:,.2f}",
                    f"{r['planned_process_peak'] / MiB:,.2f}",
                    "yes" if r["planned_diff"] == 0.0 else "no",
                ]
            )
    return md_table(
        [
            "wrap",
            "rank",
            "predicted here MiB",
            "rank's profile MiB",
            "diff",
            "rank's process MiB",
            "diff",
            "plan budget MiB",
            "planned, process MiB",
            "same gradients",
        ],
        rows,
    )


def _parts(figures: dict) -> str:
    return ", ".join(f"{k} {v / GiB:,.2f}" for k, v in figures["at_peak"].items() if v >= GiB / 100)


def _llama_table(r: dict) -> str:
    u, planned = r["unplanned"], r["least_planned"]
    rows = [
        ["unplanned", f"{u['peak_bytes'] / GiB:,.1f}", "0", _parts(u)],
        [
            "least-memory plan",
            f"{r['least_peak_bytes'] / GiB:,.1f}",
            r["least_blocks"],
            f"{r['least_recompute_flops'] / r['step_flops']:.0%} more FLOPs",
        ],
        [
            "least-memory plan applied, predicted again",
            f"{planned['peak_bytes'] / GiB:,.1f}",
            r["least_blocks"],
            _parts(planned),
        ],
        [
            "cheapest plan under 80 GB",
            f"{r['a100_plan_peak_bytes'] / GiB:,.1f}",
            r["a100_plan_blocks"],
            f"{r['a100_recompute_flops'] / r['step_flops']:.0%} more FLOPs",
        ],
    ]
    return md_table(["Llama 3 70B, one rank of 64", "peak GiB", "blocks recomputed", "at the peak (GiB) / cost"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-70b", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine_info(threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        parts = [two_ranks(wrap, Path(tmp)) for wrap in ("fsdp", "ddp")]
    sections = [("Two ranks on CPU (gloo): predicted from one process vs each rank", _rank_table(parts))]
    print(sections[-1][1], flush=True)
    data = {"two_ranks": parts}
    if not args.skip_70b:
        data["llama3_70b"] = llama3_70b()
        sections.append(("Llama 3 70B on 64 GPUs, predicted here", _llama_table(data["llama3_70b"])))
        print(sections[-1][1])
    command = "python benchmarks/many_gpus.py" + (" --skip-70b" if args.skip_70b else "")
    write_results(
        "many_gpus", "remat on many GPUs: one rank of N predicted from one process", info, command, sections, data
    )


if __name__ == "__main__":
    main()
