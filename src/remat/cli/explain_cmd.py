"""`remat explain TARGET`: why the model's own checkpointing does not lower memory, and the fix."""

from __future__ import annotations

import argparse

import remat
from remat.cli.common import EXIT_OK, OPTIMIZERS, TARGET_HELP, add_step_options, load, spinner
from remat.report.explain_text import render_explanation


def register(verbs) -> None:
    p = verbs.add_parser(
        "explain",
        help="why the model's own checkpointing does not lower memory, with measured bytes, and the fix",
        description="Run one training step of TARGET as written (recording every torch.utils.checkpoint call), "
        "again without its checkpoints, and once for each checkpoint remat cannot predict; print the findings "
        "(most serious first, by bytes at stake), the model's checkpoints, and the plan remat would use instead.",
    )
    p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    add_step_options(p)
    p.add_argument(
        "--observed",
        metavar="B",
        default=None,
        help='a peak you measured yourself, e.g. "7212MiB" from nvidia-smi, to compare with the '
        "tensors' peak remat measures",
    )
    p.set_defaults(command=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    built = load(args.target, args.mode, args.device)
    with spinner("running the step as written, then without its checkpoints"):
        expl = remat.explain(
            built.model,
            built.inputs,
            built.loss_fn,
            optimizer=OPTIMIZERS[args.optimizer],
            mode=args.mode,
            device=args.device,
            observed=args.observed,
        )
    print(render_explanation(expl), end="")
    return EXIT_OK
