"""Issue 36: the seconds a fake step predicts for an H100 against what the H100 measured, op by op and step by step.

usage: python benchmarks/gpu_seconds.py
No GPU needed: the predictions are fake-mode profiles for hardware="H100"; the truth is the repository's copy of the
H100's figures (tests/gpu_facts/h100/op_times.json, step_times.json).  The same cases and models as
tests/test_gpu_seconds.py, which holds them to 25% per op and 5 points per step; this prints every case, compared
or not.  Writes benchmarks/results/gpu_seconds.md/.json.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _common  # noqa: E402
import test_gpu_seconds as cases  # noqa: E402

import remat  # noqa: E402
from remat.planner.recipes import baseline_plans  # noqa: E402


def op_rows() -> list[list]:
    big, floor = cases._table()
    rows = []
    for case in cases.CASES:
        predicted = cases._predicted(case)
        for direction, key, harness, seconds in zip(("forward", "backward"), ("forward_s", "backward_s"), floor,
                                                    predicted):
            kernel = big[case[0]][key] - harness
            compared = big[case[0]][key] >= 3 * harness
            verdict = ("not modelled" if case[0] in cases.OFF else "compared") if compared else "harness-bound"
            rows.append([case[0], direction, round(kernel * 1e6, 1), round(seconds * 1e6, 1),
                         f"{seconds / kernel:.2f}" if kernel > 0 else "-", verdict])
    return rows


def step_rows() -> list[list]:
    import json

    truth = json.loads((cases.FACTS / "step_times.json").read_text())["models"]
    rows = []
    for name, build in (("llama_style_decoder", cases._llama_style_decoder), ("bert_base_mlm", cases._bert_base_mlm)):
        model, batch = build()
        prof = remat.profile(model, batch, mode="fake", device="cuda", hardware="H100",
                             optimizer=torch.optim.AdamW(model.parameters()))
        every = baseline_plans(prof)["every-block"]
        t = truth[name]
        rows.append([name, round(t["eager_step_s"] * 1e3, 1), round(prof.step_time_s * 1e3, 1),
                     f"+{t['every_layer_checkpointing']['step_ratio'] - 1:.1%}", f"+{every.extra_fraction:.1%}"])
    return rows


def zoo_rows() -> list[list]:
    """remat.zoo's small models, whose steps on the H100 take a few milliseconds (zoo_truth.json)."""
    import json

    from remat import zoo

    truth = json.loads((cases.FACTS / "zoo_truth.json").read_text())["models"]
    rows = []
    for name, measured in truth.items():
        model, inputs, *loss_fn = getattr(zoo, name)()
        prof = remat.profile(model, inputs, loss_fn=loss_fn[0] if loss_fn else None, mode="fake", device="cuda",
                             hardware="H100", optimizer=torch.optim.Adam(model.parameters()))
        step = measured["held"]["step_s"]
        rows.append([name, round(step * 1e3, 2), round(prof.step_time_s * 1e3, 2), f"{prof.step_time_s / step:.2f}"])
    return rows


def main() -> None:
    info = _common.machine_info()
    ops, steps, small = op_rows(), step_rows(), zoo_rows()
    op_table = _common.md_table(["case", "pass", "H100 kernel us", "predicted us", "ratio", "verdict"], ops)
    step_table = _common.md_table(["model", "H100 step ms", "predicted ms", "every layer, H100", "predicted"], steps)
    zoo_table = _common.md_table(["remat.zoo model", "H100 step ms", "predicted ms", "ratio"], small)
    print(op_table, "\n", step_table, "\n", zoo_table, sep="\n")
    path = _common.write_results(
        "gpu_seconds", "Predicted GPU seconds against an H100's", info, "python benchmarks/gpu_seconds.py",
        [("Per op (H100 kernel: the table's time less the harness's least op)", op_table),
         ("Per step (issue 36's runs)", step_table),
         ("Small steps: the host's (zoo_truth.json, the output held through backward)", zoo_table)],
        {"ops": ops, "steps": steps, "zoo": small})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
