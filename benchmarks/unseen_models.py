"""Architectures remat's tests do not build, tried as a user would: Hugging Face models from configs (random
weights, nothing downloaded; decoders, encoders, encoder-decoders, mixtures of experts, vision CNNs and
transformers), each profiled in real and in fake mode (the fake step's peak against the real one's), then planned at
its least peak and half way to the unplanned peak, and each plan checked by `remat.verify` (gradients equal, extra
FLOPs counted by FlopCounterMode equal to the plan's, the step's peak by remat's tracker against the budget).

    python benchmarks/unseen_models.py                 # ~5 min on 2 cores
    python benchmarks/unseen_models.py --models bart,swin --no-write
    python benchmarks/unseen_models.py --autocast      # each forward under CPU bf16 autocast, as a bf16 step runs
    python benchmarks/unseen_models.py --lora --autocast --models mistral,qwen2   # peft LoRA on every Linear too
    python benchmarks/unseen_models.py --models bloom --seq 512 --no-write   # where attention weights are most
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from inspect import signature
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, md_table, write_results  # noqa: E402
from _models import Autocast  # noqa: E402
from unseen_configs import MODELS  # noqa: E402

import remat  # noqa: E402


def build(name: str, seq: int = 32):
    """The model of `name` from its config, and a batch for it (2 x `seq` tokens with the attention mask a tokenizer
    gives them, 4 images of `image` pixels, 2 clips of `audio` samples, or 2 clips' log-mel frames)."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    config_name, model_name, kwargs = MODELS[name]
    kwargs = dict(kwargs)
    image, audio, features = kwargs.pop("image", None), kwargs.pop("audio", None), kwargs.pop("features", None)
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, config_name)(**kwargs, **({} if image is None else {"num_labels": 10})))
    if image is not None:
        return model, {"pixel_values": torch.randn(4, 3, image, image), "labels": torch.randint(0, 10, (4,))}
    if audio is not None:  # 2 clips of `audio` samples, 20 labels each
        labels = torch.randint(1, kwargs["vocab_size"], (2, 20))
        return model, {"input_values": torch.randn(2, audio), "labels": labels}
    if features is not None:  # 2 clips of log-mel frames, 20 labels each
        frames = torch.randn(2, features, 2 * kwargs["max_source_positions"])
        return model, {"input_features": frames, "labels": torch.randint(3, kwargs["vocab_size"], (2, 20))}
    ids = torch.randint(0, kwargs["vocab_size"], (2, seq))
    mask = {"attention_mask": torch.ones_like(ids)} if "attention_mask" in signature(model.forward).parameters else {}
    return model, {"input_ids": ids, **mask, "labels": ids}  # a tokenizer's batch: its mask, all ones


def check(name: str, autocast: bool = False, lora: bool = False, seq: int = 32) -> dict:
    """Real and fake peaks, and the least and the half-way plans verified; with `autocast`, of the model's forward
    under bf16 autocast (`_models.Autocast`: its modules are then named `inner.*`); with `lora`, of the model
    fine-tuned with peft's LoRA (rank 4) on every Linear layer but the output one, its weights frozen."""
    start = time.perf_counter()
    model, inputs = build(name, seq)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    model = Autocast(model, "cpu") if autocast else model
    real = remat.profile(model, inputs)
    fake = remat.profile(model, inputs, mode="fake")
    least = remat.frontier(real, max_points=2)[-1].peak_bytes
    out = {"model": name, "real": real.peak_bytes, "fake": fake.peak_bytes, "plans": []}
    for budget in (least, (least + real.peak_bytes) // 2):
        plan = remat.plan(real, budget)
        report = remat.verify(model, inputs, plan, time_rounds=0)
        out["plans"].append(
            {
                "budget": budget,
                "predicted": plan.peak_bytes,
                "measured": report.measured_peak_bytes,
                "ok": report.ok,
                "replays": report.unplanned_reproducible,
                "flops": [report.measured_recompute_flops, report.predicted_recompute_flops],
                "checkpoints": len(plan.segments) + len(plan.selective),
            }
        )
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def row(r: dict) -> list:
    if "error" in r:
        return [r["model"], "", "", "error: " + r["error"], "", "", "", ""]
    least, mid = r["plans"]
    over = max((p["measured"] - p["budget"]) / p["budget"] for p in r["plans"])
    return [
        r["model"],
        f"{r['real']:,}",
        f"{r['fake'] - r['real']:+,} ({(r['fake'] - r['real']) / r['real']:+.2%})",
        f"{least['predicted'] / r['real']:.0%} ({least['checkpoints']}) / {mid['predicted'] / r['real']:.0%}"
        f" ({mid['checkpoints']})",
        _verified(r["plans"]),
        "yes" if all(p["flops"][0] == p["flops"][1] for p in r["plans"]) else "NO",
        f"{over:+.2%}",
        " / ".join(f"{p['predicted'] - p['measured']:+,}" for p in r["plans"]),  # both: one may hide the other's sign
    ]


def _verified(plans: list[dict]) -> str:
    """The verify column: ok, not, or not judged where the step without the plan does not replay itself."""
    if not all(p.get("replays", True) for p in plans):
        return "not judged: the step does not replay itself"
    return "yes" if all(p["ok"] for p in plans) else "NO"


HEADERS = [
    "model",
    "real peak (bytes)",
    "fake - real",
    "least / half-way plan, % of peak (checkpoints)",
    "verify ok",
    "extra FLOPs as predicted",
    "most over budget (tracker)",
    "predicted - tracked (bytes), least / half-way plan",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--autocast", action="store_true", help="each forward under CPU bfloat16 autocast")
    parser.add_argument("--lora", action="store_true", help="each model fine-tuned with peft LoRA on its Linears")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence of a text model (default 32)")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(MODELS)
    info = machine_info()
    results = []
    for name in names:
        try:
            results.append(check(name, args.autocast, args.lora, args.seq))
        except Exception as e:  # one architecture's failure is a result, not the end of the run
            traceback.print_exc()
            results.append({"model": name, "error": f"{type(e).__name__}: {e}"[:300]})
        print(md_table(HEADERS, [row(results[-1])], pad=False).splitlines()[-1], flush=True)
    table = md_table(HEADERS, [row(r) for r in results])
    print(table)
    if not args.no_write:
        command = "python benchmarks/unseen_models.py" + (f" --models {args.models}" if args.models else "")
        command += (" --lora" if args.lora else "") + (" --autocast" if args.autocast else "")
        command += f" --seq {args.seq}" if args.seq != 32 else ""
        sections = [
            (
                "Results",
                table + "\n\nBudgets: the least peak any plan reaches, and half way from it to the unplanned peak.",
            )
        ]
        title = "Architectures the tests do not build" + (", with LoRA adapters" if args.lora else "")
        title += ", forward under bf16 autocast" if args.autocast else ""
        stem = "unseen_models" + ("_lora" if args.lora else "") + ("_autocast" if args.autocast else "")
        stem += f"_seq{args.seq}" if args.seq != 32 else ""
        write_results(stem, title, info, command, sections, results)


if __name__ == "__main__":
    main()
