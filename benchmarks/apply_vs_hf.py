"""remat.apply at 50% of the peak next to Hugging Face's own gradient checkpointing and none.

For GPT-2 and BERT built from configs: measured peak (remat's tracker, real mode),
extra FLOPs (FlopCounterMode), step time as the median ratio to no checkpointing over
interleaved rounds (MEASURING.md), and whether gradients equal the unplanned model's.
Also the overhead of applying a plan whose every decision is `keep`.

    python benchmarks/apply_vs_hf.py [--quick] [--rounds N]

Writes benchmarks/results/apply_vs_hf.md and .json (`_quick` with --quick): date, machine, torch version, threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import remat
from remat import zoo
from remat._torch_compat import flop_formulas

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402
from _models import Switch  # noqa: E402

MIB = 2**20
TITLE = "remat.apply vs Hugging Face gradient checkpointing"


def step(model, inputs, opt):
    loss = model(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def flops(model, inputs):
    with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as fc:  # remat's formulas (GQA)
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops()


def grads(model, inputs):
    torch.manual_seed(0)
    model(**inputs).loss.backward()
    g = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return g


def variants(model, prof):
    try:
        plan50 = remat.plan(prof, 0.5)
    except remat.InfeasibleBudget as e:  # small models: the least memory any plan reaches
        plan50 = remat.plan(prof, e.min_bytes)
    keep = remat.plan(prof, 1.0)

    def hf_on():
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    return [
        Switch("no checkpointing", lambda: None, lambda: None),
        Switch("HF gradient checkpointing (every layer)", hf_on, model.activation_checkpointing_disable),
        Switch(
            f"remat at {plan50.budget_bytes / prof.peak_bytes:.0%} ({plan50.solver}, {len(plan50.segments)} checkpoints)",
            lambda: remat.apply(model, plan50),
            lambda: remat.remove(model),
        ),
        Switch("remat keep-everything plan", lambda: remat.apply(model, keep), lambda: remat.remove(model)),
    ], plan50


def measure(name, factory, rounds):
    model, inputs = factory()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: the weights stay put across rounds
    prof = remat.profile(model, inputs, optimizer=opt)
    vs, plan50 = variants(model, prof)
    ref_grads = grads(model, inputs)
    base_flops = flops(model, inputs)
    rows = []
    for v in vs:
        v.on()
        p = remat.profile(model, inputs, optimizer=opt)
        g = grads(model, inputs)
        rows.append(
            {
                "variant": v.name,
                "peak": p.peak_bytes,
                "extra_flops": flops(model, inputs) - base_flops,
                "grads_equal": all(torch.equal(a, b) for a, b in zip(g, ref_grads)),
            }
        )
        v.off()
    times = {v.name: [] for v in vs}
    for _ in range(2):  # warm-up
        for v in vs:
            v.on()
            step(model, inputs, opt)
            v.off()
    for _ in range(rounds):
        for v in vs:
            v.on()
            t0 = time.perf_counter()
            step(model, inputs, opt)
            times[v.name].append(time.perf_counter() - t0)
            v.off()
    base = times[vs[0].name]
    for row in rows:
        ratios = [t / b for t, b in zip(times[row["variant"]], base)]
        row["time_ratio"] = statistics.median(ratios)
    return name, prof, plan50, rows


SIZES = {  # GPT-2's; BERT's the same in its own words
    "full": dict(n_layer=4, n_embd=256, n_head=4, seq=256, batch=8, vocab=8192),
    "quick": dict(n_layer=2, n_embd=128, n_head=4, seq=128, batch=4, vocab=2048),
}


def _section(name: str, prof, plan50, rows: list[dict]) -> tuple[str, str]:
    head = (
        f"{name} ({prof.model}, unplanned peak {prof.peak_bytes / MIB:,.1f} MiB with AdamW; remat's budget: "
        f"{plan50.budget_bytes / MIB:,.1f} MiB ({plan50.budget_bytes / prof.peak_bytes:.0%}), "
        f"predicted {plan50.peak_bytes / MIB:,.1f} MiB)"
    )
    base = rows[0]["peak"]
    cells = [
        [
            r["variant"],
            f"{r['peak'] / MIB:,.1f} MiB",
            f"{r['peak'] / base - 1:+.1%}",
            f"{r['extra_flops'] / 1e9:,.2f}",
            f"{r['time_ratio']:.3f}",
            "yes" if r["grads_equal"] else "NO",
        ]
        for r in rows
    ]
    headers = ["strategy", "measured peak", "vs none", "extra GFLOP", "step time vs none (median)", "grads equal"]
    return head, md_table(headers, cells)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    g = SIZES["quick" if args.quick else "full"]
    b = dict(
        n_layer=g["n_layer"], hidden=g["n_embd"], heads=g["n_head"], seq=g["seq"], batch=g["batch"], vocab=g["vocab"]
    )
    rounds = args.rounds or (3 if args.quick else 7)
    sections, data = [("", f"{rounds} interleaved rounds after 2 warm-up rounds.")], {}
    for name, factory in (("GPT-2", lambda: zoo.gpt2(**g)), ("BERT", lambda: zoo.bert(**b))):
        name, prof, plan50, rows = measure(name, factory, rounds)
        sections.append(_section(name, prof, plan50, rows))
        data[name] = rows
    command = "python benchmarks/apply_vs_hf.py" + (" --quick" if args.quick else "")
    out = "apply_vs_hf" + ("_quick" if args.quick else "")
    print(write_results(out, TITLE, machine_info(), command, sections, data).read_text())


if __name__ == "__main__":
    main()
