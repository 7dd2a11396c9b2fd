"""The `remat` command: a thin layer over the library.

It parses arguments, loads the TARGET (`remat.target`), calls `remat.profile`, prints
the reports of `remat.report` and writes the files asked for.  Every `RematError`
ends the command with its message on stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.status import Status

import remat
from remat.errors import RematError
from remat.report.plot import plot_timeline
from remat.report.text import render_profile, summarize_profile
from remat.target import Target, load_target
from remat.types import StepProfile

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
DEMO_TARGET = "remat.zoo:demo"


# -- optimizers the command line can name ---------------------------------------------------


def _adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params)


def _sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)  # plain SGD: no optimizer state


OPTIMIZERS: dict[str, Callable | None] = {"adam": _adam, "sgd": _sgd, "none": None}


# -- entry point --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the `remat` command line with `argv` (default: `sys.argv[1:]`); returns the exit status.

    Example:
        >>> main(["profile", "remat.zoo:mlp_report000", "--mode", "fake"])
        0

    Known limitations: argparse errors (unknown options) exit through `SystemExit(2)`
    as usual rather than returning.
    """
    args = build_parser().parse_args(argv)
    with _warnings_to_stderr():
        try:
            return args.command(args)
        except RematError as e:
            print(str(e), file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("remat: interrupted.", file=sys.stderr)
            return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `remat` command, with one subparser per verb."""
    parser = argparse.ArgumentParser(
        prog="remat",
        description="Where the memory of one PyTorch training step goes, and how to checkpoint it.",
    )
    parser.add_argument("--version", action="version", version=f"remat {remat.__version__} (torch {torch.__version__})")
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_profile(verbs)
    _add_demo(verbs)
    return parser


def _add_profile(verbs) -> None:
    p = verbs.add_parser(
        "profile",
        help="measure (or predict) the memory of one training step of TARGET",
        description="Profile one training step (forward, loss, backward, optimizer step) of TARGET.",
    )
    p.add_argument("target", metavar="TARGET", help="path/to/file.py:factory or package.module:factory; "
                   "the factory returns (model, inputs) or (model, inputs, loss_fn)")
    p.add_argument("--mode", choices=("real", "fake"), default="real",
                   help="real: run the step; fake: predict it with fake tensors, allocating nothing (default: real)")
    p.add_argument("--device", type=_device_arg, default=None,
                   help="device to profile for, e.g. cuda (default: where the factory puts the model); "
                   "with --mode fake a CUDA target is simulated on a machine without one")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adam",
                   help="optimizer whose state counts in the step (default: adam; sgd has no state)")
    _add_outputs(p)
    p.add_argument("--top", type=_count_arg, default=10, metavar="N",
                   help="how many candidate blocks the report lists (default: 10)")
    p.set_defaults(command=_cmd_profile)


def _add_demo(verbs) -> None:
    p = verbs.add_parser(
        "demo",
        help="profile a built-in GPT-2-style model and explain the result",
        description=f"Profile one training step of the built-in {DEMO_TARGET} (a GPT-2-style model, Adam) "
        "and explain the result in plain words.",
    )
    _add_outputs(p)
    p.set_defaults(command=_cmd_demo)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="F", type=Path, help="also write the profile as JSON to F")
    p.add_argument("--plot", metavar="F", type=Path, help="also write the memory timeline as a PNG to F")


def _device_arg(text: str) -> str:
    try:
        torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:1)") from e
    return text


def _count_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, saw {text!r}")
    return n


# -- remat profile ----------------------------------------------------------------------------


def _cmd_profile(args: argparse.Namespace) -> int:
    prof = _profile_target(args.target, args.mode, args.device, OPTIMIZERS[args.optimizer])
    print(render_profile(prof, top=args.top), end="")
    if args.json is not None or args.plot is not None:
        print()
    _write_outputs(prof, args.json, args.plot)
    return EXIT_OK


def _profile_target(target: str, mode: str, device: str | None, optimizer: Callable | None) -> StepProfile:
    return _profile_built(_load(target, mode, device), mode, device, optimizer)


def _load(target: str, mode: str, device: str | None) -> Target:
    with _spinner(f"loading {target}"):
        return load_target(target, fake=(mode == "fake"), device=_build_device(mode, device))


def _profile_built(built: Target, mode: str, device: str | None, optimizer: Callable | None) -> StepProfile:
    """`remat.profile` with a spinner on stderr saying which phase is running."""
    with _spinner("running the step") as status:
        return remat.profile(
            built.model, built.inputs, built.loss_fn,
            optimizer=optimizer, mode=mode, device=device, progress=_progress(status),
        )


def _build_device(mode: str, device: str | None) -> str | None:
    """Where the factory should build: `device`, except a CUDA target simulated in fake mode (CPU)."""
    if device is None or not device.startswith("cuda") or torch.cuda.is_available():
        return device
    if mode == "real":
        raise RematError(
            f"remat: --device {device} with --mode real runs the step on a GPU, but this machine has no "
            f"CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False). "
            f"Fix: run on a machine with a GPU, or predict the step with --mode fake --device {device}."
        )
    return None


def _progress(status: Status) -> Callable[[str, int], None]:
    def report(phase: str, ops: int) -> None:
        status.update(f"running the step: {phase} ({ops} ops)")

    return report


@contextlib.contextmanager
def _spinner(text: str) -> Iterator[Status]:
    """A rich status spinner on stderr (shows nothing when stderr is not a terminal)."""
    with Console(stderr=True).status(text) as status:
        yield status


def _write_outputs(prof: StepProfile, json_path: Path | None, plot_path: Path | None) -> None:
    if json_path is not None:
        _write(json_path, "the profile as JSON", lambda p: p.write_text(prof.to_json(), encoding="utf-8"))
    if plot_path is not None:
        _write(plot_path, "the memory timeline plot", lambda p: plot_timeline(prof, p))


def _write(path: Path, what: str, write: Callable[[Path], None]) -> None:
    try:
        write(path)
    except OSError as e:
        raise RematError(
            f"remat: could not write {what} to {path}: {e.strerror or e}. Expected a writable file path. "
            "Fix: create the folder first, or pick another path."
        ) from e
    print(f"wrote {what} to {path}")


# -- remat demo ----------------------------------------------------------------------------------


@dataclass
class DemoRun:
    """What the demo's steps pass along: each step reads what earlier steps left here."""

    args: argparse.Namespace
    target: Target | None = None
    profile: StepProfile | None = None


def _demo_profile(run: DemoRun) -> None:
    run.target = _load(DEMO_TARGET, "real", None)
    run.profile = _profile_built(run.target, "real", None, _adam)
    print(render_profile(run.profile), end="")


def _demo_explain(run: DemoRun) -> None:
    print(summarize_profile(run.profile), end="")


def _demo_outputs(run: DemoRun) -> None:
    _write_outputs(run.profile, run.args.json, run.args.plot)


DemoStep = tuple[str, Callable[[DemoRun], None]]


def _demo_steps(args: argparse.Namespace) -> list[DemoStep]:
    """The demo, in order; later verbs (plan, apply, verify) add their steps here."""
    steps: list[DemoStep] = [
        (f"Profile one training step of {DEMO_TARGET} (GPT-2-style, Adam, real mode)", _demo_profile),
        ("In plain words", _demo_explain),
    ]
    if args.json is not None or args.plot is not None:
        steps.append(("Write files", _demo_outputs))
    return steps


def _cmd_demo(args: argparse.Namespace) -> int:
    run, steps = DemoRun(args), _demo_steps(args)
    for i, (title, step) in enumerate(steps, start=1):
        if i > 1:
            print()
        print(f"[{i}/{len(steps)}] {title}")
        print()
        step(run)
    return EXIT_OK


# -- logging ------------------------------------------------------------------------------------


class _StderrHandler(logging.Handler):
    """Writes each record to whatever `sys.stderr` is at the time (so spinners and capture work)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # logging must never break the command
            self.handleError(record)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Show the library's warnings (fallbacks, approximations) on stderr while a command runs."""
    handler = _StderrHandler(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("remat")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
