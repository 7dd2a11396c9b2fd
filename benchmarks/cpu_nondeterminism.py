"""How often a CPU step's gradients differ from run to run, and what `remat.verify` says of a plan then
(NOTE [A step that does not replay itself], Rule 3, in `remat.verifier.replay`).

    python benchmarks/cpu_nondeterminism.py                # ~4 min on 2 cores
    python benchmarks/cpu_nondeterminism.py --verifies 4 --no-write

The backward of an index with repeated indices (`index_put_` accumulating) adds into each element from several
threads, in the order they reach it.  Measured with a second process spinning on one core (a busy machine) and
without it: (1) `B[ids]` for 128 ids into 4 rows of 256, its backward run RUNS times, how many gave other gradients
than the first, with and without `torch.use_deterministic_algorithms(True)`; (2) gpt-oss (3 layers, its expert
biases gathered per token), its unplanned step run STEPS times from one seed, how many differed from the first; and
`remat.verify` of its least-memory plan, how many were judged again with deterministic kernels and how many ok.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402
from unseen_models import build  # noqa: E402

import remat  # noqa: E402
from remat.verifier.replay import deterministic_kernels  # noqa: E402

RUNS, STEPS = 3000, 30


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(on: bool):
    """A second process spinning on one core while inside, where `on`."""
    spinner = multiprocessing.get_context("fork").Process(target=_spin, daemon=True) if on else None
    if spinner:
        spinner.start()
    try:
        yield
    finally:
        if spinner:
            spinner.kill()
            spinner.join()


def index_backward(deterministic: bool) -> int:
    """Of RUNS backwards of `B[ids]`, how many gave other gradients than the first."""
    torch.manual_seed(0)
    ids, grad = torch.randint(0, 4, (128,)), torch.randn(128, 256)
    table = torch.zeros(4, 256, requires_grad=True)
    runs = []
    with deterministic_kernels() if deterministic else contextlib.nullcontext():  # as remat.verify sets them
        for _ in range(RUNS):
            (table[ids] * grad).sum().backward()
            runs.append(table.grad)
            table.grad = None
    return sum(not torch.equal(g, runs[0]) for g in runs[1:])


def gpt_oss_steps() -> int:
    """Of STEPS runs of gpt-oss's unplanned step from one seed, how many differed from the first."""
    model, inputs = build("gpt_oss")
    runs = []
    for _ in range(STEPS):
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
        runs.append({n: p.grad for n, p in model.named_parameters()})
    return sum(any(not torch.equal(g[n], runs[0][n]) for n in g) for g in runs[1:])


def gpt_oss_verifies(times: int) -> tuple[int, int, list[float]]:
    """Of `times` verifies of gpt-oss's least-memory plan: how many judged again with deterministic kernels, how many
    ok, and the first runs' differences where judged again."""
    model, inputs = build("gpt_oss")
    plan = remat.plan(prof := remat.profile(model, inputs), remat.frontier(prof, max_points=2)[-1].peak_bytes)
    again, ok, moved = 0, 0, []
    for _ in range(times):
        report = remat.verify(model, inputs, plan, time_rounds=0)
        ok += report.ok
        if getattr(report, "grad_deterministic_diff", None) is not None:  # remat before fe85e11 has none
            again += 1
            moved.append(max(report.grad_max_abs_diff.values()))
    return again, ok, moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifies", type=int, default=12, help="verifies of gpt-oss's plan per load (default 12)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    info, rows, data = machine_info(), [], []
    for load in (False, True):
        with busy(load):
            r = {
                "load": load,
                "index": index_backward(False),
                "index_deterministic": index_backward(True),
                "gpt_oss_steps": gpt_oss_steps(),
            }
            r["judged_again"], r["ok"], r["first_diffs"] = gpt_oss_verifies(args.verifies)
        data.append(r)
        rows.append(
            [
                "a second process spinning" if load else "idle",
                f"{r['index']} of {RUNS - 1}",
                f"{r['index_deterministic']} of {RUNS - 1}",
                f"{r['gpt_oss_steps']} of {STEPS - 1}",
                f"{r['judged_again']} of {args.verifies}"
                + (f" ({max(r['first_diffs']):.2g})" if r["first_diffs"] else ""),
                f"{r['ok']} of {args.verifies}",
            ]
        )
        print(rows[-1], flush=True)
    headers = [
        "machine",
        "B[ids] backward differs",
        "same, deterministic kernels",
        "gpt-oss step differs",
        "verify judged again (largest first difference)",
        "verify ok",
    ]
    table = md_table(headers, rows)
    print(table)
    if not args.no_write:
        command = "python benchmarks/cpu_nondeterminism.py" + (f" --verifies {args.verifies}" * (args.verifies != 12))
        write_results(
            "cpu_nondeterminism",
            "Gradients that differ from run to run on CPU",
            info,
            command,
            [("Results", table)],
            data,
        )


if __name__ == "__main__":
    main()
