"""Does a compiled step's gradient belong to the loss it computed, with dropout?  torch.compile's activation memory
budget below 1.0 may recompute dropout in the backward graph with other random numbers than the forward's
(pytorch/pytorch#190758); remat's plans that set that budget keep what each random op drew (NOTE [The compiler's
budget as a plan], Rule 5).  For each configuration, in float64 with the same random numbers in every forward (the
seed set before each): the gradient's product with a random direction against the loss's central finite difference
along it.  A right gradient agrees to about 1e-8; a re-drawn mask is off by percents.

    python benchmarks/compile_rng.py            # the peers' GPT-2 (6 layers, dropout 0.1): ~4 min on 2 cores
    python benchmarks/compile_rng.py --quick    # 2 layers
    python benchmarks/compile_rng.py --device cuda --out compile_rng_cuda   # on a GPU (Inductor's Triton kernels)
    python benchmarks/compile_rng.py --peaks    # what keeping the masks costs: peak and seconds, ~5 min
    python benchmarks/compile_rng.py --peaks --peers-size --budgets 1,0.95,0.9 --rounds 3
                                                # the same on the peers' GPT-2 (6x128, seq 128, batch 4)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402

import remat  # noqa: E402
from remat import compiled_plans, zoo  # noqa: E402
from remat._torch_compat.compiler import activation_memory_budget  # noqa: E402
from remat.applier import compiler_budget  # noqa: E402

PEERS_GPT2 = dict(n_layer=6, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048)
"""The peers harness's default GPT-2 (benchmarks/peers)."""


EPS = 1e-6
"""The finite difference's step along the direction (float64: its error is about 1e-8 of the derivative)."""


def gradient_error(model, compiled, loss_of) -> float:
    """|grad . v - finite difference along v| / |finite difference| for the loss `loss_of(compiled)`, the
    gradients of its second step (compiled and warm), every forward from seed 1."""

    def loss():
        torch.manual_seed(1)  # the same dropout masks in every forward
        return loss_of(compiled)

    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        loss().backward()
    torch.manual_seed(7)
    direction = [torch.randn_like(p) for p in params]
    along = sum((p.grad * d).sum() for p, d in zip(params, direction) if p.grad is not None).item()
    ends = []
    for sign in (1, -2):  # the loss at +EPS, then at -EPS along the direction
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(sign * EPS * d)
        ends.append(loss().item())
    with torch.no_grad():  # back where it was
        for p, d in zip(params, direction):
            p.add_(EPS * d)
    finite = (ends[0] - ends[1]) / (2 * EPS)
    return abs(along - finite) / abs(finite)


def _gpt2(n_layer: int, device: str):
    """The peers' GPT-2 in float64, its loss computed here in float64 (Hugging Face's casts logits to float32)."""
    model, x = zoo.gpt2(**{**PEERS_GPT2, "n_layer": n_layer})
    ids = x["input_ids"].to(device)

    def loss_of(step):
        logits = step(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return model.to(device).double().train(), ids, loss_of


CONFIGS = [
    ("torch.compile", 1.0, ""),
    ("torch.compile, activation_memory_budget 0.5", 0.5, ""),
    ("torch.compile, activation_memory_budget 0.1", 0.1, ""),
    ("remat's least-memory plan, then torch.compile", 1.0, "least"),
    ("remat's plan of torch.compile's budget 0.5", 0.5, "budget"),
    ("remat's plan of torch.compile's budget 0.1", 0.1, "budget"),
    ("remat's least-memory plan and torch.compile's budget 0.5", 0.5, "least"),
]
"""(row, budget, remat's plan): torch.compile's own budget set by hand where no plan; remat.apply sets the plan's
budget (`Plan.compiler_budget`), keeping the random numbers (NOTE [The compiler's budget as a plan], Rule 5)."""


def run(n_layer: int, device: str = "cpu") -> list[dict]:
    rows = []
    for name, budget, planned in CONFIGS:
        torch._dynamo.reset()
        model, ids, loss_of = _gpt2(n_layer, device)
        compiled = torch.compile(model)
        plan = ""
        if planned:
            prof = remat.profile(model, {"input_ids": ids}, loss_fn=lambda out: out.logits.sum())
            chosen = remat.frontier(prof)[-1] if planned == "least" else remat.plan(prof, prof.peak_bytes)
            remat.apply(compiled, dataclasses.replace(chosen, compiler_budget=budget))
            plan = f"{len(chosen.segments)} checkpoints + {len(chosen.selective)} selective, compiler budget {budget:g}"
        with activation_memory_budget(1.0 if planned else budget):
            error = gradient_error(model, compiled, loss_of)
        rows.append({"config": name, "budget": budget, "plan": plan, "error": error})
        print(f"{name}: {error:.1e}", flush=True)
    return rows


def peaks(budgets: list[float], rounds: int = 2, size: dict | None = None) -> list[dict]:
    """What keeping the random numbers costs: `remat.zoo.gpt2(**size)` (float32, dropout 0.1) compiled with remat's
    plan of each budget and measured by remat's counter (a forked copy: its peak, the fastest of its steps), the masks
    kept (as `remat.apply` sets the budget) and re-drawn (the keeping switched off: torch's own budget), interleaved."""
    model, x = zoo.gpt2(**(size or {}))
    compiled = torch.compile(model.train())

    def loss_fn(out):
        return out.loss

    prof = remat.profile(compiled, x, loss_fn=loss_fn)
    rows = []
    for budget in budgets:
        for _ in range(rounds):
            for kept in (True, False):
                with _keeping(kept):
                    plan = compiled_plans.compiler_plan(prof, prof.peak_bytes, budget)
                    m, _ = compiled_plans.measure_compiled(compiled, plan, (x, loss_fn, None))
                rows.append({"budget": budget, "kept": kept, "peak_mib": m.peak_bytes / 2**20, "step_s": m.step_s})
                print(rows[-1], flush=True)
    return rows


@contextlib.contextmanager
def _keeping(kept: bool):
    """remat's budget as it is (`kept`), or with the keeping of random numbers switched off."""
    saved = compiler_budget.random_numbers_kept
    compiler_budget._CALLS.clear()  # each compiles afresh
    if not kept:
        compiler_budget.random_numbers_kept = contextlib.nullcontext
    try:
        yield
    finally:
        compiler_budget.random_numbers_kept = saved


def _peaks_body(rows: list[dict], size: dict | None) -> str:
    table = md_table(
        ["torch.compile budget", "dropout's masks", "peak MiB (each round)", "step ms (each round)"],
        [
            [
                f"{b:g}",
                _masks(b, k),
                ", ".join(f"{r['peak_mib']:.1f}" for r in rows if (r["budget"], r["kept"]) == (b, k)),
                ", ".join(f"{r['step_s'] * 1e3:.0f}" for r in rows if (r["budget"], r["kept"]) == (b, k)),
            ]
            for b in dict.fromkeys(r["budget"] for r in rows)
            for k in (True, False)
        ],
    )
    return (
        f"{_gpt2_words(size)}, compiled with "
        "remat's plan of each budget and measured by remat's counter (a forked copy running the loop: the "
        "process's high-water mark, the fastest of its timed steps, one thread), kept and re-drawn interleaved."
        f"\n\n{table}"
    )


def _masks(budget: float, kept: bool) -> str:
    """What becomes of dropout's masks in one row: at 1.0 torch re-draws nothing and remat keeps nothing."""
    if budget >= 1.0:
        return "remat's plan (nothing to keep at 1.0)" if kept else "torch's own (nothing re-drawn at 1.0)"
    return "kept (remat's plan)" if kept else "torch's own (may re-draw)"


def _gpt2_words(size: dict | None) -> str:
    if size is None:
        return "`remat.zoo.gpt2()` (4 layers of 256, seq 256, batch 8, vocab 8192, dropout 0.1, float32)"
    return (
        f"the peers' GPT-2 ({size['n_layer']} layers of {size['n_embd']}, seq {size['seq']}, batch {size['batch']}, "
        f"vocab {size['vocab']}, dropout 0.1, float32)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the model runs (cuda on a GPU)")
    ap.add_argument("--peaks", action="store_true", help="what keeping the masks costs in peak and seconds instead")
    ap.add_argument("--out", default="", help="results/<out>.{md,json} (default compile_rng[_quick|_peaks])")
    ap.add_argument("--budgets", default="0.5,0.1", help="--peaks: torch.compile budgets, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="--peaks: interleaved rounds per budget")
    ap.add_argument("--peers-size", action="store_true", help="--peaks: the peers' GPT-2 instead of zoo.gpt2()'s")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    t0 = time.time()
    command = shlex.join(["python", "benchmarks/compile_rng.py", *sys.argv[1:]])
    if args.peaks:
        size = PEERS_GPT2 if args.peers_size else None
        rows = peaks([float(b) for b in args.budgets.split(",")], args.rounds, size)
        body = f"{_peaks_body(rows, size)}\n\nElapsed {time.time() - t0:.0f} s."
        title = "What keeping dropout's masks costs under torch.compile's budget"
        write_results(args.out or "compile_rng_peaks", title, machine_info(), command, [("Results", body)], rows)
        return
    n_layer = 2 if args.quick else 6
    rows = run(n_layer, args.device)
    table = md_table(
        ["configuration", "remat's plan", "gradient's error along v"],
        [[r["config"], r["plan"] or "—", f"{r['error']:.1e}"] for r in rows],
    )
    body = (
        f"GPT-2 ({n_layer} layers of 128, 4 heads, seq 128, batch 4, vocab 2048, dropout 0.1, float64) on "
        f"{args.device}, the "
        f"second step's gradients.\n\n{table}\n\ngradient's error along v = abs(grad . v - finite difference) / "
        f"abs(finite difference), v a random direction, the central finite difference of step {EPS:g} along it, "
        f"every forward from one seed (the same dropout masks).  Elapsed {time.time() - t0:.0f} s."
    )
    name = args.out or "compile_rng" + ("_quick" if args.quick else "")
    title = "Compiled gradients against the loss, with dropout"
    write_results(name, title, machine_info(), command, [("Results", body)], rows)


if __name__ == "__main__":
    main()
