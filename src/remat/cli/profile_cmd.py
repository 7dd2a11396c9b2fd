"""`remat profile TARGET`: measure (or predict) the memory of one training step and print the report."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from remat.cli.common import (
    EXIT_OK,
    OPTIMIZERS,
    TARGET_HELP,
    add_outputs,
    add_step_options,
    load,
    profile_options,
    profile_built,
    write_outputs,
)
from remat.report.text import render_profile
from remat.types import StepProfile


def register(verbs) -> None:
    p = verbs.add_parser(
        "profile",
        help="measure (or predict) the memory of one training step of TARGET",
        description="Profile one training step (forward, loss, backward, optimizer step) of TARGET.",
    )
    p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    add_step_options(p)
    add_outputs(p)
    p.add_argument(
        "--top",
        type=_count_arg,
        default=10,
        metavar="N",
        help="how many candidate blocks the report lists (default: 10)",
    )
    p.set_defaults(command=_cmd_profile)


def _count_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, saw {text!r}")
    return n


def _cmd_profile(args: argparse.Namespace) -> int:
    prof = _profile_target(args.target, args.mode, args.device, OPTIMIZERS[args.optimizer], profile_options(args))
    print(render_profile(prof, top=args.top), end="")
    if args.json is not None or args.plot is not None:
        print()
    write_outputs(prof, args.json, args.plot)
    return EXIT_OK


def _profile_target(target: str, mode: str, device: str | None, optimizer: Callable | None, loop: dict) -> StepProfile:
    return profile_built(load(target, mode, device), mode, device, optimizer, loop)
