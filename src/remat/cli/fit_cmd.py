"""`remat fit CONFIG --gpu 24GiB --seq 8192`: will one training step of a Hugging Face model fit a GPU, and if
not, what to change (`remat.fit.will_it_fit`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from remat.cli.common import spinner, write
from remat.fit import DEFAULT_OPTIM, DEFAULT_SEQ, DTYPES, KINDS, OPTIMS, will_it_fit
from remat.fit.build import TASKS
from remat.measure.device.roofline import GPUS


def register(verbs) -> None:
    p = verbs.add_parser(
        "fit",
        help="will a Hugging Face model's training step fit a GPU? (from its config.json, nothing downloaded)",
        description="Build the model of CONFIG on the meta device, predict one steady AdamW training step for the "
        "GPU with fake tensors, and say whether it fits as is, fits with a checkpointing plan (and at what "
        "time), or does not fit, with the least it needs and the single changes that would make it fit. "
        "Exit status 0 when it fits, 1 when it does not, 2 for an error.",
    )
    p.add_argument(
        "config",
        metavar="CONFIG",
        help="a Hugging Face config.json, a folder holding one, or a model name (needs the network)",
    )
    p.add_argument(
        "--gpu",
        required=True,
        metavar="G",
        help='the GPU\'s memory ("24GiB", "80GB") or its name (H100, H200, A100, A100-40GB, L4, L40S, '
        "4090, 3090, A10G, T4)",
    )
    p.add_argument(
        "--task",
        default=None,
        metavar="T",
        help="the head the training script builds, as its AutoModelFor... class: "
        f"{', '.join(TASKS)} (default: the one the config's architectures name)",
    )
    _add_step_shape(p)
    _add_optimizer(p)
    p.set_defaults(command=_cmd_fit)


def _add_step_shape(p: argparse.ArgumentParser) -> None:
    """The step `remat fit` predicts: its size, dtype, adapters, ranks, and what to try where it does not fit."""
    _add_rows(p)
    p.add_argument(
        "--dtype",
        default="bf16",
        metavar="|".join(DTYPES),
        help="bf16/fp16/fp32: weights, gradients and AdamW state in that dtype; amp-bf16/amp-fp16: fp32 "
        "weights, forward under autocast (default: bf16)",
    )
    p.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="R",
        help="train LoRA adapters of rank R on every linear layer (peft), the model frozen",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        metavar="N",
        help="N GPUs sharding the model with FSDP2, each with --batch sequences (default: 1)",
    )
    p.add_argument(
        "--hardware",
        choices=GPUS,
        default=None,
        type=_any_case,
        help="the GPU whose roofline predicts seconds (default: the named GPU's, else H100)",
    )
    p.add_argument(
        "--changes",
        default=",".join(KINDS),
        metavar="K,K",
        help="where it does not fit, the kinds of change to try: some of batch, seq, lora, world-size "
        "(default: all), or none",
    )
    p.add_argument(
        "--out",
        metavar="F",
        type=Path,
        help="write the plan as JSON to F when it fits with one (remat.load_plan reads it)",
    )


def _add_rows(p: argparse.ArgumentParser) -> None:
    """What one row of the batch is (tokens, or an image classifier's images), and how many a GPU takes."""
    p.add_argument(
        "--seq",
        type=int,
        default=None,
        metavar="N",
        help=f"tokens per sequence (Whisper: label tokens; an image classifier takes none: its rows are images, "
        f"see --image-size) (default: {DEFAULT_SEQ})",
    )
    p.add_argument(
        "--image-size",
        type=int,
        default=None,
        metavar="N",
        help="an image classifier's images: N x N pixels (default: its config's image_size)",
    )
    p.add_argument(
        "--choices",
        type=int,
        default=None,
        metavar="N",
        help="a multiple choice model's answers per row, a sequence of --seq tokens each (default: 4, as in SWAG)",
    )
    p.add_argument(
        "--batch", type=int, default=1, metavar="B", help="sequences (or images) per GPU and step (default: 1)"
    )


def _add_optimizer(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--optim",
        default=DEFAULT_OPTIM,
        metavar="|".join(OPTIMS),
        help="the optimizer, as Hugging Face's Trainer names it: adamw_torch_fused (its default: torch's AdamW, "
        "fused, updating in place) or adamw_torch (AdamW's foreach kernels, a plain loop's default, with "
        f"temporaries of every parameter's size) (default: {DEFAULT_OPTIM})",
    )


def _cmd_fit(args: argparse.Namespace) -> int:
    with spinner("fit") as status:
        answer = will_it_fit(
            args.config,
            args.gpu,
            seq=args.seq,
            image_size=args.image_size,
            choices=args.choices,
            task=args.task,
            batch=args.batch,
            dtype=args.dtype,
            lora=args.lora,
            world_size=args.world_size,
            optim=args.optim,
            hardware=args.hardware,
            changes=_changes(args.changes),
            progress=lambda phase, done: status.update(phase),
        )
    print(str(answer), end="")
    if args.out is not None and answer.plan is not None:
        write(args.out, "the plan as JSON", answer.plan.save)
    elif args.out is not None:
        print(f"no plan to write to {args.out}: the step {answer.outcome.verdict}.")
    return answer.exit_status


def _changes(text: str) -> tuple[str, ...]:
    return () if text.strip().lower() == "none" else tuple(k.strip() for k in text.split(",") if k.strip())


def _any_case(text: str) -> str:
    """ "h100" is "H100"."""
    return next((name for name in GPUS if name.lower() == text.lower()), text)
