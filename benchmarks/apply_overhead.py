"""What `remat.apply` costs per step beyond the recomputation itself.

Two pairs of identical work, timed interleaved (MEASURING.md: the median over rounds of the
ratio within each round, after warm-up):

1. keep: the unplanned step against the same model after `remat.apply(model, plan)` with a
   plan whose every decision is `keep` (remat installs nothing then; this measures the noise).
2. wrapper: every block checkpointed by torch's own `checkpoint_wrapper` (non-reentrant)
   against every block checkpointed by `remat.apply(model, "every-block")` — the same
   recomputation, so any difference is remat's wrapper (a Python closure per call).

On a 64-block chain of small blocks, where per-call overhead is most visible, and on a
GPT-2 built from a config.  Target (issue 4): within 2%.

    python benchmarks/apply_overhead.py [--rounds N] [--quick]

Writes benchmarks/results/apply_overhead.md and .json (dated, machine, torch, threads).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn

import remat
from remat import zoo
from remat._torch_compat import fsdp_checkpoint_wrapper
from remat.planner import baseline_plans

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, timed, write_results  # noqa: E402
from _models import Switch, replace_submodule, unwrap_checkpoints  # noqa: E402


def small_chain(blocks: int = 64, width: int = 256, batch: int = 256):
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width)) for _ in range(blocks)]
    )
    return model, torch.randn(batch, width)


def step(model: nn.Module, inputs) -> None:
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    loss = out.loss if hasattr(out, "loss") else out.float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


def torch_every_block(model: nn.Module, blocks: list[str]) -> nn.Module:
    """A copy-free torch baseline: each block replaced by checkpoint_wrapper(block) in its parent."""
    for name in blocks:
        replace_submodule(model, name, fsdp_checkpoint_wrapper(model.get_submodule(name)))
    return model


def pair(model, inputs, a: Switch, b: Switch, rounds: int) -> dict:
    """Median over rounds of time(B) / time(A), the order A, B / B, A alternating; one warm-up round first."""
    ratios, a_s, b_s = [], [], []

    def run(s: Switch) -> float:
        s.on()
        try:
            return timed(partial(step, model, inputs))
        finally:
            s.off()

    for r in range(rounds + 1):
        if r % 2:  # alternate which goes first, so that drift and cache warmth hit both alike
            tb, ta = run(b), run(a)
        else:
            ta, tb = run(a), run(b)
        if r:  # round 0 warms up
            ratios.append(tb / ta)
            a_s.append(ta)
            b_s.append(tb)
    return {
        "a": a.name,
        "b": b.name,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "a_median_s": statistics.median(a_s),
        "b_median_s": statistics.median(b_s),
        "ratios": ratios,
    }


def nothing() -> None:
    pass


def measure(model, inputs, rounds: int) -> dict[str, dict]:
    """The two pairs on one model: keep-everything plan vs no plan, remat's wrapper vs torch's."""
    prof = remat.profile(model, inputs)
    keep = remat.plan(prof, 1.0)
    assert set(keep.decisions.values()) == {"keep"}
    blocks = [seg[0] for seg in baseline_plans(prof)["every-block"].segments]

    def remove():
        remat.remove(model)

    return {
        "keep": pair(
            model,
            inputs,
            Switch("no plan", nothing, nothing),
            Switch("remat keep-everything plan", lambda: remat.apply(model, keep), remove),
            rounds,
        ),
        "wrapper": pair(
            model,
            inputs,
            Switch(
                "torch checkpoint_wrapper on every block",
                lambda: torch_every_block(model, blocks),
                lambda: unwrap_checkpoints(model),
            ),
            Switch('remat.apply(model, "every-block")', lambda: remat.apply(model, "every-block"), remove),
            rounds,
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="5 rounds, smaller models (a smoke test)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds = 5 if args.quick else args.rounds
    info = machine_info(args.threads)
    batch, gpt_batch = (64, 2) if args.quick else (256, 8)
    cases = {
        f"64-block chain [Linear 256, GELU, Linear 256], batch {batch}": small_chain(batch=batch),
        f"HF GPT-2 (zoo.gpt2: 4 x 256, seq 256, batch {gpt_batch})": zoo.gpt2(batch=gpt_batch),
    }
    rows, data = [], {}
    for label, (model, inputs) in cases.items():
        results = measure(model, inputs, rounds)
        for name, res in results.items():
            verdict = "met" if abs(res["ratio_median"] - 1) <= 0.02 else "**missed**"
            rows.append(
                [
                    label,
                    f"{res['b']} / {res['a']}",
                    f"{res['a_median_s']:.3f}",
                    f"{res['b_median_s']:.3f}",
                    f"{res['ratio_median']:.3f}",
                    f"{res['ratio_min']:.3f}–{res['ratio_max']:.3f}",
                    f"within 2%: {verdict}",
                ]
            )
            data[f"{label} | {name}"] = res
        print(
            f"{label}: keep {results['keep']['ratio_median']:.3f}, wrapper {results['wrapper']['ratio_median']:.3f}",
            flush=True,
        )
    table = md_table(["model", "B / A", "A median s", "B median s", "median ratio", "range", "target"], rows)
    text = (
        f"{rounds} interleaved rounds after one warm-up round; each round times A and B (one forward + "
        "backward each; A first in even rounds, B first in odd ones); ratio = B / A within the round; "
        "median over rounds.\n\n" + table
    )
    path = write_results(
        "apply_overhead",
        "What remat.apply costs per step beyond the recomputation",
        info,
        "python benchmarks/apply_overhead.py" + (" --quick" if args.quick else ""),
        [("Results", text)],
        {"rounds": rounds, "results": data},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
